"""L4 corpus commands: ARCA.OBSERVE, ARCA.DRAFT, ARCA.SINCE.

Tokens travel as little-endian u32 packed in one bulk string. `NS ns` selects a namespace
(nodes pass their model fingerprint); without it the namespace is `default`, so the C++
original's two forms (`ARCA.OBSERVE <tokens>`, `ARCA.DRAFT <tail> <k>`) keep working.
"""

from __future__ import annotations

from arca.commands.args import SYNTAX, parse_int
from arca.commands.registry import CommandContext, CommandError, command
from shared.tokens import TokenPackingError, pack_tokens, unpack_tokens

DEFAULT_NAMESPACE = b"default"
SINCE_DEFAULT_COUNT = 100
SINCE_MAX_COUNT = 10_000


def split_namespace(argv: list[bytes], counts: tuple[int, ...]) -> tuple[bytes, list[bytes]]:
    """(namespace, the arguments after the name and the optional `NS ns`); their number must
    be one of `counts`."""
    if len(argv) - 3 in counts and argv[1].upper() == b"NS":
        return argv[2], argv[3:]
    if len(argv) - 1 in counts:
        return DEFAULT_NAMESPACE, argv[1:]
    raise CommandError(SYNTAX)


def unpack(payload: bytes, what: str):
    try:
        return unpack_tokens(payload)
    except TokenPackingError:
        raise CommandError(f"ERR {what} length {len(payload)} is not a multiple of 4 "
                           f"(tokens are packed little-endian u32)") from None


@command("ARCA.OBSERVE", arity=-2, flags=("write", "denyoom"), group="arca",
         summary="Store one finished generation in the corpus; returns its stream id",
         args="[NS ns] tokens")
def arca_observe(ctx: CommandContext, argv: list[bytes]):
    namespace, (payload,) = split_namespace(argv, (1,))
    unpack(payload, "token payload")
    if not payload:
        raise CommandError("ERR empty token stream")
    return ctx.archive.observe(namespace, payload)


@command("ARCA.DRAFT", arity=-3, flags=("readonly", "fast"), group="arca",
         summary="Draft up to k tokens that followed the longest matching suffix of tail",
         args="[NS ns] tail k")
def arca_draft(ctx: CommandContext, argv: list[bytes]):
    namespace, rest = split_namespace(argv, (2,))
    tail = unpack(rest[0], "tail")
    cap = ctx.archive.config.draft_max_k
    k = parse_int(rest[1], "ERR k must be a positive integer")
    if k < 1:
        raise CommandError("ERR k must be a positive integer")
    if k > cap:
        raise CommandError(f"ERR k must be at most {cap}")
    found = ctx.archive.draft(namespace, tail, k)
    return None if not found else pack_tokens(found)


@command("ARCA.SINCE", arity=-2, flags=("readonly",), group="arca",
         summary="Streams observed after a cursor: [stream id, packed tokens] pairs, oldest first",
         args="[NS ns] cursor [COUNT n]")
def arca_since(ctx: CommandContext, argv: list[bytes]):
    namespace, rest = split_namespace(argv, (1, 3))
    if len(rest) == 3 and rest[1].upper() != b"COUNT":
        raise CommandError(SYNTAX)
    cursor = parse_int(rest[0], "ERR invalid cursor")
    if cursor < 0:
        raise CommandError("ERR invalid cursor")
    count = SINCE_DEFAULT_COUNT
    if len(rest) == 3:
        count = parse_int(rest[2])
        if not 1 <= count <= SINCE_MAX_COUNT:
            raise CommandError(f"ERR COUNT must be within 1..{SINCE_MAX_COUNT}")
    return [[stream_id, packed] for stream_id, packed in ctx.archive.since(namespace, cursor, count)]
