"""COMMAND, COMMAND COUNT/LIST/INFO/DOCS: generated from the registry, never written by hand."""

from __future__ import annotations

import re

from arca.commands.registry import CommandContext, CommandSpec, Status, all_specs, command, lookup


def _info(spec: CommandSpec) -> list:
    first, last, step = spec.keys
    return [
        spec.fullname.encode(),
        spec.arity,
        [Status(flag) for flag in spec.flags],
        first,
        last,
        step,
        [Status(f"@{spec.group}")],
        [],
        [],
        [_info(sub) for sub in _subs(spec)],
    ]


def _subs(spec: CommandSpec) -> list[CommandSpec]:
    return sorted(spec.subcommands.values(), key=lambda s: s.name)


_TOKEN = re.compile(r"\[|\]|\||[^\s\[\]|]+")


def _arguments(text: str) -> list[dict]:
    """A flat argument list for COMMAND DOCS from a usage string like 'key [NX | XX] [GET]'."""
    arguments: list[dict] = []
    depth = 0
    for token in _TOKEN.findall(text):
        if token == "[":
            depth += 1
        elif token == "]":
            depth = max(depth - 1, 0)
        elif token == "|" or token == "...":
            continue
        else:
            name = token.strip(".").lower() or token
            doc: dict = {b"name": name.encode(), b"type": b"pure-token" if token.isupper() else b"string"}
            if token.isupper():
                doc[b"token"] = token.encode()
            if depth:
                doc[b"flags"] = [Status("optional")]
            arguments.append(doc)
    return arguments


def _docs(spec: CommandSpec) -> dict:
    doc: dict = {
        b"summary": spec.summary.encode(),
        b"since": spec.since.encode(),
        b"group": spec.group.encode(),
    }
    if spec.args:
        doc[b"arguments"] = _arguments(spec.args)
    if spec.subcommands:
        doc[b"subcommands"] = {sub.fullname.encode(): _docs(sub) for sub in _subs(spec)}
    return doc


@command("COMMAND", arity=-1, flags=("loading", "stale"), group="server", summary="Details about all commands", since="2.8.13")
def command_all(ctx: CommandContext, argv: list[bytes]):
    return [_info(spec) for spec in all_specs()]


@command("COMMAND|COUNT", arity=2, flags=("loading", "stale"), group="server", summary="Number of commands", since="2.8.13")
def command_count(ctx: CommandContext, argv: list[bytes]):
    return len(all_specs())


@command("COMMAND|LIST", arity=-2, flags=("loading", "stale"), group="server", summary="Names of all commands", args="[FILTERBY MODULE name | ACLCAT category | PATTERN pattern]", since="7.0.0")
def command_list(ctx: CommandContext, argv: list[bytes]):
    return [spec.fullname.encode() for spec in all_specs()]


@command("COMMAND|INFO", arity=-2, flags=("loading", "stale"), group="server", summary="Details about some or all commands", args="[command-name [command-name ...]]", since="2.8.13")
def command_info(ctx: CommandContext, argv: list[bytes]):
    if len(argv) == 2:
        return command_all(ctx, argv)
    return [None if (spec := lookup(name)) is None else _info(spec) for name in argv[2:]]


@command("COMMAND|DOCS", arity=-2, flags=("loading", "stale"), group="server", summary="Documentary information about commands", args="[command-name [command-name ...]]", since="7.0.0")
def command_docs(ctx: CommandContext, argv: list[bytes]):
    specs = all_specs() if len(argv) == 2 else [s for name in argv[2:] if (s := lookup(name))]
    return {spec.fullname.encode(): _docs(spec) for spec in specs}
