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


TEXTS = ("The harbour of Vellmar was built in the year of the long winter, ",
         "Invoice 4471 from Dunmore Supplies Ltd, dated 3 March 2025, to Harlow Bakery, ",
         "Write the welcome message for new members of the rowing club, with the rules: ",
         "The pilots kept a lamp burning in the tower of Saint Ives, and their rules ")


class Steps:
    """Sequences of the texts above in one context; `step` decodes parts of them with logits on
    every row and takes the cells it wrote back, so each step starts from the same cache."""

    def __init__(self, gemma_path, n_seqs: int, outputs: int, prefix: int) -> None:
        from node.engine.llama import LlamaContext, LlamaModel, TokenBatch

        self.model = LlamaModel(gemma_path, extra_buffers=False)
        self.ctx = LlamaContext(self.model, n_ctx=2048, n_batch=128, n_ubatch=128, n_seq_max=n_seqs,
                                n_threads=2, max_outputs_per_seq=outputs)
        self.batch = TokenBatch(128)
        self.streams = [self.model.tokenize(text * 8)[:120] for text in TEXTS[:n_seqs]]
        for seq in range(n_seqs if prefix else 0):
            self.step([(seq, 0, prefix)], keep=True)

    def step(self, parts: list[tuple[int, int, int]], keep: bool = False) -> np.ndarray:
        """(sequence, from, count) for each part; the rows' logits."""
        self.batch.clear()
        for seq, start, n in parts:
            self.batch.add(self.streams[seq][start:start + n], start, seq, logits="all")
        assert self.ctx.decode(self.batch) == 0
        rows = np.array(self.ctx.logits(sum(n for _, _, n in parts)), copy=True)
        for seq, start, _ in parts if not keep else ():
            self.ctx.seq_rm(seq, start, -1)
        return rows

    def close(self) -> None:
        self.ctx.close()
        self.model.close()


@pytest.mark.model
def test_rows_of_several_sequences_past_64_get_what_a_smaller_step_gives_them(gemma_path):
    """A step of 64 query rows or more from several sequences (users decoding with their drafts)
    takes flash attention's one-row kernel, as a step under 64 does, not the tiled one
    (deploy/llama_cpp/patches/0003-fa-tiles-one-stream.patch): 4 sequences of 16 rows give the
    rows of the first three what the same rows give in a step of 63, bit for bit. With the
    tiled kernel (the stock build) they differ: it sums in float32 where the one-row kernel
    keeps float16."""
    steps = Steps(gemma_path, 4, 16, prefix=60)
    try:
        whole = steps.step([(seq, 60, 16) for seq in range(4)])
        under = steps.step([(0, 60, 16), (1, 60, 16), (2, 60, 16), (3, 60, 15)])
        assert np.isfinite(whole).all()
        assert np.array_equal(whole[:48], under[:48]), "rows of a 64-row step differ from the same rows in a step of 63"
    finally:
        steps.close()


@pytest.mark.model
def test_a_step_of_decoding_rows_beside_a_prompt_chunk_gives_every_row_its_attention(gemma_path):
    """Past 64 rows, decoding rows of two sequences beside 48 prompt rows of a third: the chunks
    of decoding rows take the one-row kernel, the prompt's the tiled one, on the two threads at
    once. The decoding rows get exactly what a step of them alone gives them (where one thread's
    one-row scratch overlapped the other's tiled scratch they came out NaN or wrong), the
    prompt's rows what a step of the prompt alone gives them up to the kernels' precision, and
    the same step the same logits every time."""
    steps = Steps(gemma_path, 3, 48, prefix=0)
    try:
        steps.step([(0, 0, 60)], keep=True)
        steps.step([(1, 0, 60)], keep=True)
        decoding = steps.step([(0, 60, 16), (1, 60, 16)])
        prompt = steps.step([(2, 0, 48)])
        first = steps.step([(0, 60, 16), (1, 60, 16), (2, 0, 48)])
        for _ in range(5):
            mixed = steps.step([(0, 60, 16), (1, 60, 16), (2, 0, 48)])
            assert np.isfinite(mixed).all()
            assert np.array_equal(mixed[:32], decoding), "decoding rows beside a prompt chunk differ from the same rows alone"
            # the prompt's rows: the tiled kernel sums in float32 where the one-row kernel keeps
            # float16 (0.13 logits apart on average here, up to 2), the same choices
            assert float(np.abs(mixed[32:] - prompt).mean()) < 0.5
            assert (mixed[32:].argmax(axis=1) == prompt.argmax(axis=1)).mean() >= 0.9
            assert np.array_equal(mixed, first), "the same step gave other logits"
    finally:
        steps.close()
