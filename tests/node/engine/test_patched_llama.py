"""The llama.cpp the node runs is the pinned release with deploy/llama_cpp's patches, and the
patched matrix kernel gives the rows of a step past a tile of 4 exactly what the 4-wide tiles
give them.

The patch (deploy/llama_cpp/patches/0001-sgemm-rows-past-the-tile.patch) computes the columns
left over a multiple of 4 in the same pass as the full tiles, with the 4-wide kernel cut to
their width. Causal attention makes a token's logits independent of the tokens after it, so a
step of 9, 10 or 11 tokens with logits must give its rows what a step of the same tokens and
enough more to fill 12 gives them: there every row is computed by full tiles. A wrong column
index, a missed column or a thread taking another's tile shows here as different logits.
(Steps of fewer than 8 tokens are not compared with steps of 8: there, in the stock build as in
the patched one, other matrices of the transformer take other kernels by the batch's size, and
rows differ by up to a logit, the argmax the same.)
"""

from __future__ import annotations

import numpy as np
import pytest

from deploy.llama_cpp import build

llama_cpp = pytest.importorskip("llama_cpp", reason="node extra not installed")


def test_the_node_runs_the_patched_release():
    assert llama_cpp.__version__ == build.local_version(), (
        f"llama-cpp-python {llama_cpp.__version__} is installed, not the patched "
        f"{build.local_version()}: `make install` builds and installs it")


@pytest.mark.model
def test_rows_past_a_tile_get_the_logits_full_tiles_give_them(gemma_path):
    from node.engine.llama import LlamaContext, LlamaModel, TokenBatch

    model = LlamaModel(gemma_path, extra_buffers=False)
    ctx = LlamaContext(model, n_ctx=1024, n_batch=64, n_ubatch=64, n_seq_max=1, n_threads=2,
                       max_outputs_per_seq=16)
    try:
        tokens = model.tokenize("The harbour of Vellmar was built in the year of the long winter, " * 6)
        prefix, probe = tokens[:60], tokens[60:76]
        batch = TokenBatch(64)
        batch.add(prefix, 0, 0, logits="last")
        assert ctx.decode(batch) == 0

        def step(n: int) -> np.ndarray:
            batch.clear()
            batch.add(probe[:n], len(prefix), 0, logits="all")
            assert ctx.decode(batch) == 0
            rows = np.array(ctx.logits(n), copy=True)
            ctx.seq_rm(0, len(prefix), -1)
            return rows

        for n, whole in ((9, 12), (10, 12), (11, 12), (13, 16), (14, 16), (15, 16)):
            past, tiled = step(n), step(whole)[:n]
            assert np.array_equal(past, tiled), f"{n} rows differ from the same rows in a step of {whole}"
            assert np.isfinite(past).all()
    finally:
        ctx.close()
        model.close()
