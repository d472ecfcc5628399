"""TLS for ARCA's listener: the server's SSL context from redis-server's tls-* settings.

`tls-cert-file` and `tls-key-file` are the server's certificate chain and key (PEM);
`tls-ca-cert-file` is the CA that client certificates must chain to; `tls-auth-clients`
says whether a client must present one (`yes`, the default as in Redis), may (`optional`:
one that is presented must verify) or is not asked (`no`). A certificate that does not
verify fails the handshake with a TLS alert (arca/tls_stream.py runs the handshake); under `yes`, a client that presents none completes it and is
then told `-DENIED TLS client certificate required` and closed (arca/connection.py), so the
refusal is a clear error on both sides instead of a connection reset. A client certificate proves who
connects, not what it may do: with no password, protected mode treats a TLS listener like
any other exposed one. TLS 1.2 is the lowest version offered.
"""

from __future__ import annotations

import ssl
from pathlib import Path

from shared.config import ConfigError

AUTH_CLIENTS = ("yes", "no", "optional")
_VERIFY = {"yes": ssl.CERT_OPTIONAL, "optional": ssl.CERT_OPTIONAL, "no": ssl.CERT_NONE}
NO_CLIENT_CERT = "DENIED TLS client certificate required (tls-auth-clients yes): connect with the client's certificate and key"


def _readable(name: str, value: str | None) -> str:
    if not value:
        raise ConfigError(f"[server] {name}: required when tls-port is set")
    path = Path(value).expanduser()
    if not path.is_file():
        raise ConfigError(f"[server] {name}: no such file: {path}")
    return str(path)


def server_context(cert_file: str | None, key_file: str | None, ca_cert_file: str | None,
                   auth_clients: str) -> ssl.SSLContext:
    """The listener's context; ConfigError (naming the key) for a missing or unusable file."""
    if auth_clients not in AUTH_CLIENTS:
        raise ConfigError(f"[server] tls-auth-clients: expected one of {', '.join(AUTH_CLIENTS)}, got {auth_clients!r}")
    cert = _readable("tls-cert-file", cert_file)
    key = _readable("tls-key-file", key_file)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    try:
        context.load_cert_chain(cert, key)
    except (ssl.SSLError, OSError) as exc:
        raise ConfigError(f"[server] tls-cert-file / tls-key-file: cannot use {cert} with {key}: {exc}") from None
    context.verify_mode = _VERIFY[auth_clients]
    if auth_clients != "no":
        ca = _readable("tls-ca-cert-file", ca_cert_file)
        try:
            context.load_verify_locations(cafile=ca)
        except (ssl.SSLError, OSError) as exc:
            raise ConfigError(f"[server] tls-ca-cert-file: cannot load {ca}: {exc}") from None
    return context
