"""The engine thread: admission, one batch per step, one llama_decode per step.

Each step (all on the one thread that owns the llama context):
1. cancelled requests end and their slots are freed;
2. queued requests are admitted by the rules of node/engine/admission.py (classes, room,
   group slots, followers of an identical prompt being prefilled, late forks of a running
   group, expiry after `max_wait_s`), which returns decisions this class applies. A request
   that is admitted can never run out of KV (budget.py); the rest wait in a bounded queue
   (`EngineOverloaded` beyond it). A new prompt takes the free slot whose KV still holds the
   longest prefix of it (a resident prefix, budget.py) and continues at the first token that
   differs; the prefix cache tier is then asked only for a longer prefix (prefix_state.py);
3. the batch gets every decoding sequence's next token plus its draft tokens (logits on
   each), then prefill chunks of newcomers (interactive ones first) under
   `step_token_budget`; the speculator plans the step as a whole (drafting.py; `Speculator.plan`: the
   decoding sequences' room for drafts, the prompt tokens on offer and the budget in, and
   whether the batch drains: nothing queued, and how often a slot freed mid-batch was lately
   taken again at once, refill.py; the drafts and the prompt tokens the step carries out), so
   a long prompt
   delays the others by one chunk per step at most (with nobody decoding, prefill takes
   the whole batch). Chunks also end on the prefix cache's block boundaries, whose
   per-sequence state is saved right after the step. While an interactive request is
   active, batch work yields (`_plan`): batch prompts wait, batch sequences verify no
   drafts, sit out the steps that prefill an interactive prompt and decode one at a time
   (in turn) beside interactive decoding; a batch prompt goes in
   chunks of at most BATCH_PREFILL_CHUNK tokens, the longest wait of a live arrival;
   A constrained sequence's tokens the grammar admits alone (`_jump`: the mask holds one
   token) are taken the moment they are known, without logits: they go into the next step
   as rows that ask for none (jump-forward), only the last of them gets its logits.
   Sequences of one group with the same tokens so far (a Conclave's candidates before their
   draws differ) put one entry in the batch: the others ride its rows (riders.py).
   A prompt (greedy, or sampled with no seed) whose rest fits the share of the step any plan
   leaves prompts (and no state to save or copy inside it, no fork waiting for it) decodes that
   rest as pending tokens of a decoding entry (`_prompt_tail`): rows without logits but the last's, so the speculator may
   draft the answer's first tokens in the prompt's own step, and its first token and kept
   drafts come out of that step;
4. one llama_decode; each sequence samples from its own logits rows, keeping the draft
   tokens its own choices agree with (node/engine/verify.py) and removing the rest of the
   draft's KV with llama_memory_seq_rm. A request asking for
   `store_final_state` that finishes has its prompt + answer state saved before its slot
   is freed. A slot freed by a request that did not fail keeps its KV, resident, until a
   prompt takes it or the reservations need its cells.

Between planning and the step's decode, one batch of waiting embedding inputs runs in the
embeddings context of its own (node/engine/embedder.py), smaller while sequences generate.

A failed decode is retried on halves of the batch until the failing request is alone;
that request ends with an error and every other one goes on. Any exception while
handling one sequence ends that sequence only.
"""

from __future__ import annotations

import bisect
import collections
import logging
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np

from node.engine import admission, prefix_state
from node.engine.budget import KVBudget
from node.engine.embedder import Embedder
from node.engine.errors import EngineClosed, EngineOverloaded, InvalidRequest
from node.engine.drafting import Drafting
from node.engine.hooks import PROMPT_SHARE, PrefixCacheHook, Speculator
from node.engine.limits import SchedulerLimits
from node.engine.outbox import Outbox
from node.engine.refill import Refill
from node.engine.threads import ThreadTuner
from node.engine.llama import LlamaContext, LlamaModel, TokenBatch
from node.engine.riders import riders
from node.engine.sampling import Choice
from node.engine.sequence import Phase, Sequence
from node.engine.types import COMPLETED, INTERACTIVE, FinishReason
from node.engine.verify import Verdict, verify

log = logging.getLogger(__name__)

IDLE_WAIT_S = 0.05
BATCH_PREFILL_CHUNK = 64  # prompt tokens of a batch line per step: bounds a live arrival's wait
COUNTERS = ("steps", "batch_tokens", "decode_ms", "step_ms", "prefill_tokens", "generated_tokens", "shared_prefills",
            "draft_tokens", "draft_accepted", "draft_rejected", "prefix_tokens_restored", "prefix_states_stored",
            "final_states_stored", "forked_late", "resident_hits", "resident_tokens", "resident_evicted",
            "jumped_tokens", "shared_rows", "logit_rows", "prefix_waits", "prefix_copies", "prefix_copied_tokens")
JUMP_MAX = 16  # grammar-forced tokens taken after one sampled token (each a row in the next step)


def _priority(seq: Sequence) -> int:
    return seq.request.priority


@dataclass(slots=True)
class _Entry:
    """One sequence's tokens in the current batch."""

    seq: Sequence
    tokens: list[int]
    start: int
    decoding: bool
    first_row: int = -1
    known: int = 0  # leading tokens whose next token is known (jump-forward): no logits for them
    riders: list[Sequence] = field(default_factory=list)  # identical siblings drawing from these rows (riders.py)


def _trim(chunks: list[_Entry], budget: int) -> list[_Entry]:
    """The prompt chunks cut to `budget` tokens in order: what `_prefill_entries` gives for that
    budget (each chunk is the smaller of its own bound and the budget left)."""
    kept: list[_Entry] = []
    for e in chunks:
        if budget <= 0:
            break
        del e.tokens[budget:]
        kept.append(e)
        budget -= len(e.tokens)
    return kept


class Scheduler:
    """The step loop over one llama context: it applies the decisions of admission.py,
    drafting.py and prefix_state.py, builds and decodes the batch and ends sequences. `step()`
    is one round (a test drives it with no thread, over tests/node/engine/fake_llama.py);
    `run()` loops on the engine thread that node/engine/engine.py starts and joins."""

    def __init__(self, model: LlamaModel, ctx: LlamaContext, limits: SchedulerLimits, *,
                 prefix_cache: PrefixCacheHook | None = None, speculator: Speculator | None = None,
                 threads: ThreadTuner | None = None, embedder: Embedder | None = None,
                 when_idle: Callable[[], object] | None = None) -> None:
        self._model = model
        self._when_idle = when_idle  # called on this thread as it goes idle, and at each wake while idle
        self._embedder = embedder  # embedding batches, run between generation steps (embedder.py)
        self._ctx = ctx
        self._limits = limits
        self._prefix_cache = prefix_cache
        bind_window = getattr(prefix_cache, "bind_window", None)
        if bind_window is not None:  # the cache cuts a state only where its window stays whole
            bind_window(model.n_swa)
        self._drafting = Drafting(speculator, limits.max_draft)
        self.threads = threads
        self._threads_now = threads.current if threads is not None else 0
        self._ctx_threads = ctx.n_threads
        self._eog = model.info.eog_tokens
        self._pieces: dict[int, bytes] = {}
        self._batch = TokenBatch(ctx.n_batch)
        self._lock = threading.Lock()
        self._wake = threading.Condition(self._lock)
        self._queue: collections.deque[Sequence] = collections.deque()
        self._active: list[Sequence] = []
        self._refill = Refill()  # how often a slot freed mid-batch is taken again at once (refill.py)
        self._budget = KVBudget(limits.n_parallel, ctx.n_ctx)
        self._attended = 0  # filler tokens in slot 0 while calibrating (`_attend`)
        self._closing = False
        self.counters: dict[str, float] = dict.fromkeys(COUNTERS, 0)
        self.first_calibration = threading.Event()  # set once `run` has made its first calibration (or given way)
        self.outbox = Outbox()  # the channels' events to their loops, delivered at each step's end (outbox.py)
        self._batch_turn = 0  # which waiting batch sequence decodes beside live work
        # forced tokens per sequence and step: its pending tokens and drafts fit its share of a batch
        self._jump_max = max(0, min(JUMP_MAX, ctx.n_batch // limits.n_parallel - 1 - limits.max_draft))

    # -- caller side (any thread) ---------------------------------------------------------

    def enqueue(self, seqs: list[Sequence]) -> None:
        with self._lock:
            if self._closing:
                raise EngineClosed("the engine is closed")
            if len(self._queue) + len(seqs) > self._limits.max_queue:
                raise EngineOverloaded(f"{len(self._queue)} requests already waiting (max_queue "
                                       f"{self._limits.max_queue}); retry later")
            self._queue.extend(seqs)
            self._refill.arrived(time.perf_counter())
            self._wake.notify()

    def embed_waiting(self) -> bool:
        return self._embedder is not None and self._embedder.pending()

    def wake(self) -> None:
        with self._lock:
            self._wake.notify()

    def stats(self) -> dict[str, int | float]:
        """Gauges now, and counters since start (step_ms: whole steps, decode_ms: inside llama_decode)."""
        active = list(self._active)
        return {
            "active": len(active),
            "queued": len(self._queue),
            "slots_total": self._limits.n_parallel,
            "slots_free": len(self._budget.free_slots),
            "kv_cells_total": self._ctx.n_ctx,
            "kv_cells_reserved": self._budget.reserved,
            "kv_cells_used": KVBudget.cells_used(active),
            "kv_cells_resident": self._budget.resident_cells,
            "slots_resident": len(self._budget.resident),
            "threads": self.threads.current if self.threads is not None else self._ctx_threads,
            "threads_tuned": int(self.threads is not None),
            "slot_refill": round(self._refill.share, 3),
            **{k: round(v) if k.endswith("_ms") else int(v) for k, v in self.counters.items()},
        }

    def stop(self) -> None:
        """Ask `run` to return: it ends what is active and cancels what waits (the thread's
        owner, node/engine/engine.py, joins it)."""
        with self._lock:
            self._closing = True
            self._wake.notify()

    # -- engine thread ----------------------------------------------------------------------

    def run(self) -> None:
        """The engine thread's loop: a step while there is work, asleep otherwise, until `stop`."""
        try:
            self._calibrate()
        finally:
            self.first_calibration.set()
        while True:
            with self._lock:
                idle = self._idle()
            if idle and self._drafting.calibration_due():
                self._calibrate()
            while True:
                with self._lock:
                    if not self._idle():
                        break
                if self._when_idle is not None:
                    self._when_idle()
                with self._lock:
                    if self._idle():
                        self._wake.wait()
            if self._closing:
                break
            try:
                if not self.step():
                    with self._lock:
                        self._wake.wait(IDLE_WAIT_S)
            except Exception:  # a scheduler bug: end what is running, keep serving
                log.exception("engine step failed; ending the active requests")
                for seq in list(self._active):
                    self._end(seq, "error", "internal engine error")
        self.shutdown()

    def _idle(self) -> bool:
        """Nothing to do and not closing (the caller holds the lock)."""
        return not self._closing and not self._queue and not self._active and not self.embed_waiting()

    def shutdown(self) -> None:
        """End every active sequence and every waiting one as cancelled ("engine closed")."""
        for seq in list(self._active):
            self._end(seq, "cancelled", "engine closed")
        with self._lock:
            waiting, self._queue = list(self._queue), collections.deque()
        for seq in waiting:
            seq.finish("cancelled", "engine closed")

    def step(self) -> bool:
        """One scheduling round; False when there was nothing to decode. `run` calls it on the
        engine thread; a test may call it on its own with no thread running."""
        start = time.perf_counter()
        self.outbox.hold()
        try:
            return self._step(start)
        finally:
            self.outbox.release()

    def _step(self, start: float) -> bool:
        self._reap_cancelled()
        self._admit()
        self._expire_waiting()
        entries = self._plan()
        embedded = self._embed(busy=bool(self._active))
        if not entries:
            return embedded
        decoding = all(e.decoding and not e.seq.prompt_pending for e in entries)  # no prompt tokens in it
        threads = self._use_threads(decoding)
        t0 = time.perf_counter()
        self._decode(entries)
        elapsed = time.perf_counter() - t0
        if decoding:
            n_tokens = sum(len(e.tokens) for e in entries)
            if not any(e.known for e in entries):  # all rows with logits
                self._drafting.step_done(len(entries), n_tokens, elapsed, [(e.start, len(e.tokens)) for e in entries])
            if self.threads is not None:
                self.threads.observe(threads, n_tokens, elapsed)
        self.counters["steps"] += 1
        self.counters["step_ms"] += (time.perf_counter() - start) * 1000
        return True

    def _embed(self, busy: bool) -> bool:
        """One batch of waiting embedding inputs, in its own context (node/engine/embedder.py)."""
        if self._embedder is None or not self._embedder.pending():
            return False
        try:
            return self._embedder.step(busy)
        except Exception:  # the embedder fails its own jobs; this is a bug in it: keep generating
            log.exception("embedding step failed")
            return True

    def _use_threads(self, decoding: bool) -> int:
        """Set the tuner's thread count for this step (a trial's count on decode-only steps)."""
        if self.threads is None:
            return 0
        wanted = self.threads.threads() if decoding else self.threads.current
        if wanted != self._threads_now:
            self._ctx.set_threads(wanted)
            self._threads_now = wanted
        return wanted

    def _reap_cancelled(self) -> None:
        for seq in [s for s in self._active if s.channel.cancelled]:
            self._end(seq, "cancelled")
        with self._lock:
            gone = [s for s in self._queue if s.channel.cancelled]
            for seq in gone:
                self._queue.remove(seq)
        for seq in gone:
            seq.finish("cancelled")

    def _expire_waiting(self) -> None:
        """After admission: refuse the waiting requests whose `max_wait_s` has passed (admission.py)."""
        now = time.perf_counter()
        with self._lock:
            decided = admission.expiry(self._queue, self._active, now)
            for seq in decided.serving:
                seq.t_wait = now
            for seq in decided.late:
                self._queue.remove(seq)
        if decided.late:
            retry = admission.retry_after(self._active, self.counters["steps"], self.counters["step_ms"],
                                          self._limits.step_token_budget)
            for seq in decided.late:
                seq.finish("error", f"no slot or KV room came free within {seq.request.max_wait_s:g} s "
                                    f"({len(self._active)} requests running); retry in {retry} s", retry)

    # -- admission ----------------------------------------------------------------------------

    def _admit(self) -> None:
        """Start what admission.py lets in: forks of running groups first, then the queue's head
        while a slot is free and the head fits."""
        self._admit_forks()
        while self._budget.free_slots:
            with self._lock:
                decided = admission.admission(self._queue, self._active, self._budget, self._limits)
                if decided is None or self._waits_for_prefix(decided):
                    return
                self._queue.remove(decided.seq)
            try:
                self._start(decided.seq, decided.own, decided.leader)
            except Exception as exc:  # this request alone fails; what it took is given back
                self._refuse(decided.seq, exc)

    def _waits_for_prefix(self, decided: admission.Admit) -> bool:
        """Whether the head waits for a sequence prefilling the same prefix (admission.py
        `prefix_wait`); the leader's prefill then stops where the head takes it over: a state is
        stored at the block boundary the head restores, or the head copies the leader's KV."""
        hook = self._prefix_cache
        copy_tokens = self._copy_tokens
        wait_tokens = self._limits.prefix_wait_tokens if hook is not None else 0
        if decided.leader is not None or (wait_tokens <= 0 and copy_tokens <= 0):
            return False
        wait = admission.prefix_wait(
            decided.seq, self._active,
            (lambda seq: hook.boundaries_to_store(seq.prompt, seq.request.cache_scope)) if hook is not None
            else (lambda seq: ()), wait_tokens, copy_tokens)
        if wait is None:
            return False
        stops = wait.leader.store_at if wait.store else wait.leader.copy_at
        if wait.boundary not in stops:
            bisect.insort(stops, wait.boundary)
        if not decided.seq.waited_for_prefix:
            decided.seq.waited_for_prefix = True
            self.counters["prefix_waits"] += 1
        return True

    @property
    def _copy_tokens(self) -> int:
        """The fewest leading prompt tokens worth copying from another slot's KV (0: never; only
        where slots keep their KV for other prompts at all)."""
        return self._limits.prefix_copy_tokens if self._limits.resident else 0

    def _admit_forks(self) -> None:
        with self._lock:
            forks = admission.forks(self._queue)
        for seq in forks:
            if not self._budget.free_slots:
                return
            decided = admission.fork_admission(seq, self._active, self._budget, self._limits, self._window_kept)
            if decided is None:
                continue
            with self._lock:
                if seq not in self._queue:
                    continue
                self._queue.remove(seq)
            try:
                self._start_fork(seq, decided.own, decided.source)
            except Exception as exc:
                self._refuse(seq, exc)

    def _start_fork(self, seq: Sequence, own: int, source: Sequence) -> None:
        """Clone the prompt but its last token from source; that token is decoded again for the
        fork's own first logits (one token of prefill instead of the whole prompt)."""
        assert source.share is not None
        seq.make_sampler(self._model.n_vocab)
        slot, _ = self._claim(None)
        self._budget.take_fork(seq, own, source.share, slot)
        self._evict()
        self._admitted(seq)
        seq.phase = Phase.PREFILL
        n = len(seq.prompt) - 1
        if n > 0:
            self._ctx.seq_cp(source.slot, seq.slot, 0, n)
        seq.n_past, seq.store_at = n, []
        self.counters["shared_prefills"] += 1
        self.counters["forked_late"] += 1

    def _start(self, seq: Sequence, own: int, leader: Sequence | None) -> None:
        """Sampler, slot and reservation, then prefill (or follow an identical prompt)."""
        seq.make_sampler(self._model.n_vocab)
        slot, kept = self._claim(seq.prompt if leader is None else None, seq.request.cache_scope)
        self._budget.take(seq, own, leader.share if leader else None, slot)
        self._evict()
        self._admitted(seq)
        if leader is not None:
            seq.phase, seq.leader = Phase.FOLLOWER, leader
            leader.followers.append(seq)
            self.counters["shared_prefills"] += 1
        else:
            seq.phase = Phase.PREFILL
            if self._copy_prefix(seq, kept) == kept > 0:  # the slot's own KV, unless another holds more
                seq.n_past = seq.n_cached = kept
                self.counters["resident_hits"] += 1
                self.counters["resident_tokens"] += kept
            self._restore_prefix(seq)

    def _copy_prefix(self, seq: Sequence, kept: int) -> int:
        """Start seq from a copy of the KV of an active sequence holding more of its prompt than
        the `kept` tokens its slot holds (admission.py `prefix_copy`): the copy is of the cells'
        contents (`state_copy`), cut after the shared tokens, not computed again. The prompt
        tokens the slot's KV holds after: `kept` where no sequence holds more, 0 if the copy
        failed (the slot's KV is gone then)."""
        if self._copy_tokens <= 0:
            return kept
        found = admission.prefix_copy(seq, self._active, kept, self._window_copied, self._copy_tokens)
        if found is None:
            return kept
        n = found.n_tokens
        self._ctx.seq_rm(seq.slot)
        if not (self._ctx.state_copy(found.source.slot, seq.slot) and self._ctx.seq_rm(seq.slot, n, -1)
                and self._ctx.seq_pos_max(seq.slot) == n - 1 and self._window_kept(seq.slot, n)):
            log.warning("copying %d prompt tokens from another slot failed; the prefix cache or a prefill gives them", n)
            self._ctx.seq_rm(seq.slot)
            return 0
        seq.n_past = seq.n_cached = n
        self.counters["prefix_copies"] += 1
        self.counters["prefix_copied_tokens"] += n
        return n

    def _claim(self, prompt: tuple[int, ...] | None, scope: str = "") -> tuple[int, int]:
        """The free slot a sequence takes and the tokens of `prompt` its resident KV keeps
        (budget.py `choose`; None: nothing to keep; only a slot the same tenant, `scope`, left
        continues); the rest of that KV is removed."""
        decided = prefix_state.claim(self._budget, prompt, self._limits.resident, self._window_kept, scope)
        self._ctx.seq_rm(decided.slot, decided.kept, -1)
        return decided.slot, decided.kept

    def _evict(self) -> None:
        """Clear the resident KV whose cells the reservations need."""
        for slot in self._budget.overflow():
            self._ctx.seq_rm(slot)
            self.counters["resident_evicted"] += 1

    def _leave(self, seq: Sequence, slot: int, reason: FinishReason) -> None:
        """seq's slot is free: its KV stays resident (the tokens of seq it holds) unless the
        request failed, when what the KV holds is not known."""
        n = prefix_state.resident_tokens(seq, reason, self._limits.resident, self._ctx.seq_pos_max(slot))
        self._ctx.seq_rm(slot, n, -1)
        if n > 0:
            self._budget.keep(slot, seq.tokens[:n], seq.request.cache_scope)

    def _admitted(self, seq: Sequence) -> None:
        """seq holds its slot: it is active and its caller is told."""
        seq.t_admit = time.perf_counter()
        self._active.append(seq)
        seq.channel.mark_started()

    def _refuse(self, seq: Sequence, exc: Exception) -> None:
        """End a request that failed while being admitted, releasing its slot and cells."""
        if isinstance(exc, InvalidRequest):
            log.warning("request %s refused at admission: %s", seq.request.request_id or id(seq), exc)
            message = str(exc)
        else:
            log.exception("request %s failed at admission", seq.request.request_id or id(seq))
            message = f"{type(exc).__name__}: {exc}"
        self._end(seq, "error", message)

    def _restore_prefix(self, seq: Sequence) -> None:
        hook = self._prefix_cache
        if hook is None:
            return
        try:
            decided = prefix_state.restore(hook, seq)  # beyond what the slot's resident KV keeps (seq.n_past)
            if decided.state is not None:
                self._ctx.seq_rm(seq.slot)
                seq.n_past = seq.n_cached = 0
                n_tokens = decided.n_tokens
                restored = self._ctx.state_set(seq.slot, decided.state)
                if restored and self._ctx.seq_pos_max(seq.slot) >= n_tokens:  # more than the prompt shares: cut
                    restored = self._ctx.seq_rm(seq.slot, n_tokens, -1) and self._window_kept(seq.slot, n_tokens)
                if restored and self._ctx.seq_pos_max(seq.slot) == n_tokens - 1:
                    seq.n_past = seq.n_cached = n_tokens
                    self.counters["prefix_tokens_restored"] += n_tokens
                else:
                    self._ctx.seq_rm(seq.slot)
            seq.store_at = decided.store_at(seq.n_past)
            if seq.n_past and seq.n_past in decided.boundaries:
                # the slot holds the prompt up to a point the cache wants (an exact fork a resident
                # prefix ends at): its state is stored now, as no prefill chunk will end there
                self._store_prefix(seq, seq.n_past)
        except Exception:
            log.exception("prefix cache lookup failed; prefilling from scratch")
            self._ctx.seq_rm(seq.slot)
            seq.n_past, seq.n_cached, seq.store_at = 0, 0, []

    # -- the batch ----------------------------------------------------------------------------

    def _plan(self) -> list[_Entry]:
        """The step's entries. While an interactive request is active, batch work yields: batch
        prompts wait, batch sequences verify no drafts, sit out the steps in which an
        interactive prompt is prefilled (its time to first token is the batch-free one), and
        beside interactive decoding only one of them decodes a step, in turn (a live step
        carries one batch token at most, and the batch still moves and frees its slots)."""
        entries: list[_Entry] = []
        live = [seq for seq in self._active if seq.request.priority == INTERACTIVE]
        self._prompt_tail(bool(live))
        decoding = [s for s in self._active if s.phase is Phase.DECODE and s.request.priority == INTERACTIVE]
        waiting = [s for s in self._active if s.phase is Phase.DECODE and s.request.priority > INTERACTIVE]
        if not live:
            decoding += waiting
        elif waiting and not any(seq.phase is not Phase.DECODE for seq in live):
            self._batch_turn += 1  # beside live decoding: one batch sequence a step, in turn
            decoding.append(waiting[self._batch_turn % len(waiting)])
        joining = bool(self._queue) or len(decoding) < len(self._active)  # queued, prefilling or held back
        riding: dict[int, list[Sequence]] = {}
        if self._limits.shared_rows:
            decoding, riding = riders(decoding)  # identical siblings share their leader's rows
        asks = [ask for seq in decoding if not (live and seq.request.priority > INTERACTIVE)
                for ask in [self._drafting.ask(seq)] if ask is not None]
        asking = {ask.seq.key for ask in asks}
        # what the sequences that draft nothing hold the batch to (a vote's candidate holds it to
        # nothing: its vote may end it at any step)
        draining = None if joining else max((seq.tokens_left for seq in decoding
                                             if seq.key not in asking and not seq.request.voted), default=0)
        used = sum(len(seq.pending) for seq in decoding)
        room = (self._limits.step_token_budget if decoding else self._batch.capacity) - used
        room = min(room, self._batch.capacity - used)
        chunks = self._prefill_entries(live, room)
        plan = self._drafting.plan(len(decoding), asks, sum(len(e.tokens) for e in chunks), room, draining,
                                   self._refill.share if draining is not None else 0.0)
        self.counters["draft_tokens"] += plan.rows
        for seq in decoding:
            seq.draft = plan.drafts.get(seq.key)
            seq.hint = plan.hints.get(seq.key)
            tokens = [int(t) for t in seq.draft.tokens] if seq.draft is not None else []
            entries.append(_Entry(seq, seq.pending + tokens, seq.n_past, True, known=len(seq.pending) - 1,
                                  riders=riding.get(id(seq), [])))
            for rider in riding.get(id(seq), ()):
                rider.draft = None
        return entries + _trim(chunks, plan.prefill)

    def _prompt_tail(self, live: bool) -> None:
        """Prompts whose rest fits this step start decoding it: the rest becomes their pending
        tokens (no logits but for the last), so the speculator may draft their answers' first
        tokens in this step as it does for every decoding sequence, and the step that computes
        a prompt's last token also verifies what follows it. Taken in the order prompts get the
        step's room, within the share of it any plan leaves to prompts (`PROMPT_SHARE`: the
        planner would have granted them as a chunk); only where no state is to be saved or
        copied inside the rest (a prefill chunk ends there), no fork waits for the prompt, and
        the request drafts and names no seed. The prompt's KV is then computed in a batch whose
        size follows the draft, and the kernels' sums with it: a seeded draw (temperature 0.9,
        top_p 0.95) went the other way at the 12th token of a request sent again, where the
        request's seed is to give plain decoding's text (a greedy choice keeps a drafted token
        at such a near-tie, sampling.DRAFT_TIE_NATS; an unseeded draw promises its distribution
        only, which verification keeps exactly)."""
        if not self._drafting.enabled:
            return
        decoding = [s for s in self._active if s.phase is Phase.DECODE]
        room = min(self._limits.step_token_budget, self._batch.capacity) - sum(len(s.pending) for s in decoding)
        share = int(room * PROMPT_SHARE)
        for seq in sorted(self._active, key=_priority):
            if seq.phase is not Phase.PREFILL or (live and seq.request.priority > INTERACTIVE):
                continue
            left = seq.prefill_left
            if left > share:
                return  # the prompts after it wait for the room it takes
            share -= left
            sampling = seq.request.sampling
            if seq.followers or seq.store_at or seq.copy_at or not seq.request.speculation \
                    or (not sampling.greedy and sampling.seed is not None):
                continue
            draft_seq = self._drafting.begin(seq)
            if draft_seq is None:
                continue
            seq.phase, seq.draft_seq = Phase.DECODE, draft_seq
            seq.pending, seq.prompt_pending = list(seq.prompt[seq.n_past:]), left

    def _prefill_entries(self, live: list[Sequence], budget: int) -> list[_Entry]:
        """Prompt chunks for up to `budget` tokens, interactive prompts first."""
        entries: list[_Entry] = []
        for seq in sorted(self._active, key=_priority):  # interactive prompts get the step's room first
            if budget <= 0:
                break
            batch = seq.request.priority > INTERACTIVE
            if seq.phase is not Phase.PREFILL or (live and batch):
                continue  # a batch prompt waits while live requests run: its chunks would slow their steps
            # a batch prompt goes in small chunks: a live request arriving waits for one of them at most
            n = seq.chunk_end(min(seq.prefill_left, budget, BATCH_PREFILL_CHUNK if batch else budget))
            entries.append(_Entry(seq, list(seq.prompt[seq.n_past:seq.n_past + n]), seq.n_past, False))
            budget -= n
        return entries

    def _calibrate(self) -> None:
        """Let the speculator measure what steps with drafts cost, on idle slots, before serving."""
        if not self._drafting.enabled:
            return
        for slot in self._budget.drop_residents():  # measuring uses the slots
            self._ctx.seq_rm(slot)
        self._attended = 0
        self._drafting.calibrate(self._measure, self._attend)
        self._ctx.clear()

    def _measure(self, n_seqs: int, k: int) -> float | None:
        """Seconds of one decode of n_seqs sequences with k drafts each; None once requests wait
        (calibration gives way to them)."""
        if self._giving_way():
            return None
        n_seqs = max(1, min(n_seqs, self._limits.n_parallel, self._batch.capacity // (k + 1)))
        self._batch.clear()
        for slot in range(n_seqs):
            self._batch.add([self._filler()] * (k + 1), 0, slot, logits="all")
        return self._timed_decode(*((slot, 0) for slot in range(n_seqs)))

    def _attend(self, context: int, k: int) -> float | None:
        """Seconds of one decode of k drafts of one sequence (slot 0) after `context` tokens of
        it, all rows with logits; context 0 with a second slot: of a sequence of its own there,
        beside slot 0's context, which stays. None once requests wait, or where the context
        cannot hold them or k is more than a sequence may draft (the logits buffer has no rows
        for it). The context is filler computed unmeasured, in chunks of the step budget (a
        request arriving waits for one chunk at most), and kept for the next call (`_attended`)."""
        slot = 1 if context == 0 and self._limits.n_parallel > 1 else 0
        cells = self._attended + k + 1 if slot == 1 else context + k + 1  # the cells in use with these rows
        if k > self._limits.max_draft or cells > self._ctx.n_ctx:
            return None
        if slot == 0 and context < self._attended:
            self._ctx.seq_rm(0, context, -1)
            self._attended = context
        while True:
            if self._giving_way():
                return None
            if slot == 1 or self._attended >= context:
                break
            n = min(context - self._attended, self._limits.step_token_budget, self._batch.capacity)
            self._batch.clear()
            self._batch.add([self._filler()] * n, self._attended, 0, logits="none")
            if self._ctx.decode(self._batch) != 0:
                raise RuntimeError("llama_decode failed while computing a context to measure after")
            self._attended += n
        self._batch.clear()
        self._batch.add([self._filler()] * (k + 1), context, slot, logits="all")
        return self._timed_decode((slot, context))

    def _giving_way(self) -> bool:
        """Whether a request waits or the engine is closing: measuring stops for them."""
        with self._lock:
            return bool(self._queue) or self._closing

    def _filler(self) -> int:
        """The token the measuring steps are made of."""
        return self._model.info.bos if self._model.info.bos is not None else 1

    def _timed_decode(self, *measured: tuple[int, int]) -> float:
        """Seconds of one decode of the batch as it stands, then each measured sequence's cells
        removed from its position on: (slot, position) each. A failed decode is an error."""
        t0 = time.perf_counter()
        rc = self._ctx.decode(self._batch)
        elapsed = time.perf_counter() - t0
        for slot, position in measured:
            self._ctx.seq_rm(slot, position, -1)
        if rc != 0:
            raise RuntimeError(f"llama_decode failed (code {rc}) while measuring")
        return elapsed

    def _fill(self, entries: list[_Entry]) -> int:
        batch = self._batch
        batch.clear()
        rows = 0
        for e in entries:
            completes = not e.decoding and e.start + len(e.tokens) == len(e.seq.prompt)
            batch.add(e.tokens, e.start, e.seq.slot, logits="all" if e.decoding else ("last" if completes else "none"),
                      known=e.known)
            e.first_row = rows if (e.decoding or completes) else -1
            rows += len(e.tokens) - e.known if e.decoding else int(completes)
        return rows

    def _decode(self, entries: list[_Entry]) -> None:
        """Decode the entries; on failure bisect until the failing sequence is alone."""
        n_rows = self._fill(entries)
        t0 = time.perf_counter()
        rc = self._ctx.decode(self._batch)
        if rc == 0:
            self.counters["decode_ms"] += (time.perf_counter() - t0) * 1000
            self.counters["batch_tokens"] += self._batch.n_tokens
            self.counters["logit_rows"] += n_rows  # rows of the output projection (forced and prompt rows: none)
            logits = self._ctx.logits(n_rows) if n_rows else None
            for e in entries:
                if e.seq.phase is not Phase.DONE:
                    self._guarded(e.seq, self._consume, e, logits)
            return
        for e in entries:  # llama.cpp rolls back a failed batch; make sure of it per sequence
            self._ctx.seq_rm(e.seq.slot, e.start, -1)
        if len(entries) == 1:
            self._end(entries[0].seq, "error", f"llama_decode failed (code {rc}) for this request")
            return
        log.warning("llama_decode returned %d for %d sequences; retrying in halves", rc, len(entries))
        half = len(entries) // 2
        self._decode(entries[:half])
        self._decode([e for e in entries[half:] if e.seq.phase is not Phase.DONE])

    def _guarded(self, seq: Sequence, fn: Callable[..., None], *args: Any) -> None:
        try:
            fn(*args)
        except Exception as exc:
            log.exception("request %s failed", seq.request.request_id or id(seq))
            self._end(seq, "error", f"{type(exc).__name__}: {exc}")

    def _consume(self, e: _Entry, logits: np.ndarray | None) -> None:
        seq = e.seq
        if not e.decoding:
            seq.n_past += len(e.tokens)
            self.counters["prefill_tokens"] += len(e.tokens)
            if seq.store_at and seq.store_at[0] == seq.n_past:
                self._store_prefix(seq, seq.store_at.pop(0))
            seq.copy_at = [at for at in seq.copy_at if at > seq.n_past]
            if e.first_row >= 0:
                assert logits is not None
                self._prompt_done(seq, logits[e.first_row])
            return
        assert logits is not None  # decoding: its rows were asked for
        in_prompt = self._prompt_computed(seq)
        for rider in e.riders:  # before the leader: its rejected drafts' cells are still there to share
            if rider.phase is Phase.DECODE:
                self._guarded(rider, self._ride, e, rider, logits)
        verdict = self._verify(e, seq, logits)
        seq.n_steps += 0 if in_prompt else 1  # steps after the prompt's, as for a prompt prefilled
        self.counters["generated_tokens"] += verdict.generated
        self.counters["draft_accepted"] += verdict.accepted
        seq.n_past += e.known + verdict.n_valid
        verified = len(e.tokens) - e.known  # the last pending token and the draft: the rows with logits
        if verdict.n_valid < verified:
            self.counters["draft_rejected"] += verified - verdict.n_valid
            self._ctx.seq_rm(seq.slot, seq.n_past, -1)
        if seq.draft is not None and seq.draft_seq is not None:  # also when the sequence ends inside its drafts
            self._drafting.verified(seq.draft_seq, seq.draft, verdict.accepted)
            seq.draft = None
        if verdict.reason is not None:
            self._end(seq, verdict.reason)
            return
        seq.pending = [seq.tokens[-1]]
        self._jump(seq)

    def _verify(self, e: _Entry, seq: Sequence, logits: np.ndarray) -> Verdict:
        """seq's own choices over the entry's rows with logits (the entry's sequence's, or a rider's)."""
        assert seq.sampler is not None  # made at admission
        sampler = seq.sampler
        draft = e.seq.draft
        dists = draft.dists if draft is not None and not sampler.params.greedy else None
        after = draft.after if draft is not None else e.seq.hint
        verified = e.tokens[e.known:]  # the last pending token and the draft: the rows with logits
        return verify(verified, logits[e.first_row:e.first_row + len(verified)],
                      lambda row, draft: sampler.choose(row, seq.tokens, draft),
                      lambda choice: seq.accept(choice, self._eog, self.piece), dists=dists,
                      choose_against=lambda row, token, dist: sampler.choose_against(row, seq.tokens, token, dist),
                      after=after)

    def _ride(self, e: _Entry, rider: Sequence, logits: np.ndarray) -> None:
        """A rider (riders.py) draws from its leader's rows and shares the cells of the tokens it kept."""
        in_prompt = self._prompt_computed(rider)
        verdict = self._verify(e, rider, logits)
        rider.n_steps += 0 if in_prompt else 1
        kept = e.known + verdict.n_valid
        self._ctx.seq_cp(e.seq.slot, rider.slot, rider.n_past, rider.n_past + kept)
        rider.n_past += kept
        self.counters["generated_tokens"] += verdict.generated
        self.counters["shared_rows"] += verdict.generated
        if verdict.reason is not None:
            self._end(rider, verdict.reason)
            return
        rider.pending = [rider.tokens[-1]]
        self._jump(rider)

    def _prompt_computed(self, seq: Sequence) -> bool:
        """Whether the step just decoded held the last tokens of seq's prompt as its pending
        tokens (`_prompt_tail`): they count as prefilled, and its prompt is done."""
        if not seq.prompt_pending:
            return False
        self.counters["prefill_tokens"] += seq.prompt_pending
        seq.prompt_pending, seq.t_prompt_done = 0, time.perf_counter()
        return True

    def _prompt_done(self, leader: Sequence, row: np.ndarray) -> None:
        now = time.perf_counter()
        group = [leader]
        for follower in leader.followers:
            if follower.phase is Phase.FOLLOWER:
                self._ctx.seq_cp(leader.slot, follower.slot, -1, -1)
                follower.n_past = leader.n_past
                follower.leader = None
                group.append(follower)
        leader.followers = []
        for seq in group:
            seq.phase = Phase.DECODE
            seq.t_prompt_done = now
            seq.draft_seq = self._drafting.begin(seq)
            self._guarded(seq, self._first_token, seq, row)

    def _first_token(self, seq: Sequence, row: np.ndarray) -> None:
        assert seq.sampler is not None  # made at admission
        choice = seq.sampler.choose(row, seq.tokens)
        self.counters["generated_tokens"] += 1
        reason = seq.accept(choice, self._eog, self.piece)
        if reason is not None:
            self._end(seq, reason)
        else:
            seq.pending = [choice.token]
            self._jump(seq)

    def _jump(self, seq: Sequence) -> None:
        """Jump-forward: while the sequence's grammar settles the next token, take it now.

        No logits can change a forced token (greedy or sampled, the sampler takes the
        grammar's forced token) nor which way a complete output ends (only end-of-generation
        tokens fit), so it is accepted as if chosen and joins the pending tokens; the next
        step decodes them all, asking logits for the last one only, and an end ends the
        sequence with no step at all. A request asking for logprobs is left out (each
        token's logprob needs its row)."""
        grammar = seq.constraint
        if grammar is None or seq.request.logprobs is not None:
            return
        for _ in range(self._jump_max):
            token = grammar.only()
            if token is None:
                return
            grammar.accept(token)
            self.counters["generated_tokens"] += 1
            self.counters["jumped_tokens"] += 1
            reason = seq.accept(Choice(token), self._eog, self.piece)
            if reason is not None:
                self._end(seq, reason)
                return
            seq.pending.append(token)

    def _store_prefix(self, seq: Sequence, n_tokens: int) -> None:
        if self._prefix_cache is None:
            return
        try:
            self._prefix_cache.store(seq.prompt, n_tokens, self._ctx.state_get(seq.slot), seq.request.cache_scope)
            self.counters["prefix_states_stored"] += 1
        except Exception:
            log.exception("prefix cache store failed at %d tokens", n_tokens)

    def _store_final(self, seq: Sequence) -> None:
        """Save prompt + answer of a finished sequence (`GenerationRequest.store_final_state`).

        The KV holds `seq.tokens[:n_past]` (an end-of-generation token is not in `tokens`). The
        sequence is about to be freed, so its KV is cut at the boundary prefix_state.py chose
        and saved there. A sliding-window model whose window before that boundary was already
        reused is not stored (the next prompt prefills what it misses).
        """
        hook = self._prefix_cache
        if hook is None:
            return
        n_kv = seq.n_past
        try:
            n_tokens = prefix_state.final_boundary(hook, seq)
            if n_tokens is None:
                return
            self._ctx.seq_rm(seq.slot, n_tokens, -1)
            if self._ctx.seq_pos_max(seq.slot) != n_tokens - 1 or not self._window_kept(seq.slot, n_tokens):
                return
            hook.store(seq.tokens[:n_kv], n_tokens, self._ctx.state_get(seq.slot), seq.request.cache_scope)
            self.counters["prefix_states_stored"] += 1
            self.counters["final_states_stored"] += 1
        except Exception:
            log.exception("prefix cache store of a finished sequence failed at %d tokens", n_kv)

    def _window_copied(self, slot: int, n_tokens: int) -> bool:
        """Whether a copy of the slot's KV cut at `n_tokens` holds every position the token at
        `n_tokens` attends to (prefix_state.py `window_copied`)."""
        n_swa = self._model.n_swa
        return n_swa == 0 or prefix_state.window_copied(n_swa, self._ctx.seq_pos_min(slot),
                                                        self._ctx.seq_pos_max(slot), n_tokens)

    def _window_kept(self, slot: int, n_tokens: int) -> bool:
        """Whether the KV still holds every position the token at `n_tokens` attends to."""
        n_swa = self._model.n_swa
        return n_swa == 0 or prefix_state.window_kept(n_swa, self._ctx.seq_pos_min(slot), n_tokens)

    def piece(self, token: int) -> bytes:
        """A token's text, memoised (the engine's `token_piece`: every caller shares the memo)."""
        piece = self._pieces.get(token)
        if piece is None:
            piece = self._pieces[token] = self._model.token_piece(token)
        return piece

    # -- ending ----------------------------------------------------------------------------------

    def _end(self, seq: Sequence, reason: FinishReason, error: str | None = None) -> None:
        """Free what seq holds and finish it; the finish reaches the client whatever fails."""
        if seq.phase is Phase.DONE:
            return
        try:
            if seq.phase is Phase.PREFILL and seq.followers:
                self._hand_over(seq)
            elif seq.phase is Phase.FOLLOWER and seq.leader is not None:
                seq.leader.followers.remove(seq)
            if seq in self._active:
                self._active.remove(seq)
                if not self._active:
                    self._refill.emptied()
                elif not self._queue:
                    self._refill.freed(time.perf_counter())
            if (reason in COMPLETED and seq.request.store_final_state and self._prefix_cache is not None
                    and seq.phase is Phase.DECODE):
                self._store_final(seq)
            if seq.draft_seq is not None:
                self._drafting.end(seq.draft_seq, seq.tokens)
                seq.draft_seq = seq.draft = None
            slot = self._budget.release(seq)
            if slot is not None:
                self._leave(seq, slot, reason)
        finally:
            seq.finish(reason, error)

    def _hand_over(self, leader: Sequence) -> None:
        """A leader leaves mid-prefill: its first follower takes over the KV done so far."""
        heir, rest = leader.followers[0], leader.followers[1:]
        if leader.n_past:
            self._ctx.seq_cp(leader.slot, heir.slot, -1, -1)
        heir.phase, heir.leader, heir.n_past = Phase.PREFILL, None, leader.n_past
        heir.store_at, heir.followers = leader.store_at, rest
        for follower in rest:
            follower.leader = heir
        leader.followers = []

