"""ArchiveConfig: every knob of the archive, with finite documented default budgets.

Budgets (all bytes):
- `max_bytes` (L1, default 256 MiB): key + value + `ENTRY_OVERHEAD` bytes per entry. Every L1
  value is held in RAM (the SQLite file is the durable copy, read only at open), so this
  budget bounds both RAM and disk use of L1; the least recently used entries are evicted to
  fit a write.
- `corpus_max_bytes` (L4, default 64 MiB = 16M tokens): 4 bytes per stored token. The
  in-memory n-gram index costs about 9 more bytes of RAM per stored byte (see ngrams.py):
  the default budget means about 600 MB of RAM when full.
- `kv_max_bytes` (L3, default 1 GiB): blob bytes; blobs live on disk only.

Durability ("commit" by default):
- "commit": WAL with synchronous=NORMAL. A committed write survives a process crash or
  `kill -9`; the last commits before a power loss or kernel crash may be lost.
- "fsync": WAL with synchronous=FULL: every commit is fsynced and survives power loss.
- "everysec": as "commit" on disk, but the server acknowledges writes before committing and
  commits once a second: a process crash loses up to about one second of acknowledged writes.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

DURABILITY_MODES = ("commit", "fsync", "everysec")
MIB = 1024 * 1024

# Approximate RAM cost of one L1 entry beyond its key and value bytes (ordered-dict node,
# two bytes-object headers), measured at about 150 bytes on CPython 3.11.
ENTRY_OVERHEAD = 128

# Hard ceilings on the draft parameters, whatever the configuration says.
NGRAM_LIMIT = 32
DRAFT_K_LIMIT = 4096


@dataclass(frozen=True, slots=True)
class ArchiveConfig:
    directory: Path
    max_bytes: int = 256 * MIB
    corpus_max_bytes: int = 64 * MIB
    kv_max_bytes: int = 1024 * MIB
    durability: str = "commit"
    ngram_min: int = 1
    ngram_max: int = 8
    draft_max_k: int = 256
    # Longest hash chain walked per n-gram level during a draft: bounds DRAFT latency.
    draft_max_chain: int = 128
    # PRAGMA quick_check at open (cost grows with the file; about 1 s per GiB here).
    verify_on_open: bool = True
    database_name: str = field(default="archive.db")

    def __post_init__(self) -> None:
        object.__setattr__(self, "directory", Path(self.directory).expanduser())
        if self.durability not in DURABILITY_MODES:
            raise ValueError(f"durability must be one of {', '.join(DURABILITY_MODES)}, got {self.durability!r}")
        for name in ("max_bytes", "corpus_max_bytes", "kv_max_bytes"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be a positive number of bytes")
        if not 1 <= self.ngram_min <= self.ngram_max <= NGRAM_LIMIT:
            raise ValueError(f"need 1 <= ngram_min <= ngram_max <= {NGRAM_LIMIT}, "
                             f"got {self.ngram_min}..{self.ngram_max}")
        if not 1 <= self.draft_max_k <= DRAFT_K_LIMIT:
            raise ValueError(f"draft_max_k must be within 1..{DRAFT_K_LIMIT}")
        if self.draft_max_chain < 1:
            raise ValueError("draft_max_chain must be at least 1")

    @property
    def database_path(self) -> Path:
        return self.directory / self.database_name
