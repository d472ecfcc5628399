"""The kernel probe on the real model: a trapping kernel leads to a node without extra buffer
types, the verdict is cached and invalidated, and on this host the probe agrees with what a
real decode with extra buffer types does.

The fault is injected through the probe's documented hook (REAME_KERNEL_PROBE_FAULT): the
probe child kills itself by SIGILL just before its first batched decode with extra buffers
on, which is what a VM that traps AMX tile instructions does to it.
"""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from node.engine import huge_pages, kernels
from node.engine.kernel_probe import FAULT_ENV

pytestmark = pytest.mark.model


# A probe here shares two cores with another test worker: its own 60 s bound (a node's start on a
# busy host) would time out, which is no verdict; these tests judge verdicts, so they wait longer.
PROBE_S = 300.0


@pytest.fixture(autouse=True)
def no_fault(monkeypatch):
    monkeypatch.delenv(FAULT_ENV, raising=False)


def test_a_probe_child_dying_by_sigill_means_no_extra_buffers_logged_once(gemma_path, tmp_path, monkeypatch, caplog):
    monkeypatch.setenv(FAULT_ENV, "SIGILL")
    caplog.set_level(logging.INFO, logger="node.engine.kernels")
    choice = kernels.choose_kernels(gemma_path, cache_dir=tmp_path, n_threads=2, timeout_s=PROBE_S)
    assert not choice.extra_buffers and choice.usable is False and "SIGILL" in choice.reason
    assert choice.line is not None and 0 < choice.line.per_token <= choice.line.seconds(1)  # measured without
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "SIGILL" in warnings[0].getMessage()
    caplog.clear()
    # the fault is still set
    again = kernels.choose_kernels(gemma_path, cache_dir=tmp_path, n_threads=2, timeout_s=PROBE_S)
    assert again.cached and not again.extra_buffers and "SIGILL" in again.reason and again.probe_s == 0
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]


def test_the_cached_verdict_is_reused_and_a_changed_key_probes_again(gemma_path, tmp_path, monkeypatch):
    first = kernels.choose_kernels(gemma_path, cache_dir=tmp_path, n_threads=2, timeout_s=PROBE_S)
    assert not first.cached and first.probe_s > 0 and len(list(tmp_path.glob("*.json"))) == 1
    probes = []
    real_probe = kernels.probe_kernels

    def counting(*args, **kwargs):
        probes.append(args)
        return real_probe(*args, **kwargs)

    monkeypatch.setattr(kernels, "probe_kernels", counting)
    start = time.perf_counter()
    cached = kernels.choose_kernels(gemma_path, cache_dir=tmp_path, n_threads=2, timeout_s=PROBE_S)
    assert cached.cached and cached.extra_buffers == first.extra_buffers and not probes
    assert time.perf_counter() - start < 0.5
    kernels.choose_kernels(gemma_path, cache_dir=tmp_path, n_threads=1, timeout_s=PROBE_S)  # another thread count
    monkeypatch.setattr(kernels, "cpu_flags", lambda: "fpu sse2 avx2 a-new-flag")  # another CPU
    kernels.choose_kernels(gemma_path, cache_dir=tmp_path, n_threads=2, timeout_s=PROBE_S)
    assert len(probes) == 2 and len(list(tmp_path.glob("*.json"))) == 3
    for verdict in tmp_path.glob("*.json"):  # a damaged verdict is probed again, not trusted
        verdict.write_bytes(b"{not json")
    kernels.choose_kernels(gemma_path, cache_dir=tmp_path, n_threads=2, timeout_s=PROBE_S)
    assert len(probes) == 3


def test_a_setting_decides_without_a_probe(gemma_path, tmp_path, monkeypatch):
    monkeypatch.setattr(kernels, "probe_kernels", lambda *a, **k: pytest.fail("probed despite the setting"))
    assert not kernels.choose_kernels(gemma_path, setting="off", cache_dir=tmp_path).extra_buffers
    assert kernels.choose_kernels(gemma_path, setting="on", cache_dir=tmp_path).extra_buffers
    with pytest.raises(ValueError):
        kernels.choose_kernels(gemma_path, setting="maybe", cache_dir=tmp_path)


REAL_DECODE = textwrap.dedent("""
    import sys
    from node.engine.engine import Engine, EngineConfig
    from node.engine.types import GenerationRequest, SamplingParams
    engine = Engine(EngineConfig(model_path=sys.argv[1], n_ctx=1024, n_parallel=2, n_batch=64, n_ubatch=64, step_token_budget=64,
                                 extra_buffers="on"))
    prompt = tuple(engine.tokenize("The three primary colours are red, yellow and"))
    handles = [engine.submit_n(GenerationRequest(prompt_tokens=prompt, max_tokens=8,
                                                 sampling=SamplingParams(temperature=0.0)), 2)]
    for handle in handles[0]:
        for event in handle.iter_sync(timeout=60):
            pass
    print("decoded with", engine.kernel_report()["buffers"])
    engine.close()
""")


def test_the_probe_agrees_with_a_real_decode_with_extra_buffers_on_this_host(gemma_path, tmp_path):
    choice = kernels.probe_kernels(gemma_path, n_threads=2, timeout_s=PROBE_S)
    assert not choice.timed_out, choice
    root = Path(__file__).resolve().parents[3]
    env = {k: v for k, v in os.environ.items() if k != FAULT_ENV}
    env["PYTHONPATH"] = str(root)
    env["REAME_HOME"] = str(tmp_path)
    done = subprocess.run([sys.executable, "-c", REAL_DECODE, str(gemma_path)], capture_output=True, env=env,
                          timeout=180, check=False)
    survived = done.returncode == 0 and b"decoded with" in done.stdout
    assert survived == choice.usable, (choice, done.returncode, done.stderr[-2000:])


def test_a_node_whose_probe_traps_serves_without_extra_buffers_and_says_so(gemma_path, tmp_path, monkeypatch, caplog):
    """The whole node: the probe child dies by SIGILL, the node loads without extra buffer
    types, logs it once, answers a chat, and shows the kernel path in /health and /metrics."""
    from tests.node.api.live import LiveNode, http_json, metric, node_settings

    monkeypatch.setenv(FAULT_ENV, "SIGILL")
    caplog.set_level(logging.INFO, logger="node.engine.kernels")
    with LiveNode(node_settings(gemma_path, tmp_path)) as node:
        status, _, body = http_json("POST", f"{node.url}/v1/completions",
                                    {"prompt": "One, two,", "max_tokens": 4, "temperature": 0})
        assert status == 200 and body["usage"]["completion_tokens"] >= 1
        status, _, health = http_json("GET", f"{node.url}/health")
        kernels_seen = health["kernels"]
        assert kernels_seen["extra_buffers"] == "off" and "SIGILL" in kernels_seen["reason"]
        assert kernels_seen["machine"] and kernels_seen["features"] and kernels_seen["buffers"]
        assert not any(name in kernels_seen["buffers"] for name in ("AMX", "CPU_REPACK"))
        if huge_pages.offered():  # [memory] huge_pages = auto: the weights read into 2 MiB pages
            weights = sum(kernels_seen["buffers"].values())
            most = weights + 2 * huge_pages.page_size() / 2**20  # the weights' mapping, in whole huge pages
            assert 0.95 * weights <= kernels_seen["huge_pages_mib"] <= most, kernels_seen
            assert metric(node.url, "reame_weights_huge_pages_bytes") == pytest.approx(
                kernels_seen["huge_pages_mib"] * 2**20, rel=1e-3)
        else:
            assert kernels_seen["huge_pages_mib"] is None
        line = kernels_seen["step_cost_line_ms"]
        assert 0 <= line["per_token"] <= line["per_step"] + line["per_token"]
        assert metric(node.url, "reame_kernel_info", extra_buffers="off") == 1
        assert metric(node.url, "reame_step_cost_seconds", part="per_token") > 0
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING and "SIGILL" in r.getMessage()]
    assert len(warnings) == 1


def test_a_probe_that_runs_out_of_time_is_off_for_this_start_and_not_kept(gemma_path, tmp_path, caplog):
    """A busy host can make the probe slow; that is no verdict on the kernels."""
    caplog.set_level(logging.WARNING, logger="node.engine.kernels")
    choice = kernels.choose_kernels(gemma_path, cache_dir=tmp_path, n_threads=2, timeout_s=0.05)
    assert not choice.extra_buffers and choice.timed_out and "timed out" in choice.reason
    assert not list(tmp_path.glob("*.json"))
    assert any("timed out" in r.getMessage() for r in caplog.records)
