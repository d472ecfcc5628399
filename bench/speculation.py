"""Speculative decoding against plain decoding, case by case, in the same run.

    .venv/bin/python bench/speculation.py [--tokens 128] [--rounds 2] [--cases a,b,...] [--model PATH]

One engine with the node's controller (prompt lookup + the Palimpsest, calibrated cost
line) serves every case; each case runs its requests with `speculation=False` (plain
decoding, the baseline) and with speculation, alternating, best round of each, after one
unmeasured plain run that leaves the prompts resident in their slots for both; tokens/s are
generated tokens over wall time. Greedy, end-of-generation
banned so runs have their full length. Greedy outputs are compared: "identical", or where
they first differ (the batch non-invariance of the CPU kernels at a near-tie).

Cases (targets in docs/BENCHMARKS.md):
  repeat    the same request again, L1 not involved (the engine only): the Palimpsest
  fleet     node B with an empty state and a remote ARCA (in-process server on loopback,
            mirrored with ARCA.SINCE) answers a differently worded request over the document
            node A answered; A's answer reached ARCA by ARCA.OBSERVE as the service writes it
  rewrite   prompt lookup: rewrite a 300-token paragraph
  extract   prompt lookup: an extraction quoting the document
  prose     free prose, nothing to match
  users4    4 users on a repetitive mix (aggregate), and on a non-repetitive mix; each with
            its ceilings on the cost line and against the plain run as measured (`PlainRun`)
  nightly   40 classification requests, then 40 new items with the same instruction
  sampled   a seeded sampled request (temperature 0.8) sent again, L1 not involved
  sampled_rewrite  the rewrite at temperature 0.5, seeded
  conclave  a Conclave of 5 (all started, 48 tokens, sampled) against one answer, speculation on
  conclave_start  the node's default Conclave (adaptive start) on the same new requests, with the
            node's start record (node/serving/conclave/start.py) and without it
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Sequence

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.host import print_header  # noqa: E402
from bench.offline_model import default_model  # noqa: E402
from bench.text_oracle import SOURCES_MIN_MATCH, oracle_steps  # noqa: E402

if TYPE_CHECKING:
    from node.speculative.costs import CostCurve

PARAGRAPH = (
    "The harbour of Vellmar was built in the last years of the old kingdom, when the river still carried "
    "timber from the northern forests down to the sea. Its first quay was a wall of rough granite, laid "
    "without mortar by fishermen who had no money for masons, and the stones can still be seen at low tide "
    "below the customs house. In the century that followed, the town grew rich on salt and wool. Merchants "
    "built tall houses along the water with cellars that flooded every spring, and a guild of pilots was "
    "founded to bring the heavy ships through the sandbanks at the mouth of the river. The pilots kept a "
    "lamp burning in the tower of Saint Ives, and their rules, written in a small brown book, are kept in "
    "the town library. When the railway arrived, the harbour declined. The salt trade moved south, the "
    "pilots' guild was dissolved, and the tall houses were divided into flats. Today the harbour serves "
    "small fishing boats and the ferry to the islands, which leaves twice a day in summer and once a day "
    "in winter, weather permitting."
)
DOCUMENT = (
    "Invoice 4471 from Dunmore Supplies Ltd, dated 3 March 2025, to Harlow Bakery, 12 Mill Lane, Ashby. "
    "Items: 40 kg of wholemeal flour at 1.20 per kg, 12 boxes of dried yeast at 3.50 per box, 6 sacks of "
    "rye flour at 18.00 per sack. Delivery charge 15.00. Total due 234.00, payable within 30 days to "
    "account 20-44-18 0039 1122. Contact: Maria Keane, accounts department, telephone 01632 960 118."
)
PROSE = ("Write a story about a young woman who travels to a city she has never seen:",
         "Describe the sounds of a forest at night:", "Explain how bread rises in the oven:",
         "Tell me about the life of a lighthouse keeper in winter:")
# the non-repetitive mix's later rounds: new requests each round, as the Palimpsest knows the earlier answers
MORE_PROSE = (("Describe a market town on the morning of a fair:", "Explain why the sea is salty:",
               "Write a letter from a soldier to his sister:", "Tell me how a violin is made:"),
              ("Describe the first snow of the year in a mountain village:", "Explain how bees find flowers:",
               "Write a fable about a fox and a heron:", "Tell me about the work of a night nurse:"),
              ("Describe an old railway station at dawn:", "Explain how a river carves a valley:",
               "Write a speech for the opening of a small library:", "Tell me about a day in the life of a potter:"),
              ("Describe the smell of a bakery in winter:", "Explain why leaves change colour in autumn:",
               "Write a story about two brothers who build a boat:", "Tell me how cheese is made in the Alps:"),
              ("Describe a thunderstorm over the sea:", "Explain how a clock keeps time:",
               "Write a diary entry of a girl on her first day at a new school:",
               "Tell me about the history of the bicycle:"))
REVIEWS = ("The soup was cold and the waiter ignored us.", "Lovely staff, quick service, will come back.",
           "The room smelled of smoke and the bed was broken.", "Best pizza I have had in years.",
           "Overpriced and bland, not worth the wait.", "A charming little place with great coffee.",
           "Noisy, dirty and slow.", "Friendly owner and fresh bread every morning.")
INSTRUCTION = ("Classify the sentiment of the customer review as positive or negative, and give a one-line "
               "reason.\nAnswer in the form 'Sentiment: <positive|negative>. Reason: <reason>.'\n")


def greedy(engine, text: str, tokens: int, speculation: bool, temperature: float = 0.0):
    """The case's request: greedy, or seeded sampling at `temperature` (the same seed every time)."""
    from node.engine.types import GenerationRequest, SamplingParams

    ban = {t: float("-inf") for t in engine.model_info.eog_tokens}
    return GenerationRequest(tuple(engine.tokenize(text)), max_tokens=tokens, speculation=speculation,
                             sampling=SamplingParams(temperature=temperature, logit_bias=ban,
                                                     seed=SEED if temperature > 0 else None))


SEED = 2026


def timed(engine, texts: list[str], tokens: int, speculation: bool, concurrent: bool = False,
          temperature: float = 0.0, finals: list | None = None, walls: list | None = None):
    """(tokens per second, outputs) for the texts, one after another or all at once; each
    request's last event (`Finished`) is added to `finals` when given, the run's wall seconds to
    `walls`."""
    start = time.perf_counter()
    ends, requests = [], []
    if concurrent:
        requests = [greedy(engine, t, tokens, speculation, temperature) for t in texts]
        handles = [engine.submit(request) for request in requests]
        ends = [list(h.iter_sync(timeout=1800))[-1] for h in handles]
    else:
        for t in texts:
            requests.append(greedy(engine, t, tokens, speculation, temperature))
            ends.append(list(engine.submit(requests[-1]).iter_sync(timeout=1800))[-1])
    wall = time.perf_counter() - start
    if walls is not None:
        walls.append(wall)
    if speculation:  # what the Palimpsest learned: the prompts and answers of speculative requests
        LEARNED.extend((*r.prompt_tokens, *end.generated) for r, end in zip(requests, ends))
    if finals is not None:
        finals.extend(ends)
    outs = [end.generated for end in ends]
    return _generated(outs) / wall, outs


def fewest_seconds(line, steps: int, rows: int, live: Sequence[int] = ()) -> float:
    """The least time `rows` rows with logits take in `steps` or more decode steps on the cost
    line (staircase and lone row included), each step at least one row: a floor under every
    schedule that does that work, whatever rows it gives to whom.

    `live`: the fewest steps each of the sequences sharing the steps decodes in. A sequence has
    a row in every step until it ends, so step t carries at least as many rows as there are
    sequences with t steps or more. Without it, the floor may put one row in most steps and the
    rest in a few, which concurrent sequences can never do: 4 of them sharing 44 steps would be
    held to 1.25x plain decoding's time instead of 1.04x."""
    import numpy as np

    cost = np.array([line.seconds(r) for r in range(rows + 1)])
    cost[0] = np.inf
    best, reach = np.inf, np.full(rows + 1, np.inf)
    reach[0] = 0.0  # reach[m]: the least time of the steps so far holding m rows in all
    for taken in range(1, rows + 1):
        least = max(1, sum(1 for s in live if s >= taken))
        shifted = np.full((rows + 1, rows + 1), np.inf)
        for r in range(least, rows + 1):
            shifted[r:, r] = reach[:rows + 1 - r] + cost[r]
        reach = shifted.min(axis=1)
        if taken >= steps:
            best = min(best, reach[rows])
    return float(best)


LEARNED: list[tuple[int, ...]] = []  # prompt and answer of every speculative request so far (`timed`)


def plain_seconds(line, plain: list) -> float:
    """The plain run of concurrent requests on the line: all in one batch, a step per token
    after the first, rows as many as requests still going."""
    lengths = [len(end.generated) - 1 for end in plain]
    return sum(line.seconds(sum(1 for n in lengths if n > j)) for j in range(max(lengths)))


def text_ceiling(line, plain: list, prompts: list, learned: list, min_match: int = 1,
                 plain_run: PlainRun | None = None) -> tuple[float, int]:
    """What the text allows concurrent requests against their plain run, on the line: the
    fewest steps a source drafting from text seen takes over each answer plain decoding wrote
    (bench/text_oracle.py; `learned`: what the Palimpsest held before; `min_match`: the
    fewest context tokens a draft's occurrence must match), the run as many as the answer
    needing most, each step a row for every answer still going, a row for every token after
    each first; (the ratio, those steps). With `plain_run`, the ratio against the plain run as
    measured (`PlainRun.ceiling`)."""
    each = [oracle_steps(p, end.generated, learned, min_match=min_match) for p, end in zip(prompts, plain)]
    rows = sum(len(end.generated) - 1 for end in plain)
    plain_s, floor = plain_seconds(line, plain), fewest_seconds(line, max(each), rows, each)
    if plain_run is None:
        return plain_s / floor, max(each)
    most = max(len(end.generated) - 1 for end in plain)
    return plain_run.ceiling(plain_s, floor, most - max(each)), max(each)


def concurrent_ceiling(line, plain: list, spec: list, plain_run: PlainRun | None = None) -> str:
    """What the cost line allows the speculative run of concurrent requests, against the plain run.

    The plain run, on the line: all requests in one batch, a step per token after the first,
    rows as many as requests still going. The speculative run cannot take fewer steps than the
    request with the most (a step gives a request at most one token beyond what its drafts kept,
    and the steps are one after another), nor fewer rows than tokens after each first one, nor
    fewer rows in a step than requests it took part in: `fewest_seconds` over those. A request
    that drafts nothing holds the whole run to as many steps as plain decoding, so the ceiling
    is then near 1.0x whatever the others keep.

    With `plain_run` (the plain run as measured) the ceiling is also given against it
    (`PlainRun.ceiling`): the line's figures leave out what both modes pay alike."""
    lengths = [len(end.generated) - 1 for end in plain]
    plain_s = plain_seconds(line, plain)
    steps = max(end.steps for end in spec)
    rows = sum(len(end.generated) - 1 for end in spec)
    floor = fewest_seconds(line, steps, rows, [end.steps for end in spec])
    on_line = plain_s / floor
    said = (f"the slowest request's {steps} steps and {rows} rows on the line, against {max(lengths)} steps plain")
    if plain_run is None:
        return f"ceiling {on_line:.2f}x: {said}"
    return (f"ceiling {plain_run.ceiling(plain_s, floor, max(lengths) - steps):.2f}x against the plain run as "
            f"measured ({on_line:.2f}x on the line alone: {said})")


@dataclass(frozen=True, slots=True)
class PlainRun:
    """A plain run of concurrent requests as measured: its wall seconds and what its steps spent
    outside llama_decode, a step on average."""

    wall_s: float
    outside_s: float

    def ceiling(self, plain_line_s: float, floor_line_s: float, steps_saved: int) -> float:
        """The most a speculative run of the same answers can gain against this run: it saves what
        the line says its fewest steps and rows save (`plain_line_s` - `floor_line_s`) and the
        plain run's time outside llama_decode for every step saved, nothing else. What the line
        leaves out is paid alike by both modes: the rows' attention over their sequences'
        contexts (a row for each token in either mode), the tokens' sampling, the events, the
        first token's step; a ceiling drawn on the line alone counts none of it, so it sits above
        what any schedule can reach."""
        saved = plain_line_s - floor_line_s + max(0, steps_saved) * self.outside_s
        left = self.wall_s - saved
        return self.wall_s / left if left > 0 else float("inf")


def compare(plain: list[tuple[int, ...]], spec: list[tuple[int, ...]]) -> str:
    for i, (a, b) in enumerate(zip(plain, spec)):
        if a != b:
            first = next((j for j, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
            return f"differ: output {i} at token {first} of {len(a)}"
    return "identical"


def versus(engine, texts: list[str], tokens: int, rounds: int, concurrent: bool = False,
           temperature: float = 0.0, finals: tuple[list, list] | None = None,
           plain_runs: list | None = None) -> tuple[float, float, str]:
    """Best-of-rounds tokens/s off and on, alternating;
    outputs compared. The texts are run once first, unmeasured and plain (which teaches the
    Palimpsest nothing), so that both modes find their prompts resident in a slot: otherwise
    the mode measured first would pay a prefill that the second one skips. `finals`: (plain,
    speculative) lists that get the requests' last events of each mode's best round;
    `plain_runs` gets the best plain round as measured (`PlainRun`)."""
    rates: dict[bool, list[float]] = {False: [], True: []}  # by mode: speculation off, on
    outs: dict[bool, list] = {False: [], True: []}
    best: dict[bool, list] = {False: [], True: []}
    best_plain: PlainRun | None = None
    timed(engine, texts, tokens, False, concurrent, temperature)
    for _ in range(rounds):
        for speculation in (False, True):
            ends: list = []
            walls: list[float] = []
            before = engine.stats()
            rate, outs[speculation] = timed(engine, texts, tokens, speculation, concurrent, temperature, ends, walls)
            if not rates[speculation] or rate > max(rates[speculation]):
                best[speculation] = ends
                if not speculation:
                    best_plain = PlainRun(walls[0], _outside_ms(before, engine.stats()) / 1000)
            rates[speculation].append(rate)
    if finals is not None:
        finals[0].extend(best[False])
        finals[1].extend(best[True])
    if plain_runs is not None and best_plain is not None:
        plain_runs.append(best_plain)
    return max(rates[False]), max(rates[True]), compare(outs[False], outs[True])


def _generated(outs: list) -> int:
    return sum(len(o) for o in outs)


def sandwiched(engine, texts: list[str], tokens: int, finals: tuple[list, list],
               plain_runs: list | None = None) -> tuple[float, float, str]:
    """Concurrent requests run once with speculation, between two plain runs (after one more,
    unmeasured, that leaves the prompts resident): (the plain runs' mean tokens/s, speculation's,
    outputs compared, with what each mode's steps spent outside llama_decode). For requests
    speculation may see only once (the Palimpsest learns their answers), where `versus` would
    repeat them: the plain runs teach it nothing. `finals` gets the first plain run's last events
    and the speculative run's; `plain_runs` the plain runs as measured, their mean (`PlainRun`)."""
    timed(engine, texts, tokens, False, True)
    walls: list[float] = []  # the two plain runs'
    s0 = engine.stats()
    before, plain = timed(engine, texts, tokens, False, True, finals=finals[0], walls=walls)
    s1 = engine.stats()
    on, spec = timed(engine, texts, tokens, True, True, finals=finals[1])
    s2 = engine.stats()
    after, _ = timed(engine, texts, tokens, False, True, walls=walls)
    if plain_runs is not None:
        plain_runs.append(PlainRun(statistics.mean(walls), _outside_ms(s0, s1) / 1000))
    return ((before + after) / 2, on, f"{compare(plain, spec)}; outside llama_decode off {_outside_ms(s0, s1):.2f} "
            f"on {_outside_ms(s1, s2):.2f} ms a step")


def _outside_ms(before: dict, after: dict) -> float:
    """What the engine's steps between two stats() spent outside llama_decode, a step on average:
    planning, sampling, bookkeeping, events."""
    d = _delta(before, after)
    return (d["step_ms"] - d["decode_ms"]) / max(1, d["steps"])


def row(name: str, off: float, on: float, verdict: str, target: str) -> str:
    load = os.getloadavg()[0]
    return (f"{name:34s} off {off:6.1f} tok/s  on {on:6.1f} tok/s  {on / off:5.2f}x  (target {target})  "
            f"{verdict}  load {load:.1f}")


def case_repeat(engine, args) -> list[str]:
    text = REPEAT_TEXT
    timed(engine, [text], args.tokens, True)  # the first time: what the Palimpsest will know
    return [row("repeat (Palimpsest, L1 off)", *versus(engine, [text], args.tokens, args.rounds), ">= 3.0x")]


REPEAT_TEXT = "Write the welcome message for new members of the Vellmar rowing club, with the rules of the boathouse:"


def case_sampled(engine, args) -> list[str]:
    """The seeded sampled request (temperature 0.8) sent again, against greedy's repeat in the same run."""
    text = "Write the notice for the members of the Vellmar sailing club about the winter moorings:"
    timed(engine, [text], args.tokens, True, temperature=0.8)  # the first time: what the Palimpsest will know
    return [row("seeded sampled repeat (t 0.8, L1 off)", *versus(engine, [text], args.tokens, args.rounds,
                                                                 temperature=0.8), ">= 2.2x")]


def case_sampled_rewrite(engine, args) -> list[str]:
    text = f"Rewrite the following paragraph, correcting nothing and keeping every sentence:\n\n{PARAGRAPH}\n\nRewritten:\n"
    return [row("sampled rewrite (t 0.5, lookup)", *versus(engine, [text], args.tokens, args.rounds,
                                                           temperature=0.5), ">= 1.8x")]


def case_conclave(engine, args) -> list[str]:
    """A Conclave of 5 (all started, 48 tokens each, end of generation banned; explorers sample at
    0.7) against one answer of the same request, speculation on in both, best of rounds.

    It runs on engines of its own with 6 slots (a group holds n_parallel - 1 of them), so the
    5 candidates are rows of one batch (the main engine's 4 slots would run them in two rounds):
    once with shared rows (identical candidates ride one row, node/engine/riders.py) and once
    without, in the same run. Each side's engine counters are printed (steps, rows, decode and
    the time outside it, drafts, rows shared), and two ceilings from the cost line: 5 rows
    against 1 (lockstep, no drafts), and 5 times the one answer's rows per step against them
    (5 candidates that share nothing and draft as well as the one answer).

    That request is the same every round, so from the second round on the one answer (the
    request's own seed) replays the answer the Palimpsest stored in a few steps, while the
    explorers' draws at 0.7 part from what they drew before at near-ties and write new text:
    the Conclave waits for its slowest explorer. So each side also answers new requests of the
    same shape (`fresh_invoice`, nothing stored for them): one answer to one, the Conclave over
    another, alternating which goes first, summed over `--fresh` pairs (whether the explorers agree
    varies from one invoice to the next, so a few pairs say little)."""
    lines = []
    for shared in (True, False):
        run = _in_own_process(_conclave_run, engine.config.model_path, shared, args)
        t1, t5, s1, s5, line, fresh = run.one_s, run.conclave_s, run.one_stats, run.conclave_stats, run.line, run.fresh
        r1 = s1["batch_tokens"] / max(1, s1["steps"])
        lockstep = line.seconds(5) / line.seconds(1)
        drafting = line.seconds(round(5 * r1)) / line.seconds(round(r1))
        kept = s5["draft_accepted"] / max(1, s5["draft_tokens"])
        best = _best_drafting(line, 5, kept) / _best_drafting(line, 1, kept)
        label = "conclave of 5, 48 tokens, sampled" + ("" if shared else " (rows not shared)")
        lines += [f"conclave engine's cost line: {line.describe()}",
                  f"  one answer: {_breakdown(s1)}", f"  conclave:   {_breakdown(s5)}",
                  f"{label:34s} one {t1:6.2f} s  conclave {t5:6.2f} s  {t5 / t1:5.2f}x one answer  (target <= 2.0x; "
                  f"ceilings sharing nothing: 5 rows cost {lockstep:.2f} steps, 5 x the one answer's {r1:.1f} rows a "
                  f"step {drafting:.2f}x, each drafting its best length at the kept share {kept:.2f} "
                  f"{best:.2f}x)  load {os.getloadavg()[0]:.1f}",
                  f"{label + ', new requests':34s} one {fresh.one_s:6.2f} s  conclave {fresh.conclave_s:6.2f} s  "
                  f"{fresh.conclave_s / fresh.one_s:5.2f}x one answer  (target <= 2.0x; {args.fresh} new requests "
                  f"each side, summed; 5 rows cost {lockstep:.2f} steps; ceiling from what the candidates wrote "
                  f"{fresh.floor_s / fresh.one_s:.2f}x: their decoding, drafted from every text they saw, at least "
                  f"{fresh.decoding_floor_s:.2f} s on the line, and their prompts "
                  f"{fresh.floor_s - fresh.decoding_floor_s:.2f} s as computed; the decoding alone "
                  f"{fresh.decoding_floor_s / fresh.one_s:.2f}x)  load {os.getloadavg()[0]:.1f}",
                  f"  new requests, one answer: {_breakdown(fresh.one_stats)}",
                  f"  new requests, conclave:   {_breakdown(fresh.conclave_stats)}"]
    return lines


def _in_own_process(fn, *args):
    """fn(*args) in a child process of its own (spawned), its result sent back.

    The child's engine is the only one decoding in its process. Two engines in one process
    used to slow each other's steps (~12 ms a one-token step on this 2-core host: libgomp's
    workers outnumbered the cores and its barriers stopped spinning); an idle engine now lets its
    workers go while another is open (node/engine/compute_threads.py), and a process of its own
    still keeps the measured side free of the main engine's state and threads."""
    import concurrent.futures
    import multiprocessing

    with concurrent.futures.ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn")) as pool:
        return pool.submit(fn, *args).result()


def fresh_invoice(i: int) -> str:
    """The Conclave case's request with an invoice nobody asked about before (numbers, names and
    amounts differ with i; the length and shape do not)."""
    customers = ("Harlow Bakery, 12 Mill Lane, Ashby", "Pryor Dairy, 4 Kiln Road, Wembury",
                 "Tansley Mill, 88 Quay Street, Orford", "Brook Farm Shop, 2 Elm Row, Dunsop")
    document = (f"Invoice {4471 + 37 * i} from Dunmore Supplies Ltd, dated {3 + i % 25} March 2025, to "
                f"{customers[i % len(customers)]}. Items: {40 + i} kg of wholemeal flour at 1.{20 + i % 70} per kg, "
                f"{12 + i % 9} boxes of dried yeast at 3.50 per box, {6 + i % 5} sacks of rye flour at 18.00 per sack. "
                f"Delivery charge 15.00. Payable within 30 days to account 20-44-18 {1000 + 13 * i:04d} 1122. "
                "Contact: Maria Keane, accounts department, telephone 01632 960 118.")
    return f"Invoice text:\n{document}\nCopy the invoice text exactly:\n"


def conclave_floor(line, prompt: Sequence[int], candidates: list[list[int]],
                   earlier: Sequence[Sequence[int]] = ()) -> float:
    """The least time a Conclave's decoding could take on the cost line, given what its
    candidates wrote (their generated tokens): as many steps as the candidate needing most,
    where each drafts from text seen (bench/text_oracle.py from occurrences matching as many
    tokens as the node's sources need: its prompt, its own text, its siblings' whole texts and
    `earlier`, every prompt and answer the engine had before, which the Palimpsest holds), and a
    row for every token after each candidate's first, a prefix that several candidates share
    counted once (identical candidates ride one row). The prompt's prefill and the first tokens
    are left out, so it is below what any schedule of this work takes."""
    steps = max((oracle_steps(prompt, c, [*(s for s in candidates if s is not c), *earlier],
                              min_match=SOURCES_MIN_MATCH)
                 for c in candidates if c), default=0)
    rows = len({tuple(c[:j]) for c in candidates for j in range(2, len(c) + 1)})
    return fewest_seconds(line, steps, rows) if steps and rows else 0.0


def _best_drafting(line, m: int, p: float, longest: int = 16) -> float:
    """Seconds per token of m sequences sharing nothing, each verifying a draft of the length that
    is best on the cost line when each draft token is kept with probability p after the ones before."""
    return min(line.seconds(m * (1 + k)) / sum(p ** i for i in range(k + 1))
               for k in range(longest + 1))


def case_conclave_start(engine, args) -> list[str]:
    """The node's default Conclave of 5 (adaptive: an absolute majority first, the rest on
    disagreement) over the conclave case's new requests, with the node's start record (a
    Conclave starts whole where half or more of the last ones needed every candidate) and without it,
    each in an engine and process of its own, as `case_conclave` runs: the same request asked
    twice first (its explorers disagree), then `--fresh` pairs of new ones."""
    lines = []
    spent = {}
    for start in ("learned", "adaptive"):
        run = _in_own_process(_conclave_run, engine.config.model_path, True, args, start)
        fresh, starts = run.fresh, run.starts
        spent[start] = fresh.conclave_s
        label = "default conclave" + (", start record" if start == "learned" else ", adaptive only")
        lines += [f"conclave engine's cost line: {run.line.describe()}",
                  f"{label:34s} one {fresh.one_s:6.2f} s  conclave {fresh.conclave_s:6.2f} s  "
                  f"{fresh.conclave_s / fresh.one_s:5.2f}x one "
                  f"answer over {args.fresh} new requests each side; started {starts.count(True)} whole, "
                  f"{starts.count(False)} with their first candidates  load {os.getloadavg()[0]:.1f}"]
    # the one answers draft from what the Conclaves wrote before them (the Palimpsest), so their
    # sums differ between the two processes too: the Conclaves' own sums compare the policies
    lines.append(f"{'start record against adaptive only':34s} conclaves {spent['learned']:6.2f} s against "
                 f"{spent['adaptive']:6.2f} s, {spent['adaptive'] / spent['learned']:.2f}x faster")
    return lines


@dataclass(frozen=True, slots=True)
class FreshSums:
    """New requests each side, summed: one answer's seconds, the Conclaves', and the least the
    Conclaves could have taken on the cost line (their decoding alone, and with their prompts)."""

    one_s: float
    conclave_s: float
    decoding_floor_s: float
    floor_s: float
    one_stats: dict
    conclave_stats: dict


@dataclass(frozen=True, slots=True)
class ConclaveSides:
    """What `_conclave_run` measured: the same request answered once and by a Conclave (best of
    rounds, with each side's engine counters for its best round), the engine's cost line, the
    new requests' sums, and whether each new request's Conclave started whole."""

    one_s: float
    conclave_s: float
    one_stats: dict
    conclave_stats: dict
    line: CostCurve
    fresh: FreshSums
    starts: list[bool]


def _conclave_run(model_path, shared: bool, args, start: str = "all") -> ConclaveSides:
    """`start`: "all" (every candidate at once), "adaptive" (the node's default policy) or
    "learned" (the default policy with the node's start record)."""
    from node.engine.engine import Engine, EngineConfig
    from node.serving.conclave.runner import ConclavePolicy, ConclaveRun
    from node.serving.conclave.start import StartRecord
    from node.speculative.controller import Controller, ControllerConfig
    from node.speculative.lookup import PromptLookup
    from node.speculative.palimpsest import Palimpsest
    from node.speculative.siblings import SiblingDraft

    controller = Controller([PromptLookup(), SiblingDraft(), Palimpsest()],
                            ControllerConfig(max_draft=16, n_parallel=6))
    own = Engine(EngineConfig(model_path=model_path, n_ctx=8192, n_parallel=6, max_draft=16,
                              speculator=controller, shared_rows=shared))
    try:
        deadline = time.monotonic() + 60
        while not controller.costs.measured and time.monotonic() < deadline:
            time.sleep(0.1)
        text = f"Invoice text:\n{DOCUMENT}\nCopy the invoice text exactly:\n"
        request = greedy(own, text, 48, True, temperature=0.8)

        seen: list[tuple[int, ...]] = []  # every prompt and answer so far, in order

        async def one(asked=request) -> float:
            began = time.perf_counter()
            _, end = await own.submit(asked, asyncio.get_running_loop()).collect()
            seen.append((*asked.prompt_tokens, *end.generated))
            return time.perf_counter() - began

        # each Conclave's prompt, its candidates' tokens, and how many of `seen` came before it
        written: list[tuple[tuple[int, ...], list[list[int]], int]] = []
        prefilled: list[float] = []  # each Conclave's prompt computed: from admission to its first token

        policy = ConclavePolicy(adaptive=start != "all")
        record = StartRecord() if start == "learned" else None
        starts: list[bool] = []  # each new request's Conclave: started whole

        async def conclave(asked=request) -> float:
            loop = asyncio.get_running_loop()
            began = time.perf_counter()
            run = ConclaveRun(lambda reqs, spare, group: own.submit_group(reqs, loop, spare=spare, group=group),
                              asked, 5, policy, record)
            run.start()
            outcome = await run.decide()
            spent = time.perf_counter() - began
            starts.append(outcome.at_once)
            first = run.candidates[0].finished
            prefilled.append(first.timings.get("prefill_s", 0.0) if first is not None else 0.0)
            tokens = [list(c.finished.generated) if c.finished is not None else own.tokenize(c.text, add_bos=False)
                      for c in run.candidates]
            written.append((asked.prompt_tokens, tokens, len(seen)))
            seen.extend((*asked.prompt_tokens, *t) for t in tokens)
            return spent

        def snap() -> dict:
            sibling = controller.stats.snapshot()["sibling"]
            return {**own.stats(), "sibling_drafted": sibling["drafted"], "sibling_kept": sibling["accepted"]}

        async def rounds() -> tuple[float, float, dict, dict]:
            ones, alls = [], []
            one_stats: dict = {}
            all_stats: dict = {}
            for _ in range(args.rounds):
                before = snap()
                ones.append(await one())
                mid = snap()
                alls.append(await conclave())
                after = snap()
                if ones[-1] == min(ones):
                    one_stats = _delta(before, mid)
                if alls[-1] == min(alls):
                    all_stats = _delta(mid, after)
            return min(ones), min(alls), one_stats, all_stats

        async def fresh() -> FreshSums:
            """New requests each round: one answer to one, the Conclave over another; the least
            the Conclaves' candidates' decoding could have taken (`conclave_floor`), and that
            plus the Conclaves' prompts as they were computed (a new prompt, as long as the one
            answer's: no schedule computes it for less)."""
            spent = [0.0, 0.0]
            sums: list[dict] = [dict.fromkeys(STAT_KEYS, 0), dict.fromkeys(STAT_KEYS, 0)]
            del written[:], prefilled[:], starts[:]
            for r in range(args.fresh):
                pair = (greedy(own, fresh_invoice(2 * r), 48, True, temperature=0.8),
                        greedy(own, fresh_invoice(2 * r + 1), 48, True, temperature=0.8))
                for side in ((0, 1) if r % 2 == 0 else (1, 0)):
                    at_start = snap()
                    spent[side] += await (one(pair[0]) if side == 0 else conclave(pair[1]))
                    sums[side] = {k: sums[side][k] + v for k, v in _delta(at_start, snap()).items()}
            line = engine_costs(own)
            decoding = sum(conclave_floor(line, prompt, texts, seen[:before]) for prompt, texts, before in written)
            return FreshSums(spent[0], spent[1], decoding, decoding + sum(prefilled), sums[0], sums[1])

        t1, t5, s1, s5 = asyncio.run(rounds())
        new = asyncio.run(fresh())
        return ConclaveSides(t1, t5, s1, s5, engine_costs(own), new, starts)
    finally:
        own.close()


STAT_KEYS = ("steps", "batch_tokens", "decode_ms", "step_ms", "generated_tokens", "draft_tokens", "draft_accepted",
             "shared_rows", "sibling_drafted", "sibling_kept")


def _delta(before: dict, after: dict) -> dict:
    return {k: after.get(k, 0) - before.get(k, 0) for k in STAT_KEYS}


def _breakdown(d: dict) -> str:
    steps = max(1, d["steps"])
    return (f"{d['steps']} steps, {d['batch_tokens']} rows ({d['batch_tokens'] / steps:.1f}/step), decode "
            f"{d['decode_ms']} ms ({d['decode_ms'] / steps:.1f}/step), outside decode {d['step_ms'] - d['decode_ms']} ms "
            f"({(d['step_ms'] - d['decode_ms']) / steps:.1f}/step), {d['generated_tokens']} tokens, drafted "
            f"{d['draft_tokens']} kept {d['draft_accepted']}, rows shared {d['shared_rows']}, sibling drafts "
            f"{d['sibling_drafted']} kept {d['sibling_kept']}")


def engine_costs(engine):
    """The engine's cost curve: its line, bent to the sizes its calibration measured."""
    return engine.config.speculator.costs


def case_fleet(engine_a, args) -> list[str]:
    """Node A answers; node B (fresh controller and engine state, a remote ARCA) answers a different wording."""
    import redis.asyncio

    from node.archive.client import RemoteArchive
    from node.archive.mirror import CorpusMirror
    from node.engine.engine import Engine, EngineConfig
    from node.speculative.controller import Controller, ControllerConfig
    from node.speculative.lookup import PromptLookup
    from node.speculative.palimpsest import Palimpsest
    from shared.tokens import pack_tokens
    from tests.arca.arca_harness import start_server

    question_a = "Extract the total due and the payment account from this invoice.\n"
    question_b = "From the invoice below, what is owed and to which account must it be paid?\n"
    tail = f"Invoice text:\n{DOCUMENT}\nSummary of the invoice:"
    with tempfile.TemporaryDirectory() as tmp:
        server = start_server(Path(tmp))
        try:
            ns = b"bench-model"
            _, outs = timed(engine_a, [question_a + tail], args.tokens, True)
            prompt = tuple(engine_a.tokenize(question_a + tail))

            async def publish_and_mirror(palimpsest: Palimpsest) -> int:
                remote = RemoteArchive("127.0.0.1", server.port, timeout_ms=2000)
                await remote.start()
                await remote.observe(ns, (*prompt[-64:], *outs[0]))  # what node A's service writes
                mirror = CorpusMirror(remote, ns, palimpsest.add)
                fetched = await mirror.sync()
                palimpsest.ingest(1 << 30)
                # what asking ARCA for each draft (ARCA.DRAFT, with redis-py as any client would)
                # would cost against the mirrored index
                tail = (*prompt[-64:], *outs[0][:40])[-16:]
                direct = redis.asyncio.Redis(host="127.0.0.1", port=server.port)
                timings["arca_draft"] = [await timed_async(direct.execute_command, "ARCA.DRAFT", "NS", ns,
                                                           pack_tokens(tail), 16) for _ in range(200)]
                await direct.aclose()
                timings["local"] = [timed_sync(palimpsest.continuation, tail, 16) for _ in range(200)]
                await remote.close()
                return fetched

            timings: dict[str, list[float]] = {}
            controller = Controller([PromptLookup(), Palimpsest()], ControllerConfig(max_draft=16, n_parallel=4))
            palimpsest = controller.source("archive")
            assert isinstance(palimpsest, Palimpsest)
            fetched = asyncio.run(publish_and_mirror(palimpsest))
            engine_b = Engine(EngineConfig(model_path=engine_a.config.model_path, n_ctx=4096, n_parallel=4,
                                           max_draft=16, speculator=controller))
            try:
                off, on, verdict = versus(engine_b, [question_b + tail], args.tokens, args.rounds)
            finally:
                engine_b.close()
        finally:
            server.stop()
    arca_us, local_us = (statistics.median(timings[k]) * 1e6 for k in ("arca_draft", "local"))
    return [row(f"fleet (B drafts A's answer, {fetched} mirrored)", off, on, verdict, ">= 2.0x"),
            f"{'  a draft: ARCA.DRAFT over loopback':34s} p50 {arca_us:8.1f} us  the mirrored Palimpsest p50 "
            f"{local_us:6.1f} us  ({arca_us / local_us:.0f}x; a decode step is {engine_a_step_ms(engine_a):.1f} ms)"]


async def timed_async(fn, *args) -> float:
    start = time.perf_counter()
    await fn(*args)
    return time.perf_counter() - start


def timed_sync(fn, *args) -> float:
    start = time.perf_counter()
    fn(*args)
    return time.perf_counter() - start


def engine_a_step_ms(engine) -> float:
    stats = engine.stats()
    return stats["step_ms"] / max(1, stats["steps"])


def case_rewrite(engine, args) -> list[str]:
    text = f"Rewrite the following paragraph, correcting nothing and keeping every sentence:\n\n{PARAGRAPH}\n\nRewritten:\n"
    return [row("rewrite 300 tokens (lookup)", *versus(engine, [text], args.tokens, args.rounds), ">= 1.8x")]


def case_extract(engine, args) -> list[str]:
    text = (f"Document:\n{PARAGRAPH}\n\nQuote, word for word, the sentences of the document about the pilots "
            f"and the railway.\nQuotes:\n\"")
    return [row("extraction quoting (lookup)", *versus(engine, [text], args.tokens, args.rounds), ">= 1.8x")]


def case_prose(engine, args) -> list[str]:
    return [row("free prose", *versus(engine, [PROSE[0]], args.tokens, args.rounds), ">= 0.97x")]


# the 4 users' repetitive mix: three requests that quote their prompts, one free
REPETITIVE_MIX = (f"Rewrite the following paragraph, keeping every sentence:\n\n{PARAGRAPH}\n\nRewritten:\n",
                  f"Invoice text:\n{DOCUMENT}\nCopy the invoice text exactly:\n",
                  f"Document:\n{PARAGRAPH}\n\nQuote the first three sentences exactly:\n\"",
                  "Write the welcome message for new members of the Vellmar rowing club, with the rules of the boathouse:")


def case_users4(engine, args) -> list[str]:
    finals: tuple[list, list] = ([], [])
    runs: list[PlainRun] = []
    off, on, verdict = versus(engine, list(REPETITIVE_MIX), args.tokens, args.rounds, True, finals=finals,
                              plain_runs=runs)
    lines = [row("4 users, repetitive mix (aggregate)", off, on,
                 f"{verdict}; {saved(finals[1])}; {concurrent_ceiling(engine_costs(engine), *finals, runs[-1])}",
                 ">= 1.7x")]
    # the non-repetitive mix gets new requests each round (the Palimpsest knows the answers of the
    # rounds before), so speculation runs once a round, between two plain runs (a drift of the
    # host's speed within a round then favours neither mode); each round's ratio is its own
    ratios = []
    for r, texts in enumerate((PROSE, *MORE_PROSE)[:max(1, args.rounds)]):
        finals = ([], [])
        learned = list(LEARNED)
        off, on, verdict = sandwiched(engine, list(texts), args.tokens, finals, runs)
        ratios.append(on / off)
        line = engine_costs(engine)
        prompts = [engine.tokenize(t) for t in texts]
        text, steps = text_ceiling(line, finals[0], prompts, learned, plain_run=runs[-1])
        paired, paired_steps = text_ceiling(line, finals[0], prompts, learned, min_match=SOURCES_MIN_MATCH,
                                            plain_run=runs[-1])
        lines.append(row(f"4 users, non-repetitive mix, round {r + 1}", off, on,
                         f"{verdict}; {saved(finals[1])}; {concurrent_ceiling(line, *finals, runs[-1])}; "
                         f"what the text allows against the plain run as measured {text:.2f}x (bench/text_oracle.py: "
                         f"the slowest answer in {steps} steps), {paired:.2f}x from occurrences matching "
                         f"{SOURCES_MIN_MATCH}+ tokens as the node's sources need ({paired_steps} steps)",
                         ">= 1.2x, never < 1.0x"))
    lines.append(f"{'4 users, non-repetitive, all rounds':34s} geometric mean {statistics.geometric_mean(ratios):.2f}x "
                 f"(rounds {min(ratios):.2f}x-{max(ratios):.2f}x)")
    return lines


def saved(ends: list) -> str:
    """The steps each request saved against a step per token."""
    return "steps saved by request " + ", ".join(f"{len(end.generated) - 1 - end.steps}" for end in ends)


def case_nightly(engine, args) -> list[str]:
    def items(offset: int) -> list[str]:
        return [f"{INSTRUCTION}Review: {REVIEWS[(i + offset) % len(REVIEWS)]} (order {1000 + i + offset})\nSentiment:"
                for i in range(40)]

    tokens = 24
    first_on, _ = timed(engine, items(0), tokens, True, concurrent=True)
    second_on, spec_out = timed(engine, items(40), tokens, True, concurrent=True)
    second_off, plain_out = timed(engine, items(40), tokens, False, concurrent=True)
    load = os.getloadavg()[0]
    return [f"{'nightly batch, 40 then 40 new':34s} first {first_on:6.1f} tok/s  second {second_on:6.1f} tok/s "
            f"({second_on / first_on:.2f}x the first)  second off {second_off:6.1f} tok/s "
            f"({second_on / second_off:.2f}x)  {compare(plain_out, spec_out)}  load {load:.1f}"]


CASES = {"repeat": case_repeat, "fleet": case_fleet, "rewrite": case_rewrite, "extract": case_extract,
         "prose": case_prose, "users4": case_users4, "nightly": case_nightly, "sampled": case_sampled,
         "sampled_rewrite": case_sampled_rewrite, "conclave": case_conclave, "conclave_start": case_conclave_start}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--fresh", type=int, default=6,
                        help="new requests each side of the Conclave case (whether its explorers agree varies by request)")
    parser.add_argument("--cases", default=",".join(CASES))
    parser.add_argument("--model", type=Path, default=None)
    parser.add_argument("--max-draft", type=int, default=None,
                        help="longest draft per sequence and step (default: the node's, speculative.max_draft)")
    args = parser.parse_args()
    print_header(getattr(args, 'model', None), threads=getattr(args, 'threads', None))

    from node.config import OPTIONS_BY_NAME
    from node.engine.engine import Engine, EngineConfig
    from node.speculative.controller import Controller, ControllerConfig
    from node.speculative.lookup import PromptLookup
    from node.speculative.palimpsest import Palimpsest

    max_draft = args.max_draft or OPTIONS_BY_NAME["speculative.max_draft"].default
    controller = Controller([PromptLookup(), Palimpsest()], ControllerConfig(max_draft=max_draft, n_parallel=4))
    engine = Engine(EngineConfig(model_path=args.model or default_model(), n_ctx=8192, n_parallel=4,
                                 max_draft=max_draft, speculator=controller))
    print(f"drafts of at most {max_draft} tokens")
    print(f"load average at start: {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores")
    lines = []
    try:
        deadline = time.monotonic() + 60
        while not controller.costs.measured and time.monotonic() < deadline:  # calibration gives way to requests
            time.sleep(0.1)
        timed(engine, ["Hello"], 4, False)  # warm-up
        costs = controller.costs
        print(f"verify cost line ({'measured' if costs.measured else 'default: calibration did not finish'}): "
              f"{costs.describe()}")
        print("  its medians: " + ", ".join(f"{n} tok {sec * 1000:.1f} ms" for n, sec in sorted(costs.points.items())))
        for name in args.cases.split(","):
            for line in CASES[name.strip()](engine, args):
                print(line, flush=True)
                lines.append(line)
    finally:
        engine.close()
    for name, stats in controller.stats.snapshot().items():
        print(f"source {name}: drafted {stats['drafted']}, kept {stats['accepted']} ({stats['acceptance']}), "
              f"switched off {stats['switched_off']}x, on {stats['switched_on']}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
