"""The llama.cpp engine: one context, one thread, one interleaved batch per step."""
