"""The serving layer's settings: made once from the node's settings (node/config.py) where the
node is wired, and handed to the planner (node/serving/planner.py) and the jobs
(node/serving/jobs.py)."""

from __future__ import annotations

from dataclasses import dataclass, field

from node.serving.conclave.runner import ConclavePolicy
from node.serving.live_first import BATCH_INTERVAL_S

MAX_EMBEDDING_INPUTS = 2048  # OpenAI's limit, the default of [embeddings] max_inputs


@dataclass(frozen=True, slots=True)
class EmbeddingLimits:
    """Bounds of one embeddings request (node/serving/embeddings.py)."""

    max_inputs: int = MAX_EMBEDDING_INPUTS
    max_request_tokens: int = 300_000


@dataclass(frozen=True, slots=True)
class ServiceOptions:
    l1_enabled: bool = True
    l1_ttl_s: int | None = None
    observe: bool = True
    observe_prompt_tokens: int = 64
    max_pending_writes: int = 256
    prefetch_timeout_s: float = 2.0  # a fleet prefetch longer than this is given up
    max_queue_wait_s: float = 0.0  # a live request waiting longer for a slot is a 503 (0: no bound)
    batch_interval_s: float = BATCH_INTERVAL_S  # while live requests are answered, one batch line per this
    conclave: ConclavePolicy = field(default_factory=ConclavePolicy)
    embeddings: EmbeddingLimits = field(default_factory=EmbeddingLimits)
