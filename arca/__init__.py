"""ARCA: the fleet's archive (L1 answers, L4 corpus, L3 KV blocks) behind the Redis protocol.

Never imports node, llama_cpp or aiohttp: an ARCA box runs on the base install alone.
"""

__version__ = "0.1.0"
