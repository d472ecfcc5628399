"""Talking to a model from the terminal: load it with progress, answer once, or chat in turns.

The conversation is kept as chat messages and rendered through the model's chat template at
every turn, so the model sees the whole history (and the prefix cache makes the repeated part
cheap). Answers stream to stdout as they are generated; a short cost line goes to stderr.
"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, TextIO

from node.engine.errors import EngineError
from node.models.templates import ChatTemplate
from node.engine.types import Finished, GenerationRequest, SamplingParams, TextDelta

if TYPE_CHECKING:
    from node.config import NodeSettings
    from node.engine.engine import Engine
    from node.serving.conclave.runner import ConclavePolicy

PROMPT = "> "


class ConversationTooLong(EngineError):
    """The history no longer fits in the context."""


def load_engine(settings: NodeSettings) -> Engine:
    """Fetch the model if needed (download bar), then load it under a progress bar."""
    from rich.console import Console
    from rich.progress import BarColumn, Progress, TaskProgressColumn, TextColumn

    from node.assembly import open_engine
    from node.models.catalog import resolve_model

    resolved = resolve_model(settings.model.path, settings.home)  # downloads before the bar
    console = Console(stderr=True)
    columns = (TextColumn("loading {task.description}"), BarColumn(), TaskProgressColumn())
    with Progress(*columns, console=console, transient=True) as progress:
        task = progress.add_task(resolved.alias, total=1.0)
        engine = open_engine(settings, on_progress=lambda done: progress.update(task, completed=done))
    config = engine.config
    console.print(f"[dim]{resolved.alias}: context {config.n_ctx}, KV {config.kv_type}, "
                  f"{config.n_threads} threads[/dim]", highlight=False)
    return engine


class Conversation:
    """Chat history plus the generation settings of one terminal session."""

    def __init__(self, engine: Engine, *, max_tokens: int, temperature: float, seed: int | None = None,
                 stats: TextIO | None = None) -> None:
        self.engine = engine
        self.template = ChatTemplate.for_engine(engine)
        self.sampling = SamplingParams(temperature=temperature, seed=seed)
        self.max_tokens = max_tokens
        self.history: list[dict[str, str]] = []
        self.stats = stats if stats is not None else sys.stderr

    def reset(self) -> None:
        self.history.clear()

    def _request(self, messages: list[dict[str, str]]) -> GenerationRequest:
        tokens = self.engine.tokenize(self.template.render(messages), add_bos=True, special=True)
        room = self.engine.n_ctx - len(tokens)
        if room < 1:
            what = "the conversation" if self.history else "the prompt"
            hint = "; /reset starts over" if self.history else "; raise --ctx"
            raise ConversationTooLong(
                f"{what} ({len(tokens)} tokens) does not fit the context ({self.engine.n_ctx}){hint}"
            )
        return GenerationRequest(tuple(tokens), max_tokens=min(self.max_tokens, room),
                                 sampling=self.sampling, stop=self.template.stop_strings)

    def conclave(self, text: str, out: TextIO, n: int, policy: ConclavePolicy, *, votes: bool = False) -> int:
        """Answer `text` by a Conclave of n candidates: the winner, then `CONCLAVE consensus=k/N`."""
        import asyncio

        from node.serving.conclave.runner import ConclaveRun, Outcome

        request = self._request([*self.history, {"role": "user", "content": text}])

        async def decide() -> Outcome:
            loop = asyncio.get_running_loop()
            run = ConclaveRun(lambda reqs, spare, group: self.engine.submit_group(reqs, loop, spare=spare, group=group),
                              request, n, policy)
            run.start()
            try:
                return await run.decide()
            finally:
                run.cancel()

        outcome = asyncio.run(decide())
        assert outcome.winner.finished is not None
        if outcome.winner.finished.reason == "error":
            raise EngineError(outcome.winner.finished.error or "generation failed")
        out.write(outcome.winner.text + "\n")
        verdict = outcome.verdict
        line = f"CONCLAVE consensus={verdict.consensus}/{outcome.candidates}"
        if votes:
            shown = " ".join(f"{answer!r}={count}" for answer, count in verdict.votes.items())
            line += (f" decision={verdict.method} started={outcome.started} cancelled={outcome.cancelled}"
                     f" votes: {shown or '(no extractable answers)'}")
        out.write(line + "\n")
        out.flush()
        self._report(outcome.winner.finished)
        return 0

    def reply(self, text: str, out: TextIO) -> Finished:
        """Answer `text` given the history, streaming to `out`; the turn joins the history."""
        messages = [*self.history, {"role": "user", "content": text}]
        request = self._request(messages)
        handle = self.engine.submit(request)
        parts: list[str] = []
        finished: Finished | None = None
        try:
            for event in handle.iter_sync():
                if isinstance(event, TextDelta):
                    out.write(event.text)
                    out.flush()
                    parts.append(event.text)
                else:
                    finished = event
        except KeyboardInterrupt:  # stop this answer, keep the session
            handle.cancel()
            finished = next(e for e in handle.iter_sync() if isinstance(e, Finished))
        out.write("\n")
        out.flush()
        assert finished is not None
        if finished.reason == "error":
            raise EngineError(finished.error or "generation failed")
        self.history = [*messages, {"role": "assistant", "content": "".join(parts).strip()}]
        self._report(finished)
        return finished

    def _report(self, finished: Finished) -> None:
        decode_s = finished.timings.get("decode_s") or 0.0
        rate = f", {finished.completion_tokens / decode_s:.1f} tok/s" if decode_s > 0 else ""
        stopped = " (stopped)" if finished.reason == "cancelled" else ""
        print(f"[{finished.prompt_tokens} prompt + {finished.completion_tokens} generated tokens"
              f"{rate}]{stopped}", file=self.stats, flush=True)

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
