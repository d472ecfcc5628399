"""The remote archive's connections: one server, or a Redis / Valkey Cluster, each behind breakers.

`SingleServer` is one RESP server (ARCA, Redis or Valkey), plain or TLS, through a bounded
pool of redis.asyncio connections with short timeouts and one circuit breaker
(node/archive/breaker.py). `ClusterServers` is redis-py's RedisCluster (it follows MOVED and
ASK, and reloads the slot map after a connection failure) with one breaker per master: a
failed master opens only the breaker of the slots it served, so keys on the other masters
keep their speed-up. Its watcher probes the master and reloads the slot map; once a replica
has taken the slots over (failover), the old master's breaker retires and the keys go to the
new master.

Both answer `breaker_for(key)` (the breaker guarding the server that holds `key`),
`execute(*command)`, `each(commands)` (one pipeline, one round trip per server) and `state()`;
neither knows the archive's tiers. `each(..., bulk=True)` is for L3's megabyte transfers: on a
single server they run on a small pool of their own whose per-reply socket timeout is
`BULK_TIMEOUT_FACTOR` times the archive timeout, since a 1 MB part whose write waits for the
server's group commit is not a dead server, and the short answer-path timeout had such writes
fail (and open the breaker) whenever the host was busy.
"""

from __future__ import annotations

import asyncio
import logging
import ssl
from dataclasses import dataclass
from typing import Any, Awaitable, Callable, Sequence

from node.address import ArchiveAddress
from node.archive.breaker import Breaker
from node.archive.errors import ArchiveUnavailable

log = logging.getLogger(__name__)
BULK_TIMEOUT_FACTOR = 10
BULK_CONNECTIONS = 4


@dataclass(frozen=True, slots=True)
class TlsFiles:
    """Files for a TLS connection: the CA that signed the server's certificate (empty: the
    system's trust store), and this node's own certificate and key when the server asks for one."""

    ca_cert_file: str | None = None
    cert_file: str | None = None
    key_file: str | None = None


def connection_kwargs(address: ArchiveAddress, tls: TlsFiles, timeout: float) -> dict[str, Any]:
    kwargs: dict[str, Any] = {
        "username": address.username, "password": address.password, "socket_timeout": timeout,
        "socket_connect_timeout": timeout, "protocol": 2, "client_name": "reame-node",
    }
    if address.tls:
        kwargs.update(ssl_ca_certs=tls.ca_cert_file, ssl_certfile=tls.cert_file, ssl_keyfile=tls.key_file,
                      ssl_cert_reqs="required", ssl_check_hostname=True)
    return kwargs


# The TLS alerts (as OpenSSL names them) a server sends about the client's certificate.
_CLIENT_CERT_ALERTS = ("ALERT_UNKNOWN_CA", "ALERT_BAD_CERTIFICATE", "ALERT_CERTIFICATE_UNKNOWN",
                       "ALERT_CERTIFICATE_REQUIRED", "ALERT_UNSUPPORTED_CERTIFICATE", "ALERT_CERTIFICATE_EXPIRED")


def describe_failure(exc: BaseException) -> str:
    """What went wrong, in words that say what to fix."""
    import redis.exceptions as errors

    text = str(exc) or type(exc).__name__
    cause = exc.__cause__ or exc.__context__
    if isinstance(exc, errors.AuthenticationError) or "WRONGPASS" in text or "NOAUTH" in text:
        return f"credentials refused ({text}); check [arca] password or the URL's user:password@"
    if isinstance(exc, ssl.SSLError) or isinstance(cause, ssl.SSLError) or "SSL" in text or "certificate" in text:
        if "DENIED" in text:  # an ARCA asking for this node's certificate
            return f"TLS client certificate refused ({text}); set [arca] tls_cert_file and tls_key_file"
        if any(alert in text for alert in _CLIENT_CERT_ALERTS):  # the server's alert about this node's certificate
            return (f"TLS client certificate refused by the server ({text}); [arca] tls_cert_file must be "
                    "signed by the CA the server trusts (its tls-ca-cert-file)")
        return f"TLS handshake failed ({text}); check the certificates ([arca] tls_* keys)"
    return text


def transport_errors() -> tuple[type[BaseException], ...]:
    """The failures that mean "could not ask the server" (as opposed to an error reply)."""
    import redis.exceptions as errors

    return (errors.ConnectionError, errors.TimeoutError, errors.ClusterError, errors.RedisClusterException, OSError,
            asyncio.TimeoutError)


class Servers:
    """What both kinds share: probing a breaker's server while it is away."""

    name: str
    breaker: Breaker
    timeout: float
    on_contact: Callable[[], Awaitable[None]] | None = None  # after each successful probe
    _reported: str | None = None

    def report(self, reason: str) -> None:
        """Credentials and certificates are configuration mistakes: say so once, as an error."""
        if ("credentials" in reason or "TLS" in reason) and reason != self._reported:
            self._reported = reason
            log.error("archive %s: %s", self.name, reason)

    async def _contact(self, ping: Callable[[], Awaitable[Any]]) -> None:
        await ping()
        if self.on_contact is not None:
            await self.on_contact()

    async def _probe(self, breaker: Breaker, ping: Callable[[], Awaitable[Any]]) -> bool:
        import redis.exceptions as errors

        failures: tuple[type[BaseException], ...] = (*transport_errors(), errors.ResponseError)  # PING refused: unusable
        try:
            await asyncio.wait_for(self._contact(ping), self.timeout * 2)
        except failures as exc:
            reason = describe_failure(exc)
            self.report(reason)
            breaker.failed(ArchiveUnavailable(reason))
            return False
        breaker.succeeded()
        return True

    def state(self) -> str:
        return "ok" if all(breaker.closed for breaker in self.breakers()) else "degraded"

    def breakers(self) -> list[Breaker]:
        return [self.breaker]


class SingleServer(Servers):
    def __init__(self, address: ArchiveAddress, tls: TlsFiles, timeout: float, max_connections: int) -> None:
        import redis.asyncio as redis
        from redis.asyncio.retry import Retry
        from redis.backoff import NoBackoff

        self.name = address.display()
        self.timeout = timeout
        self.breaker = Breaker(self.name)
        kwargs = connection_kwargs(address, tls, timeout)
        if address.tls:
            kwargs["connection_class"] = redis.SSLConnection
        self.pool = redis.BlockingConnectionPool(
            host=address.host, port=address.port, max_connections=max_connections, timeout=timeout,
            retry=Retry(NoBackoff(), 0), **kwargs)
        self.client = redis.Redis(connection_pool=self.pool, retry=Retry(NoBackoff(), 0))
        bulk_timeout = timeout * BULK_TIMEOUT_FACTOR
        self.bulk_pool = redis.BlockingConnectionPool(
            host=address.host, port=address.port, max_connections=BULK_CONNECTIONS, timeout=bulk_timeout,
            retry=Retry(NoBackoff(), 0), **{**kwargs, "socket_timeout": bulk_timeout})
        self.bulk_client = redis.Redis(connection_pool=self.bulk_pool, retry=Retry(NoBackoff(), 0))

    def breaker_for(self, key: bytes | None) -> Breaker:
        return self.breaker

    async def execute(self, *command: Any) -> Any:
        return await self.client.execute_command(*command)

    async def each(self, commands: Sequence[Sequence[Any]], *, bulk: bool = False) -> list[Any]:
        """The replies of `commands`, sent in one pipeline on one connection (in order)."""
        pipe = (self.bulk_client if bulk else self.client).pipeline(transaction=False)
        for command in commands:
            pipe.execute_command(*command)
        return list(await pipe.execute())

    async def raw(self, *command: Any) -> Any:
        """One command without redis-py's reply parsing (COMMAND INFO of an unknown name)."""
        connection = await self.pool.get_connection()
        try:
            await connection.send_command(*command)
            return await connection.read_response()
        finally:
            await self.pool.release(connection)

    async def ping(self) -> bool:
        return await self._probe(self.breaker, lambda: self.client.execute_command("PING"))

    def start_watching(self) -> None:
        self.breaker.start_watching(self.ping)

    async def close(self) -> None:
        await self.breaker.stop_watching()
        await self.client.aclose()
        await self.bulk_client.aclose()


class ClusterServers(Servers):
    def __init__(self, address: ArchiveAddress, tls: TlsFiles, timeout: float, max_connections: int) -> None:
        from redis.asyncio.cluster import ClusterNode, RedisCluster
        from redis.asyncio.retry import Retry
        from redis.backoff import NoBackoff

        self.name = address.display()
        self.timeout = timeout
        self.breaker = Breaker(self.name)  # the whole cluster, while no slot map is known
        self._masters: dict[str, Breaker] = {}
        self._watching = False
        kwargs = connection_kwargs(address, tls, timeout)
        self.client = RedisCluster(
            startup_nodes=[ClusterNode(host, port) for host, port in address.hosts],
            require_full_coverage=False, max_connections=max_connections, ssl=address.tls,
            retry=Retry(NoBackoff(), 1), **kwargs)

    def _master_of(self, key: bytes) -> str | None:
        manager = self.client.nodes_manager
        if not manager.slots_cache:
            return None
        try:
            return manager.get_node_from_slot(self.client.keyslot(key)).name
        except Exception:  # a slot no master serves (yet)
            return None

    def breaker_for(self, key: bytes | None) -> Breaker:
        name = None if key is None or not self.breaker.closed else self._master_of(key)
        if name is None:
            return self.breaker
        breaker = self._masters.get(name)
        if breaker is None:
            breaker = self._masters[name] = Breaker(f"{self.name} master {name}")
            if self._watching:
                breaker.start_watching(lambda: self._probe_master(name, breaker))
        return breaker

    async def execute(self, *command: Any) -> Any:
        return await self.client.execute_command(*command)

    async def each(self, commands: Sequence[Sequence[Any]], *, bulk: bool = False) -> list[Any]:
        """One pipeline: redis-py sends each master its commands at once, the masters in parallel."""
        pipe = self.client.pipeline()
        for command in commands:
            pipe.execute_command(*command)
        return list(await pipe.execute())

    def breakers(self) -> list[Breaker]:
        return [self.breaker, *self._masters.values()]

    async def _reload(self) -> None:
        """Reach the cluster: the first time set the client up, then reload the slot map."""
        await self.client.initialize()
        await self.client.nodes_manager.initialize()

    async def ping(self) -> bool:
        return await self._probe(self.breaker, self._reload)

    def start_watching(self) -> None:
        self._watching = True
        self.breaker.start_watching(self.ping)
        for name, breaker in self._masters.items():
            breaker.start_watching(lambda: self._probe_master(name, breaker))

    async def _probe_master(self, name: str, breaker: Breaker) -> bool:
        """While a master is away: reload the slot map; a master that serves no slot any more
        (a replica took them over) retires its breaker, else PING it."""
        try:
            await asyncio.wait_for(self.client.nodes_manager.initialize(), self.timeout * 4)
        except Exception as exc:  # every seed unreachable: keep the old map, probe the master
            log.debug("cluster slot map reload failed: %s", exc)
        masters = {nodes[0].name: nodes[0] for nodes in self.client.nodes_manager.slots_cache.values() if nodes}
        default = self.client.get_default_node()
        if masters and (default is None or default.name not in masters):
            self.client.set_default_node(next(iter(masters.values())))  # keyless commands go there
        if name not in masters:
            breaker.retire("a replica serves its slots now")
            self._masters.pop(name, None)
            return True
        node = self.client.get_node(node_name=name)
        return await self._probe(breaker, lambda: self.client.execute_command("PING", target_nodes=node))

    async def close(self) -> None:
        for breaker in self.breakers():
            await breaker.stop_watching()
        await self.client.aclose()
