"""Per-token sampling cost at Gemma's full vocabulary (262,144): numpy against llama.cpp.

    .venv/bin/python bench/sampling.py [--iterations 300] [--model PATH]

Real logits: one decode of a prompt, then the same row sampled repeatedly. Settings:
temperature 0.8, top_k 40, top_p 0.95, min_p 0.05, repeat penalty 1.1 with frequency and
presence penalties over the last 64 tokens. The baseline is llama.cpp's own sampler chain
with the same stages (penalties, top_k, top_p, min_p, temp, dist) through
llama_sampler_sample, which builds a candidate array over the whole vocabulary per token.
Also printed: greedy argmax, and top_k disabled (top_p over the whole vocabulary).

Then rows as a server meets them, read from memory rather than cache: 64 rows of logits from
one decode of 64 tokens (64 MiB), a 64 MiB buffer written between passes, each row sampled
once a pass. There the column maxima of top_k's bound (`group_maxima`, by halving) are timed
against numpy's reduction over the 64-row view (the same numbers), and a whole sampled choice
against greedy's argmax.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.host import print_header  # noqa: E402
from bench.offline_model import default_model  # noqa: E402

PROMPT = "The old lighthouse keeper looked out over the water and"


def per_call_ms(fn, iterations: int) -> float:
    fn()
    start = time.perf_counter()
    for _ in range(iterations):
        fn()
    return (time.perf_counter() - start) * 1000 / iterations


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--iterations", type=int, default=300)
    parser.add_argument("--model", type=Path, default=None)
    args = parser.parse_args()
    print_header(getattr(args, 'model', None), threads=getattr(args, 'threads', None))

    import llama_cpp as ll

    from node.engine.llama import LlamaContext, LlamaModel, TokenBatch
    from node.engine.sampling import TokenSampler
    from node.engine.types import SamplingParams

    model = LlamaModel(args.model or default_model())
    ctx = LlamaContext(model, n_ctx=512, n_batch=512, n_ubatch=512, n_seq_max=1, n_threads=os.cpu_count() or 1,
                       max_outputs_per_seq=64)
    prompt = model.tokenize(PROMPT)
    batch = TokenBatch(512)
    batch.add(prompt, 0, 0)
    if ctx.decode(batch) != 0:
        raise SystemExit("decode failed")
    row = ctx.logits(1)[0]
    history = (prompt * 8)[-64:]
    full = SamplingParams(temperature=0.8, top_k=40, top_p=0.95, min_p=0.05, repeat_penalty=1.1,
                          repeat_last_n=64, frequency_penalty=0.1, presence_penalty=0.1, seed=1)

    ours = TokenSampler(full, model.n_vocab)
    greedy = TokenSampler(SamplingParams(temperature=0.0), model.n_vocab)
    no_top_k = TokenSampler(SamplingParams(temperature=0.8, top_k=0, top_p=0.95, min_p=0.0, seed=1), model.n_vocab)

    chain = ll.llama_sampler_chain_init(ll.llama_sampler_chain_default_params())
    for stage in (ll.llama_sampler_init_penalties(model.n_vocab, 64, 1.1, 0.1, 0.1), ll.llama_sampler_init_top_k(40),
                  ll.llama_sampler_init_top_p(0.95, 1), ll.llama_sampler_init_min_p(0.05, 1),
                  ll.llama_sampler_init_temp(0.8), ll.llama_sampler_init_dist(1)):
        ll.llama_sampler_chain_add(chain, stage)
    for token in history:
        ll.llama_sampler_accept(chain, token)
    raw_ctx = ctx._ptr  # the bench reaches into the wrapper to drive llama.cpp's sampler on the same logits

    t_ours = per_call_ms(lambda: ours.choose(row, history), args.iterations)
    t_llama = per_call_ms(lambda: ll.llama_sampler_sample(chain, raw_ctx, -1), args.iterations)
    t_greedy = per_call_ms(lambda: greedy.choose(row, history), args.iterations)
    t_no_top_k = per_call_ms(lambda: no_top_k.choose(row, history), args.iterations)
    ll.llama_sampler_free(chain)
    cold = rows_from_memory(ctx, batch, model.tokenize(PROMPT * 12)[:64], ours, greedy, history)
    ctx.close()
    model.close()

    print(f"load average during the run: {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores")
    print(f"per-token sampling cost, vocabulary {model.n_vocab}, {args.iterations} iterations:")
    print(f"  llama.cpp sampler chain (penalties, top_k 40, top_p, min_p, temp)  {t_llama:7.3f} ms")
    print(f"  reame numpy sampler, same settings                              {t_ours:7.3f} ms")
    print(f"  ratio llama.cpp / reame                                         {t_llama / t_ours:7.2f}x")
    print(f"  reame greedy (argmax)                                           {t_greedy:7.3f} ms")
    print(f"  reame top_p 0.95 without top_k                                  {t_no_top_k:7.3f} ms")
    halving, reduction, sampled, argmax = cold
    print("rows read from memory (64 rows of one decode, caches flushed between passes, best of 5 passes):")
    print(f"  top_k's column maxima by halving (group_maxima)                 {halving * 1000:7.3f} ms")
    print(f"  the same by numpy's reduction over 64 rows                      {reduction * 1000:7.3f} ms")
    print(f"  ratio reduction / halving                                       {reduction / halving:7.2f}x")
    print(f"  reame sampled choice, settings above                            {sampled * 1000:7.3f} ms")
    print(f"  reame greedy (argmax)                                           {argmax * 1000:7.3f} ms")
    return 0


def rows_from_memory(ctx, batch, tokens, sampler, greedy, history) -> tuple[float, float, float, float]:
    """Seconds a row, best of 5 passes over rows that are not in cache: (column maxima by halving,
    by numpy's reduction, a sampled choice, a greedy choice)."""
    import numpy as np

    from node.engine.sampling import BLOCK, group_maxima

    batch.clear()
    batch.add(tokens, 0, 0, logits="all")
    ctx.seq_rm(0)
    if ctx.decode(batch) != 0:
        raise SystemExit("decode failed")
    rows = ctx.logits(len(tokens))
    views = [row.reshape(BLOCK, len(row) // BLOCK) for row in rows]
    for view in views:
        assert np.array_equal(group_maxima(view), np.maximum.reduce(view, axis=0))
    flush = np.zeros(64 << 20, dtype=np.uint8)

    def best(fn, items) -> float:
        times = []
        for _ in range(5):
            np.add(flush, 1, out=flush)  # evicts the rows from every cache level
            start = time.perf_counter()
            for item in items:
                fn(item)
            times.append((time.perf_counter() - start) / len(items))
        return min(times)

    return (best(group_maxima, views), best(lambda v: np.maximum.reduce(v, axis=0), views),
            best(lambda r: sampler.choose(r, history), rows), best(lambda r: greedy.choose(r, history), rows))


if __name__ == "__main__":
    sys.exit(main())
