"""An engine says, as it starts, when the engines already open in its process crowd the cores.

llama.cpp's OpenMP workers belong to the thread that decoded, as long as it lives; once they
outnumber the cores, every engine's steps are slower (node/engine/engine.py `_crowding`). The
real model, real engines: the log line is what a benchmark or an embedding program sees."""

from __future__ import annotations

import logging
import os

import pytest

from node.engine import engine as engine_module
from node.engine.engine import Engine, EngineConfig
from node.engine.llama import system_info

pytestmark = pytest.mark.model


def crowded(caplog) -> bool:
    return any("outnumber" in r.getMessage() for r in caplog.records if r.name == engine_module.__name__)


def test_a_second_engine_is_told_and_one_alone_is_not(gemma_path, caplog):
    if "OPENMP = 1" not in system_info():
        pytest.skip("llama.cpp built without OpenMP: its threads do not outlive a decode")
    cores = len(os.sched_getaffinity(0))
    already = sum(engine_module._LIVE.values())  # engines other tests of this process hold open

    def open_engine() -> Engine:
        return Engine(EngineConfig(model_path=gemma_path, n_ctx=256, n_parallel=1, n_threads=cores))

    caplog.set_level(logging.WARNING, logger=engine_module.__name__)
    first = open_engine()
    assert crowded(caplog) == (already > 0)
    caplog.clear()
    second = open_engine()
    assert crowded(caplog)  # the first one's threads and its own: twice the cores
    first.close()
    second.close()
    caplog.clear()
    third = open_engine()
    try:
        assert crowded(caplog) == (already > 0)  # closed engines no longer count
    finally:
        third.close()
