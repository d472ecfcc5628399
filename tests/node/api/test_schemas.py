"""Request validation: every field's type and range, unsupported features, defaults."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from node.api.errors import error_reply
from node.serving.errors import InvalidRequest, UnsupportedFeature
from node.api.schemas import parse_chat, parse_completion
from node.serving import structure

CHAT = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
TEXT = {"model": "m", "prompt": "hi"}


@pytest.mark.parametrize(
    "field, value, param",
    [
        ("max_tokens", "5", "max_tokens"),
        ("max_tokens", True, "max_tokens"),
        ("max_tokens", 0, "max_tokens"),
        ("max_tokens", 1.5, "max_tokens"),
        ("max_completion_tokens", [], "max_completion_tokens"),
        ("temperature", "hot", "temperature"),
        ("temperature", 3, "temperature"),
        ("top_p", 1.5, "top_p"),
        ("top_k", -1, "top_k"),
        ("top_k", 2.5, "top_k"),
        ("min_p", "0.1", "min_p"),
        ("seed", "42", "seed"),
        ("stop", 5, "stop"),
        ("stop", ["ok", 3], "stop"),
        ("stop", [""], "stop"),
        ("stop", ["x"] * 17, "stop"),
        ("n", 0, "n"),
        ("n", 99, "n"),
        ("n", "2", "n"),
        ("presence_penalty", 5, "presence_penalty"),
        ("frequency_penalty", {}, "frequency_penalty"),
        ("repeat_penalty", "1.1", "repeat_penalty"),
        ("logit_bias", [1, 2], "logit_bias"),
        ("logit_bias", {"abc": 1}, "logit_bias"),
        ("logit_bias", {"\u00b2": 1}, "logit_bias"),
        ("logit_bias", {"12": 500}, "logit_bias"),
        ("logit_bias", {"12": "1"}, "logit_bias"),
        ("stream", "yes", "stream"),
        ("model", 7, "model"),
    ],
)
@pytest.mark.parametrize("parse, base", [(parse_chat, CHAT), (parse_completion, TEXT)])
def test_wrong_types_and_ranges_name_the_field(parse, base, field, value, param):
    with pytest.raises(InvalidRequest) as caught:
        parse({**base, field: value})
    assert caught.value.param == param
    assert error_reply(caught.value).status == 400
    assert param in caught.value.message


@pytest.mark.parametrize(
    "body, param",
    [
        ({"messages": None}, "messages"),
        ({"messages": []}, "messages"),
        ({"messages": "hi"}, "messages"),
        ({"messages": ["hi"]}, "messages[0]"),
        ({"messages": [{"role": "user"}]}, "messages[0].content"),
        ({"messages": [{"role": "user", "content": None}]}, "messages[0].content"),
        ({"messages": [{"role": "user", "content": 12}]}, "messages[0].content"),
        ({"messages": [{"role": "wizard", "content": "x"}]}, "messages[0].role"),
        ({"messages": [{"role": "user", "content": [{"type": "text"}]}]}, "messages[0].content[0].text"),
        ({"messages": [{"role": "user", "content": [{"type": "text", "text": 5}]}]}, "messages[0].content[0].text"),
        ({"messages": [{"role": "user", "content": ["plain"]}]}, "messages[0].content[0]"),
        ({**CHAT, "logprobs": 1}, "logprobs"),
        ({**CHAT, "top_logprobs": 3}, "top_logprobs"),
        ({**CHAT, "logprobs": True, "top_logprobs": 21}, "top_logprobs"),
        ({**CHAT, "stream_options": {"include_usage": True}}, "stream_options"),
        ({**CHAT, "stream": True, "stream_options": {"include_usage": "yes"}}, "stream_options.include_usage"),
        ({**CHAT, "stream": True, "stream_options": []}, "stream_options"),
        # a json_schema beside type text is unused, but still held to its documented shape
        ({**CHAT, "response_format": {"type": "text", "json_schema": {"name": 0.0, "schema": {}}}},
         "response_format.json_schema.name"),
        ({**CHAT, "response_format": {"type": "json_object", "json_schema": {"name": "x"}}},
         "response_format.json_schema.schema"),
        ({**CHAT, "response_format": {"type": "text", "json_schema": {"schema": "x"}}},
         "response_format.json_schema.schema"),
        ({**CHAT, "response_format": {"type": "text", "json_schema": []}}, "response_format.json_schema"),
    ],
)
def test_chat_shape_errors(body, param):
    with pytest.raises(InvalidRequest) as caught:
        parse_chat(body)
    assert caught.value.param == param


@pytest.mark.parametrize(
    "body, param",
    [
        ({**TEXT, "tools": [{"type": "function", "function": {"name": "f"}}]}, "tools"),
        ({**CHAT, "tools": [{"type": "retrieval"}]}, "tools[0].type"),
        ({**CHAT, "response_format": {"type": "json_schema", "json_schema": {
            "name": "x", "schema": {"type": "array", "uniqueItems": True}}}}, "response_format.json_schema.schema"),
        ({**CHAT, "functions": [{}]}, "functions"),
        ({"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]},
         "messages[0].content[0].type"),
        ({"messages": [{"role": "function", "name": "f", "content": "x"}]}, "messages[0].role"),
        ({**TEXT, "suffix": "end"}, "suffix"),
        ({**TEXT, "echo": True, "logprobs": 2}, "echo"),
    ],
)
def test_unsupported_features_are_refused_clearly(body, param):
    parse = parse_chat if "messages" in body else parse_completion
    with pytest.raises(UnsupportedFeature) as caught:
        structure.verify_all(structure.checks(parse(body).options))  # parsing, then the checks off the loop
    assert caught.value.param == param
    assert "not supported" in caught.value.message


def test_body_must_be_an_object():
    for body in ([], "x", 3, None):
        with pytest.raises(InvalidRequest):
            parse_chat(body)


def test_chat_fields_are_read_into_a_frozen_request():
    req = parse_chat({
        "model": "gemma", "max_completion_tokens": 7, "temperature": 0, "top_k": 5, "top_p": 0.5, "min_p": 0.1,
        "seed": 3, "stop": "END", "n": 2, "presence_penalty": 0.5, "frequency_penalty": -0.5, "repeat_penalty": 1.1,
        "logit_bias": {"17": -100}, "logprobs": True, "top_logprobs": 2, "stream": True,
        "stream_options": {"include_usage": True}, "user": "ignored", "response_format": {"type": "text"},
        "messages": [{"role": "developer", "content": "be brief"},
                     {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}],
    })
    options = req.options
    assert req.model == "gemma"
    assert [m.as_dict() for m in req.messages] == [{"role": "system", "content": "be brief"},
                                                  {"role": "user", "content": "ab"}]
    assert (options.max_tokens, options.n, options.stop, options.logprobs) == (7, 2, ("END",), 2)
    assert options.stream and options.include_usage and options.deterministic
    sampling = options.sampling
    assert (sampling.temperature, sampling.top_k, sampling.top_p, sampling.min_p, sampling.seed) == (0, 5, 0.5, 0.1, 3)
    assert (sampling.presence_penalty, sampling.frequency_penalty, sampling.repeat_penalty) == (0.5, -0.5, 1.1)
    assert dict(sampling.logit_bias) == {17: -100.0}
    with pytest.raises(AttributeError):
        req.model = "other"  # frozen


def test_completion_prompt_forms():
    assert parse_completion({"prompt": "a"}).prompts == ("a",)
    assert parse_completion({"prompt": ["a", "b"]}).prompts == ("a", "b")
    assert parse_completion({"prompt": [1, 2, 3]}).prompts == ((1, 2, 3),)
    assert parse_completion({"prompt": [[1, 2], [3]]}).prompts == ((1, 2), (3,))
    assert parse_completion({"prompt": "a"}).options.max_tokens == 16
    assert parse_completion({"prompt": "a", "logprobs": 0}).options.logprobs == 0
    for bad in (None, 5, [], [1, "a"], [[1], []], [[-1]], [True], {"a": 1}):
        with pytest.raises(InvalidRequest) as caught:
            parse_completion({"prompt": bad})
        assert caught.value.param == "prompt"


def test_defaults_and_aliases():
    req = parse_chat(CHAT)
    assert req.options.max_tokens == 512 and req.options.n == 1 and req.options.logprobs is None
    assert not req.options.stream and not req.options.deterministic
    assert parse_chat({**CHAT, "logprobs": True}).options.logprobs == 0
    assert parse_chat({**CHAT, "max_tokens": 9}).options.max_tokens == 9
    assert parse_completion({**TEXT, "max_tokens": 3.0}).options.max_tokens == 3
    assert parse_completion({**TEXT, "stop": ["a", "a", "b"]}).options.stop == ("a", "b")


JSON = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**70), 2**70) | st.floats(allow_nan=False) | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=12,
)
FIELDS = st.sampled_from(["model", "prompt", "messages", "max_tokens", "max_completion_tokens", "temperature",
                          "top_p", "top_k", "min_p", "seed", "stop", "n", "presence_penalty", "frequency_penalty",
                          "repeat_penalty", "logit_bias", "logprobs", "top_logprobs", "echo", "stream",
                          "stream_options", "best_of", "conclave", "tools", "response_format"])


@settings(max_examples=300, deadline=None)
@given(body=st.dictionaries(FIELDS, JSON, max_size=8), base=st.sampled_from([CHAT, TEXT]))
def test_any_json_is_either_a_request_or_a_400(body, base):
    parse = parse_chat if base is CHAT else parse_completion
    try:
        parse({**base, **body})
    except InvalidRequest as exc:
        assert error_reply(exc).status == 400 and exc.message
