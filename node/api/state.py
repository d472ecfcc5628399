"""What a running node app holds, under typed application keys (no module globals)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from aiohttp import web

from node.api.metrics import Metrics
from node.archive_client import ArchiveClient
from node.served_model import ServedModel
from node.service import CompletionService


@dataclass(frozen=True, slots=True)
class NodeState:
    settings: Any  # NodeSettings
    engine: Any  # node.engine.engine.Engine
    archive: ArchiveClient
    model: ServedModel
    metrics: Metrics
    service: CompletionService
    gate: "InFlightGate"
    started_at: float


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


SETTINGS: web.AppKey[Any] = web.AppKey("settings", object)
STATE: web.AppKey[NodeState] = web.AppKey("state", NodeState)
