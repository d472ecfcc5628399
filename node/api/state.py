"""What a running node app holds, under typed application keys (no module globals)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from aiohttp import web

from node.archive.client import ArchiveClient
from node.batches.runner import BatchRunner
from node.config import NodeSettings
from node.serving.engine_client import EngineClient
from node.serving.metrics import Metrics
from node.serving.model import ServedModel
from node.serving.savings import Savings
from node.serving.tenants import OPEN
from node.serving.service import CompletionService
from node.speculative.controller import Controller

if TYPE_CHECKING:
    from node.assembly import Node


@dataclass(frozen=True, slots=True)
class NodeState:
    settings: NodeSettings
    engine: EngineClient
    archive: ArchiveClient
    model: ServedModel
    metrics: Metrics
    service: CompletionService
    gate: "InFlightGate"
    started_at: float
    savings: Savings
    speculation: Controller | None = None  # None when speculation is off
    batches: BatchRunner | None = None     # the Batch API (node/batches), set once the node has started

    @classmethod
    def of(cls, node: Node) -> "NodeState":
        """The state of an open node (node/assembly.py), its gate at `[server] max_concurrent_requests`."""
        return cls(node.settings, node.engine, node.archive, node.model, node.metrics, node.service,
                   InFlightGate(node.settings.server.max_concurrent_requests), node.started_at, node.savings,
                   node.controller)


class InFlightGate:
    """Counts generation requests in flight; beyond the limit the node answers 503."""

    __slots__ = ("limit", "current")

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.current = 0

    def try_enter(self) -> bool:
        if self.current >= self.limit:
            return False
        self.current += 1
        return True

    def leave(self) -> None:
        self.current -= 1


SETTINGS: web.AppKey[NodeSettings] = web.AppKey("settings", NodeSettings)
STATE: web.AppKey[NodeState] = web.AppKey("state", NodeState)
# The tenant (node/serving/tenants.py) of an authenticated request, set by the auth middleware;
# absent on a node without keys and on a public route asked without a key.
TENANT: web.RequestKey[str] = web.RequestKey("tenant", str)
# Whether the request may see the node's details (/health): it presented a valid key, or the node has none.
TRUSTED: web.RequestKey[bool] = web.RequestKey("trusted", bool)


def tenant_of(request: web.Request) -> str:
    """The tenant whose caches the request uses: its key's, or the open tenant of a node without keys."""
    return request.get(TENANT, OPEN)


def trusted(request: web.Request) -> bool:
    return request.get(TRUSTED, True)
