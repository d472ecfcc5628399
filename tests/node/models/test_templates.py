"""Chat templates: built-in families rendered exactly, GGUF templates sandboxed, content checked."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from node.models.templates import ChatTemplate, TemplateError, family_for

CONVERSATION = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "Hi"},
    {"role": "assistant", "content": "Hello!"},
    {"role": "user", "content": "Bye"},
]


@pytest.mark.parametrize(
    "family, expected",
    [
        ("gemma",
         "<start_of_turn>user\nBe brief.\n\nHi<end_of_turn>\n<start_of_turn>model\nHello!"
         "<end_of_turn>\n<start_of_turn>user\nBye<end_of_turn>\n<start_of_turn>model\n"),
        ("chatml",
         "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n"
         "<|im_start|>assistant\nHello!<|im_end|>\n<|im_start|>user\nBye<|im_end|>\n"
         "<|im_start|>assistant\n"),
        ("llama2",
         "[INST] <<SYS>>\nBe brief.\n<</SYS>>\n\nHi [/INST] Hello! </s><s>[INST] Bye [/INST]"),
        ("llama3",
         "<|start_header_id|>system<|end_header_id|>\n\nBe brief.<|eot_id|>"
         "<|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|>"
         "<|start_header_id|>assistant<|end_header_id|>\n\nHello!<|eot_id|>"
         "<|start_header_id|>user<|end_header_id|>\n\nBye<|eot_id|>"
         "<|start_header_id|>assistant<|end_header_id|>\n\n"),
        ("zephyr",
         "<|system|>\nBe brief.</s>\n<|user|>\nHi</s>\n<|assistant|>\nHello!</s>\n"
         "<|user|>\nBye</s>\n<|assistant|>\n"),
        ("tulu",
         "<|system|>\nBe brief.\n<|user|>\nHi\n<|assistant|>\nHello!<|endoftext|>\n"
         "<|user|>\nBye\n<|assistant|>\n"),
    ],
)
def test_builtin_families_render_exactly(family, expected):
    template = ChatTemplate.builtin(family)
    assert template.render(CONVERSATION) == expected
    assert template.name == f"builtin:{family}"
    assert template.stop_strings


def test_gemma_single_turn_exact_and_without_generation_prompt():
    gemma = ChatTemplate.builtin("gemma")
    user = [{"role": "user", "content": "  Name three rivers.\n"}]
    assert gemma.render(user) == "<start_of_turn>user\nName three rivers.<end_of_turn>\n<start_of_turn>model\n"
    assert gemma.render(user, add_generation_prompt=False) == (
        "<start_of_turn>user\nName three rivers.<end_of_turn>\n"
    )
    assert gemma.stop_strings == ("<end_of_turn>",)


def test_gemma_requires_alternating_roles():
    with pytest.raises(TemplateError, match="alternate"):
        ChatTemplate.builtin("gemma").render([{"role": "user", "content": "a"}] * 2)


def test_multi_part_text_is_flattened():
    parts = [{"role": "user", "content": [{"type": "text", "text": "Hel"}, {"type": "text", "text": "lo"}]}]
    assert ChatTemplate.builtin("chatml").render(parts) == (
        "<|im_start|>user\nHello<|im_end|>\n<|im_start|>assistant\n"
    )


@pytest.mark.parametrize(
    "messages, fragment",
    [
        ([{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}], "image_url"),
        ([{"role": "user", "content": 5}], "string or an array"),
        ([{"role": "user", "content": [{"type": "text", "text": None}]}], "needs a string"),
        ([{"content": "no role"}], "role"),
        ([], "empty"),
        (["not an object"], "object"),
    ],
)
def test_bad_messages_are_clear_errors(messages, fragment):
    with pytest.raises(TemplateError, match=fragment):
        ChatTemplate.builtin("chatml").render(messages)


@dataclass(frozen=True)
class Info:
    architecture: str
    chat_template: str | None = None
    n_vocab: int = 0
    bos_text: str | None = None
    eos_text: str | None = None


@pytest.mark.parametrize(
    "architecture, n_vocab, family",
    [("gemma3", 262144, "gemma"), ("qwen2", 151936, "chatml"), ("llama", 32000, "llama2"),
     ("llama", 128256, "llama3"), ("olmoe", 50304, "tulu"), ("mystery", 1000, "chatml")],
)
def test_builtin_chosen_by_architecture(architecture, n_vocab, family):
    assert family_for(architecture, n_vocab) == family
    assert ChatTemplate.for_model(Info(architecture, n_vocab=n_vocab)).name == f"builtin:{family}"


def test_catalog_family_overrides_architecture():
    assert ChatTemplate.for_model(Info("llama", n_vocab=32000), family="zephyr").name == "builtin:zephyr"


GGUF_TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def test_gguf_template_wins_and_bos_is_left_to_the_tokenizer():
    info = Info("qwen2", chat_template=GGUF_TEMPLATE, bos_text="<s>", eos_text="<|im_end|>")
    template = ChatTemplate.for_model(info)
    assert template.name.startswith("gguf:")
    assert template.render([{"role": "user", "content": "Hi"}]) == (
        "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
    )
    assert "<|im_end|>" in template.stop_strings
    other = ChatTemplate.for_model(Info("qwen2", chat_template=GGUF_TEMPLATE + " "))
    assert other.name != template.name  # the name identifies the template text (cache keys)


def test_gguf_template_helpers_and_errors():
    helpers = ChatTemplate.from_gguf(
        "{{ strftime_now('%Y') | length }}{{ messages | tojson }}"
        "{% if messages | length > 1 %}{{ raise_exception('one message only') }}{% endif %}"
    )
    assert helpers.render([{"role": "user", "content": "é"}]).startswith('4[{"role": "user", "content": "é"}]')
    with pytest.raises(TemplateError, match="one message only"):
        helpers.render(CONVERSATION)


def test_gguf_template_is_sandboxed():
    escape = ChatTemplate.from_gguf("{{ messages.__class__.__mro__[1].__subclasses__() }}")
    with pytest.raises(TemplateError):
        escape.render([{"role": "user", "content": "x"}])
    mutate = ChatTemplate.from_gguf("{{ messages.append(1) }}")
    with pytest.raises(TemplateError):
        mutate.render([{"role": "user", "content": "x"}])


def test_broken_gguf_template_is_a_clear_error():
    with pytest.raises(TemplateError, match="does not compile"):
        ChatTemplate.from_gguf("{% for %}")
