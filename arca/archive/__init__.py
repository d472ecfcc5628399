"""The archive: SQLite-backed L1 entries, L4 token corpus and L3 KV blocks, as a Python API.

Independent of the RESP server: the ARCA daemon serves it over the Redis protocol and a node
embeds it in-process. See `Archive` for the API and `ArchiveConfig` for budgets and
durability modes.
"""

from .archive import Archive
from .config import ArchiveConfig
from .entries import Entry
from .errors import ArchiveCorruptError, ArchiveError, ArchiveOOMError

__all__ = ["Archive", "ArchiveConfig", "ArchiveCorruptError", "ArchiveError", "ArchiveOOMError", "Entry"]
