"""OpenAI response objects: whole completions, stream chunks, logprobs and usage.

Builders only: they take the service's choice events and the request's identity and return
plain dicts ready for orjson. `Collector` gathers a non-streamed answer choice by choice. A
Conclave's verdict is the top-level `reame` object of the response, or of the stream chunk
carrying the winner's finish_reason. A request with tools reads each choice through a
`ToolCallReader` (node/serving/tools.py): calls become `message.tool_calls` (streamed as
`delta.tool_calls` with an index) and the finish reason `tool_calls`.
"""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass, field

from node.engine.types import TokenLogprob
from node.serving.plan import ChoiceDone, ChoiceEvent, ChoiceText, Plan
from node.serving.tools import ToolCallReader


@dataclass(frozen=True, slots=True)
class Identity:
    """What every object of one response repeats."""

    kind: str  # "chat" | "text"
    model: str
    system_fingerprint: str
    id: str = field(default="")
    created: int = field(default=0)

    @classmethod
    def new(cls, kind: str, model: str, system_fingerprint: str) -> "Identity":
        prefix = "chatcmpl-" if kind == "chat" else "cmpl-"
        return cls(kind, model, system_fingerprint, prefix + uuid.uuid4().hex, int(time.time()))

    def envelope(self, chunk: bool) -> dict:
        if self.kind == "chat":
            obj = "chat.completion.chunk" if chunk else "chat.completion"
        else:
            obj = "text_completion"
        return {"id": self.id, "object": obj, "created": self.created, "model": self.model,
                "system_fingerprint": self.system_fingerprint}


def _text(raw: bytes) -> str:
    return raw.decode("utf-8", "replace")


def chat_logprobs(items: tuple[TokenLogprob, ...] | list[TokenLogprob]) -> dict:
    return {"content": [
        {"token": _text(item.text), "logprob": item.logprob, "bytes": list(item.text),
         "top_logprobs": [{"token": _text(text), "logprob": lp, "bytes": list(text)} for _, text, lp in item.top]}
        for item in items
    ], "refusal": None}


def text_logprobs(items: tuple[TokenLogprob, ...] | list[TokenLogprob], offset: int) -> dict:
    offsets, position = [], offset
    for item in items:
        offsets.append(position)
        position += len(_text(item.text))
    return {
        "tokens": [_text(item.text) for item in items],
        "token_logprobs": [item.logprob for item in items],
        "top_logprobs": [{_text(text): lp for _, text, lp in item.top} for item in items],
        "text_offset": offsets,
    }


def usage(prompt_tokens: int, completion_tokens: int, cached_tokens: int = 0) -> dict:
    """OpenAI's usage object; `cached_tokens`: prompt tokens not computed (restored prefix, L1)."""
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens,
            "prompt_tokens_details": {"cached_tokens": min(cached_tokens, prompt_tokens)}}


def tool_readers(plan: Plan, n_choices: int) -> list[ToolCallReader] | None:
    """One reader per choice when the answer may hold tool calls, else None."""
    output = plan.options.output
    if plan.kind != "chat" or output is None or output.choice is None:
        return None
    call_id = plan.turn.call_id if plan.turn is not None else None  # a session keeps its answer's call
    return [ToolCallReader(output, plan.markers, call_id if index == 0 else None) for index in range(n_choices)]


class Collector:
    """Accumulates the events of a non-streamed answer into one response object."""

    def __init__(self, identity: Identity, n_choices: int, want_logprobs: bool,
                 readers: list[ToolCallReader] | None = None) -> None:
        self.identity = identity
        self.readers = readers
        self.want_logprobs = want_logprobs
        self.texts: list[list[str]] = [[] for _ in range(n_choices)]
        self.logprobs: list[list[TokenLogprob]] = [[] for _ in range(n_choices)]
        self.finish: list[str | None] = [None] * n_choices
        self.completion_tokens = 0
        self.cached_tokens = 0
        self.consensus: dict | None = None

    def add(self, event: ChoiceEvent) -> None:
        if isinstance(event, ChoiceText):
            self.texts[event.index].append(event.text)
            self.logprobs[event.index].extend(event.logprobs)
        elif isinstance(event, ChoiceDone):
            self.finish[event.index] = event.finish_reason
            self.completion_tokens += event.completion_tokens
            self.cached_tokens += event.cached_tokens
            if event.consensus is not None:
                self.consensus = dict(event.consensus)

    def response(self, prompt_tokens: int) -> dict:
        choices = []
        for index, (parts, reason) in enumerate(zip(self.texts, self.finish)):
            text = "".join(parts)
            items = self.logprobs[index]
            if self.identity.kind == "chat":
                message: dict[str, object] = {"role": "assistant", "content": text, "refusal": None}
                if self.readers is not None and reason is not None:
                    reader = self.readers[index]
                    reader.feed(text)
                    _, reason = reader.finish(reason)
                    message["content"] = reader.content()
                    if reader.calls:
                        message["tool_calls"] = [call.as_dict() for call in reader.calls]
                choices.append({
                    "index": index, "message": message,
                    "logprobs": chat_logprobs(items) if self.want_logprobs else None, "finish_reason": reason,
                })
            else:
                choices.append({"index": index, "text": text, "finish_reason": reason,
                                "logprobs": text_logprobs(items, 0) if self.want_logprobs else None})
        response = {**self.identity.envelope(chunk=False), "choices": choices,
                    "usage": usage(prompt_tokens, self.completion_tokens, self.cached_tokens)}
        if self.consensus is not None:
            response["reame"] = self.consensus
        return response


class ChunkMaker:
    """Stream chunks of one response, in OpenAI's order and shapes."""

    def __init__(self, identity: Identity, want_logprobs: bool, include_usage: bool,
                 readers: list[ToolCallReader] | None = None) -> None:
        self.identity = identity
        self.readers = readers
        self.want_logprobs = want_logprobs
        self.include_usage = include_usage
        self.offsets: dict[int, int] = {}
        self.completion_tokens = 0
        self.cached_tokens = 0

    def _chunk(self, choice: dict) -> dict:
        chunk = {**self.identity.envelope(chunk=True), "choices": [choice]}
        if self.include_usage:
            chunk["usage"] = None
        return chunk

    def role(self, index: int) -> dict:
        return self._chunk({"index": index, "delta": {"role": "assistant", "content": ""},
                            "logprobs": None, "finish_reason": None})

    def event(self, event: ChoiceEvent) -> dict:
        chat = self.identity.kind == "chat"
        if isinstance(event, ChoiceDone):
            self.completion_tokens += event.completion_tokens
            self.cached_tokens += event.cached_tokens
            body: dict[str, object] = {"index": event.index, "finish_reason": event.finish_reason, "logprobs": None}
            if chat:
                body["delta"] = {}
            else:
                body["text"] = ""
            chunk = self._chunk(body)
            if event.consensus is not None:
                chunk["reame"] = dict(event.consensus)
            return chunk
        logprobs = None
        if self.want_logprobs:
            if chat:
                logprobs = chat_logprobs(event.logprobs)
            else:
                logprobs = text_logprobs(event.logprobs, self.offsets.get(event.index, 0))
        self.offsets[event.index] = self.offsets.get(event.index, 0) + len(event.text)
        body = {"index": event.index, "logprobs": logprobs, "finish_reason": None}
        body |= {"delta": {"content": event.text}} if chat else {"text": event.text}
        return self._chunk(body)

    def events(self, event: ChoiceEvent) -> list[dict]:
        """The chunks of one event: through the choice's tool-call reader when there is one."""
        if self.readers is None:
            return [self.event(event)]
        reader = self.readers[event.index]
        if isinstance(event, ChoiceText):
            pieces = reader.feed(event.text)
            done = None
        else:
            pieces, reason = reader.finish(event.finish_reason)
            done = ChoiceDone(event.index, reason, event.completion_tokens, cached_tokens=event.cached_tokens)
        chunks = []
        for piece in pieces:
            if piece[0] == "content":
                chunks.append(self.event(ChoiceText(event.index, piece[1])))
            else:
                chunks.append(self._chunk({"index": event.index, "delta": {"tool_calls": [piece[2]]},
                                           "logprobs": None, "finish_reason": None}))
        if done is not None:
            chunks.append(self.event(done))
        return chunks

    def usage_chunk(self, prompt_tokens: int) -> dict:
        return {**self.identity.envelope(chunk=True), "choices": [],
                "usage": usage(prompt_tokens, self.completion_tokens, self.cached_tokens)}
