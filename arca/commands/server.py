"""Server commands: DBSIZE FLUSHDB FLUSHALL INFO CONFIG GET/SET/RESETSTAT TIME SAVE SHUTDOWN.

INFO combines the server's own counters (server, clients, stats) with the archive's
`info()` (memory, persistence, keyspace, arca). CONFIG exposes the keys stock tools ask for
(redis-benchmark reads `save` and `appendonly`); the password can be set, never read.
"""

from __future__ import annotations

import os
import platform
import resource
import ssl
import time

from arca import __version__
from arca.commands.args import INT_MAX, SYNTAX, parse_int
from arca.commands.connection import REDIS_COMPAT_VERSION
from arca.commands.glob import compile_glob
from arca.commands.registry import CommandContext, CommandError, ServerState, command
from arca.protocol import NO_REPLY, OK

_APPENDFSYNC = {"fsync": "always", "everysec": "everysec", "commit": "no"}
_TITLES = {"cpu": "CPU"}  # section headers that are not the capitalized name


@command("DBSIZE", arity=1, flags=("readonly", "fast"), group="server", summary="Number of keys")
def dbsize(ctx: CommandContext, argv: list[bytes]):
    return ctx.archive.dbsize()


def _flush(ctx: CommandContext, argv: list[bytes]):
    if len(argv) > 2 or (len(argv) == 2 and argv[1].upper() not in (b"ASYNC", b"SYNC")):
        raise CommandError(SYNTAX)
    ctx.archive.flush()
    return OK


@command("FLUSHDB", arity=-1, flags=("write",), group="server", summary="Remove every key", args="[ASYNC | SYNC]")
def flushdb(ctx: CommandContext, argv: list[bytes]):
    return _flush(ctx, argv)


@command("FLUSHALL", arity=-1, flags=("write",), group="server", summary="Remove every key", args="[ASYNC | SYNC]")
def flushall(ctx: CommandContext, argv: list[bytes]):
    return _flush(ctx, argv)


@command("TIME", arity=1, flags=("fast",), group="server", summary="The server time", since="2.6.0")
def time_(ctx: CommandContext, argv: list[bytes]):
    now = time.time_ns() // 1000
    return [b"%d" % (now // 1_000_000), b"%d" % (now % 1_000_000)]


def _rss_bytes() -> int:
    try:
        with open("/proc/self/statm", encoding="ascii") as handle:
            return int(handle.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        import resource

        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def _cpu() -> dict[str, str]:
    """INFO cpu: seconds of CPU used by the process, its waited-for children and this thread."""
    fields = {}
    for suffix, who in (("", resource.RUSAGE_SELF), ("_children", resource.RUSAGE_CHILDREN),
                        ("_main_thread", getattr(resource, "RUSAGE_THREAD", resource.RUSAGE_SELF))):
        usage = resource.getrusage(who)
        fields[f"used_cpu_sys{suffix}"] = f"{usage.ru_stime:.6f}"
        fields[f"used_cpu_user{suffix}"] = f"{usage.ru_utime:.6f}"
    return fields


def _info_sections(ctx: CommandContext) -> dict[str, dict]:
    server, stats = ctx.server, ctx.server.stats
    options = server.options
    archive = ctx.archive.info()
    keyspace = dict(archive.get("keyspace", {}))
    if "keys" in keyspace:
        keys = keyspace.pop("keys")
        expires = keyspace.pop("expires", 0)
        if keys:
            keyspace = {"db0": f"keys={keys},expires={expires},avg_ttl=0", **keyspace}
    return {
        "server": {
            "redis_version": REDIS_COMPAT_VERSION,
            "arca_version": __version__,
            "redis_mode": "standalone",
            "os": f"{platform.system()} {platform.release()} {platform.machine()}",
            "arch_bits": 64 if platform.architecture()[0] == "64bit" else 32,
            "python_version": platform.python_version(),
            "process_id": os.getpid(),
            "tcp_port": max(0, server.tcp_port or options.port),
            "uptime_in_seconds": server.uptime_seconds,
            "uptime_in_days": server.uptime_seconds // 86400,
            "config_file": options.config_file,
        },
        "clients": {
            "connected_clients": len(server.clients),
            "maxclients": server.maxclients,
            "blocked_clients": 0,
        },
        "memory": {
            # Tools such as `redis-cli --stat` read used_memory: the L1 bytes under the budget.
            "used_memory": archive.get("memory", {}).get("l1_used_bytes", 0),
            "used_memory_rss": _rss_bytes(),
            "maxmemory": options.max_bytes,
            "maxmemory_policy": "allkeys-lru",
            "mem_allocator": "libc",
            **archive.get("memory", {}),
        },
        "persistence": {"durability": options.durability, **archive.get("persistence", {})},
        "stats": {
            "total_connections_received": stats.connections_received,
            "total_commands_processed": stats.commands_processed,
            "instantaneous_ops_per_sec": stats.ops_per_sec,
            "rejected_connections": stats.rejected_connections,
            "acl_access_denied_auth": stats.auth_failures.total,
            "tls_handshake_failures": stats.tls_failures.total,
            "tls_client_cert_rejected": stats.tls_cert_rejected,
            "total_protocol_errors": stats.protocol_errors,
            "keyspace_hits": archive.get("arca", {}).get("keyspace_hits", 0),
            "keyspace_misses": archive.get("arca", {}).get("keyspace_misses", 0),
            "total_commits": stats.commits,
            "commit_seconds_total": round(stats.commit_seconds, 6),
        },
        "replication": {
            # No replicas and no replication backlog: a master on its own.
            "role": "master",
            "connected_slaves": 0,
            "master_failover_state": "no-failover",
            "master_replid": server.replid,
            "master_replid2": "0" * 40,
            "master_repl_offset": 0,
            "second_repl_offset": -1,
            "repl_backlog_active": 0,
            "repl_backlog_size": 0,
            "repl_backlog_first_byte_offset": 0,
            "repl_backlog_histlen": 0,
        },
        "cpu": _cpu(),
        "commandstats": _commandstats(ctx),
        "errorstats": {f"errorstat_{prefix}": f"count={count}" for prefix, count in stats.errors.items()},
        "cluster": {"cluster_enabled": 0},
        "keyspace": keyspace,
        "arca": archive.get("arca", {}),
    }


# The commands the L1 table answers itself (its plain_calls order): counted, not timed.
_PLAIN_COMMANDS = ("get", "set", "ping", "mget", "mset", "incr", "decr", "incrby", "decrby")
_NOT_DEFAULT = frozenset({"commandstats"})  # left out of INFO and INFO default, as in Redis


def _commandstats(ctx: CommandContext) -> dict[str, str]:
    stats = ctx.server.stats
    counters = {name: list(values) for name, values in stats.commands.items()}
    plain = ctx.archive.plain_calls()
    base = stats.plain_base or (0,) * len(plain)
    for name, calls, before in zip(_PLAIN_COMMANDS, plain, base):
        counters.setdefault(name, [0, 0, 0, 0])[0] += calls - before
    fields = {}
    for name, (calls, nanoseconds, rejected, failed) in counters.items():
        if calls or rejected:
            usec = nanoseconds // 1000
            per_call = usec / calls if calls else 0.0
            fields[f"cmdstat_{name}"] = (f"calls={calls},usec={usec},usec_per_call={per_call:.2f},"
                                         f"rejected_calls={rejected},failed_calls={failed}")
    return fields


@command("INFO", arity=-1, flags=("loading", "stale"), group="server", summary="Information and statistics about the server", args="[section [section ...]]")
def info(ctx: CommandContext, argv: list[bytes]):
    sections = _info_sections(ctx)
    wanted: set[str] = set()
    for arg in argv[1:] or [b"default"]:
        name = arg.decode("utf-8", "replace").lower()
        if name in ("all", "everything"):
            wanted.update(sections)
        elif name == "default":
            wanted.update(set(sections) - _NOT_DEFAULT)
        else:
            wanted.add(name)  # an unknown section adds nothing
    blocks = []
    for name, fields in sections.items():
        if name in wanted:
            lines = [f"# {_TITLES.get(name, name.capitalize())}"]
            lines += [f"{key}:{value}" for key, value in fields.items()]
            blocks.append("\r\n".join(lines) + "\r\n")
    return "\r\n".join(blocks).encode()


def _config_view(server: ServerState, budget: int) -> dict[str, str]:
    options = server.options
    limits = options.limits
    view = {
        "bind": options.host,
        "port": str(max(0, server.tcp_port or options.port)),  # Redis: 0 = no plain listener
        "tls-port": str(server.tls_port or options.tls_port),
        "tls-auth-clients": ("no" if options.tls_context is None or
                             options.tls_context.verify_mode == ssl.CERT_NONE else
                             "yes" if options.tls_require_client_cert else "optional"),
        "dir": options.directory,
        "save": "",
        "appendonly": "yes",  # every write goes to the archive on disk
        "appendfsync": _APPENDFSYNC.get(options.durability, "no"),
        "maxmemory": str(budget),
        "maxmemory-policy": "allkeys-lru",
        "maxclients": str(server.maxclients),
        "databases": "1",
        "protected-mode": "yes" if options.protected_mode else "no",
        "timeout": "0",
        "cluster-enabled": "no",
        "slowlog-log-slower-than": str(server.slowlog.log_slower_than_us),
        "slowlog-max-len": str(server.slowlog.max_len),
    }
    view["proto-max-bulk-len"] = str(limits.max_bulk_len)
    view["client-query-buffer-limit"] = str(limits.max_query_buffer)
    return view


@command("CONFIG|GET", arity=-3, flags=("admin", "noscript", "loading", "stale"), group="server", summary="Read configuration parameters", args="parameter [parameter ...]", since="2.0.0")
def config_get(ctx: CommandContext, argv: list[bytes]):
    view = _config_view(ctx.server, ctx.archive.max_bytes)
    found: dict[bytes, bytes] = {}
    for pattern in argv[2:]:
        matches = compile_glob(pattern.lower())
        for key, value in view.items():
            if matches(key.encode()):
                found[key.encode()] = value.encode()
    return found


def _set_failed(name: str, why: str) -> CommandError:
    return CommandError(f"ERR CONFIG SET failed (possibly related to argument '{name}') - {why}")


MAXCLIENTS_RANGE = (1, 2**32 - 1)  # Redis's: an unsigned int


def _integer_setting(name: str, text: bytes, low: int, high: int = INT_MAX) -> int:
    """A CONFIG SET integer: strictly written, within low..high, with Redis's errors."""
    try:
        value = parse_int(text)
    except CommandError:
        raise _set_failed(name, "argument couldn't be parsed into an integer") from None
    if not low <= value <= high:
        raise _set_failed(name, f"argument must be between {low} and {high} inclusive")
    return value


def _maxclients(text: bytes) -> int:
    return _integer_setting("maxclients", text, *MAXCLIENTS_RANGE)


@command("CONFIG|SET", arity=-4, flags=("admin", "loading", "stale"), group="server", summary="Set configuration parameters (requirepass, maxclients, maxmemory, slowlog-log-slower-than, slowlog-max-len)", args="parameter value [parameter value ...]", since="2.0.0")
def config_set(ctx: CommandContext, argv: list[bytes]):
    if len(argv) % 2:
        raise CommandError("ERR wrong number of arguments for 'config|set' command")
    view = _config_view(ctx.server, ctx.archive.max_bytes)
    changes: dict[str, bytes] = {}
    for i in range(2, len(argv), 2):
        name = argv[i].decode("utf-8", "replace").lower()
        if name not in view and name != "requirepass":
            raise CommandError(f"ERR Unknown option or number of arguments for CONFIG SET - '{name}'")
        if name not in _SETTABLE:
            raise _set_failed(name, "can't set immutable config")
        changes[name] = argv[i + 1]
    slowlog = ctx.server.slowlog
    slowlog_changes = {name: _slowlog_setting(name, changes.pop(name)) for name in _SLOWLOG_SETTINGS
                       if name in changes}
    budget = _memory_setting("maxmemory", changes["maxmemory"]) if "maxmemory" in changes else None
    if "maxclients" in changes:
        ctx.server.maxclients = _maxclients(changes["maxclients"])
    if budget is not None:
        ctx.archive.max_bytes = budget or ctx.server.options.max_bytes  # 0: the configured budget
    if "requirepass" in changes:
        password = changes["requirepass"].decode("utf-8", "surrogateescape")
        ctx.server.requirepass = password or None
    if "slowlog-log-slower-than" in slowlog_changes:
        slowlog.log_slower_than_us = slowlog_changes["slowlog-log-slower-than"]
    if "slowlog-max-len" in slowlog_changes:
        slowlog.max_len = slowlog_changes["slowlog-max-len"]
        slowlog.trim()
    return OK


_SLOWLOG_SETTINGS = {"slowlog-log-slower-than": -1, "slowlog-max-len": 0}  # name: lowest value
_SETTABLE = frozenset({"requirepass", "maxclients", "maxmemory", *_SLOWLOG_SETTINGS})
_MEMORY_UNITS = {b"": 1, b"b": 1, b"k": 1000, b"kb": 1024, b"m": 1000**2, b"mb": 1024**2,
                 b"g": 1000**3, b"gb": 1024**3}


def _memory_setting(name: str, text: bytes) -> int:
    """A CONFIG SET memory amount as Redis reads one: bytes, or a number with k/kb/m/mb/g/gb."""
    digits = text.rstrip(b"bkmgBKMG")
    unit = _MEMORY_UNITS.get(text[len(digits):].lower())
    if unit is None or not digits.isdigit() or not 0 <= int(digits) * unit <= 2**63 - 1:
        raise _set_failed(name, "argument must be a memory value")
    return int(digits) * unit


def _slowlog_setting(name: str, text: bytes) -> int:
    return _integer_setting(name, text, _SLOWLOG_SETTINGS[name])


@command("SHUTDOWN", arity=-1, flags=("admin", "noscript", "loading", "stale", "no_multi"), group="server", summary="Commit everything and stop the server", args="[NOSAVE | SAVE] [NOW] [FORCE]")
def shutdown(ctx: CommandContext, argv: list[bytes]):
    for arg in argv[1:]:
        if arg.upper() not in (b"NOSAVE", b"SAVE", b"NOW", b"FORCE"):
            raise CommandError(SYNTAX)
    if ctx.server.request_shutdown is None:
        raise CommandError("ERR SHUTDOWN is not available in this process")
    ctx.server.request_shutdown()
    ctx.client.close_after_reply = True
    return NO_REPLY  # like Redis: the client sees the connection close, not a reply


@command("SAVE", arity=1, flags=("admin", "noscript", "no_multi"), group="server", summary="Commit every pending write now (writes are committed continuously anyway)")
def save(ctx: CommandContext, argv: list[bytes]):
    ctx.archive.commit()
    return OK


@command("CONFIG|RESETSTAT", arity=2, flags=("admin", "loading", "stale"), group="server", summary="Reset the counters INFO reports", since="2.0.0")
def config_resetstat(ctx: CommandContext, argv: list[bytes]):
    ctx.server.stats.reset()
    ctx.server.stats.plain_base = ctx.archive.plain_calls()
    ctx.archive.reset_stats()
    return OK
