"""COMMAND, COMMAND COUNT/LIST/INFO/DOCS/GETKEYS/GETKEYSANDFLAGS: generated from the
registry, never written by hand.

A command's ACL categories follow from its spec as Redis assigns them: `@write`/`@read`
from its flags, one for its group (`@string`, `@bitmap`, `@keyspace`, `@connection`,
`@transaction`), `@admin` and `@dangerous` for admin commands, then `@fast` or `@slow`.
GETKEYS reads a command's keys from its (first, last, step) spec, as Redis reads a
range key spec.
"""

from __future__ import annotations

import re

from arca.commands.args import SYNTAX
from arca.commands.glob import compile_glob
from arca.protocol import SetReply
from arca.commands.registry import (CommandContext, CommandError, CommandSpec, Status, all_specs, command,
                                    key_positions, lookup)

_MORE_CATEGORIES = {"DBSIZE": ["keyspace"], "FLUSHDB": ["keyspace", "dangerous"],
                    "FLUSHALL": ["keyspace", "dangerous"], "INFO": ["dangerous"],
                    "KEYS": ["dangerous"], "COMMAND": ["connection"]}  # where Redis files these too
_GROUP_CATEGORY = {"string": "string", "bitmap": "bitmap", "generic": "keyspace",
                   "connection": "connection", "transactions": "transaction"}


def acl_categories(spec: CommandSpec) -> list[str]:
    """The ACL categories of a command, without the leading @, in Redis's order."""
    if spec.handler is None:
        return ["slow"]  # a container of subcommands (OBJECT, CLIENT), as in Redis
    flags = spec.flags
    categories = ["write"] if "write" in flags else ["read"] if "readonly" in flags else []
    if spec.group in _GROUP_CATEGORY:
        categories.append(_GROUP_CATEGORY[spec.group])
    categories += _MORE_CATEGORIES.get(spec.name.partition("|")[0], [])
    if "admin" in flags:
        categories += ["admin", "dangerous"]
    categories.append("fast" if "fast" in flags else "slow")
    return categories


def _info(spec: CommandSpec) -> list:
    first, last, step = spec.keys
    return [
        spec.fullname.encode(),
        spec.arity,
        SetReply(Status(flag) for flag in spec.flags),
        first,
        last,
        step,
        SetReply(Status(f"@{category}") for category in acl_categories(spec)),
        [],
        [],
        [_info(sub) for sub in _subs(spec)],
    ]


def _resolve(name: bytes) -> CommandSpec | None:
    """A command or `parent|sub` subcommand by name; None for anything else (`get|key`)."""
    parent_name, bar, sub = name.partition(b"|")
    spec = lookup(parent_name)
    if spec is None or not bar:
        return spec
    if b"|" in sub:
        return None
    return spec.subcommands.get(sub.lower())


def _every_name() -> list[CommandSpec]:
    """Every command and every subcommand (`config|get`), parents first."""
    specs = []
    for spec in all_specs():
        specs.append(spec)
        specs.extend(_subs(spec))
    return specs


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


@command("COMMAND|LIST", arity=-2, flags=("loading", "stale"), group="server", summary="Names of all commands and subcommands", args="[FILTERBY MODULE module-name | ACLCAT category | PATTERN pattern]", since="7.0.0")
def command_list(ctx: CommandContext, argv: list[bytes]):
    specs = _every_name()
    if len(argv) == 2:
        return [spec.fullname.encode() for spec in specs]
    if len(argv) != 5 or argv[2].upper() != b"FILTERBY":
        raise CommandError(SYNTAX)
    kind, value = argv[3].upper(), argv[4]
    if kind == b"MODULE":
        return []  # no modules
    if kind == b"ACLCAT":
        category = value.decode("utf-8", "replace").lower()
        return [spec.fullname.encode() for spec in specs if category in acl_categories(spec)]
    if kind == b"PATTERN":
        matches = compile_glob(value.lower())
        return [spec.fullname.encode() for spec in specs if matches(spec.fullname.encode())]
    raise CommandError(SYNTAX)


@command("COMMAND|INFO", arity=-2, flags=("loading", "stale"), group="server", summary="Details about some or all commands", args="[command-name [command-name ...]]", since="2.8.13")
def command_info(ctx: CommandContext, argv: list[bytes]):
    if len(argv) == 2:
        return command_all(ctx, argv)
    return [None if (spec := _resolve(name)) is None else _info(spec) for name in argv[2:]]


def _keys_of(argv: list[bytes]) -> tuple[CommandSpec, list[int]]:
    """The command `argv` names and the positions of its keys, with Redis's errors."""
    spec = lookup(argv[0])
    if spec is not None and spec.subcommands and (len(argv) > 1 or spec.handler is None):
        spec = spec.subcommands.get(argv[1].lower()) if len(argv) > 1 else None
    if spec is None:
        raise CommandError("ERR Invalid command specified")
    if spec.keys[0] == 0:
        raise CommandError("ERR The command has no key arguments")
    if (spec.arity > 0 and spec.arity != len(argv)) or len(argv) < -spec.arity:
        raise CommandError("ERR Invalid number of arguments specified for command")
    positions = key_positions(spec, argv)
    if not positions:
        raise CommandError("ERR Invalid arguments specified for command")
    return spec, positions


def _key_flags(spec: CommandSpec) -> SetReply:
    """Redis's key-spec flags for a key of a plain read or write command."""
    if "write" in spec.flags:
        return SetReply([Status("RW"), Status("access"), Status("update")])
    return SetReply([Status("RO"), Status("access")])


@command("COMMAND|GETKEYS", arity=-4, flags=("loading", "stale"), group="server", summary="The keys of a full command", args="command [arg [arg ...]]", since="2.8.13")
def command_getkeys(ctx: CommandContext, argv: list[bytes]):
    command_argv = argv[2:]
    _, positions = _keys_of(command_argv)
    return [command_argv[i] for i in positions]


@command("COMMAND|GETKEYSANDFLAGS", arity=-4, flags=("loading", "stale"), group="server", summary="The keys of a full command and how it uses each", args="command [arg [arg ...]]", since="7.0.0")
def command_getkeysandflags(ctx: CommandContext, argv: list[bytes]):
    command_argv = argv[2:]
    spec, positions = _keys_of(command_argv)
    return [[command_argv[i], _key_flags(spec)] for i in positions]


@command("COMMAND|DOCS", arity=-2, flags=("loading", "stale"), group="server", summary="Documentary information about commands", args="[command-name [command-name ...]]", since="7.0.0")
def command_docs(ctx: CommandContext, argv: list[bytes]):
    specs = all_specs() if len(argv) == 2 else [s for name in argv[2:] if (s := lookup(name))]
    return {spec.fullname.encode(): _docs(spec) for spec in specs}
