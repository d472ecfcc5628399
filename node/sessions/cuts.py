"""Cutting a rendered chat template where later requests diverge, for warm-ahead and sessions.

(How the cut text becomes tokens is node/serving/prompts.py.)

A chat template renders a whole conversation; the prefix KV cache needs the part that later
requests will share token for token. Both cuts render the conversation with a placeholder
(`CUT`, private-use characters no real text contains) at the point of interest and cut the
rendered text there, so whatever the template writes around messages (role headers, a system
message folded into the first user turn, end-of-turn markers) is exactly what a later
request renders too.

`shared_prefix(template, messages)`: warm-ahead. When the last message is a system message,
a placeholder user message follows it and the text is cut at its content: the result is what
every request that continues these messages with a user message shares (with Gemma, the
document folded into the first user turn, followed by its "\\n\\n"). Otherwise the cut is at
the end of the last message's content: requests whose last message starts with that content
(a document followed by a question in one user message) share it.

`turn_suffix(template, history, new)`: sessions. The text that follows an answer in the
rendered conversation: `closing` (what closes the answer, e.g. "<end_of_turn>\\n") and
`opening` (the new messages and the generation prompt).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping, Sequence

from node.models.templates import ChatTemplate, TemplateError

CUT = "\ue000reame-cut\ue000"


class CutError(TemplateError):
    """The template dropped or repeated the placeholder: no well-defined cut exists."""


@dataclass(frozen=True, slots=True)
class TurnSuffix:
    closing: str  # after the answer's content, before the next message
    opening: str  # the next messages and the generation prompt


def _after_cut(text: str) -> tuple[str, str]:
    if text.count(CUT) != 1:
        raise CutError("the chat template does not render message content verbatim; cannot cut it")
    head, tail = text.split(CUT)
    return head, tail


def shared_prefix(template: ChatTemplate, messages: Sequence[Mapping[str, Any]]) -> str:
    """The rendered text every later request continuing `messages` shares (module docstring)."""
    if not messages:
        raise CutError("no messages to warm")
    items = [dict(message) for message in messages]
    if items[-1]["role"] in ("system", "developer"):
        items.append({"role": "user", "content": CUT})
    else:
        items[-1]["content"] = f"{items[-1]['content']}{CUT}"
    head, _ = _after_cut(template.render(items, add_generation_prompt=False))
    return head


def turn_suffix(template: ChatTemplate, history: Sequence[Mapping[str, Any]],
                new: Sequence[Mapping[str, Any]]) -> TurnSuffix:
    """What follows the last answer of `history` when `new` messages are added."""
    if not history or history[-1]["role"] != "assistant":
        raise CutError("a conversation continues after an answer")
    items = [dict(message) for message in history]
    items[-1] = {"role": "assistant", "content": CUT}  # an answer that was a call ends as one does
    _, closing = _after_cut(template.render(items, add_generation_prompt=False))
    _, following = _after_cut(template.render([*items, *map(dict, new)], add_generation_prompt=True))
    if not following.startswith(closing):
        raise CutError("the chat template renders an answer differently once more messages follow")
    return TurnSuffix(closing, following[len(closing):])
