"""Tool-call turns of a conversation, as a chat template can render them.

An agent loop sends back what the model called (an assistant message with `tool_calls`) and
what each call returned (a message with role "tool", its `tool_call_id` and content). The
messages reach a template in Hugging Face's convention (node/serving/requests.py's
`ChatMessage.as_dict`): a call's `function.arguments` is the parsed object.

A template renders tools natively when it writes calls between `<tool_call>` markers (Qwen
2.5 / Hermes style; `native_tool_markers`): it gets the messages as they are. Any other
template (Gemma's, which demands user/assistant alternation, the built-in ChatML one) gets
them converted by `plain_tool_turns`, in `ChatTemplate.render` and nowhere else:
- an assistant call becomes assistant text holding the call as the compact JSON object
  `{"name":...,"arguments":...}` the forced-call grammar makes the model write
  (node/serving/tools.py), one line per call after any content, so the model reads its
  own earlier call in its own format;
- a tool result becomes a user turn saying which function and call id it answers, then its
  content;
- a converted turn is merged with a neighbour of the same role (contents joined by a blank
  line), so that two results in a row, or a result followed by the user's next question,
  make one user turn and the template's alternation holds.
"""

from __future__ import annotations

import json
from typing import Any, Mapping, Sequence

TOOL_CALL_OPEN = "<tool_call>"
TOOL_CALL_CLOSE = "</tool_call>"


def native_tool_markers(source: str) -> tuple[str, str] | None:
    """The markers a template that renders `tools` writes its calls between, if it does."""
    if "tools" in source and TOOL_CALL_OPEN in source and TOOL_CALL_CLOSE in source:
        return TOOL_CALL_OPEN, TOOL_CALL_CLOSE
    return None


def call_text(name: str, arguments: Any) -> str:
    """A call as the forced-call grammar writes it: compact, `name` first, key order kept."""
    return json.dumps({"name": name, "arguments": arguments}, separators=(",", ":"), ensure_ascii=False)


def result_text(message: Mapping[str, Any]) -> str:
    name = message.get("name")
    source = f"{name} (call {message.get('tool_call_id')})" if name else f"call {message.get('tool_call_id')}"
    return f"Tool result of {source}:\n{message.get('content') or ''}"


def _plain(message: Mapping[str, Any]) -> tuple[dict[str, Any], bool]:
    """The message without tool fields, and whether it was converted."""
    if message.get("role") == "tool":
        return {"role": "user", "content": result_text(message)}, True
    calls = message.get("tool_calls")
    if message.get("role") == "assistant" and calls:
        lines = [message["content"]] if message.get("content") else []
        for call in calls:
            function = call.get("function", call)
            lines.append(call_text(function.get("name"), function.get("arguments")))
        return {"role": "assistant", "content": "\n".join(lines)}, True
    return dict(message), False


def plain_tool_turns(messages: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """The messages with tool calls and results as plain text turns (module docstring)."""
    if not any(message.get("role") == "tool" or message.get("tool_calls") for message in messages):
        return [dict(message) for message in messages]
    out: list[dict[str, Any]] = []
    converted: list[bool] = []
    for message in messages:
        plain, was_converted = _plain(message)
        if out and out[-1]["role"] == plain["role"] and (was_converted or converted[-1]):
            out[-1]["content"] = f"{out[-1]['content']}\n\n{plain['content']}"
            converted[-1] = True
            continue
        out.append(plain)
        converted.append(was_converted)
    return out
