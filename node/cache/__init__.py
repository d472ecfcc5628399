"""The prefix KV cache: saved sequence states keyed by chained block hashes, in RAM, on the
node's disk and in ARCA (L3), so no node prefills the same prefix twice.

    identity = engine_identity(model_fingerprint(path), "q8_0", swa_full=False)
    cache = PrefixCache(identity, PrefixCacheConfig(directory=path))
    engine = Engine(EngineConfig(..., prefix_cache=cache))
    fleet = FleetTier(cache, archive_client)      # on the event loop; optional
    await fleet.prefetch(prompt_tokens)           # before engine.submit(...)
"""

from node.cache.blob import BlobError, StateBlob
from node.cache.fleet import FleetConfig, FleetTier
from node.cache.keys import BlockChain, Boundary, CacheIdentity, engine_identity, runtime_id
from node.cache.prefix_cache import PrefixCache, PrefixCacheConfig

__all__ = [
    "BlobError",
    "BlockChain",
    "Boundary",
    "CacheIdentity",
    "FleetConfig",
    "FleetTier",
    "PrefixCache",
    "PrefixCacheConfig",
    "StateBlob",
    "engine_identity",
    "runtime_id",
]
