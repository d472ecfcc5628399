"""L1 keys: everything that changes the output changes the key; nothing else does.

The key is derived from the request's dataclass fields; `test_every_request_field_is_classified`
fails when a field is added to the requests without deciding whether it shapes the answer.
"""

from __future__ import annotations

import dataclasses

from node.api.schemas import parse_chat
from node.engine.types import SamplingParams, TokenLogprob
from node.serving.l1 import (
    GREEDY_IRRELEVANT, KEY_PREFIX, KEYED, NOT_KEYED, REQUEST_FIELDS, Piece, StoredAnswer, StoredChoice,
    decode_answer, encode_answer, keyed_fields, l1_key,
)
from node.serving.requests import GenerationOptions

BASE = {"messages": [{"role": "user", "content": "x"}], "temperature": 0, "max_tokens": 8}


def key(body_changes=None, **identity):
    options = parse_chat({**BASE, **(body_changes or {})}).options
    args = {"fingerprint": "ab" * 32, "kv_type": "f16", "kind": "chat", "template": "builtin:gemma",
            "prompt_tokens": (2, 10, 11)} | identity
    return l1_key(options=options, **args)


def test_key_is_stable_and_prefixed():
    assert key() == key()
    assert key().startswith(KEY_PREFIX) and len(key()) == len(KEY_PREFIX) + 64


def test_output_shaping_inputs_change_the_key():
    base = key()
    variants = [
        key(fingerprint="cd" * 32), key(kv_type="q8_0"), key(kind="text"), key(template="builtin:chatml"),
        key(prompt_tokens=(2, 10, 12)), key(prompt_tokens=(2, 10, 11, 0)),
        key({"max_tokens": 9}), key({"stop": "\n"}), key({"n": 2}), key({"logprobs": True}),
        key({"repeat_penalty": 1.1}), key({"presence_penalty": 0.1}), key({"frequency_penalty": 0.1}),
        key({"logit_bias": {"5": 1}}),
    ]
    assert len({base, *variants}) == len(variants) + 1


def option_fields() -> set[str]:
    names = {f.name for f in dataclasses.fields(GenerationOptions) if f.name != "sampling"}
    return names | {f"sampling.{f.name}" for f in dataclasses.fields(SamplingParams)}


def test_every_request_field_is_classified():
    fields = option_fields()
    unclassified = fields - KEYED - NOT_KEYED
    assert not unclassified, f"add {sorted(unclassified)} to KEYED or NOT_KEYED in node/serving/l1.py"
    assert not KEYED & NOT_KEYED and KEYED | NOT_KEYED == fields and GREEDY_IRRELEVANT <= KEYED
    for request_type, routes in REQUEST_FIELDS.items():
        assert set(routes) == {f.name for f in dataclasses.fields(request_type)}, request_type.__name__


def test_every_keyed_field_is_in_the_key_of_a_sampled_request():
    options = parse_chat({**BASE, "temperature": 0.5}).options
    assert set(keyed_fields(options)) == KEYED
    assert set(keyed_fields(parse_chat(BASE).options)) == KEYED - GREEDY_IRRELEVANT


def test_grammar_changes_the_key():
    options = parse_chat(BASE).options
    constrained = dataclasses.replace(options, sampling=dataclasses.replace(options.sampling,
                                                                           grammar='root ::= "yes"'))
    args = {"fingerprint": "ab" * 32, "kv_type": "f16", "kind": "chat", "template": "t", "prompt_tokens": (2,)}
    assert l1_key(options=options, **args) != l1_key(options=constrained, **args)


def test_greedy_ignores_parameters_that_cannot_change_a_greedy_choice():
    assert key({"top_k": 3, "top_p": 0.2, "min_p": 0.3, "seed": 9, "stream": True, "user": "u"}) == key()


def test_sampled_keys_include_the_sampler():
    hot = {"temperature": 0.8, "seed": 1}
    assert key(hot) != key({**hot, "seed": 2})
    assert key(hot) != key({**hot, "top_k": 3})


def test_record_round_trip_and_garbage_is_a_miss():
    lp = TokenLogprob(token=5, text=b"\xe2\x82", logprob=-0.5, top=((5, b"\xe2\x82", -0.5), (6, b"b", -1.5)))
    answer = StoredAnswer(12, (StoredChoice((Piece("Hel"), Piece("lo", (lp,))), "stop", 3, "\n\n"),
                               StoredChoice((), "length", 0)))
    assert decode_answer(encode_answer(answer)) == answer
    for garbage in (b"", b"not json", b"[]", b'{"v": 99}', b'{"v": 1, "prompt_tokens": 1, "choices": [{}]}'):
        assert decode_answer(garbage) is None
    assert dataclasses.is_dataclass(answer)
