"""The node's subcommands: `reame list`, `reame run`, and the config mode `reame --config FILE`.

`run` answers one prompt (streamed to stdout through the chat template), or chats turn after
turn keeping the conversation, or, with `--serve`, hands the settings to the API runner.
Expected failures (unknown model, bad config, no network, a prompt too long) end in one line
on stderr and exit code 1, never a traceback.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from pathlib import Path
from typing import Any, Callable, Sequence

from node.config import home_dir, load_settings
from node.engine.models import CATALOG, ModelError, local_models, models_dir
from node.engine.templates import TemplateError
from shared.config import ConfigError
from shared.logs import configure_logging

log = logging.getLogger(__name__)

CHAT_HELP = "chatting with {model}: /reset starts over, Ctrl-D quits, Ctrl-C stops an answer"


def build_parser(prog: str, *, model_positional: bool) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=prog, description="Run a model: one answer, a chat, or a server.")
    if model_positional:
        parser.add_argument("model", help="catalog alias (reame list) or path to a GGUF file")
        parser.add_argument("prompt", nargs="?", help="answer this and exit; without it, chat")
    parser.add_argument("--prompt", dest="prompt_flag", metavar="TEXT", help="answer this and exit")
    parser.add_argument("--max-tokens", type=int, default=512, help="longest answer (default 512)")
    parser.add_argument("--temp", type=float, default=0.7, help="temperature; 0 = greedy (default 0.7)")
    parser.add_argument("--seed", type=int, help="sampling seed, for reproducible answers")
    parser.add_argument("--threads", type=int, help="CPU threads (default: autoconfigured)")
    parser.add_argument("--ctx", type=int, help="context length in tokens (default: autoconfigured)")
    parser.add_argument("--parallel", type=int, help="sequences decoded together (default: 1, 4 serving)")
    parser.add_argument("--config", type=Path, metavar="FILE", help="INI settings (see conf/reame.conf)")
    parser.add_argument("--verbose", action="store_true", help="log what the node does")
    serve = parser.add_argument_group("serving")
    serve.add_argument("--serve", action="store_true", help="serve the OpenAI-compatible API")
    serve.add_argument("--host", help="address to listen on (default 127.0.0.1)")
    serve.add_argument("--port", type=int, help="port to listen on (default 8080)")
    serve.add_argument("--api-key", help="require this bearer key on every route but /health")
    serve.add_argument("--arca", metavar="HOST:PORT", help="shared ARCA archive (default: embedded)")
    return parser


def settings_from_args(args: argparse.Namespace) -> Any:
    serving = args.serve
    flags = {
        "model.path": getattr(args, "model", None),
        "model.threads": args.threads,
        "model.context_length": args.ctx,
        "server.parallel": args.parallel if args.parallel is not None or serving else 1,
        "server.host": args.host,
        "server.port": args.port,
        "server.api_key": args.api_key,
        "arca.remote": args.arca,
    }
    return load_settings(args.config, flags)


# ----------------------------------------------------------------------------- reame list


def cmd_list(argv: Sequence[str]) -> int:
    argparse.ArgumentParser(prog="reame list", description="The model catalog and what is on disk.").parse_args(argv)
    from rich.console import Console
    from rich.table import Table

    home = home_dir(os.environ)
    table = Table(title=f"models ({models_dir(home)})", title_justify="left")
    for column in ("model", "description", "size", "context", "template", "on disk"):
        table.add_column(column, no_wrap=column in ("model", "size"))
    known = set()
    for entry in CATALOG:
        path = entry.path(home)
        known.add(path.name)
        if path.is_file():
            status = "[green]yes[/green]"
        elif entry.url is None:
            status = "no: assembled on first run"
        else:
            status = "no: downloaded on first run"
        table.add_row(entry.alias, entry.title, f"{entry.size_mb} MB", str(entry.context),
                      entry.template, status)
    for path in local_models(home):
        if path.name not in known:
            size = path.stat().st_size >> 20
            table.add_row(str(path.name), "local GGUF (run it by path)", f"{size} MB", "model", "model's", "yes")
    Console(width=max(Console().width, 120)).print(table)
    return 0


# ----------------------------------------------------------------------------- reame run


def cmd_run(argv: Sequence[str]) -> int:
    args = build_parser("reame run", model_positional=True).parse_args(argv)
    return run(args)


def cmd_config(argv: Sequence[str]) -> int:
    """`reame --config FILE [--serve | --prompt TEXT]`: the model comes from the file."""
    parser = build_parser("reame --config FILE", model_positional=False)
    args = parser.parse_args(["--config", *argv])
    args.prompt = None
    return run(args)


def run(args: argparse.Namespace) -> int:
    configure_logging("info" if args.verbose or args.serve else "warning")
    if not args.verbose:  # llama.cpp's load-time remarks are not the user's business
        logging.getLogger("node.engine.llama").setLevel(logging.ERROR)
    settings = settings_from_args(args)
    if args.serve:
        from node.api.runner import run_node
        from node.engine.models import resolve_model

        resolve_model(settings.model.path, settings.home)  # fail fast; a download shows its bar here
        return run_node(settings)
    prompt = args.prompt if args.prompt is not None else args.prompt_flag
    if args.max_tokens < 1:
        raise ConfigError(f"--max-tokens must be >= 1, got {args.max_tokens}")
    from node.chat import Conversation, load_engine

    engine = load_engine(settings)
    try:
        conversation = Conversation(engine, max_tokens=args.max_tokens, temperature=args.temp, seed=args.seed)
        if prompt is not None:
            return conversation.one_shot(prompt, sys.stdout)
        print(CHAT_HELP.format(model=settings.model.path), file=sys.stderr)
        if sys.stdin.isatty():
            import readline  # noqa: F401  (line editing and history for input())
        return conversation.loop(sys.stdin, sys.stdout)
    finally:
        engine.close()


COMMANDS: dict[str, Callable[[Sequence[str]], int]] = {
    "list": cmd_list,
    "run": cmd_run,
    "--config": cmd_config,
}


def run_subcommand(name: str, argv: list[str]) -> int:
    command = COMMANDS.get(name)
    if command is None:
        print(f"reame: unknown command {name!r} (try: reame list, reame run MODEL, reame arca)",
              file=sys.stderr)
        return 2
    from node.engine.errors import EngineError

    try:
        return command(argv)
    except (ModelError, ConfigError, TemplateError, EngineError, OSError) as exc:
        print(f"reame: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print(file=sys.stderr)
        return 130
