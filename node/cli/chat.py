"""Talking to a model from the terminal: load it with progress, answer once, or chat in turns.

The terminal opens the same node as a server (node/assembly.py) and answers through its
service, so a chat gets every tier a served request gets: L1 (a greedy question asked again is
replayed, not recomputed), the prefix KV cache with its fleet tier (L3), and the L4 corpus the
archive draft source drafts from (every answer is observed into it). The node runs on an event
loop of its own thread (`NodeLoop`); the main thread reads lines and takes Ctrl-C.

The conversation is kept as chat messages and rendered through the model's chat template at
every turn, so the model sees the whole history (and the prefix cache makes the repeated part
cheap). Answers stream to stdout as they are generated; a short cost line goes to stderr.
"""

from __future__ import annotations

import asyncio
import contextlib
import sys
import threading
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Coroutine, Iterator, TextIO, TypeVar

from node.engine.errors import EngineError
from node.engine.types import SamplingParams
from node.serving.engine_client import EngineClient
from node.serving.plan import ChoiceDone, ChoiceText, Plan
from node.serving.requests import ChatMessage, ChatRequest, GenerationOptions

if TYPE_CHECKING:
    from node.assembly import Node
    from node.config import NodeSettings
    from node.engine.engine import Engine

PROMPT = "> "
T = TypeVar("T")


class ConversationTooLong(EngineError):
    """The history no longer fits in the context."""


def load_engine(settings: NodeSettings) -> Engine:
    """Fetch the model if needed (download bar), then load it under a progress bar."""
    from node.assembly import open_engine

    with _loading(settings) as (alias, on_progress):
        engine = open_engine(settings, on_progress=on_progress)
    _describe(alias, engine)
    return engine


@contextlib.contextmanager
def _loading(settings: NodeSettings) -> Iterator[tuple[str, Callable[[float], object]]]:
    """A progress bar on stderr while the model loads: the model's alias and the callback that moves it."""
    from rich.console import Console
    from rich.progress import BarColumn, Progress, TaskProgressColumn, TextColumn

    from node.models.catalog import resolve_model

    resolved = resolve_model(settings.model.path, settings.home)  # downloads before the bar
    columns = (TextColumn("loading {task.description}"), BarColumn(), TaskProgressColumn())
    with Progress(*columns, console=Console(stderr=True), transient=True) as progress:
        task = progress.add_task(resolved.alias, total=1.0)
        yield resolved.alias, lambda done: progress.update(task, completed=done)


def _describe(alias: str, engine: EngineClient) -> None:
    from rich.console import Console

    config = engine.config
    Console(stderr=True).print(f"[dim]{alias}: context {config.n_ctx}, KV {config.kv_type}, "
                               f"{config.n_threads} threads[/dim]", highlight=False)


class NodeLoop:
    """An open node on an event loop of its own thread; `call` runs a coroutine there and waits."""

    def __init__(self, settings: NodeSettings) -> None:
        from node.assembly import Node

        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, name="reame-node", daemon=True)
        self._thread.start()
        self._stack = contextlib.AsyncExitStack()
        try:
            with _loading(settings) as (alias, on_progress):
                self.node: Node = self.call(self._stack.enter_async_context(Node.open(settings,
                                                                                      on_progress=on_progress)))
        except BaseException:
            self._stop()
            raise
        _describe(alias, self.node.engine)

    def call(self, coro: Coroutine[Any, Any, T]) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result()

    def close(self) -> None:
        try:
            self.call(self._stack.aclose())
        finally:
            self._stop()

    def _stop(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join()
        self.loop.close()


@dataclass(slots=True)
class Turn:
    """One answer as it streamed."""

    prompt_tokens: int
    text: str = ""
    completion_tokens: int = 0
    finish_reason: str = "cancelled"
    consensus: dict[str, Any] | None = None
    cache: str = "bypass"
    decode_s: float = 0.0  # from the first text to the end (a Conclave: from the start)


class Conversation:
    """Chat history plus the generation settings of one terminal session."""

    def __init__(self, node: NodeLoop, *, max_tokens: int, temperature: float, seed: int | None = None,
                 stats: TextIO | None = None) -> None:
        self.node = node
        self.service = node.node.service
        self.sampling = SamplingParams(temperature=temperature, seed=seed)
        self.max_tokens = max_tokens
        self.history: list[dict[str, str]] = []
        self.stats = stats if stats is not None else sys.stderr

    def reset(self) -> None:
        self.history.clear()

    def _plan(self, messages: list[dict[str, str]], conclave: int = 1) -> Plan:
        n_ctx = self.service.model.n_ctx
        tokens = self.service.prompts.chat(messages)
        room = n_ctx - len(tokens)
        if room < 1:
            what = "the conversation" if self.history else "the prompt"
            hint = "; /reset starts over" if self.history else "; raise --ctx"
            raise ConversationTooLong(f"{what} ({len(tokens)} tokens) does not fit the context ({n_ctx}){hint}")
        options = GenerationOptions(max_tokens=min(self.max_tokens, room), sampling=self.sampling, stop=(), n=1,
                                    logprobs=None, stream=True, include_usage=False, conclave=conclave)
        request = ChatRequest(None, tuple(ChatMessage(m["role"], m["content"]) for m in messages), options)
        return self.service.plan_chat(request)

    def _answer(self, plan: Plan, write: Callable[[str], None] | None) -> Turn:
        """The plan's answer, its text handed to `write` as it streams; Ctrl-C stops it (the turn
        then ends "cancelled" with what was generated so far)."""
        stop = asyncio.Event()
        turn = Turn(len(plan.jobs[0].prompt_tokens))
        future = asyncio.run_coroutine_threadsafe(self._run(plan, write, turn, stop), self.node.loop)
        while True:
            try:
                future.result()
                return turn
            except KeyboardInterrupt:  # stop this answer, keep the session
                self.node.loop.call_soon_threadsafe(stop.set)

    async def _run(self, plan: Plan, write: Callable[[str], None] | None, turn: Turn, stop: asyncio.Event) -> None:
        first: float | None = None  # a Conclave's winner streams at once when decided: its time is the whole answer's
        started = time.perf_counter()

        async def consume() -> None:
            nonlocal first
            async for event in result.events():
                if isinstance(event, ChoiceText):
                    first = first if first is not None else time.perf_counter()
                    turn.text += event.text
                    if write is not None:
                        write(event.text)
                elif isinstance(event, ChoiceDone):
                    turn.completion_tokens = event.completion_tokens
                    turn.finish_reason = event.finish_reason
                    turn.consensus = dict(event.consensus) if event.consensus is not None else None
                    begun = started if event.consensus is not None or first is None else first
                    turn.decode_s = time.perf_counter() - begun

        async with self.service.answer(plan) as result:
            turn.cache = result.cache
            answering = asyncio.ensure_future(consume())
            stopping = asyncio.ensure_future(stop.wait())
            await asyncio.wait({answering, stopping}, return_when=asyncio.FIRST_COMPLETED)
            stopping.cancel()
            if not answering.done():
                answering.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await answering
                turn.finish_reason = "cancelled"
                turn.completion_tokens = len(self.service.prompts.continuation(turn.text)) if turn.text else 0
            else:
                answering.result()

    def conclave(self, text: str, out: TextIO, n: int, *, votes: bool = False) -> int:
        """Answer `text` by a Conclave of n candidates: the winner, then `CONCLAVE consensus=k/N`."""
        turn = self._answer(self._plan([*self.history, {"role": "user", "content": text}], conclave=n), None)
        out.write(turn.text + "\n")
        verdict = turn.consensus or {}
        line = f"CONCLAVE consensus={verdict.get('consensus', 0)}/{verdict.get('candidates', n)}"
        if votes:
            shown = " ".join(f"{answer!r}={count}" for answer, count in (verdict.get("votes") or {}).items())
            line += (f" decision={verdict.get('decision')} started={verdict.get('started')}"
                     f" stopped_early={'yes' if verdict.get('stopped_early') else 'no'}"
                     f" votes: {shown or '(no extractable answers)'}")
        out.write(line + "\n")
        out.flush()
        self._report(turn)
        return 0

    def reply(self, text: str, out: TextIO) -> Turn:
        """Answer `text` given the history, streaming to `out`; the turn joins the history."""
        messages = [*self.history, {"role": "user", "content": text}]

        def write(piece: str) -> None:
            out.write(piece)
            out.flush()

        turn = self._answer(self._plan(messages), write)
        out.write("\n")
        out.flush()
        self.history = [*messages, {"role": "assistant", "content": turn.text.strip()}]
        self._report(turn)
        return turn

    def _report(self, turn: Turn) -> None:
        if turn.cache == "hit":
            how = ", replayed from L1"
        else:
            how = f", {turn.completion_tokens / turn.decode_s:.1f} tok/s" if turn.decode_s > 0 else ""
        stopped = " (stopped)" if turn.finish_reason == "cancelled" else ""
        print(f"[{turn.prompt_tokens} prompt + {turn.completion_tokens} generated tokens{how}]{stopped}",
              file=self.stats, flush=True)

    def one_shot(self, prompt: str, out: TextIO) -> int:
        self.reply(prompt, out)
        return 0

    def loop(self, stdin: TextIO, out: TextIO) -> int:
        """Read turns until end of input (Ctrl-D); `/reset` forgets the conversation."""
        while True:
            try:
                line = input(PROMPT) if stdin is sys.stdin else _read(stdin, out)
            except EOFError:
                out.write("\n")
                return 0
            except KeyboardInterrupt:
                out.write("\n")
                continue
            text = line.strip()
            if not text:
                continue
            if text == "/reset":
                self.reset()
                print("(conversation cleared)", file=out, flush=True)
                continue
            if text in ("/quit", "/exit"):
                return 0
            try:
                self.reply(text, out)
            except ConversationTooLong as exc:
                print(f"reame: {exc}", file=self.stats, flush=True)


def _read(stdin: TextIO, out: TextIO) -> str:
    out.write(PROMPT)
    out.flush()
    line = stdin.readline()
    if not line:
        raise EOFError
    return line
