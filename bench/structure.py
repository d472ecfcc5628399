"""Structured output against its baselines, in the same run: one command, both figures, the ratio.

    .venv/bin/python bench/structure.py [--rounds 2] [--cases mask,extract,list] [--model PATH]
                                        [--llama-server PATH]

One engine with the node's speculation controller (prompt lookup and Il Suggeritore; the
Palimpsest left out so nothing is remembered between the baseline and the measured run) serves
every case. Greedy; tokens/s are generated tokens over wall time. Every series repeats one
prompt after a warm-up request, so each finds the prompt resident in its slot (the engine's
default) and its wall time is the decode and the prompt's last token.

  mask     per-token cost of the grammar along a real constrained answer (the 8-field schema):
           llguidance's single-token check (what sampling does first), its whole-vocabulary
           mask, its forced tokens, and llama.cpp's own grammar sampler judging the whole
           262,144-token vocabulary; each p50/p99 against the measured decode step, with the
           compile time of each engine.
  extract  JSON extraction with an 8-field schema over a document: constrained output (compact
           JSON) with jump-forward (tokens the grammar admits alone taken without logits) and
           Il Suggeritore against unconstrained decoding of the same length (end of generation
           banned, speculation off), and the same constrained request asking for logprobs
           (every token's row computed: nothing jumped, forced tokens verified as drafts); and, when a llama.cpp server binary is found
           (bench/llama_server.py: --llama-server, $REAME_LLAMA_SERVER or the benches' build),
           against its grammar sampler on the same schema and prompt, run with the node's
           kernels: with a grammar that admits compact JSON only (as ours), and with its own
           json_schema conversion (whitespace allowed, so more tokens). Every series, ours and
           its, is timed alike: one warm-up request, then --rounds timed ones, the fastest kept,
           each the request's wall time, the prompt cached on both sides (ours resident in its
           slot, the peer's by `cache_prompt`); each is reported per answer and per token, and
           the ratios are given both ways.
  list     a fresh 12-item numbered list, no grammar: form rules on against speculation off.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench import llama_server  # noqa: E402
from bench.host import print_header  # noqa: E402
from bench.offline_model import default_model  # noqa: E402

DOCUMENT = (
    "New starter record. Maria Keane joined Dunmore Supplies Ltd on 3 March 2025 as senior accounts clerk in "
    "the finance department of the Ashby office, 12 Mill Lane. She is 41 years old, was born in Cork, Ireland, "
    "and can be reached at maria.keane@dunmore.example or on 01632 960 118. Her manager is Tom Harlow. "
    "Her starting salary is 34,500 pounds a year and she works full time."
)
SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string"}, "age": {"type": "integer", "minimum": 16, "maximum": 100},
        "employer": {"type": "string"}, "job_title": {"type": "string"},
        "department": {"type": "string"}, "email": {"type": "string"},
        "phone": {"type": "string"}, "manager": {"type": "string"},
    },
    "required": ["name", "age", "employer", "job_title", "department", "email", "phone", "manager"],
    "additionalProperties": False,
}
EXTRACT_PROMPT = f"Document:\n{DOCUMENT}\n\nThe person in the document as a JSON record:\n"
# The base model names distinct countries here (fruit made it repeat one item, which turned the
# case into prompt lookup's); none of them but the first is in the prompt.
LIST_PROMPT = "The countries of Europe, as a numbered list:\n1. Albania\n2."
LIST_TOKENS = 60


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q / 100 * len(ordered)))]


def load() -> str:
    return f"load {os.getloadavg()[0]:.1f}"


def make_engine(model: Path):
    from node.engine.engine import Engine, EngineConfig
    from node.speculative.controller import Controller, ControllerConfig
    from node.speculative.format import Suggeritore
    from node.speculative.lookup import PromptLookup

    lookup = PromptLookup()
    controller = Controller([lookup, *Suggeritore(lookup=lookup).sources()], ControllerConfig(max_draft=16))
    engine = Engine(EngineConfig(model_path=model, n_ctx=4096, n_parallel=4, max_draft=16, speculator=controller))
    controller.bind_vocabulary(engine.token_piece, lambda text: engine.tokenize(text, add_bos=False, special=False))
    return engine, controller


def run(engine, prompt: str, tokens: int, *, speculation: bool, grammar=None, ban_eog: bool = False,
        logprobs: int | None = None):
    """(tokens, seconds, text, decode steps) of one greedy generation."""
    from node.engine.types import GenerationRequest, SamplingParams

    bias = {t: float("-inf") for t in engine.model_info.eog_tokens} if ban_eog else {}
    request = GenerationRequest(tuple(engine.tokenize(prompt)), max_tokens=tokens, speculation=speculation,
                                logprobs=logprobs,
                                sampling=SamplingParams(temperature=0.0, logit_bias=bias, grammar=grammar))
    steps = engine.stats()["steps"]
    start = time.perf_counter()
    events = list(engine.submit(request).iter_sync(timeout=1800))
    seconds = time.perf_counter() - start
    text = "".join(e.text for e in events[:-1])
    return events[-1].completion_tokens, seconds, text, engine.stats()["steps"] - steps


def schema_spec():
    from node.engine.types import GrammarSpec
    from node.serving.structure import canonical_json

    return GrammarSpec("json_schema", canonical_json(SCHEMA))


def case_mask(engine, controller, args) -> list[str]:
    import ctypes

    import numpy as np

    import llama_cpp as ll
    from llama_cpp.llama_grammar import json_schema_to_gbnf

    spec = schema_spec()
    started = time.perf_counter()
    engine.grammars.tokenizer()
    vocab_s = time.perf_counter() - started
    compiled = engine.prepare_grammar(spec)
    n, seconds, text, steps = run(engine, EXTRACT_PROMPT, 160, speculation=False, grammar=spec)
    step_ms = seconds / max(1, steps) * 1000
    tokens = list(engine.tokenize(text, add_bos=False, special=False))
    matcher = compiled.matcher()
    check, mask, forced = [], [], []
    row = np.zeros(engine.model_info.n_vocab, dtype=np.float32)
    for token in tokens:
        t0 = time.perf_counter()
        matcher.allows(token)
        t1 = time.perf_counter()
        matcher.masked(row)
        t2 = time.perf_counter()
        matcher.forced()
        t3 = time.perf_counter()
        if not matcher.allows(token):
            break
        matcher.accept(token)
        check.append((t1 - t0) * 1e6)
        mask.append((t2 - t1) * 1e6)
        forced.append((t3 - t2) * 1e6)
    # llama.cpp's grammar sampler over the whole vocabulary, on the same tokens
    gbnf = json_schema_to_gbnf(json.dumps(SCHEMA))
    started = time.perf_counter()
    sampler = ll.llama_sampler_init_grammar(engine.vocab, gbnf.encode(), b"root")
    gbnf_compile_ms = (time.perf_counter() - started) * 1000
    dtype = np.dtype([("id", np.int32), ("logit", np.float32), ("p", np.float32)], align=True)
    data = np.zeros(engine.model_info.n_vocab, dtype=dtype)
    full = []
    for token in tokens[:24]:  # each call costs tens of milliseconds: a prefix of the answer is enough
        data["id"] = np.arange(len(data))
        data["logit"] = 0.0
        array = ll.llama_token_data_array(data=data.ctypes.data_as(ll.llama_token_data_p), size=len(data),
                                          selected=-1, sorted=False)
        t0 = time.perf_counter()
        ll.llama_sampler_apply(sampler, ctypes.byref(array))
        full.append((time.perf_counter() - t0) * 1e6)
        ll.llama_sampler_accept(sampler, token)
    ll.llama_sampler_free(sampler)

    outlines = outlines_masks(engine, tokens)

    def line(name: str, values: list[float]) -> str:
        return (f"  {name:44s} p50 {pct(values, 50):8.1f} us  p99 {pct(values, 99):8.1f} us  "
                f"({pct(values, 50) / 10 / step_ms:5.2f}% / {pct(values, 99) / 10 / step_ms:5.2f}% of a step)")

    return [
        f"mask cost along a {len(tokens)}-token answer; decode step {step_ms:.1f} ms (measured, {load()})",
        f"  compile: llguidance vocabulary {vocab_s:.2f} s once per engine, schema {compiled.compile_s * 1000:.1f} ms "
        f"once per schema; llama.cpp grammar {gbnf_compile_ms:.1f} ms",
        line("llguidance: check the sampled token", check),
        line("llguidance: whole-vocabulary mask + apply", mask),
        line("llguidance: forced tokens", forced),
        line("llama.cpp grammar sampler, whole vocabulary", full),
        *([f"  outlines-core: vocabulary {outlines[0]:.1f} s, index of this schema {outlines[1]:.1f} s (per schema)",
           line("outlines-core: whole-vocabulary mask", outlines[2])] if outlines else
          ["  outlines-core: not installed (pip install outlines-core); skipped"]),
        f"  ratio (llama.cpp full mask / llguidance sample-first check, p50): {pct(full, 50) / pct(check, 50):.0f}x; "
        f"(/ llguidance full mask, p50): {pct(full, 50) / pct(mask, 50):.0f}x",
    ]


def outlines_masks(engine, tokens: list[int]) -> tuple[float, float, list[float]] | None:
    """outlines-core on the same schema and tokens, when it is installed: (vocabulary s, index s, mask us)."""
    try:
        import outlines_core
    except ImportError:
        return None
    import numpy as np

    started = time.perf_counter()
    pieces: dict[str, list[int]] = {}
    eos = engine.model_info.eos if engine.model_info.eos is not None else 1
    for token in range(engine.model_info.n_vocab):
        try:
            piece = engine.token_piece(token).decode("utf-8")
        except UnicodeDecodeError:
            continue  # byte tokens: outlines-core takes text pieces
        if piece and token != eos and token not in engine.model_info.eog_tokens:
            pieces.setdefault(piece, []).append(token)
    vocabulary = outlines_core.Vocabulary(eos, pieces)
    vocab_s = time.perf_counter() - started
    started = time.perf_counter()
    regex = outlines_core.json_schema.build_regex_from_schema(json.dumps(SCHEMA))
    index = outlines_core.Index(regex, vocabulary)
    index_s = time.perf_counter() - started
    guide = outlines_core.Guide(index)
    words = np.zeros((engine.model_info.n_vocab + 31) // 32, dtype=np.int32)
    masks = []
    for token in tokens:
        t0 = time.perf_counter()
        guide.write_mask_into(words.ctypes.data, words.size, 4)
        masks.append((time.perf_counter() - t0) * 1e6)
        try:
            guide.advance(token)
        except Exception:  # its regex tokenizes the answer differently: stop at the first disagreement
            break
    return vocab_s, index_s, masks


def compact_gbnf(schema: dict) -> str:
    """The schema as a GBNF grammar that admits compact JSON only, as the node's grammar does
    (llguidance without free whitespace): llama.cpp's converter with its optional-space rule
    emptied."""
    from llama_cpp.llama_grammar import json_schema_to_gbnf

    lines = json_schema_to_gbnf(json.dumps(schema)).splitlines()
    spaces = [i for i, text in enumerate(lines) if text.startswith("space ::=")]
    if len(spaces) != 1:
        raise ValueError(f"expected one space rule in the converted grammar, found {len(spaces)}")
    lines[spaces[0]] = 'space ::= ""'
    return "\n".join(lines) + "\n"


def best_of(attempt, rounds: int):
    """One untimed warm-up of `attempt` (it returns (tokens, seconds, ...)), then `rounds` timed
    runs; the fastest run. Every series of this case, ours and the peer's, is timed this way."""
    attempt()
    return min((attempt() for _ in range(rounds)), key=lambda result: result[1])


def peer_completion(url: str, body: dict) -> tuple[int, float, str]:
    """(tokens generated, wall seconds, text) of one request to the llama.cpp server."""
    request = urllib.request.Request(f"{url}/completion", json.dumps(body).encode(),
                                     {"Content-Type": "application/json"})
    started = time.perf_counter()
    with urllib.request.urlopen(request, timeout=1800) as reply:
        answer = json.loads(reply.read())
    seconds = time.perf_counter() - started
    return int(answer.get("timings", {}).get("predicted_n", 0)), seconds, str(answer.get("content", ""))


def series(name: str, result) -> str:
    tokens, seconds = result[0], result[1]
    return (f"  {name:52s} {tokens:4d} tokens  per answer {seconds * 1000:8.1f} ms  "
            f"per token {seconds * 1000 / max(1, tokens):6.2f} ms  ({tokens / seconds:6.1f} tok/s)")


def body_row_ms(engine, repeats: int = 5) -> float:
    """Milliseconds one more token without logits adds to a one-token step (the transformer body
    alone), measured on a context of its own with the engine's kernels: median of 1 + 8 tokens
    with logits on the last only, less a one-token step, over 8. It decodes on a thread that ends
    with it: OpenMP's workers live as long as the thread that decoded, and next to the engine's
    they would outnumber the cores and slow every later step (node/engine/compute_threads.py)."""
    import concurrent.futures

    with concurrent.futures.ThreadPoolExecutor(1) as alone:
        return alone.submit(_body_row_ms, engine, repeats).result()


def _body_row_ms(engine, repeats: int) -> float:
    import statistics

    from node.engine.llama import LlamaContext, LlamaModel, TokenBatch

    model = LlamaModel(engine.config.model_path, extra_buffers=engine.kernels.extra_buffers)
    ctx = LlamaContext(model, n_ctx=1024, n_batch=64, n_ubatch=64, n_seq_max=1, n_threads=engine.stats()["threads"],
                       max_outputs_per_seq=1)
    try:
        batch = TokenBatch(64)
        tokens = model.tokenize(EXTRACT_PROMPT)[:48]
        batch.add(tokens, 0, 0, logits="last")
        ctx.decode(batch)
        times: dict[int, list[float]] = {1: [], 9: []}
        for _ in range(repeats):
            for n in times:
                batch.clear()
                batch.add(tokens[:n], len(tokens), 0, logits="last")
                t0 = time.perf_counter()
                ctx.decode(batch)
                times[n].append(time.perf_counter() - t0)
                ctx.seq_rm(0, len(tokens), -1)
        return max(0.0, (statistics.median(times[9]) - statistics.median(times[1])) * 1000 / 8)
    finally:
        ctx.close()
        model.close()


def forced_count(engine, spec, text: str) -> int:
    """Tokens of the answer no logits can change (node/engine/grammar.py `Matcher.only`: forced
    tokens and the end of a complete output), walking the grammar along it."""
    matcher = engine.prepare_grammar(spec).matcher()
    forced = 0
    for token in engine.tokenize(text, add_bos=False, special=False):
        forced += matcher.only() is not None
        matcher.accept(token)
    return forced + (matcher.only() is not None)


def case_extract(engine, controller, args) -> list[str]:
    """Ours and the peer's answers timed alike (`best_of`), each request's wall time with the
    prompt cached on both sides after the warm-up, reported per answer and per token."""
    spec = schema_spec()
    engine.prepare_grammar(spec)
    n = run(engine, EXTRACT_PROMPT, 200, speculation=False, grammar=spec)[0]  # the answer's length
    plain = best_of(lambda: run(engine, EXTRACT_PROMPT, n, speculation=False, ban_eog=True), args.rounds)
    jumped = engine.stats()["jumped_tokens"]
    ours = best_of(lambda: run(engine, EXTRACT_PROMPT, 200, speculation=True, grammar=spec), args.rounds)
    jumped = (engine.stats()["jumped_tokens"] - jumped) // (args.rounds + 1)
    # logprobs need every token's row: the engine jumps nothing, forced tokens are drafts verified with logits
    rows = best_of(lambda: run(engine, EXTRACT_PROMPT, 200, speculation=True, grammar=spec, logprobs=0), args.rounds)
    answer = ours[2]
    json.loads(answer)
    stats = controller.stats.snapshot()
    kept = {name: stats[name]["accepted"] for name in ("grammar", "grammar.copy", "grammar.quote", "lookup")}
    line = controller.costs.line()
    full_ms = line.seconds(1) * 1000
    body_ms = body_row_ms(engine)
    n_forced = forced_count(engine, spec, answer)
    share = n_forced / max(1, ours[0])
    ceiling = full_ms / ((1 - share) * full_ms + share * body_ms)
    lines = [f"extract 8 fields: warm-up + best of {args.rounds} timed requests for every series, wall time "
             f"with the prompt cached  {load()}",
             f"  cost line: {line.per_step * 1000:.1f} ms per step + {line.per_token * 1000:.2f} ms per token with "
             f"logits (a row is {line.row_share:.2f} of a one-token step)",
             series("reame unconstrained (same length, speculation off)", plain),
             series("reame constrained, every token's row (logprobs: no jump)", rows),
             series("reame constrained + jump-forward + Il Suggeritore", ours),
             f"  same answer with and without jump-forward: {rows[2] == ours[2]}; {jumped} tokens jumped per answer",
             f"  ceiling from forced tokens alone: {ceiling:4.2f}x ({n_forced} of {ours[0]} tokens forced, "
             f"{share:.2f}; a row without logits {body_ms:.2f} ms against a one-token step {full_ms:.1f} ms; prefill "
             f"left out, drafts kept can add to it)",
             f"  constrained + jump-forward / unconstrained: {plain[1] / ours[1] * ours[0] / plain[0]:5.2f}x per "
             f"token (target >= 1.5x); without jumping {plain[1] / rows[1] * rows[0] / plain[0]:5.2f}x; "
             f"draft tokens kept {kept}"]
    binary = llama_server.find_binary(args.llama_server)
    if binary is None:
        lines.append("  llama.cpp server: no binary found (--llama-server, or run bench/versus_llama_server.py once "
                     "to build it); comparison skipped")
    else:
        flags = ["-c", "4096", "-np", "1", *llama_server.kernel_flags(engine.kernels.extra_buffers)]
        lines.append(f"  llama.cpp server {binary} {' '.join(flags)}")
        lines.append(llama_server.kernel_line(engine.kernels.extra_buffers))
        base = {"prompt": EXTRACT_PROMPT, "temperature": 0, "cache_prompt": True}  # as ours finds it resident
        with llama_server.running(binary, engine.config.model_path, flags) as url:
            peer_plain = best_of(lambda: peer_completion(url, {**base, "n_predict": n, "ignore_eos": True}),
                                 args.rounds)
            compact = best_of(lambda: peer_completion(url, {**base, "n_predict": 200,
                                                              "grammar": compact_gbnf(SCHEMA)}), args.rounds)
            spaced = best_of(lambda: peer_completion(url, {**base, "n_predict": 200, "json_schema": SCHEMA}),
                             args.rounds)
        lines += [series("llama.cpp unconstrained (same length)", peer_plain),
                  series("llama.cpp grammar sampler, compact JSON", compact),
                  series("llama.cpp grammar sampler, its json_schema (whitespace)", spaced),
                  f"  ours / its grammar, compact JSON: per answer {compact[1] / ours[1]:5.2f}x faster, per token "
                  f"{compact[1] / compact[0] / (ours[1] / ours[0]):5.2f}x faster; against its json_schema answer "
                  f"({spaced[0]} tokens): per answer {spaced[1] / ours[1]:5.2f}x, per token "
                  f"{spaced[1] / spaced[0] / (ours[1] / ours[0]):5.2f}x  {load()}",
                  f"  its compact answer: {compact[2]}"]
    lines.append(f"  answer: {answer}")
    return lines


def case_list(engine, controller, args) -> list[str]:
    best_plain = best_on = 0.0
    text = ""
    for _ in range(args.rounds):
        n, seconds, _, _ = run(engine, LIST_PROMPT, LIST_TOKENS, speculation=False, ban_eog=True)
        best_plain = max(best_plain, n / seconds)
        n, seconds, text, _ = run(engine, LIST_PROMPT, LIST_TOKENS, speculation=True, ban_eog=True)
        best_on = max(best_on, n / seconds)
    stats = controller.stats.snapshot()
    rules = {name: f"{stats[name]['accepted']}/{stats[name]['drafted']}" for name in stats if name.startswith("form.")}
    return [f"12-item list, no grammar ({LIST_TOKENS} tokens)  off {best_plain:6.1f} tok/s  on {best_on:6.1f} tok/s  "
            f"{best_on / best_plain:5.2f}x  (target >= 2.0x)  kept/drafted {rules}  lookup "
            f"{stats['lookup']['accepted']}/{stats['lookup']['drafted']}  {load()}",
            f"  {distinct_items(text)} distinct items; text: " + json.dumps(text[:200])]


def distinct_items(text: str) -> int:
    """How many different items the generated list holds (a repeated item makes drafting easy)."""
    items = {line.split(". ", 1)[-1].strip() for line in ("2." + text).splitlines() if line.strip()}
    return len(items)


CASES = {"mask": case_mask, "extract": case_extract, "list": case_list}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--cases", default=",".join(CASES))
    parser.add_argument("--model", type=Path, default=None)
    parser.add_argument("--llama-server", default=None)
    args = parser.parse_args()
    print_header(getattr(args, 'model', None), threads=getattr(args, 'threads', None))
    model = args.model or default_model()
    engine, controller = make_engine(model)
    print(f"bench/structure.py on {model.name}; the machine is shared: {load()} at start "
          f"({shutil.which('uptime') and subprocess.run(['uptime'], capture_output=True, text=True).stdout.strip()})",
          flush=True)
    try:
        for name in args.cases.split(","):
            for line in CASES[name](engine, controller, args):
                print(line, flush=True)
    finally:
        engine.close()


if __name__ == "__main__":
    main()
