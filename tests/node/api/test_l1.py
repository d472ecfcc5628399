"""L1 keys: everything that changes the output changes the key; nothing else does."""

from __future__ import annotations

import dataclasses

from node.api.schemas import parse_chat
from node.engine.types import TokenLogprob
from node.serving.l1 import KEY_PREFIX, Piece, StoredAnswer, StoredChoice, decode_answer, encode_answer, l1_key

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


def test_greedy_ignores_parameters_that_cannot_change_a_greedy_choice():
    assert key({"top_k": 3, "top_p": 0.2, "min_p": 0.3, "seed": 9, "stream": True, "user": "u"}) == key()


def test_sampled_keys_include_the_sampler():
    hot = {"temperature": 0.8, "seed": 1}
    assert key(hot) != key({**hot, "seed": 2})
    assert key(hot) != key({**hot, "top_k": 3})


def test_record_round_trip_and_garbage_is_a_miss():
    lp = TokenLogprob(token=5, text=b"\xe2\x82", logprob=-0.5, top=((5, b"\xe2\x82", -0.5), (6, b"b", -1.5)))
    answer = StoredAnswer(12, (StoredChoice((Piece("Hel"), Piece("lo", (lp,))), "stop", 3),
                               StoredChoice((), "length", 0)))
    assert decode_answer(encode_answer(answer)) == answer
    for garbage in (b"", b"not json", b"[]", b'{"v": 99}', b'{"v": 1, "prompt_tokens": 1, "choices": [{}]}'):
        assert decode_answer(garbage) is None
    assert dataclasses.is_dataclass(answer)
