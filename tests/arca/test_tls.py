"""ARCA over TLS, as redis-server does it: redis-cli --tls and redis-py ssl=True against a real
listener, client certificates required, optional or not asked, AUTH with the `default` user
(and HELLO's AUTH), and wrong certificates and passwords refused with clear errors. Then the
daemon itself: TLS-only (`--port -1`), its config keys, and what it refuses to start with."""

from __future__ import annotations

import logging
import os
import shutil
import socket
import ssl
import subprocess
import sys
import time

import pytest
import redis

from arca.config import load_config
from arca.daemon import config_from_argv, protected_mode_refusal, server_options
from arca.launch import DAEMON, free_port
from arca.tls import server_context
from shared.config import ConfigError
from tests.certs import make_certs

REDIS_CLI = shutil.which("redis-cli")
needs_cli = pytest.mark.skipif(REDIS_CLI is None, reason="redis-cli not installed (apt-get install redis-tools)")
PASSWORD = "open-sesame"


@pytest.fixture(scope="module")
def certs(tmp_path_factory):
    return make_certs(tmp_path_factory.mktemp("certs"))


@pytest.fixture
def tls_arca(arca_factory, certs):
    def make(auth_clients: str = "yes", **options):
        context = server_context(str(certs.server_cert), str(certs.server_key), str(certs.ca), auth_clients)
        return arca_factory(tls_port=free_port(), tls_context=context,
                            tls_require_client_cert=auth_clients == "yes", **options)
    return make


def tls_cli(port: int, certs, *args: str, client_cert: bool = True, ca=None) -> subprocess.CompletedProcess:
    command = [REDIS_CLI, "-h", "127.0.0.1", "-p", str(port), "--tls", "--cacert", str(ca or certs.ca)]
    if client_cert:
        command += ["--cert", str(certs.client_cert), "--key", str(certs.client_key)]
    return subprocess.run([*command, *args], capture_output=True, text=True, timeout=30)


def tls_redis(port: int, certs, *, client_cert: bool = True, ca=None, **kwargs) -> redis.Redis:
    extra = {"ssl_certfile": str(certs.client_cert), "ssl_keyfile": str(certs.client_key)} if client_cert else {}
    from redis.backoff import NoBackoff
    from redis.retry import Retry

    return redis.Redis(host="127.0.0.1", port=port, ssl=True, ssl_ca_certs=str(ca or certs.ca),
                       socket_timeout=5, retry=Retry(NoBackoff(), 0), **extra, **kwargs)


@needs_cli
def test_redis_cli_over_tls_with_auth(tls_arca, certs):
    server = tls_arca(requirepass=PASSWORD)
    port = server.state.tls_port
    assert tls_cli(port, certs, "-a", PASSWORD, "--no-auth-warning", "SET", "k", "over tls").stdout == "OK\n"
    done = tls_cli(port, certs, "--user", "default", "--pass", PASSWORD, "--no-auth-warning", "GET", "k")
    assert done.stdout == "over tls\n"
    wrong = tls_cli(port, certs, "-a", "nope", "--no-auth-warning", "PING")
    assert "WRONGPASS" in wrong.stdout + wrong.stderr
    untrusted = tls_cli(port, certs, "PING", ca=certs.other_ca)
    assert "certificate verify failed" in untrusted.stdout + untrusted.stderr
    anonymous = tls_cli(port, certs, "-a", PASSWORD, "--no-auth-warning", "PING", client_cert=False)
    assert "TLS client certificate required" in anonymous.stdout + anonymous.stderr
    assert server.state.tcp_port == server.port  # the plain listener is still there beside it


def test_redis_py_over_tls(tls_arca, certs):
    server = tls_arca(requirepass=PASSWORD)
    port = server.state.tls_port
    for protocol in (2, 3):  # RESP3 sends HELLO 3 AUTH default <password>
        client = tls_redis(port, certs, username="default", password=PASSWORD, protocol=protocol)
        assert client.set("p", b"\x00bytes") and client.get("p") == b"\x00bytes"
        assert client.execute_command("ARCA.OBSERVE", b"\x01\x00\x00\x00\x02\x00\x00\x00")
        client.close()
    with pytest.raises(redis.AuthenticationError, match="invalid username-password"):
        tls_redis(port, certs, password="wrong").ping()
    with pytest.raises(redis.ConnectionError, match="CERTIFICATE_VERIFY_FAILED"):
        tls_redis(port, certs, ca=certs.other_ca, password=PASSWORD).ping()
    with pytest.raises(redis.RedisError, match="TLS client certificate required"):
        tls_redis(port, certs, client_cert=False, password=PASSWORD).ping()


def test_config_get_shows_the_listeners(tls_arca, certs):
    server = tls_arca("optional")
    client = tls_redis(server.state.tls_port, certs)
    view = client.config_get("*port*") | client.config_get("tls-auth-clients")
    assert view == {"port": str(server.port), "tls-port": str(server.state.tls_port), "tls-auth-clients": "optional"}


def test_client_certificates_optional_or_not_asked(tls_arca, certs):
    for mode in ("optional", "no"):
        server = tls_arca(mode)
        port = server.state.tls_port
        assert tls_redis(port, certs, client_cert=False).ping()
        assert tls_redis(port, certs).ping()


def test_a_client_certificate_is_not_a_password(tls_arca, certs, monkeypatch):
    """Protected mode at run time: a remote client over TLS, with a valid certificate but no
    password configured, is refused like any other."""
    import arca.connection as connection_module

    server = tls_arca()
    monkeypatch.setattr(connection_module, "is_loopback", lambda host: False)
    with pytest.raises(redis.RedisError, match="DENIED"):
        tls_redis(server.state.tls_port, certs).ping()


def test_protected_mode_counts_a_tls_listener_as_exposed(certs):
    flags = ["--host", "0.0.0.0", "--tls-port", "6421", "--tls-cert-file", str(certs.server_cert),
             "--tls-key-file", str(certs.server_key), "--tls-ca-cert-file", str(certs.ca)]
    refusal = protected_mode_refusal(config_from_argv(flags))
    assert refusal is not None and "TLS included" in refusal
    assert protected_mode_refusal(config_from_argv([*flags, "--requirepass", "x"])) is None


def test_tls_settings_from_the_config_file(tmp_path, certs):
    conf = tmp_path / "arca.conf"
    conf.write_text(f"[server]\nport = -1\ntls-port = 7001\ntls-cert-file = {certs.server_cert}\n"
                    f"tls-key-file = {certs.server_key}\ntls-ca-cert-file = {certs.ca}\ntls-auth-clients = optional\n")
    config = load_config(file=conf)
    assert (config.port, config.tls_port, config.tls_auth_clients) == (-1, 7001, "optional")
    options = server_options(config)
    assert options.tls_context is not None and not options.tls_require_client_cert


@pytest.mark.parametrize("flags, message", [
    (["--tls-port", "7001"], "tls-cert-file: required"),
    (["--tls-port", "7001", "--tls-cert-file", "/nonexistent.crt", "--tls-key-file", "/x.key"], "no such file"),
    (["--port", "-1"], "needs a tls-port"),
])
def test_unusable_tls_settings_are_named(flags, message, certs):
    with pytest.raises(ConfigError, match=message):
        server_options(config_from_argv(flags))


def test_tls_key_not_matching_the_certificate(certs):
    with pytest.raises(ConfigError, match="cannot use"):
        server_context(str(certs.server_cert), str(certs.client_key), str(certs.ca), "yes")


def tls_only_daemon(tmp_path, certs, port: int) -> subprocess.Popen:
    """`reame arca` with no plain port and TLS on `port` (client certificates required)."""
    return subprocess.Popen([sys.executable, "-c", DAEMON, "--port", "-1", "--tls-port", str(port), "--dir",
                             str(tmp_path / "arca"), "--tls-cert-file", str(certs.server_cert),
                             "--tls-key-file", str(certs.server_key), "--tls-ca-cert-file", str(certs.ca)],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT)


@needs_cli
def test_the_daemon_serves_tls_only(tmp_path, certs):
    port = free_port()
    proc = tls_only_daemon(tmp_path, certs, port)
    try:
        deadline = time.monotonic() + 30
        while tls_cli(port, certs, "PING").stdout != "PONG\n":
            assert proc.poll() is None and time.monotonic() < deadline, "the TLS daemon did not answer"
            time.sleep(0.1)
        assert tls_cli(port, certs, "SET", "a", "1").stdout == "OK\n"
    finally:
        proc.terminate()
        output = proc.communicate(timeout=30)[0].decode()
    assert proc.returncode == 0
    assert f"no plain TCP, TLS on 127.0.0.1:{port} (client certificates: yes)" in output


def stranger_redis(port: int, certs) -> redis.Redis:
    """redis-py presenting the client certificate of another CA (and trying once)."""
    return tls_redis(port, certs, client_cert=False, ssl_certfile=str(certs.stranger_cert),
                     ssl_keyfile=str(certs.stranger_key))


def stranger_context(maximum: ssl.TLSVersion, certs) -> ssl.SSLContext:
    context = ssl.create_default_context(cafile=str(certs.ca))
    context.load_cert_chain(str(certs.stranger_cert), str(certs.stranger_key))
    context.maximum_version = maximum
    return context


def test_a_client_certificate_from_another_ca_gets_an_alert_a_log_line_and_a_count(tls_arca, certs, caplog):
    """Before, the handshake failure closed the socket with the alert still in OpenSSL's buffer:
    every client saw a bare EOF ("Connection closed by server"), and nothing was logged or counted."""
    caplog.set_level(logging.WARNING, logger="arca.server")
    server = tls_arca()
    port = server.state.tls_port
    with pytest.raises(redis.ConnectionError, match="UNKNOWN_CA"):
        stranger_redis(port, certs).ping()
    # TLS 1.2: the alert ends the client's handshake; TLS 1.3: the client's handshake is done
    # before the server looks at its certificate, and the alert ends its first read.
    for maximum in (ssl.TLSVersion.TLSv1_2, ssl.TLSVersion.TLSv1_3):
        with pytest.raises(ssl.SSLError, match="UNKNOWN_CA"):
            with socket.create_connection(("127.0.0.1", port), timeout=5) as raw:
                with stranger_context(maximum, certs).wrap_socket(raw, server_hostname="127.0.0.1") as tls:
                    tls.sendall(b"PING\r\n")
                    tls.recv(64)
    lines = [r.getMessage() for r in caplog.records if "TLS connection from 127.0.0.1:" in r.getMessage()]
    assert len(lines) == 1, lines  # throttled like failed AUTH: one line per REFUSALS_LOG_EVERY_S
    assert "client certificate rejected: unable to get local issuer certificate" in lines[0], lines
    good = tls_redis(port, certs)
    stats = good.info("stats")
    assert (stats["tls_client_cert_rejected"], stats["tls_handshake_failures"]) == (3, 3)
    assert good.ping()


def test_a_plain_client_on_the_tls_port_is_counted_and_the_listener_goes_on(tls_arca, certs):
    server = tls_arca()
    with socket.create_connection(("127.0.0.1", server.state.tls_port), timeout=5) as sock:
        sock.sendall(b"PING\r\n")
        assert sock.recv(64) == b""  # closed (not TLS: OpenSSL has no version to send an alert in)
    stats = tls_redis(server.state.tls_port, certs).info("stats")
    assert (stats["tls_handshake_failures"], stats["tls_client_cert_rejected"]) == (1, 0)


@needs_cli
def test_redis_cli_with_a_certificate_from_another_ca(arca_factory, certs):
    """redis-cli shows the alert where TLS lets it: under TLS 1.2 it ends SSL_connect. Under
    TLS 1.3 the alert arrives on the first read, which hiredis reports for any failed read as
    "Server closed the connection"; the server counts it all the same."""
    for maximum in (ssl.TLSVersion.TLSv1_2, ssl.TLSVersion.TLSv1_3):
        context = server_context(str(certs.server_cert), str(certs.server_key), str(certs.ca), "yes")
        context.maximum_version = maximum
        server = arca_factory(tls_port=free_port(), tls_context=context)
        port = server.state.tls_port
        done = subprocess.run([REDIS_CLI, "-h", "127.0.0.1", "-p", str(port), "--tls", "--cacert", str(certs.ca),
                               "--cert", str(certs.stranger_cert), "--key", str(certs.stranger_key), "PING"],
                              capture_output=True, text=True, timeout=30)
        assert done.returncode != 0 and "PONG" not in done.stdout
        if maximum == ssl.TLSVersion.TLSv1_2:
            assert "alert unknown ca" in done.stderr, done.stderr
        assert tls_redis(port, certs).info("stats")["tls_client_cert_rejected"] >= 1  # redis-cli may retry


def test_the_daemon_refuses_a_certificate_from_another_ca_with_an_alert(tmp_path, certs):
    """The daemon runs uvloop, whose own TLS dropped the alert the same way."""
    port = free_port()
    proc = tls_only_daemon(tmp_path, certs, port)
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                assert tls_redis(port, certs).ping()
                break
            except redis.ConnectionError:
                assert proc.poll() is None and time.monotonic() < deadline, "the TLS daemon did not answer"
                time.sleep(0.1)
        with pytest.raises(redis.ConnectionError, match="UNKNOWN_CA"):
            stranger_redis(port, certs).ping()
        assert tls_redis(port, certs).info("stats")["tls_client_cert_rejected"] >= 1  # redis-cli may retry
    finally:
        proc.terminate()
        output = proc.communicate(timeout=30)[0].decode()
    assert "refused: client certificate rejected: unable to get local issuer certificate" in output, output


def test_large_values_and_deep_pipelines_cross_the_tls_layer_intact(tls_arca, certs):
    """ARCA encrypts and decrypts the records itself (arca/tls_stream.py): a 12 MiB value both
    ways, and 20,000 pipelined commands whose replies outrun a client that reads them late."""
    server = tls_arca()
    client = tls_redis(server.state.tls_port, certs)
    big = os.urandom(12 << 20)
    assert client.set(b"big", big) and client.get(b"big") == big
    pipe = client.pipeline(transaction=False)
    for i in range(20_000):
        pipe.set(b"k%d" % i, b"v%d" % i)
        pipe.get(b"k%d" % (i // 2))
    replies = pipe.execute()
    assert replies[1::2] == [b"v%d" % (i // 2) for i in range(20_000)]
    with socket.create_connection(("127.0.0.1", server.state.tls_port), timeout=10) as raw:
        context = ssl.create_default_context(cafile=str(certs.ca))
        context.load_cert_chain(str(certs.client_cert), str(certs.client_key))
        with context.wrap_socket(raw, server_hostname="127.0.0.1") as tls:
            tls.sendall(b"GET k7\r\n")
            assert tls.recv(64) == b"$2\r\nv7\r\n"
            plain = tls.unwrap()  # the client's close_notify is answered with the server's
            assert plain.recv(64) == b""  # and the close
            plain.close()


def test_a_client_that_never_completes_the_handshake_is_dropped_and_counted(tls_arca, certs, monkeypatch):
    import arca.tls_stream as tls_stream

    monkeypatch.setattr(tls_stream, "HANDSHAKE_TIMEOUT_SECONDS", 0.5)
    server = tls_arca()
    started = time.monotonic()
    with socket.create_connection(("127.0.0.1", server.state.tls_port), timeout=5) as sock:
        assert sock.recv(64) == b""  # nothing sent: closed after the handshake timeout
    assert 0.4 < time.monotonic() - started < 3
    assert tls_redis(server.state.tls_port, certs).info("stats")["tls_handshake_failures"] == 1
