"""Single-stream decode speed: through the engine against a raw llama-cpp-python loop.

    .venv/bin/python bench/decode.py [--tokens 128] [--rounds 3] [--model PATH]

Both run in this process on the same model file with the same context settings (threads,
n_ctx, flash attention left to llama.cpp): the raw loop is llama_cpp's low-level API alone
(llama_batch_get_one, llama_decode, numpy argmax over llama_get_logits_ith), the floor
any Python wrapper can reach. Both decode greedily for --tokens tokens after the prompt. The engine run is a greedy request through Engine.submit,
its scheduler thread, sampler, detokenizer and event queue. Rounds alternate raw and
engine so machine noise hits both; the best round of each is compared.
Target: engine >= 0.95x raw.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.host import print_header  # noqa: E402
from bench.offline_model import default_model  # noqa: E402

PROMPT = "Count from one to two hundred, in words, separated by commas: one, two, three,"


def raw_decode(model_path: Path, prompt: str, n_tokens: int, n_ctx: int, threads: int) -> float:
    """tok/s of a bare llama-cpp-python greedy loop (model and context made here, not timed)."""
    import llama_cpp as ll

    from node.engine.llama import backend

    backend()
    mparams = ll.llama_model_default_params()
    model = ll.llama_model_load_from_file(str(model_path).encode(), mparams)
    cparams = ll.llama_context_default_params()
    cparams.n_ctx, cparams.n_batch, cparams.n_threads, cparams.n_threads_batch = n_ctx, 512, threads, threads
    cparams.swa_full = False  # as the engine's context (llama.cpp's default is the full-size cache)
    ctx = ll.llama_init_from_model(model, cparams)
    vocab = ll.llama_model_get_vocab(model)
    n_vocab = ll.llama_vocab_n_tokens(vocab)
    data = prompt.encode()
    buf = (ll.llama_token * (len(data) + 8))()
    n = ll.llama_tokenize(vocab, data, len(data), buf, len(buf), True, True)
    ll.llama_decode(ctx, ll.llama_batch_get_one(buf, n))
    token = (ll.llama_token * 1)()
    start = time.perf_counter()
    for _ in range(n_tokens):
        logits = np.ctypeslib.as_array(ll.llama_get_logits_ith(ctx, -1), shape=(n_vocab,))
        token[0] = int(np.argmax(logits))
        if ll.llama_decode(ctx, ll.llama_batch_get_one(token, 1)) != 0:
            raise RuntimeError("raw llama_decode failed")
    elapsed = time.perf_counter() - start
    ll.llama_free(ctx)
    ll.llama_model_free(model)
    return n_tokens / elapsed


def engine_decode(engine, prompt: str, n_tokens: int) -> float:
    from node.engine.types import GenerationRequest, SamplingParams

    # plain greedy, as the raw loop (the counting prompt runs its full length in practice;
    # an early end-of-generation would only shorten the measured run, not skew tok/s)
    req = GenerationRequest(tuple(engine.tokenize(prompt)), max_tokens=n_tokens,
                            sampling=SamplingParams(temperature=0.0))
    first = None
    for event in engine.submit(req).iter_sync(timeout=600):
        if first is None:
            first = time.perf_counter()  # clock starts at the first token, as the raw loop's does
    elapsed = time.perf_counter() - first
    return (event.completion_tokens - 1) / elapsed


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--model", type=Path, default=None)
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    args = parser.parse_args()
    print_header(getattr(args, 'model', None), threads=getattr(args, 'threads', None))
    model_path = args.model or default_model()

    from node.engine.engine import Engine, EngineConfig

    n_ctx = 1024
    engine = Engine(EngineConfig(model_path=model_path, n_ctx=n_ctx, n_threads=args.threads, n_parallel=1))
    raw, eng = [], []
    start_stats = engine.stats()
    try:
        for r in range(args.rounds):
            raw.append(raw_decode(model_path, PROMPT, args.tokens, n_ctx, args.threads))
            eng.append(engine_decode(engine, PROMPT, args.tokens))
            print(f"round {r + 1}: raw {raw[-1]:6.1f} tok/s   engine {eng[-1]:6.1f} tok/s")
        stats = engine.stats()
    finally:
        engine.close()
    step_ms = stats["step_ms"] - start_stats["step_ms"]
    host_share = 1 - (stats["decode_ms"] - start_stats["decode_ms"]) / step_ms
    best_raw, best_eng = max(raw), max(eng)
    print(f"load average during the run: {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores")
    print(f"single stream, {args.tokens} tokens, {args.threads} threads, best of {args.rounds}:")
    print(f"  raw llama-cpp-python loop  {best_raw:6.1f} tok/s")
    print(f"  reame engine               {best_eng:6.1f} tok/s")
    print(f"  ratio engine/raw           {best_eng / best_raw:6.3f}  (target >= 0.95)")
    print(f"  engine step time outside llama_decode: {host_share:.1%} (the wrapper's own cost, load-independent)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
