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


def tasks() -> int:
    return len(os.listdir("/proc/self/task"))


def settles_at(expected: int, timeout_s: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while tasks() != expected and time.monotonic() < deadline:
        time.sleep(0.02)
    return tasks() == expected


def test_release_ends_the_workers_of_the_thread_that_decoded(gemma_path):
    needs_openmp()
    model = LlamaModel(gemma_path)
    ctx = LlamaContext(model, n_ctx=128, n_batch=8, n_ubatch=8, n_seq_max=1, n_threads=3)
    counts: dict[str, int] = {}

    def decode_then_release() -> None:
        batch = TokenBatch(8)
        batch.add(model.tokenize("The sky is"), 0, 0)
        counts["before"] = tasks()
        assert ctx.decode(batch) == 0
        counts["team"] = tasks()  # 2 workers beside this thread
        counts["released"] = compute_threads.release()
        counts["after"] = tasks() if settles_at(counts["before"]) else tasks()

    try:
        thread = threading.Thread(target=decode_then_release)
        thread.start()
        thread.join()
    finally:
        ctx.close()
        model.close()
    assert counts["team"] == counts["before"] + 2
    assert counts["released"] and counts["after"] == counts["before"]


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
