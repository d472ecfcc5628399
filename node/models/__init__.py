"""Model management: the catalog, downloads, content fingerprints, GGUF metadata, chat
templates, and the loader that fits an engine to the host and opens it."""
