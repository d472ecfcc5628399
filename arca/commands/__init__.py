"""ARCA's commands, one module per family. Importing this package registers every command.

The corpus (ARCA.OBSERVE/DRAFT/SINCE) and KV-block commands live in corpus.py and
kvblocks.py beside the others and register the same way.
"""

from __future__ import annotations

import importlib

from arca.commands.registry import CommandContext, CommandError, Status, dispatch

_FAMILIES = ("connection", "strings", "values", "ranges", "bits", "keys", "keyspace", "objects", "server",
             "slowlog", "introspection", "transactions", "corpus", "kvblocks")

for _family in _FAMILIES:
    try:
        importlib.import_module(f"{__name__}.{_family}")
    except ModuleNotFoundError as exc:
        if exc.name != f"{__name__}.{_family}":  # only a family not written yet may be absent
            raise

__all__ = ["CommandContext", "CommandError", "Status", "dispatch"]
