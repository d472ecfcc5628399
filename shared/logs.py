"""Logging set-up, called only by the CLI: one format for ARCA and the node."""

from __future__ import annotations

import logging

LEVELS = ("debug", "info", "warning", "error")


def configure_logging(level: str = "info") -> None:
    logging.basicConfig(
        level=getattr(logging, level.upper(), logging.INFO),
        format="%(asctime)s %(levelname)-7s %(name)s: %(message)s",
        datefmt="%H:%M:%S",
    )
