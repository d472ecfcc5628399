"""One real Gemma engine for the whole engine suite (loading it once keeps the suite fast)."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def engine(gemma_path):
    pytest.importorskip("llama_cpp", reason="node extra not installed")
    from node.engine.engine import Engine, EngineConfig

    # one sequence may use 1024 cells (not the default 512 = 2048 / 4): the suite's long prompts
    # (600 tokens and more) fit one sequence, the four slots still share the 2048
    eng = Engine(EngineConfig(model_path=gemma_path, n_ctx=2048, n_parallel=4, n_batch=512,
                              max_queue=16, step_token_budget=64, seq_cells=1024))
    yield eng
    eng.close()
