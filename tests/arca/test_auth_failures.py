"""Failed AUTH attempts are counted (INFO stats acl_access_denied_auth, as Redis names it) and
logged, at most one line per REFUSALS_LOG_EVERY_S, over a real socket."""

from __future__ import annotations

import logging

import redis

from tests.arca.test_server import recv_exactly

WRONG = b"-WRONGPASS invalid username-password pair or user is disabled.\r\n"


def test_failed_auth_is_counted_and_logged_without_flooding(arca_factory, caplog):
    server = arca_factory(requirepass="hunter2")
    caplog.set_level(logging.WARNING, logger="arca.commands.connection")
    with server.connect() as sock:
        sock.sendall(b"AUTH guess\r\n" * 40 + b"AUTH default nope\r\n" * 5 + b"HELLO 3 AUTH default wrong\r\n")
        assert recv_exactly(sock, WRONG * 46) == WRONG * 46
    with redis.Redis(host="127.0.0.1", port=server.port, password="hunter2", protocol=2) as good:
        assert good.info("stats")["acl_access_denied_auth"] == 46
    lines = [r.getMessage() for r in caplog.records if "AUTH failed" in r.getMessage()]
    assert len(lines) == 1 and "127.0.0.1" in lines[0], lines  # one line per REFUSALS_LOG_EVERY_S, not 46
