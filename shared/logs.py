"""Logging set-up, called only by the CLI: one format for ARCA and the node, with the password of
any address in a line hidden (`RedactingFormatter`)."""

from __future__ import annotations

import logging

from shared.text import redact_url

LEVELS = ("debug", "info", "warning", "error")


FORMAT = "%(asctime)s %(levelname)-7s %(name)s: %(message)s"


class RedactingFormatter(logging.Formatter):
    """Every line with the password of any `scheme://user:password@host` address hidden, whoever
    logs it (the node's settings, an archive client's error, a library's message)."""

    def format(self, record: logging.LogRecord) -> str:
        return redact_url(super().format(record))


def configure_logging(level: str = "info") -> None:
    handler = logging.StreamHandler()
    handler.setFormatter(RedactingFormatter(FORMAT, datefmt="%H:%M:%S"))
    logging.basicConfig(level=getattr(logging, level.upper(), logging.INFO), handlers=[handler])
