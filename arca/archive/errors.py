"""The archive's typed errors; the RESP server maps each type to one error prefix."""

from __future__ import annotations

from pathlib import Path


class ArchiveError(Exception):
    """Anything the archive refuses or cannot do (bad argument, locked directory, I/O failure)."""


class ArchiveOOMError(ArchiveError):
    """A value does not fit its byte budget even after evicting everything else.

    The server answers it as `-OOM <message>`, like Redis under `maxmemory`.
    """


class ArchiveCorruptError(ArchiveError):
    """The database file is damaged; the archive refuses to open rather than serve garbage."""

    def __init__(self, path: Path, detail: str, hint: str | None = None) -> None:
        self.path = Path(path)
        self.detail = detail
        self.hint = hint or (
            f"stop every process using it, move {self.path.name} (and any -wal/-shm files beside it) "
            f"aside, then either start with an empty archive or salvage rows with "
            f"`sqlite3 {self.path} .recover | sqlite3 recovered.db`"
        )
        super().__init__(f"archive database {self.path} is damaged: {detail}. Recovery: {self.hint}")
