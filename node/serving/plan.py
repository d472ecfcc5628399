"""What the service makes of a request before anything runs, and the events of its answer.

A `Plan` holds one `Job` per prompt: its tokens (the chat template already applied), the
engine request, the number of choices and the L1 key (None: not deterministic, or L1 off).
Answering a plan yields `ChoiceText` and `ChoiceDone` events in generation order; the API
shapes them into OpenAI objects, any other front end may read them as they are.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping

from node.engine.types import GenerationRequest, TokenLogprob
from node.serving.requests import GenerationOptions
from node.serving.tools import ToolMarkers
from node.sessions.turns import SessionTurn



@dataclass(frozen=True, slots=True)
class Job:
    first_choice: int
    prompt_tokens: tuple[int, ...]
    echo_text: str
    request: GenerationRequest
    n: int
    key: bytes | None
    conclave: int = 1  # > 1: one answer voted among this many candidates
    best_of: int = 1   # > n: the n best of this many candidates by mean logprob


@dataclass(frozen=True, slots=True)
class Plan:
    kind: str  # "chat" | "text"
    jobs: tuple[Job, ...]
    options: GenerationOptions
    turn: SessionTurn | None = None  # a chat turn inside a session
    markers: ToolMarkers | None = None  # how the template marks tool calls (tool_choice "auto")

    @property
    def prompt_tokens(self) -> int:
        return sum(len(job.prompt_tokens) for job in self.jobs)


@dataclass(frozen=True, slots=True)
class ChoiceText:
    index: int
    text: str
    logprobs: tuple[TokenLogprob, ...] = ()


@dataclass(frozen=True, slots=True)
class ChoiceDone:
    index: int
    finish_reason: str
    completion_tokens: int
    consensus: Mapping[str, object] | None = None  # a Conclave's verdict (the response's `reame` object)
    cached_tokens: int = 0  # prompt tokens not computed for it (usage.prompt_tokens_details.cached_tokens)
    stop_sequence: str | None = None  # the stop string that ended it (Anthropic's stop_reason "stop_sequence")


ChoiceEvent = ChoiceText | ChoiceDone
