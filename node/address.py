"""Where the remote archive is: `[arca] remote` parsed into an `ArchiveAddress`.

Below both its readers: the settings check the value when they load (node/config.py) and
the archive client connects to it (node/archive/).

Accepted forms:

    host:port                          plain RESP (the original form)
    arca://host:port  redis://host:port
    rediss://host:port                 TLS
    redis://user:password@host:port    credentials (user alone: `redis://:password@...`)
    redis+cluster://host:port,host:port,...    a Redis / Valkey Cluster (seed nodes)
    rediss+cluster://host:port,...             the same over TLS

The scheme says how to connect, not what answers: whether the server is an ARCA or a plain
Redis/Valkey is learnt at connect (node/archive/remote.py). A cluster is always treated as
Redis. Percent-escapes in the user and password are decoded (`%40` for `@`).
"""

from __future__ import annotations

from dataclasses import dataclass
from urllib.parse import unquote

DEFAULT_PORT = 6420  # ARCA's port; a Redis URL without a port means Redis's 6379
REDIS_PORT = 6379
SCHEMES = {
    "arca": (False, False), "redis": (False, False), "rediss": (True, False),
    "redis+cluster": (False, True), "rediss+cluster": (True, True),
}


class AddressError(ValueError):
    """`[arca] remote` is not a form this node understands; the message says which are."""


@dataclass(frozen=True, slots=True)
class ArchiveAddress:
    hosts: tuple[tuple[str, int], ...]
    tls: bool = False
    cluster: bool = False
    username: str | None = None
    password: str | None = None

    @property
    def host(self) -> str:
        return self.hosts[0][0]

    @property
    def port(self) -> int:
        return self.hosts[0][1]

    def display(self) -> str:
        """The address without credentials (for logs and /health)."""
        scheme = ("rediss" if self.tls else "redis") + ("+cluster" if self.cluster else "")
        hosts = ",".join(f"[{h}]:{p}" if ":" in h else f"{h}:{p}" for h, p in self.hosts)
        return f"{scheme}://{hosts}"


def _host_port(text: str, default_port: int) -> tuple[str, int]:
    text = text.strip()
    if text.startswith("["):  # [::1]:6379
        host, _, rest = text[1:].partition("]")
        port_text = rest[1:] if rest.startswith(":") else ""
    elif text.count(":") == 1:
        host, _, port_text = text.partition(":")
    else:
        host, port_text = text, ""
    if not host:
        raise AddressError(f"missing host in {text!r}")
    if not port_text:
        return host, default_port
    if not (port_text.isascii() and port_text.isdigit()) or not 0 < int(port_text) < 65536:
        raise AddressError(f"bad port in {text!r}")
    return host, int(port_text)


def parse_address(text: str) -> ArchiveAddress:
    """`[arca] remote` as an ArchiveAddress; AddressError names what is wrong."""
    text = text.strip()
    if "://" not in text:  # the original host:port form
        host, sep, port = text.rpartition(":")
        if not sep or not host or not (port.isascii() and port.isdigit()) or not 0 < int(port) < 65536:
            raise AddressError(f"expected host:port or a URL such as redis://host:port, got {text!r}")
        return ArchiveAddress(((host.strip("[]"), int(port)),))
    scheme, _, rest = text.partition("://")
    scheme = scheme.lower()
    if scheme not in SCHEMES:
        raise AddressError(f"unknown scheme {scheme!r} in {text!r}: expected one of "
                           + ", ".join(f"{s}://" for s in SCHEMES))
    tls, cluster = SCHEMES[scheme]
    rest = rest.split("/", 1)[0].split("?", 1)[0]  # a /db path or ?options are not used
    userinfo, at, hostlist = rest.rpartition("@")
    username = password = None
    if at:
        user, colon, secret = userinfo.partition(":")
        username = unquote(user) or None
        password = unquote(secret) if colon else None
        if not colon:  # redis://password@host is not a form redis-py reads either
            raise AddressError(f"credentials in {scheme}:// must be user:password@ or :password@")
    default_port = DEFAULT_PORT if scheme == "arca" else REDIS_PORT
    parts = [part for part in hostlist.split(",") if part.strip()]
    if not parts:
        raise AddressError(f"missing host in {text!r}")
    hosts = tuple(_host_port(part, default_port) for part in parts)
    if len(hosts) > 1 and not cluster:
        raise AddressError(f"several hosts need a cluster URL ({'rediss' if tls else 'redis'}+cluster://...)")
    return ArchiveAddress(hosts, tls, cluster, username, password)
