"""Ollama's response objects: streamed NDJSON chunks, the final object, and the model listings.

`OllamaReply` turns the service's events for one choice into Ollama's objects: a chunk per piece
of text (`message.content` for /api/chat, `response` for /api/generate), tool calls as
`message.tool_calls` with `function.arguments` an object (read by the choice's `ToolCallReader`,
node/serving/tools.py), and the final object with `done`, `done_reason`, token counts and
durations in nanoseconds. `prompt_eval_count` is the whole prompt (tokens restored from the prefix
cache or answered from L1 included: what the request holds, not what was computed);
`load_duration` is 0 (the model is loaded when the node starts). /api/tags, /api/show and /api/ps
describe the one served model (`model_entry`, `model_show`).
"""

from __future__ import annotations

import json
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Mapping

from node.api.shapes import chat_logprobs
from node.api.state import NodeState
from node.serving.plan import ChoiceDone, ChoiceEvent, ChoiceText
from node.serving.requests import ToolCall
from node.serving.tools import ToolCallReader

NS = 1_000_000_000
FOREVER = "9999-12-31T23:59:59Z"  # /api/ps: the model stays loaded while the node runs
FILE_TYPES = {0: "F32", 1: "F16", 2: "Q4_0", 3: "Q4_1", 7: "Q8_0", 8: "Q5_0", 9: "Q5_1", 10: "Q2_K",
              11: "Q3_K_S", 12: "Q3_K_M", 13: "Q3_K_L", 14: "Q4_K_S", 15: "Q4_K_M", 16: "Q5_K_S",
              17: "Q5_K_M", 18: "Q6_K", 32: "BF16"}  # llama.cpp's general.file_type values


def timestamp(at: float | None = None) -> str:
    """RFC 3339 in UTC, as Ollama writes `created_at`."""
    moment = datetime.fromtimestamp(time.time() if at is None else at, timezone.utc)
    return moment.strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def ollama_call(call: ToolCall) -> dict[str, Any]:
    return {"function": {"name": call.name, "arguments": json.loads(call.arguments)}}


class OllamaReply:
    """The objects of one answer (one choice) to /api/chat (`chat`) or /api/generate."""

    def __init__(self, model: str, chat: bool, reader: ToolCallReader | None, want_logprobs: bool) -> None:
        self.model = model
        self.chat = chat
        self.reader = reader
        self.want_logprobs = want_logprobs
        self.started = time.perf_counter()
        self.first_at: float | None = None
        self.text: list[str] = []
        self.logprobs: list[dict] = []
        self.calls: list[ToolCall] = []
        self.done_reason = "stop"
        self.eval_count = 0

    def _object(self, content: str, calls: list[ToolCall] | None = None, logprobs: list[dict] | None = None,
                done: bool = False) -> dict[str, Any]:
        obj: dict[str, Any] = {"model": self.model, "created_at": timestamp()}
        if self.chat:
            message: dict[str, Any] = {"role": "assistant", "content": content}
            if calls:
                message["tool_calls"] = [ollama_call(call) for call in calls]
            obj["message"] = message
        else:
            obj["response"] = content
        if logprobs:
            obj["logprobs"] = logprobs
        obj["done"] = done
        return obj

    def add(self, event: ChoiceEvent) -> list[dict[str, Any]]:
        """The stream chunks of one event (none for the choice's end: see `final`)."""
        if isinstance(event, ChoiceText):
            if self.first_at is None:
                self.first_at = time.perf_counter()
            logprobs = chat_logprobs(event.logprobs)["content"] if self.want_logprobs else []
            self.logprobs.extend(logprobs)
            if self.reader is None:
                self.text.append(event.text)
                return [self._object(event.text, logprobs=logprobs)]
            pieces = self.reader.feed(event.text)
            chunks = []
            for piece in pieces:
                if piece[0] == "content":
                    self.text.append(piece[1])
                    chunks.append(self._object(piece[1], logprobs=logprobs))
                    logprobs = []
            return chunks
        if isinstance(event, ChoiceDone) and event.index == 0:
            self.eval_count = event.completion_tokens
            self.done_reason = event.finish_reason
            if self.reader is None:
                return []
            pieces, _ = self.reader.finish(event.finish_reason)  # Ollama says "stop" after calls too
            chunks = []
            for piece in pieces:
                if piece[0] == "content":
                    self.text.append(piece[1])
                    chunks.append(self._object(piece[1]))
            self.calls = list(self.reader.calls)
            if self.calls:
                self.text = [self.reader.content() or ""]
                chunks.append(self._object("", self.calls))
            return chunks
        return []

    def final(self, prompt_tokens: int, *, whole: bool, context: list[int] | None = None) -> dict[str, Any]:
        """The last object: with everything (`whole`, not streamed) or with the statistics only."""
        now = time.perf_counter()
        first = self.first_at if self.first_at is not None else now
        obj = self._object("".join(self.text) if whole else "", self.calls if whole else None,
                           self.logprobs if whole else None, done=True)
        obj |= {"done_reason": self.done_reason, "total_duration": int((now - self.started) * NS),
                "load_duration": 0, "prompt_eval_count": prompt_tokens,
                "prompt_eval_duration": int((first - self.started) * NS),
                "eval_count": self.eval_count, "eval_duration": int((now - first) * NS)}
        if context is not None:
            obj["context"] = context
        return obj


def loaded(model: str, chat: bool) -> dict[str, Any]:
    """The answer to an empty request (Ollama's way to load a model): it is loaded already."""
    obj: dict[str, Any] = {"model": model, "created_at": timestamp()}
    if chat:
        obj["message"] = {"role": "assistant", "content": ""}
    else:
        obj["response"] = ""
    return obj | {"done": True, "done_reason": "load"}


def model_details(state: NodeState) -> dict[str, Any]:
    meta: Mapping[str, str] = state.engine.model_info.metadata
    family = state.engine.model_info.architecture
    try:
        file_type = FILE_TYPES.get(int(meta.get("general.file_type", "")), "unknown")
    except ValueError:
        file_type = "unknown"
    return {"parent_model": "", "format": "gguf", "family": family, "families": [family],
            "parameter_size": str(meta.get("general.size_label", "")), "quantization_level": file_type}


def model_entry(state: NodeState, *, running: bool = False) -> dict[str, Any]:
    """The served model as /api/tags lists it (and /api/ps, with `running`)."""
    path = Path(state.engine.config.model_path)
    name = f"{state.model.model_id}:latest"
    entry: dict[str, Any] = {"name": name, "model": name, "size": path.stat().st_size,
                             "digest": state.model.fingerprint, "details": model_details(state)}
    if running:
        return entry | {"expires_at": FOREVER, "size_vram": 0, "context_length": state.model.n_ctx}
    return entry | {"modified_at": timestamp(path.stat().st_mtime)}


def model_show(state: NodeState) -> dict[str, Any]:
    """/api/show: details, the GGUF's metadata, the chat template and what the model can do."""
    info = state.engine.model_info
    template = state.model.template
    capabilities = ["completion"] + (["tools"] if template.renders_tools else [])
    parameters = "\n".join(f"stop {json.dumps(stop)}" for stop in template.stop_strings)
    return {
        "modelfile": f"FROM {state.engine.config.model_path}\n", "parameters": parameters,
        "template": template.source, "details": model_details(state),
        "model_info": {**info.metadata, f"{info.architecture}.context_length": info.n_ctx_train},
        "capabilities": capabilities,
        "modified_at": timestamp(Path(state.engine.config.model_path).stat().st_mtime),
    }
