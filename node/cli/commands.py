"""The node's subcommands: `reame list`, `reame run`, `reame warm`, `reame batch`, `reame stats`,
and the config mode `reame --config FILE`.

`run` answers one prompt (streamed to stdout through the chat template; with `--conclave N`
by a Conclave of N candidates, node/serving/conclave/; `--best-of N` is its deprecated
alias, which says so), or chats turn after
turn keeping the conversation, or, with `--serve`, hands the settings to the API runner.
`warm` prefills documents known in advance into the prefix cache directory a node will use
(node/sessions/warm.py), and with `--arca` pushes them to ARCA's L3 for the whole fleet.
`batch` answers a Batch API input file (node/cli/batch.py); `stats` shows what a running
node saved (GET /v1/reame/stats). Expected failures (unknown model, bad config, no network, a prompt too long) end in one line
on stderr and exit code 1, never a traceback.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Sequence

from node.config import NodeSettings, home_dir, load_settings
from node.models.catalog import CATALOG, local_models, models_dir
from node.models.errors import ModelError
from node.models.templates import ChatTemplate, TemplateError
from shared.config import ConfigError
from shared.logs import configure_logging

if TYPE_CHECKING:
    from node.engine.engine import Engine

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
    parser.add_argument("--conclave", type=int, metavar="N",
                        help="Conclave: N candidates forked from one prefill, the answer by majority vote "
                        "(prints CONCLAVE consensus=k/N; --verbose adds the votes)")
    parser.add_argument("--best-of", type=int, metavar="N",
                        help="deprecated alias of --conclave (the API's best_of is OpenAI's, not a vote)")
    parser.add_argument("--threads", type=int, help="CPU threads (default: autoconfigured)")
    parser.add_argument("--extra-buffers", choices=("auto", "on", "off"),
                        help="llama.cpp's AMX and repacked-weight kernels (default auto: a probe decides)")
    parser.add_argument("--ctx", type=int, help="context length in tokens (default: autoconfigured)")
    parser.add_argument("--parallel", type=int, help="sequences decoded together (default: 1, 4 serving)")
    parser.add_argument("--config", type=Path, metavar="FILE", help="INI settings (see conf/reame.conf)")
    parser.add_argument("--verbose", action="store_true", help="log what the node does")
    serve = parser.add_argument_group("serving")
    serve.add_argument("--serve", action="store_true", help="serve the OpenAI-compatible API")
    serve.add_argument("--host", help="address to listen on (default 127.0.0.1)")
    serve.add_argument("--port", type=int, help="port to listen on (default 8080)")
    serve.add_argument("--api-key", help="require this bearer key on every route (/health: status only without it)")
    serve.add_argument("--api-keys", metavar="KEY,KEY", help="more bearer keys, comma-separated; each key is a "
                       "tenant of its own (cached answers and prefix states are not shared between keys)")
    serve.add_argument("--arca", metavar="URL", help="shared archive: host:port, redis://, rediss://, "
                       "redis+cluster://... (default: embedded)")
    return parser


def quiet_logging(verbose: bool) -> None:
    """Warnings only, unless --verbose; llama.cpp's load-time remarks are not the user's business."""
    configure_logging("info" if verbose else "warning")
    if not verbose:
        logging.getLogger("node.engine.llama").setLevel(logging.ERROR)


def conclave_flag(args: argparse.Namespace) -> str:
    """Which flag set the Conclave's size (`args.conclave` holds it after this, 1 when none did);
    `--best-of` says on stderr that it is deprecated."""
    if args.best_of is None:
        args.conclave = 1 if args.conclave is None else args.conclave
        return "--conclave"
    print("reame: --best-of is deprecated and will be removed: it runs a Conclave (a vote among N "
          "candidates), unlike the API's best_of; use --conclave N", file=sys.stderr)
    if args.conclave is not None and args.conclave != args.best_of:
        raise ConfigError(f"--conclave {args.conclave} and --best-of {args.best_of} disagree: give --conclave alone")
    args.conclave = args.best_of
    return "--best-of"


def settings_from_args(args: argparse.Namespace) -> NodeSettings:
    serving = args.serve
    flags = {
        "model.path": getattr(args, "model", None),
        "model.threads": args.threads,
        "model.extra_buffers": args.extra_buffers,
        "model.context_length": args.ctx,
        "server.parallel": args.parallel if args.parallel is not None or serving else max(1, args.conclave),
        "server.host": args.host,
        "server.port": args.port,
        "server.api_key": args.api_key,
        "server.api_keys": args.api_keys,
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
    flag = conclave_flag(args)
    settings = settings_from_args(args)
    if args.serve:
        from node.api.runner import run_node
        from node.models.catalog import resolve_model

        resolve_model(settings.model.path, settings.home)  # fail fast; a download shows its bar here
        return run_node(settings)
    prompt = args.prompt if args.prompt is not None else args.prompt_flag
    if args.max_tokens < 1:
        raise ConfigError(f"--max-tokens must be >= 1, got {args.max_tokens}")
    if not 1 <= args.conclave <= settings.conclave.max_candidates:
        raise ConfigError(f"{flag} must be between 1 and {settings.conclave.max_candidates} "
                          f"([conclave] max_candidates), got {args.conclave}")
    if args.conclave > 1 and prompt is None:
        raise ConfigError(f"{flag} answers one prompt: give the prompt on the command line")
    from node.cli.chat import Conversation, NodeLoop

    node = NodeLoop(settings)
    try:
        conversation = Conversation(node, max_tokens=args.max_tokens, temperature=args.temp, seed=args.seed)
        if prompt is not None and args.conclave > 1:
            return conversation.conclave(prompt, sys.stdout, args.conclave, votes=args.verbose)
        if prompt is not None:
            return conversation.one_shot(prompt, sys.stdout)
        print(CHAT_HELP.format(model=settings.model.path), file=sys.stderr)
        if sys.stdin.isatty():
            import readline  # noqa: F401  (line editing and history for input())
        return conversation.loop(sys.stdin, sys.stdout)
    finally:
        node.close()


# ----------------------------------------------------------------------------- reame warm

WARM_AS = {
    "system": "a system message: later chats that start with it and add a user message share it",
    "user": "the start of a user message: later chats whose first message starts with it share it",
    "prompt": "a completion prompt: later /v1/completions prompts that start with it share it",
}


def cmd_warm(argv: Sequence[str]) -> int:
    parser = argparse.ArgumentParser(
        prog="reame warm", description="Prefill documents into the prefix KV cache before anyone asks. "
        "A node started later with the same model, settings and cache directory restores them from disk.")
    parser.add_argument("files", nargs="+", type=Path, help="UTF-8 text files, one document each")
    parser.add_argument("--model", help="catalog alias or GGUF path (default: the config's [model] path)")
    parser.add_argument("--config", type=Path, metavar="FILE", help="INI settings (the node's)")
    parser.add_argument("--as", dest="form", choices=tuple(WARM_AS), default="system",
                        help="how later requests carry the document: " +
                        "; ".join(f"{name}: {doc}" for name, doc in WARM_AS.items()) + " (default: system)")
    parser.add_argument("--arca", metavar="URL", help="also push the states to this archive's L3 (host:port or a URL)")
    parser.add_argument("--api-key", metavar="KEY", help="warm for the requests that carry this key only (each "
                        "key is a tenant with prefix states of its own; default: every key of the config's "
                        "[server] api_key and api_keys, or the one keyless tenant when it has none)")
    parser.add_argument("--threads", type=int, help="CPU threads (default: autoconfigured)")
    parser.add_argument("--extra-buffers", choices=("auto", "on", "off"),
                        help="llama.cpp's AMX and repacked-weight kernels (default auto: a probe decides)")
    parser.add_argument("--ctx", type=int, help="context length in tokens (default: autoconfigured)")
    parser.add_argument("--verbose", action="store_true", help="log what the node does")
    args = parser.parse_args(argv)
    quiet_logging(args.verbose)
    settings = load_settings(args.config, {"model.path": args.model, "model.threads": args.threads,
                                           "model.extra_buffers": args.extra_buffers,
                                           "model.context_length": args.ctx, "server.parallel": 1,
                                           "arca.remote": args.arca})
    if not settings.cache.enabled:
        raise ConfigError("the prefix cache is off ([cache] enabled = false): there is nothing to warm")
    documents = [(path, path.read_text(encoding="utf-8")) for path in args.files]
    import asyncio

    from node.cache.prefix_cache import PrefixCache
    from node.cli.chat import load_engine

    engine = load_engine(settings)
    try:
        return asyncio.run(warm_documents(engine, settings, documents, args.form,
                                          warm_tenants(settings, args.api_key)))
    finally:
        engine.close()
        cache = engine.config.prefix_cache
        if isinstance(cache, PrefixCache):
            cache.close()


def warm_tenants(settings: NodeSettings, api_key: str | None) -> tuple[str, ...]:
    """The tenants `reame warm` prefills for: the key's, else every configured key's, else the keyless one."""
    from node.serving.tenants import OPEN, tenant_id

    keys = (api_key,) if api_key else settings.server.keys
    return tuple(tenant_id(key) for key in keys) or (OPEN,)


async def warm_documents(engine: Engine, settings: NodeSettings, documents: list[tuple[Path, str]], form: str,
                         tenants: Sequence[str] = ("",)) -> int:
    import asyncio

    from node.archive.client import open_archive
    from node.cache.fleet import FleetTier
    from node.cache.prefix_cache import PrefixCache
    from node.serving.prompts import rendered_tokens
    from node.sessions.cuts import shared_prefix
    from node.sessions.warm import warm

    loop = asyncio.get_running_loop()
    cache = engine.config.prefix_cache
    if not isinstance(cache, PrefixCache):
        raise ConfigError("the engine has no prefix cache to warm")
    template = None if form == "prompt" else ChatTemplate.for_engine(engine)
    archive = fleet = None
    if settings.arca.remote:
        archive = open_archive(settings)
        await archive.start()
        fleet = FleetTier(cache, archive)
    try:
        for path, text in documents:
            if template is None:
                tokens = tuple(engine.tokenize(text, add_bos=True, special=True))
            else:
                tokens = rendered_tokens(engine, shared_prefix(template, [{"role": form, "content": text}]))
            for number, tenant in enumerate(tenants, 1):
                result = await warm(lambda request: engine.submit(request, loop), cache, tokens, fleet=fleet,
                                    scope=tenant)
                which = f" (key {number} of {len(tenants)})" if len(tenants) > 1 else ""
                print(f"{path}{which}: {result.tokens} tokens, {result.cached_tokens} were cached, "
                      f"{result.stored_tokens} stored, {result.seconds:.2f} s", flush=True)
        await asyncio.to_thread(cache.flush)
        if fleet is not None and archive is not None:
            await fleet.drain()
            pushed = int(cache.stats()["fleet_pushes"])
            where = getattr(archive, "name", "the archive")
            print(f"pushed {pushed} states to {where} (archive: {archive.state()})")
    finally:
        if fleet is not None:
            await fleet.close()
        if archive is not None:
            await archive.close()
    return 0


# ----------------------------------------------------------------------------- reame batch


def cmd_batch(argv: Sequence[str]) -> int:
    parser = argparse.ArgumentParser(
        prog="reame batch", description="Answer a Batch API input file (JSON Lines of custom_id, method, url, "
        "body) into an output file, against a running node or a model loaded here. A rerun skips the "
        "custom_ids the output already answers; Ctrl-C leaves a consistent output.")
    parser.add_argument("input", type=Path, help="JSON Lines, OpenAI's batch input format")
    parser.add_argument("model", nargs="?", help="catalog alias or GGUF path to load here (instead of --server)")
    parser.add_argument("-o", "--output", type=Path, help="output JSON Lines (default: INPUT.output.jsonl)")
    parser.add_argument("--server", metavar="URL", help="a running node, e.g. http://127.0.0.1:8080")
    parser.add_argument("--via", choices=("batch-api", "requests"), default="batch-api",
                        help="with --server: the node's Batch API (default) or one request per line")
    parser.add_argument("--concurrency", type=int, help="lines in flight at once (default: the engine's slots); "
                        "not with the Batch API, where the node's [batch] concurrency decides")
    parser.add_argument("--api-key", help="the node's bearer key (default: $REAME_API_KEY)")
    parser.add_argument("--config", type=Path, metavar="FILE", help="INI settings for a model loaded here")
    parser.add_argument("--parallel", type=int, help="sequences decoded together for a model loaded here")
    parser.add_argument("--verbose", action="store_true", help="log what the node does")
    args = parser.parse_args(argv)
    quiet_logging(args.verbose)
    if (args.server is None) == (args.model is None):
        parser.error("give either --server URL or MODEL")
    if args.concurrency is not None and (args.concurrency < 1 or (args.server and args.via == "batch-api")):
        parser.error("--concurrency must be >= 1, and goes with --via requests or MODEL")
    import asyncio

    from node.cli.batch import BatchInputError, open_local, run as run_batch

    output = args.output or args.input.with_name(args.input.stem + ".output.jsonl")
    local = None
    if args.model is not None:
        # no Batch API runner in this process (a node sharing the home runs its own batches),
        # and no slot kept for live requests: there are none here
        settings = load_settings(args.config, {"model.path": args.model, "server.parallel": args.parallel,
                                               "batch.enabled": False, "batch.interactive_slots": 0})
        local = partial(open_local, settings)
    try:
        tally = asyncio.run(run_batch(args.input, output, server=args.server, via=args.via,
                                      concurrency=args.concurrency, api_key=args.api_key, local=local))
    except BatchInputError as exc:
        print(f"reame batch: {exc}", file=sys.stderr)
        return 1
    print(tally.summary(output))
    return 0 if tally.failed == 0 else 1


# ----------------------------------------------------------------------------- reame stats


def cmd_stats(argv: Sequence[str]) -> int:
    parser = argparse.ArgumentParser(prog="reame stats", description="What a running node saved: tokens "
                                     "served against tokens computed, by tier (GET /v1/reame/stats).")
    parser.add_argument("--server", metavar="URL", default="http://127.0.0.1:8080", help="the node (default %(default)s)")
    parser.add_argument("--api-key", help="the node's bearer key (default: $REAME_API_KEY)")
    parser.add_argument("--json", action="store_true", help="print the endpoint's JSON as it is")
    args = parser.parse_args(argv)
    import urllib.request

    import orjson

    key = args.api_key or os.environ.get("REAME_API_KEY")
    request = urllib.request.Request(args.server.rstrip("/").removesuffix("/v1") + "/v1/reame/stats",
                                     headers={"Authorization": f"Bearer {key}"} if key else {})
    with urllib.request.urlopen(request, timeout=30) as response:
        report = orjson.loads(response.read())
    if args.json:
        print(orjson.dumps(report, option=orjson.OPT_INDENT_2).decode())
        return 0
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"{args.server}: what the archive saved", title_justify="left")
    table.add_column("")
    periods = {"since start": report["since_start"], f"last {report['window_minutes']} min": report["window"]}
    for name in periods:
        table.add_column(name, justify="right")

    def row(label: str, value: Callable[[dict], object]) -> None:
        table.add_row(label, *(str(value(period)) for period in periods.values()))

    row("tokens served", lambda p: p["tokens_served"])
    row("tokens computed", lambda p: p["tokens_computed"])
    row("L1 answers (tokens, share)", lambda p: f"{p['saved']['l1']['answers']} ({p['saved']['l1']['tokens']}, "
        f"{p['saved']['l1']['share']:.0%})")
    row("prefix KV restored (share)", lambda p: f"{p['saved']['prefix']['tokens']} ({p['saved']['prefix']['share']:.0%})")
    row("drafts accepted (share)", lambda p: f"{p['saved']['drafts']['tokens']} ({p['saved']['drafts']['share']:.0%})")
    for source in report["since_start"]["saved"]["drafts"]["by_source"]:
        row(f"  from {source}", partial(_drafts_from, source))
    row("effective tok/s", lambda p: p["effective_tokens_per_second"] if p["effective_tokens_per_second"] is not None
        else "-")
    row("plain tok/s (start-up)", lambda p: p["plain_tokens_per_second"] or "-")
    row("speed-up", lambda p: f"{p['speedup']:.2f}x" if p["speedup"] else "-")
    Console().print(table)
    rates = [point["served_per_second"] or 0 for point in report["trend"]][-60:]
    if rates:
        bars = " ▁▂▃▄▅▆▇█"
        top = max(rates) or 1
        print("served/s trend: " + "".join(bars[round(r / top * 8)] for r in rates))
    return 0


def _drafts_from(source: str, period: dict) -> object:
    return period["saved"]["drafts"]["by_source"].get(source, 0)


COMMANDS: dict[str, Callable[[Sequence[str]], int]] = {
    "list": cmd_list,
    "run": cmd_run,
    "warm": cmd_warm,
    "batch": cmd_batch,
    "stats": cmd_stats,
    "--config": cmd_config,
}


def run_subcommand(name: str, argv: list[str]) -> int:
    command = COMMANDS.get(name)
    if command is None:
        print(f"reame: unknown command {name!r} (try: reame list, reame run MODEL, reame arca)",
              file=sys.stderr)
        return 2
    from node.engine.errors import EngineError
    from node.serving.errors import ServingError

    try:
        return command(argv)
    except (ModelError, ConfigError, TemplateError, EngineError, ServingError, OSError) as exc:
        print(f"reame: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print(file=sys.stderr)
        return 130
