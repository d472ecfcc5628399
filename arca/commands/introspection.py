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


_TOKEN = re.compile(r"\[|\]|\||\.\.\.|[^\s\[\]|]+")
_OPTIONAL, _MULTIPLE = Status("optional"), Status("multiple")


def _arguments(text: str) -> list[dict]:
    """COMMAND DOCS argument maps from a usage string like 'key [NX | XX] [EX seconds]'."""
    arguments, _ = _sequence(_TOKEN.findall(text), 0)
    return arguments


def _sequence(tokens: list[str], i: int) -> tuple[list[dict], int]:
    """Parse until ']' or the end; 'a | b' alternatives become one 'oneof' argument."""
    alternatives: list[list[dict]] = [[]]
    while i < len(tokens) and tokens[i] != "]":
        token = tokens[i]
        if token == "[":
            inner, i = _sequence(tokens, i + 1)
            alternatives[-1].append(_group(inner, optional=True))
        elif token == "|":
            alternatives.append([])
        elif token == "...":
            if alternatives[-1]:
                alternatives[-1][-1].setdefault(b"flags", []).append(_MULTIPLE)
        else:
            alternatives[-1].append(_word(token))
        i += 1
    if len(alternatives) == 1:
        return alternatives[0], i
    choices = [_group(choice, optional=False) for choice in alternatives]
    return [{b"name": b"choice", b"type": b"oneof", b"arguments": choices}], i


def _group(arguments: list[dict], optional: bool) -> dict:
    if len(arguments) == 1:
        group = arguments[0]
    else:
        name = b"-".join(arg[b"name"] for arg in arguments)
        group = {b"name": name, b"type": b"block", b"arguments": arguments}
    if optional:
        group.setdefault(b"flags", []).append(_OPTIONAL)
    return group


def _word(token: str) -> dict:
    if token.isupper() or token.startswith("ARCA."):
        return {b"name": token.lower().encode(), b"type": b"pure-token", b"token": token.encode()}
    return {b"name": token.encode(), b"type": b"key" if token == "key" else b"string"}


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
