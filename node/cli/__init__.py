"""`reame`, the command line: the entry point (main.py), the node's subcommands (commands.py),
the terminal chat and one-shot answers (chat.py), `reame batch` (batch.py, its output file in
batch_output.py). Subcommands import their heavy parts lazily; `python -m node.cli` is `reame`.
"""

from node.cli.main import main

__all__ = ["main"]
