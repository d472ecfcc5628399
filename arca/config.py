"""ARCA's options: one table (section, key, type, default, doc) and the frozen ArcaConfig.

Precedence is flag > environment > file > default (shared.config.resolve). The shipped
conf/arca.conf is `render_ini(OPTIONS, HEADER)`; a test keeps the two identical.
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

from arca.protocol import Limits
from shared.config import ConfigError, Option, resolve
from shared.logs import LEVELS

MIB = 1024 * 1024
DURABILITY = ("commit", "fsync", "everysec")
PASSWORD_ENV = "REAME_ARCA_PASSWORD"

HEADER = """\
ARCA, the reame archive daemon: `reame arca --config conf/arca.conf`.
Every key is listed with its default. Command-line flags override this file, and the
environment variable named under a key overrides it too. Sizes in MB are MiB."""

OPTIONS: tuple[Option, ...] = (
    Option("server", "host", str, "127.0.0.1",
           "Address to listen on. Anything but a loopback address needs requirepass (or protected-mode = false)."),
    Option("server", "port", int, 6420,
           "TCP port (0 picks a free port; the log says which; -1 = no plain TCP listener, e.g. TLS only)."),
    Option("server", "tls-port", int, 0, "TLS port, beside the plain one (0 = no TLS listener)."),
    Option("server", "tls-cert-file", str, "", "The server's certificate chain (PEM), for tls-port."),
    Option("server", "tls-key-file", str, "", "The private key of tls-cert-file (PEM)."),
    Option("server", "tls-ca-cert-file", str, "", "CA certificate(s) that client certificates must chain to (PEM)."),
    Option("server", "tls-auth-clients", str, "yes",
           "Client certificates: yes = required, optional = verified when presented, no = not asked.",
           choices=("yes", "no", "optional")),
    Option("server", "requirepass", str, None,
           "Password every client must send with AUTH (or HELLO ... AUTH) first; empty = no password.",
           env=PASSWORD_ENV),
    Option("server", "protected-mode", bool, True,
           "Without a password, serve only loopback clients (checked as clients connect, also "
           "after CONFIG SET requirepass \"\"), and refuse to start on a non-loopback address."),
    Option("server", "maxclients", int, 10000, "Most simultaneous client connections; more are refused."),
    Option("server", "log-level", str, "info", "Log verbosity.", choices=LEVELS),
    Option("server", "slowlog-log-slower-than", int, 10000,
           "SLOWLOG keeps commands that ran at least this many microseconds; 0 keeps all, -1 none."),
    Option("server", "slowlog-max-len", int, 128, "Most entries SLOWLOG keeps (the oldest go first)."),
    Option("storage", "dir", str, "~/.reame/arca", "Directory of the archive database (created if missing)."),
    Option("storage", "max-mb", int, 256,
           "L1 budget (exact answers) in MB, held in RAM and on disk; least recently used entries are evicted to fit."),
    Option("storage", "corpus-max-mb", int, 64, "L4 corpus budget in MB (4 bytes per token); oldest streams go first."),
    Option("storage", "kv-max-mb", int, 1024, "L3 prefix-KV block budget in MB, on disk."),
    Option("storage", "durability", str, "commit",
           "commit: an acknowledged write survives a process crash (kill -9); "
           "fsync: it also survives power loss (slower); "
           "everysec: acknowledged at once, committed once a second (a crash loses up to ~1 s).",
           choices=DURABILITY),
    Option("corpus", "ngram-min", int, 1, "Shortest suffix ARCA.DRAFT matches."),
    Option("corpus", "ngram-max", int, 8, "Longest suffix ARCA.DRAFT tries first."),
    Option("corpus", "draft-max-k", int, 256, "Largest k ARCA.DRAFT accepts."),
    Option("limits", "proto-max-bulk-len", int, 64 * MIB, "Largest single argument (bulk string) in bytes."),
    Option("limits", "max-multibulk-len", int, 1024 * 1024, "Most arguments in one command."),
    Option("limits", "max-inline-len", int, 64 * 1024, "Longest inline (telnet-style) command line in bytes."),
    Option("limits", "client-query-buffer-limit", int, 128 * MIB,
           "Most bytes of unfinished commands buffered per client; more closes that client."),
)


@dataclass(frozen=True, slots=True)
class ArcaConfig:
    host: str
    port: int
    tls_port: int
    tls_cert_file: str | None
    tls_key_file: str | None
    tls_ca_cert_file: str | None
    tls_auth_clients: str
    requirepass: str | None
    protected_mode: bool
    maxclients: int
    log_level: str
    slowlog_log_slower_than: int
    slowlog_max_len: int
    directory: Path
    max_mb: int
    corpus_max_mb: int
    kv_max_mb: int
    durability: str
    ngram_min: int
    ngram_max: int
    draft_max_k: int
    limits: Limits
    config_file: Path | None = None

    @property
    def binds_loopback_only(self) -> bool:
        return is_loopback(self.host)


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        address = ipaddress.ip_address(host.partition("%")[0])  # an IPv6 zone does not matter
    except ValueError:
        return False
    mapped = getattr(address, "ipv4_mapped", None)  # ::ffff:127.0.0.1 is 127.0.0.1
    return (mapped or address).is_loopback


def _positive(values: Mapping[str, Any], name: str) -> int:
    value = values[name]
    if value < 1:
        raise ConfigError(f"[{name.replace('.', '] ')}: must be at least 1, got {value}")
    return value


def _at_least(values: Mapping[str, Any], name: str, lowest: int) -> int:
    value = values[name]
    if value < lowest:
        raise ConfigError(f"[{name.replace('.', '] ')}: must be at least {lowest}, got {value}")
    return value


def load_config(
    flags: Mapping[str, Any] | None = None,
    file: Path | None = None,
    env: Mapping[str, str] | None = None,
) -> ArcaConfig:
    """Resolve every option (flags keyed 'section.key', None = not given) into an ArcaConfig."""
    values = resolve(OPTIONS, file=file, env=env, flags=flags)
    if not -1 <= values["server.port"] <= 65535:
        raise ConfigError(f"[server] port: must be within 0..65535 (or -1: none), got {values['server.port']}")
    if not 0 <= values["server.tls-port"] <= 65535:
        raise ConfigError(f"[server] tls-port: must be within 0..65535, got {values['server.tls-port']}")
    if values["server.port"] == -1 and not values["server.tls-port"]:
        raise ConfigError("[server] port: -1 (no plain listener) needs a tls-port")
    limits = Limits(
        max_bulk_len=_positive(values, "limits.proto-max-bulk-len"),
        max_multibulk_len=_positive(values, "limits.max-multibulk-len"),
        max_inline_len=_positive(values, "limits.max-inline-len"),
        max_query_buffer=_positive(values, "limits.client-query-buffer-limit"),
    )
    if limits.max_query_buffer < limits.max_bulk_len:
        raise ConfigError("[limits] client-query-buffer-limit: must be at least proto-max-bulk-len")
    return ArcaConfig(
        host=values["server.host"],
        port=values["server.port"],
        tls_port=values["server.tls-port"],
        tls_cert_file=values["server.tls-cert-file"] or None,
        tls_key_file=values["server.tls-key-file"] or None,
        tls_ca_cert_file=values["server.tls-ca-cert-file"] or None,
        tls_auth_clients=values["server.tls-auth-clients"],
        requirepass=values["server.requirepass"] or None,
        protected_mode=values["server.protected-mode"],
        maxclients=_positive(values, "server.maxclients"),
        log_level=values["server.log-level"],
        slowlog_log_slower_than=_at_least(values, "server.slowlog-log-slower-than", -1),
        slowlog_max_len=_at_least(values, "server.slowlog-max-len", 0),
        directory=Path(values["storage.dir"]).expanduser(),
        max_mb=_positive(values, "storage.max-mb"),
        corpus_max_mb=_positive(values, "storage.corpus-max-mb"),
        kv_max_mb=_positive(values, "storage.kv-max-mb"),
        durability=values["storage.durability"],
        ngram_min=_positive(values, "corpus.ngram-min"),
        ngram_max=_positive(values, "corpus.ngram-max"),
        draft_max_k=_positive(values, "corpus.draft-max-k"),
        limits=limits,
        config_file=file,
    )
