"""`reame`: the command line. Subcommands import their heavy parts lazily.

`reame arca` needs only the base install; `run`, `list` and `warm` need the node extra, and
say how to install it when it is missing instead of showing an ImportError trace.
"""

from __future__ import annotations

import sys

from node import __version__

EXAMPLES = """\
reame {version}: CPU-first LLM inference; never compute the same thing twice.

  reame run gemma3-270m "Name three rivers of Italy."   # one-shot answer, streamed
  reame run gemma3-270m --serve --port 8080             # OpenAI-compatible node
  reame arca --port 6420 --dir ~/.reame/arca            # the fleet's archive

reame list shows the model catalog; reame COMMAND --help tells more.
"""

NODE_EXTRA_HINT = (
    "reame: this command needs the node extra (llama-cpp-python and the offline model).\n"
    "Install it with:  pip install 'reame[node]'   (or `make run` in a checkout)"
)


def _node_main(name: str, argv: list[str]) -> int:
    try:
        from node.cli import commands
    except ImportError as exc:  # a missing extra, not a bug: say how to fix it
        print(f"{NODE_EXTRA_HINT}\n(missing: {exc.name})", file=sys.stderr)
        return 2
    return commands.run_subcommand(name, argv)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv:
        print(EXAMPLES.format(version=__version__), end="")
        return 0
    if argv[0] in ("-V", "--version"):
        print(f"reame {__version__}")
        return 0
    if argv[0] in ("-h", "--help", "help"):
        print(EXAMPLES.format(version=__version__), end="")
        return 0
    if argv[0] == "arca":
        from arca.daemon import main as arca_main

        return arca_main(argv[1:])
    return _node_main(argv[0], argv[1:])
