"""The output file of `reame batch`: resumable, and consistent whatever stops the run.

Lines are OpenAI Batch API output records (`{"id", "custom_id", "response": {"status_code",
"request_id", "body"}, "error"}`), appended one `write()` each as requests finish and
flushed, so an interrupted run leaves only whole lines (a process killed mid-write leaves at
most one torn last line, cut off at the next open). Opening reads which custom_ids are
already answered (status 200): a rerun skips them. Closing rewrites the file in input order,
one record per custom_id (the newest: a line that failed once and succeeded on a rerun
keeps its success), through a temp file and a rename.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import IO, Sequence

import orjson


class OutputFile:
    def __init__(self, path: Path) -> None:
        self.path = path
        self._handle: IO[bytes] | None = None

    def open(self) -> set[str]:
        """The custom_ids already answered; the file is then open for appending."""
        answered: set[str] = set()
        if self.path.exists():
            data = self.path.read_bytes()
            keep = data.rfind(b"\n") + 1  # a torn last line (no newline) goes
            if keep < len(data):
                with open(self.path, "r+b") as handle:
                    handle.truncate(keep)
            for raw in data[:keep].splitlines():
                record = _record(raw)
                if record is not None and (record.get("response") or {}).get("status_code") == 200:
                    answered.add(str(record["custom_id"]))
        else:
            self.path.parent.mkdir(parents=True, exist_ok=True)
        self._handle = open(self.path, "ab")
        return answered

    def write(self, line: bytes) -> None:
        """One whole record (ending in a newline) in one write."""
        assert self._handle is not None, "open() first"
        self._handle.write(line if line.endswith(b"\n") else line + b"\n")
        self._handle.flush()

    def close(self, order: Sequence[str]) -> int:
        """Rewrite in input order (ids not in `order` last); returns the number of records."""
        if self._handle is not None:
            self._handle.close()
            self._handle = None
        newest: dict[str, bytes] = {}
        for raw in self.path.read_bytes().splitlines():
            record = _record(raw)
            if record is not None:
                newest[str(record["custom_id"])] = raw
        rank = {custom_id: i for i, custom_id in enumerate(order)}
        ids = sorted(newest, key=lambda custom_id: rank.get(custom_id, len(rank)))
        tmp = self.path.with_name(self.path.name + ".tmp")
        with open(tmp, "wb") as out:
            out.write(b"".join(newest[custom_id] + b"\n" for custom_id in ids))
            out.flush()
            os.fsync(out.fileno())
        os.replace(tmp, self.path)
        return len(ids)


def _record(raw: bytes) -> dict | None:
    try:
        record = orjson.loads(raw)
    except orjson.JSONDecodeError:
        return None
    return record if isinstance(record, dict) and isinstance(record.get("custom_id"), str) else None
