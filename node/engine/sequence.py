"""One request's life inside the engine, and the channel its events travel back on.

`Channel` is shared by the engine thread and the caller: the engine pushes events (into
an asyncio.Queue through the engine's outbox, node/engine/outbox.py, which wakes the loop
once a step; or into a thread-safe queue for blocking callers) and reads the `cancelled`
flag every step; the caller reads events and sets the flag. Nothing else crosses threads.

`Sequence` is touched only by the engine thread: its tokens, its place in the KV cache
(slot = llama seq id, `n_past` = tokens of it in the KV), its sampler (own RNG), the
incremental detokenizer and the stop-string holdback. `accept()` takes one sampled token
and decides whether the sequence is finished: an end-of-generation token (not shown, not
in `generated`, counted in completion_tokens), a completed stop string (its text never
sent), or max_tokens.
"""

from __future__ import annotations

import asyncio
import enum
import queue
import time
from typing import Callable

from node.engine.hooks import Draft, DraftSeq
from node.engine.outbox import Outbox
from node.engine.detokenizer import IncrementalDetokenizer, StopMatcher
from node.engine.sampling import Choice, Constraint, TokenSampler
from node.engine.types import Event, Finished, FinishReason, GenerationRequest, TextDelta, TokenLogprob


class Channel:
    """Events out to the caller, the cancel flag in from the caller."""

    __slots__ = ("cancelled", "retry_after_s", "_loop", "_outbox", "_async_queue", "_sync_queue", "_started")

    def __init__(self, loop: asyncio.AbstractEventLoop | None, outbox: Outbox | None = None) -> None:
        self.cancelled = False
        self.retry_after_s = 0  # > 0: ended unstarted, no room came free in time
        self._loop = loop
        self._outbox = outbox if outbox is not None else Outbox()  # one of its own: every push at once
        self._async_queue: asyncio.Queue[Event] | None = asyncio.Queue() if loop is not None else None
        self._sync_queue: queue.SimpleQueue[Event] | None = queue.SimpleQueue() if loop is None else None
        self._started: asyncio.Event | None = asyncio.Event() if loop is not None else None

    def mark_started(self, retry_after_s: int = 0) -> None:
        """Called on the engine thread when the request gets its slot or ends (whichever is first)."""
        if self._started is None or self._started.is_set():
            return
        if retry_after_s:
            self.retry_after_s = retry_after_s
        assert self._loop is not None
        try:
            self._loop.call_soon_threadsafe(self._started.set)
        except RuntimeError:  # the caller's loop is closed
            self.cancelled = True

    async def started(self) -> int:
        """Wait until the request holds a slot or has ended; its `retry_after_s` (0: not refused)."""
        if self._started is None:
            raise RuntimeError("this handle was submitted without an event loop")
        await self._started.wait()
        return self.retry_after_s

    def push(self, event: Event) -> None:
        """Called on the engine thread; never blocks. A closed loop counts as a cancel."""
        if self._sync_queue is not None:
            self._sync_queue.put(event)
            return
        assert self._loop is not None  # an async channel has one
        self._outbox.post(self._loop, self, event)

    def deliver(self, event: Event) -> None:
        """On the caller's loop: the event into its queue (node/engine/outbox.py)."""
        assert self._async_queue is not None
        self._async_queue.put_nowait(event)

    async def get(self) -> Event:
        if self._async_queue is None:
            raise RuntimeError("this handle was submitted without an event loop: use iter_sync()")
        return await self._async_queue.get()

    def get_sync(self, timeout: float | None = None) -> Event:
        if self._sync_queue is None:
            raise RuntimeError("this handle belongs to an event loop: iterate it with `async for`")
        return self._sync_queue.get(timeout=timeout)


class Phase(enum.Enum):
    WAITING = "waiting"      # in the queue, no slot
    PREFILL = "prefill"      # has a slot, prompt going into the KV chunk by chunk
    FOLLOWER = "follower"    # has a slot, waits for its leader's identical prompt
    DECODE = "decode"        # prompt done, one token (plus drafts) per step
    DONE = "done"


class PromptShare:
    """KV cells of one prompt shared by a leader and its forks, released by the last user.

    `spare` cells are held for forks of the prompt not started yet (the Conclave's later
    candidates): a fork that starts while a member of its group still holds the prompt
    draws its cells from them, and whatever is left goes with the last user.
    """

    __slots__ = ("cells", "users", "spare")

    def __init__(self, cells: int) -> None:
        self.cells = cells
        self.users = 1
        self.spare = 0


class Sequence:
    """Engine-thread state of one generation."""

    __slots__ = (
        "request", "channel", "sampler", "prompt", "tokens", "generated", "slot", "n_past", "n_cached", "phase",
        "pending", "n_sampled", "n_steps", "leader", "followers", "share", "own_cells", "store_at",
        "seed", "constraint", "_detok", "_stops", "_stopped", "stop_matched", "_unsent_tokens", "_unsent_logprobs",
        "t_submit", "t_wait", "t_admit", "t_first", "t_prompt_done", "key", "group", "draft_seq", "draft", "hint",
        "spare", "fork", "waited_for_prefix", "copy_at", "prompt_pending",
    )

    def __init__(self, request: GenerationRequest, channel: Channel, seed: int | None = None,
                 constraint: Constraint | None = None, *, key: int = 0, group: int = 0, spare: int = 0,
                 fork: bool = False) -> None:
        self.request = request
        self.channel = channel
        self.sampler: TokenSampler | None = None  # made on the engine thread at admission
        self.constraint = constraint  # the request's grammar, compiled at submit
        self.prompt = request.prompt_tokens
        self.tokens: list[int] = list(request.prompt_tokens)
        self.generated: list[int] = []
        self.slot = -1  # llama seq id while admitted, -1 otherwise
        self.n_past = 0
        self.n_cached = 0  # prompt tokens restored from the prefix cache, not computed
        self.phase = Phase.WAITING
        self.pending: list[int] = []
        self.n_sampled = 0
        self.n_steps = 0  # decode steps that verified rows for it
        self.leader: Sequence | None = None
        self.followers: list[Sequence] = []
        self.share: PromptShare | None = None
        self.own_cells = 0
        self.store_at: list[int] = []  # prompt positions where the prefix cache wants a state saved
        self.copy_at: list[int] = []   # prompt positions where a waiting prompt copies this KV (admission.py)
        self._detok = IncrementalDetokenizer()
        self._stops = StopMatcher(request.stop)
        self._unsent_tokens: list[int] = []
        self._unsent_logprobs: list[TokenLogprob] = []
        self.t_submit = self.t_wait = time.perf_counter()  # t_wait: since its request last held a slot
        self.t_admit = self.t_first = self.t_prompt_done = 0.0
        self.seed = seed  # None: the request's seed, or a fresh one
        self._stopped = False
        self.stop_matched: str | None = None  # the stop string that ended the text
        self.key = key      # unique per engine; group: shared by the n sequences of one request
        self.group = group
        self.draft_seq: DraftSeq | None = None  # set while a speculator drafts for it
        self.draft: Draft | None = None         # the draft in the current step's batch
        self.hint: int | None = None            # undrafted: the token a source expects next (Draft.after)
        self.spare = spare  # KV cells to hold for later forks of this prompt (PromptShare.spare)
        self.fork = fork    # joins a running group: clone the prompt from a member still holding it
        self.waited_for_prefix = False  # queued behind a leader prefilling its prefix (admission.py `prefix_wait`)
        self.prompt_pending = 0  # the prompt's last tokens it decodes as pending tokens, drafts after them (scheduler.py)

    def make_sampler(self, n_vocab: int) -> None:
        """Raises InvalidRequest for parameters the vocabulary cannot satisfy."""
        self.sampler = TokenSampler(self.request.sampling, n_vocab, logprobs=self.request.logprobs,
                                    seed=self.seed, constraint=self.constraint)

    @property
    def prefill_left(self) -> int:
        return len(self.prompt) - self.n_past

    def chunk_end(self, n: int) -> int:
        """How many of the next `n` prompt tokens its prefill chunk takes: it ends at the next
        position where a state is saved or another prompt copies the KV."""
        stops = [at for at in (*self.store_at[:1], *self.copy_at) if at > self.n_past]
        return min(n, min(stops) - self.n_past) if stops else n

    @property
    def tokens_left(self) -> int:
        """The most tokens it may still sample (its max_tokens less what it sampled)."""
        return self.request.max_tokens - self.n_sampled

    def accept(self, choice: Choice, eog: frozenset[int], piece_of: Callable[[int], bytes]) -> FinishReason | None:
        """Take one sampled token; returns why the sequence ends, or None to go on."""
        token = choice.token
        self.n_sampled += 1
        if self.t_first == 0.0:
            self.t_first = time.perf_counter()
        if token in eog:
            return "stop"
        self.tokens.append(token)
        self.generated.append(token)
        piece = piece_of(token)
        self._unsent_tokens.append(token)
        if choice.logprob is not None:
            top = tuple((t, piece_of(t), lp) for t, lp in choice.top)
            self._unsent_logprobs.append(TokenLogprob(token, piece, choice.logprob, top))
        scan = self._stops.feed(self._detok.feed(piece))
        if scan.stopped:
            self._stopped = True
            self.stop_matched = scan.matched
            self._send(scan.text, keep_tokens=False)
            return "stop"
        self._send(scan.text)
        if self.n_sampled >= self.request.max_tokens:
            return "length"
        return None

    def _send(self, text: str, *, keep_tokens: bool = True) -> None:
        if not text:
            return
        tokens = tuple(self._unsent_tokens) if keep_tokens else ()
        self.channel.push(TextDelta(text, tokens, tuple(self._unsent_logprobs) if keep_tokens else ()))
        self._unsent_tokens.clear()
        self._unsent_logprobs.clear()

    def finish(self, reason: FinishReason, error: str | None = None, retry_after_s: int = 0) -> None:
        """Release held text (unless a stop string ended it) and push the last event."""
        if not self._stopped:
            scan = self._stops.feed(self._detok.flush())
            self._send(scan.text if scan.stopped else scan.text + self._stops.flush())
        now = time.perf_counter()
        timings = {"queue_s": max(0.0, self.t_admit - self.t_submit) if self.t_admit else 0.0}
        if self.t_first:
            timings["ttft_s"] = self.t_first - self.t_submit
            timings["decode_s"] = now - self.t_first
        if self.t_prompt_done and self.t_admit:
            timings["prefill_s"] = self.t_prompt_done - self.t_admit
        self.phase = Phase.DONE
        self.channel.mark_started(retry_after_s)
        self.channel.push(Finished(reason, len(self.prompt), self.n_sampled, tuple(self.generated), error, timings,
                                   self.n_cached, self.stop_matched, retry_after_s, self.n_steps))
