"""llama.cpp's OpenMP workers where a process opens more than one engine (node/engine/compute_threads.py).

Real model, real threads: `release` ends the calling thread's workers (counted in
/proc/self/task), and an idle engine calls it only while another engine is open."""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

import pytest

from node.engine import compute_threads
from node.engine.engine import Engine, EngineConfig
from node.engine.llama import LlamaContext, LlamaModel, TokenBatch, system_info
from node.engine.types import GenerationRequest

pytestmark = pytest.mark.model


def needs_openmp() -> None:
    if "OPENMP = 1" not in system_info():
        pytest.skip("llama.cpp built without OpenMP: no worker outlives a decode")
    if not Path("/proc/self/task").is_dir():
        pytest.skip("threads are counted in Linux's /proc")


def tasks() -> set[str]:
    return set(os.listdir("/proc/self/task"))


def test_release_ends_the_workers_of_the_thread_that_decoded(gemma_path):
    """Threads are told apart by id, so that another thread of the process starting or ending
    meanwhile does not count: the decode's workers appear, outlive it, and end at `release`."""
    needs_openmp()
    model = LlamaModel(gemma_path)
    ctx = LlamaContext(model, n_ctx=128, n_batch=8, n_ubatch=8, n_seq_max=1, n_threads=3)
    seen: dict[str, object] = {}

    def decode_then_release() -> None:
        batch = TokenBatch(8)
        batch.add(model.tokenize("The sky is"), 0, 0)
        before = tasks()
        assert ctx.decode(batch) == 0
        workers = tasks() - before  # 2 beside this thread
        time.sleep(0.2)
        seen["kept"] = len(workers & tasks())  # idle, they stay
        seen["released"] = compute_threads.release()
        deadline = time.monotonic() + 10
        while len(workers - tasks()) < 2 and time.monotonic() < deadline:
            time.sleep(0.02)
        seen["workers"], seen["ended"] = len(workers), len(workers - tasks())

    try:
        thread = threading.Thread(target=decode_then_release)
        thread.start()
        thread.join()
    finally:
        ctx.close()
        model.close()
    assert seen["workers"] >= 2 and seen["kept"] >= 2
    assert seen["released"] and seen["ended"] >= 2


def test_an_idle_engine_lets_its_threads_go_only_while_another_is_open(gemma_path, monkeypatch):
    needs_openmp()
    calls: list[tuple[str, int]] = []  # the threads that let their workers go
    real = compute_threads.release
    monkeypatch.setattr(compute_threads, "release",
                        lambda: calls.append((threading.current_thread().name, threading.get_ident())) or real())
    alone = compute_threads.open_engines() == 0  # another test of this process may hold an engine open

    def open_engine() -> Engine:
        engine = Engine(EngineConfig(model_path=gemma_path, n_ctx=256, n_parallel=1, n_threads=2))
        events = list(engine.submit(GenerationRequest(tuple(engine.tokenize("The sky is")), max_tokens=4))
                      .iter_sync(timeout=120))
        assert events[-1].reason in ("length", "stop")
        return engine

    first = open_engine()
    try:
        time.sleep(0.3)  # idle now
        if alone:
            assert calls == []  # one engine keeps its workers
        second = open_engine()  # wakes the first, idle: it lets its workers go
        try:
            deadline = time.monotonic() + 10
            while len(set(calls)) < 2 and time.monotonic() < deadline:
                time.sleep(0.02)
            assert {name for name, _ in calls} == {"reame-engine"} and len(set(calls)) >= 2  # both (and any other open)
        finally:
            second.close()
    finally:
        first.close()
