"""Log lines never show a password: the formatter the CLI installs hides it in any address,
and clipped ids stay short (shared/logs.py, shared/text.py)."""

from __future__ import annotations

import io
import logging

from shared.logs import FORMAT, RedactingFormatter
from shared.text import clip, redact_url


def test_every_logged_address_has_its_password_hidden():
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(RedactingFormatter(FORMAT))
    log = logging.getLogger("tests.redaction")
    log.addHandler(handler)
    log.propagate = False
    log.setLevel(logging.INFO)
    try:
        log.info("archive: %s", "remote ARCA redis://:hunter2@127.0.0.1:6420")
        log.warning("archive rediss://default:s3cr%40t@arca.local:6420,redis://u:p@[::1]:7000 refused GET")
        log.info("nothing secret in redis://127.0.0.1:6420 or http://127.0.0.1:8080/v1")
    finally:
        log.removeHandler(handler)
    text = stream.getvalue()
    assert "hunter2" not in text and "s3cr" not in text and ":p@" not in text
    assert "redis://:***@127.0.0.1:6420" in text and "rediss://default:***@arca.local:6420" in text
    assert "redis://u:***@[::1]:7000" in text
    assert "redis://127.0.0.1:6420 or http://127.0.0.1:8080/v1" in text


def test_redact_and_clip_leave_plain_text_alone():
    assert redact_url("no address here: a:b@c") == "no address here: a:b@c"
    assert clip("sess_1") == "sess_1"
    clipped = clip("x" * 20_000)
    assert len(clipped) < 100 and clipped.endswith("(19936 more characters)")
