"""The reame inference node: one llama.cpp model behind an OpenAI-compatible API."""

__version__ = "0.1.0"
