"""Errors per archive operation, owned by one archive client and exported by /metrics."""

from __future__ import annotations

OPERATIONS = ("ping", "get", "set", "observe", "since", "kv_get", "kv_put", "kv_exists",
              "session_get", "session_put", "session_delete")


class ArchiveCounters:
    __slots__ = ("errors",)

    def __init__(self) -> None:
        self.errors: dict[str, int] = dict.fromkeys(OPERATIONS, 0)

    def error(self, operation: str) -> None:
        self.errors[operation] = self.errors.get(operation, 0) + 1

