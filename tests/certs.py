"""Test certificates made with the openssl command line: a CA, a server certificate for
127.0.0.1 and localhost (also usable as a client's: cluster nodes present it to each other on
the TLS cluster bus), a client certificate, a second CA that signed none of them, and a client
certificate that second CA signed (one the first CA's servers must refuse)."""

from __future__ import annotations

import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest


@dataclass(frozen=True)
class Certs:
    ca: Path
    server_cert: Path
    server_key: Path
    client_cert: Path
    client_key: Path
    other_ca: Path  # trusts nothing of the above
    stranger_cert: Path  # a client certificate signed by other_ca
    stranger_key: Path


def _openssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True, timeout=60)


def _ca(directory: Path, name: str) -> tuple[Path, Path]:
    key, cert = directory / f"{name}.key", directory / f"{name}.crt"
    _openssl("req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
             "-keyout", str(key), "-out", str(cert), "-days", "2", "-subj", f"/CN={name}", cwd=directory)
    return cert, key


def _signed(directory: Path, name: str, ca: tuple[Path, Path], extensions: str) -> tuple[Path, Path]:
    key, csr, cert = directory / f"{name}.key", directory / f"{name}.csr", directory / f"{name}.crt"
    ext = directory / f"{name}.ext"
    ext.write_text(extensions)
    _openssl("req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes", "-keyout", str(key),
             "-out", str(csr), "-subj", f"/CN={name}", cwd=directory)
    _openssl("x509", "-req", "-in", str(csr), "-CA", str(ca[0]), "-CAkey", str(ca[1]), "-CAcreateserial",
             "-out", str(cert), "-days", "2", "-extfile", str(ext), cwd=directory)
    return cert, key


def make_certs(directory: Path) -> Certs:
    if shutil.which("openssl") is None:
        pytest.skip("the openssl command line is not installed")
    directory.mkdir(parents=True, exist_ok=True)
    ca = _ca(directory, "test-ca")
    other = _ca(directory, "other-ca")
    server = _signed(directory, "server", ca, "subjectAltName=IP:127.0.0.1,DNS:localhost\n"
                     "extendedKeyUsage=serverAuth,clientAuth\n")
    client = _signed(directory, "client", ca, "extendedKeyUsage=clientAuth\n")
    stranger = _signed(directory, "stranger", other, "extendedKeyUsage=clientAuth\n")
    return Certs(ca[0], server[0], server[1], client[0], client[1], other[0], stranger[0], stranger[1])
