"""From a request to the token ids the model reads: chat template, tokenizer, BOS, once.

Every prompt the node runs comes through here: chat messages rendered through the model's
chat template, completion prompts as text, rendered text cut by warm-ahead, and the text a
session turn adds after an answer. Rendered template text is tokenized with control tokens
parsed and BOS first, exactly once, also for a template that writes BOS itself.
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

from node.models.templates import ChatTemplate
from node.serving.engine_client import EngineClient


class Prompts:
    def __init__(self, template: ChatTemplate, engine: EngineClient) -> None:
        self.template = template
        self.engine = engine

    def chat(self, messages: Sequence[Mapping[str, Any]], *, add_generation_prompt: bool = True,
             tools: Sequence[Mapping[str, object]] | None = None) -> tuple[int, ...]:
        """Messages rendered through the chat template and tokenized (template errors raise);
        `tools` are handed to templates that render them (OpenAI's tool objects)."""
        extra = {"tools": list(tools)} if tools else {}
        return self.rendered(self.template.render(messages, add_generation_prompt=add_generation_prompt, **extra))

    def rendered(self, text: str) -> tuple[int, ...]:
        """Rendered template text as the model reads it: control tokens parsed, BOS first, once."""
        return rendered_tokens(self.engine, text)

    def completion(self, text: str) -> tuple[int, ...]:
        """A completion prompt as the client wrote it (BOS first, control tokens parsed)."""
        return tuple(self.engine.tokenize(text, add_bos=True, special=True))

    def continuation(self, text: str, *, special: bool = True) -> tuple[int, ...]:
        """Text that follows tokens already in the prompt: no BOS."""
        return tuple(self.engine.tokenize(text, add_bos=False, special=special))


def rendered_tokens(engine: EngineClient, text: str) -> tuple[int, ...]:
    """See `Prompts.rendered`; for callers without a `Prompts` (the CLI's warm-ahead)."""
    tokens = engine.tokenize(text, add_bos=True, special=True)
    bos = engine.model_info.bos
    if len(tokens) > 1 and tokens[0] == tokens[1] == bos:  # a template that writes BOS itself
        tokens = tokens[1:]
    return tuple(tokens)
