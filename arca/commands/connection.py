"""Connection commands: PING ECHO QUIT SELECT AUTH HELLO RESET and the CLIENT family."""

from __future__ import annotations

import logging
import time

from arca import __version__
from arca.commands.args import NOT_INTEGER, SYNTAX, has_spaces_or_specials, parse_int
from arca.commands.registry import CommandContext, CommandError, Status, command
from arca.commands.transactions import release_watch
from arca.protocol import OK

REDIS_COMPAT_VERSION = "7.0.0"  # the Redis release whose commands and replies ARCA follows
PONG = Status("PONG")
WRONGPASS = "WRONGPASS invalid username-password pair or user is disabled."
BAD_NAME = "ERR Client names cannot contain spaces, newlines or special characters."
log = logging.getLogger(__name__)


@command("PING", arity=-1, flags=("fast",), group="connection", summary="Ping the server", args="[message]")
def ping(ctx: CommandContext, argv: list[bytes]):
    if len(argv) > 2:
        raise CommandError("ERR wrong number of arguments for 'ping' command")
    return PONG if len(argv) == 1 else argv[1]


@command("ECHO", arity=2, flags=("fast",), group="connection", summary="Echo the given string", args="message")
def echo(ctx: CommandContext, argv: list[bytes]):
    return argv[1]


@command("QUIT", arity=-1, flags=("fast", "no_auth"), group="connection", summary="Close the connection")
def quit_(ctx: CommandContext, argv: list[bytes]):
    ctx.client.close_after_reply = True
    return OK


@command("SELECT", arity=2, flags=("fast",), group="connection", summary="Change the selected database (only 0)", args="index")
def select(ctx: CommandContext, argv: list[bytes]):
    if parse_int(argv[1]) != 0:
        raise CommandError("ERR DB index is out of range")
    return OK


def _check_password(ctx: CommandContext, user: bytes, password: bytes) -> None:
    if user != b"default" or not ctx.server.password_matches(password):
        _count_failure(ctx)
        raise CommandError(WRONGPASS)
    ctx.client.authenticated = True


def _count_failure(ctx: CommandContext) -> None:
    """Count a failed AUTH (INFO stats acl_access_denied_auth) and say so in the log, at most one
    line every REFUSALS_LOG_EVERY_S seconds (a password-guessing client cannot flood the log)."""
    failures = ctx.server.stats.auth_failures
    unlogged = failures.count(time.monotonic())
    if unlogged:
        log.warning("AUTH failed from %s (%d failure(s) since the last such line, %d since start)",
                    ctx.client.addr or "?", unlogged, failures.total)


@command("AUTH", arity=-2, flags=("fast", "no_auth"), group="connection", summary="Authenticate to the server", args="[username] password")
def auth(ctx: CommandContext, argv: list[bytes]):
    if len(argv) > 3:
        raise CommandError(SYNTAX)
    if len(argv) == 2 and ctx.server.requirepass is None:
        raise CommandError(
            "ERR AUTH <password> called without any password configured for the default user. "
            "Are you sure your configuration is correct?"
        )
    user = argv[1] if len(argv) == 3 else b"default"
    _check_password(ctx, user, argv[-1])
    return OK


def hello_map(ctx: CommandContext) -> dict:
    return {
        b"server": b"redis",
        b"version": REDIS_COMPAT_VERSION.encode(),
        b"proto": ctx.client.resp,
        b"id": ctx.client.id,
        b"mode": b"standalone",
        b"role": b"master",
        b"modules": [],
        b"arca_version": __version__.encode(),
    }


@command("HELLO", arity=-1, flags=("fast", "no_auth"), group="connection", summary="Handshake: protocol version, auth, name", args="[protover [AUTH username password] [SETNAME clientname]]", since="6.0.0")
def hello(ctx: CommandContext, argv: list[bytes]):
    resp = ctx.client.resp
    if len(argv) >= 2:
        resp = parse_int(argv[1], "ERR Protocol version is not an integer or out of range")
        if resp not in (2, 3):
            raise CommandError("NOPROTO unsupported protocol version")
    credentials, name, i = None, None, 2
    while i < len(argv):
        option, more = argv[i].upper(), len(argv) - i - 1
        if option == b"AUTH" and more >= 2:
            credentials, i = (argv[i + 1], argv[i + 2]), i + 3
        elif option == b"SETNAME" and more >= 1:
            name, i = argv[i + 1], i + 2
        else:
            raise CommandError(f"ERR Syntax error in HELLO option '{argv[i].decode('utf-8', 'replace')}'")
    if credentials is not None:
        _check_password(ctx, *credentials)
    if not ctx.client.authenticated:
        raise CommandError(
            "NOAUTH HELLO must be called with the client already authenticated, otherwise the "
            "HELLO <proto> AUTH <user> <pass> option can be used to authenticate the client and "
            "select the RESP protocol version at the same time"
        )
    if name is not None:
        _set_name(ctx, name)
    ctx.client.resp = resp
    return hello_map(ctx)


@command("RESET", arity=1, flags=("fast", "no_auth"), group="connection", summary="Reset the connection", since="6.2.0")
def reset(ctx: CommandContext, argv: list[bytes]):
    ctx.client.end_transaction()
    release_watch(ctx)
    ctx.client.resp = 2
    ctx.client.name = b""
    ctx.client.authenticated = ctx.server.requirepass is None
    return Status("RESET")


def _set_name(ctx: CommandContext, name: bytes) -> None:
    if has_spaces_or_specials(name):
        raise CommandError(BAD_NAME)
    ctx.client.name = name


@command("CLIENT|SETNAME", arity=3, flags=("noscript", "loading", "stale"), group="connection", summary="Set the connection name", args="connection-name", since="2.6.9")
def client_setname(ctx: CommandContext, argv: list[bytes]):
    _set_name(ctx, argv[2])
    return OK


@command("CLIENT|GETNAME", arity=2, flags=("noscript", "loading", "stale"), group="connection", summary="Get the connection name", since="2.6.9")
def client_getname(ctx: CommandContext, argv: list[bytes]):
    return ctx.client.name or None


@command("CLIENT|ID", arity=2, flags=("noscript", "loading", "stale"), group="connection", summary="Return the connection id", since="5.0.0")
def client_id(ctx: CommandContext, argv: list[bytes]):
    return ctx.client.id


@command("CLIENT|SETINFO", arity=4, flags=("noscript", "loading", "stale"), group="connection", summary="Set client library name or version", args="LIB-NAME libname | LIB-VER libver", since="7.2.0")
def client_setinfo(ctx: CommandContext, argv: list[bytes]):
    attribute, value = argv[2].upper(), argv[3]
    if attribute not in (b"LIB-NAME", b"LIB-VER"):
        raise CommandError(f"ERR Unrecognized option '{argv[2].decode('utf-8', 'replace')}'")
    if has_spaces_or_specials(value):
        raise CommandError(f"ERR {attribute.decode().lower()} cannot contain spaces, newlines or special characters.")
    if attribute == b"LIB-NAME":
        ctx.client.lib_name = value
    else:
        ctx.client.lib_ver = value
    return OK


@command("CLIENT|INFO", arity=2, flags=("noscript", "loading", "stale"), group="connection", summary="This connection's information", since="6.2.0")
def client_info(ctx: CommandContext, argv: list[bytes]):
    return (ctx.client.info_line() + "\n").encode()


@command("CLIENT|LIST", arity=-2, flags=("admin", "noscript", "loading", "stale"), group="connection", summary="List client connections", args="[TYPE NORMAL] [ID id [id ...]]", since="2.4.0")
def client_list(ctx: CommandContext, argv: list[bytes]):
    clients = list(ctx.server.clients.values())
    i = 2
    while i < len(argv):
        option = argv[i].upper()
        if option == b"TYPE" and i + 1 < len(argv):
            kind = argv[i + 1].lower()
            if kind not in (b"normal", b"master", b"replica", b"slave", b"pubsub"):
                raise CommandError(f"ERR Unknown client type '{argv[i + 1].decode('utf-8', 'replace')}'")
            if kind != b"normal":
                clients = []
            i += 2
        elif option == b"ID" and i + 1 < len(argv):
            wanted = {parse_int(arg, "ERR Invalid client ID") for arg in argv[i + 1 :]}
            clients = [c for c in clients if c.id in wanted]
            i = len(argv)
        else:
            raise CommandError(SYNTAX)
    return "".join(c.info_line() + "\n" for c in sorted(clients, key=lambda c: c.id)).encode()


__all__ = ["NOT_INTEGER", "REDIS_COMPAT_VERSION", "hello_map"]
