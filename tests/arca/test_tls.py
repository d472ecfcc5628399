"""ARCA over TLS, as redis-server does it: redis-cli --tls and redis-py ssl=True against a real
listener, client certificates required, optional or not asked, AUTH with the `default` user
(and HELLO's AUTH), and wrong certificates and passwords refused with clear errors. Then the
daemon itself: TLS-only (`--port -1`), its config keys, and what it refuses to start with."""

from __future__ import annotations

import shutil
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


@needs_cli
def test_the_daemon_serves_tls_only(tmp_path, certs):
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-c", DAEMON, "--port", "-1", "--tls-port", str(port), "--dir",
                             str(tmp_path / "arca"), "--tls-cert-file", str(certs.server_cert),
                             "--tls-key-file", str(certs.server_key), "--tls-ca-cert-file", str(certs.ca)],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
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
