"""Ollama's request bodies parsed into the serving layer's requests (node/api/ollama_schemas.py):
options, the window, tool calls and results without ids, keep_alive, and the 400s naming fields."""

from __future__ import annotations

import json

import pytest

from node.api.ollama_schemas import Window, parse_chat, parse_embed, parse_generate, parse_model, parse_window
from node.serving.errors import InvalidRequest, UnsupportedFeature

USER = {"role": "user", "content": "hi"}


def call(name: str, **arguments: object) -> dict:
    return {"function": {"name": name, "arguments": arguments}}


def test_options_become_sampling_and_the_default_is_streamed():
    req = parse_chat({"model": "gemma3-270m:latest", "messages": [USER], "options": {
        "temperature": 0, "top_k": 5, "top_p": 0.5, "min_p": 0.1, "seed": 3, "repeat_penalty": 1.2,
        "repeat_last_n": -1, "presence_penalty": 0.5, "frequency_penalty": 0.25, "stop": ["\n"], "num_predict": 7,
        "typical_p": 1.0, "mirostat": 0, "tfs_z": 1}})
    sampling = req.options.sampling
    assert req.model == "gemma3-270m" and req.options.stream and req.options.max_tokens == 7
    assert (sampling.temperature, sampling.top_k, sampling.top_p, sampling.min_p, sampling.seed) == (0, 5, 0.5, 0.1, 3)
    assert (sampling.repeat_penalty, sampling.repeat_last_n, sampling.presence_penalty,
            sampling.frequency_penalty) == (1.2, -1, 0.5, 0.25)
    assert req.options.stop == ("\n",) and req.options.deterministic
    assert not parse_chat({"messages": [USER], "stream": False}).options.stream


@pytest.mark.parametrize("options, param", [
    ({"bogus": 1}, "options.bogus"), ({"num_gpu": 0}, "options.num_gpu"), ({"mirostat": 1}, "options.mirostat"),
    ({"top_p": 0}, "options.top_p"), ({"stop": [""]}, "options.stop"), ({"num_predict": -3}, "options.num_predict"),
    ({"repeat_last_n": -2}, "options.repeat_last_n"),
    ({"typical_p": True}, "options.typical_p"),  # a JSON true is not the neutral 1 (though Python says True == 1)
])
def test_bad_options_name_the_option(options, param):
    with pytest.raises(InvalidRequest) as caught:
        parse_chat({"messages": [USER], "options": options})
    assert caught.value.param == param and param in caught.value.message


def test_the_window_from_num_predict_and_num_ctx():
    assert parse_window({"options": {"num_predict": -1}}, 2048) == Window(None, None)
    assert parse_window({"options": {"num_predict": -2, "num_ctx": 100}}, 2048) == Window(None, 100)
    assert parse_window({}, 2048) == Window(512, None)
    assert parse_window({"options": {"num_predict": 9, "num_ctx": 2048}}, 2048) == Window(9, 2048)
    with pytest.raises(InvalidRequest) as caught:
        parse_window({"options": {"num_ctx": 4096}}, 2048)
    assert caught.value.param == "options.num_ctx" and "2048" in caught.value.message


def test_tool_calls_get_ids_and_results_answer_them_by_name_then_in_order():
    req = parse_chat({"messages": [USER, {"role": "assistant", "tool_calls": [call("a", x=1), call("b")]},
                                   {"role": "tool", "tool_name": "b", "content": "B"},
                                   {"role": "tool", "content": "A"}],
                      "tools": [{"type": "function", "function": {"name": "a"}},
                                {"type": "function", "function": {"name": "b"}}]})
    assistant, first, second = req.messages[1:]
    assert [(c.id, c.name, json.loads(c.arguments)) for c in assistant.tool_calls] == \
        [("call_1_0", "a", {"x": 1}), ("call_1_1", "b", {})]
    assert (first.tool_call_id, first.name, second.tool_call_id, second.name) == ("call_1_1", "b", "call_1_0", "a")
    assert req.options.output is not None and req.options.output.choice == "auto"


@pytest.mark.parametrize("messages, param", [
    ([USER, {"role": "tool", "content": "x"}], "messages[1].role"),
    ([USER, {"role": "assistant", "tool_calls": [call("a")]}, {"role": "tool", "tool_name": "b", "content": "x"}],
     "messages[2].role"),
    ([{"role": "user", "tool_calls": [call("a")]}], "messages[0].tool_calls"),
    ([{"role": "assistant", "tool_calls": [{"function": {"name": "a", "arguments": "{}"}}]}],
     "messages[0].tool_calls[0].function.arguments"),
    ([{"role": "robot", "content": "x"}], "messages[0].role"),
    ([{"role": "user", "content": 5}], "messages[0].content"),
    ([], "messages"),
])
def test_bad_messages_name_the_field(messages, param):
    with pytest.raises(InvalidRequest) as caught:
        parse_chat({"messages": messages})
    assert caught.value.param == param


def test_images_think_template_suffix_and_keep_alive():
    for body, param in (({"messages": [{**USER, "images": ["aGk="]}]}, "messages[0].images"),
                        ({"messages": [USER], "think": True}, "think"),
                        ({"messages": [USER], "think": "high"}, "think")):
        with pytest.raises(UnsupportedFeature) as caught:
            parse_chat(body)
        assert caught.value.param == param
    for key in ("template", "suffix", "images"):
        with pytest.raises(UnsupportedFeature):
            parse_generate({"prompt": "x", key: ["x"] if key == "images" else "x"})
    for good in ("5m", "1h30m", "-1", "0", 300, -1, "2.5s"):
        parse_chat({"messages": [USER], "keep_alive": good})
    for bad in ("soon", "5 minutes", True, [], ""):
        with pytest.raises(InvalidRequest) as caught:
            parse_chat({"messages": [USER], "keep_alive": bad})
        assert caught.value.param == "keep_alive"


def test_generate_embed_and_show_bodies():
    req = parse_generate({"prompt": "p", "system": "s", "raw": True, "context": [2, 5], "format": "json",
                          "options": {"num_predict": 4}})
    assert (req.prompt, req.system, req.raw, req.context, req.options.max_tokens) == ("p", "s", True, (2, 5), 4)
    assert req.options.output is not None and req.options.output.param == "format"
    with pytest.raises(InvalidRequest) as caught:
        parse_generate({"prompt": "p", "context": [1, -2]})
    assert caught.value.param == "context"
    with pytest.raises(UnsupportedFeature) as caught:
        parse_generate({"prompt": "p", "tools": [{"type": "function", "function": {"name": "a"}}]})
    assert caught.value.param == "tools"
    assert parse_embed({"input": "a"}, key="input") == (None, ["a"], None)
    assert parse_embed({"model": "m:latest", "input": ["a", "b"]}, key="input") == ("m", ["a", "b"], None)
    assert parse_embed({"prompt": "a", "dimensions": 64}, key="prompt") == (None, ["a"], 64)
    for bad in ({"repeat_last_n": -1.5}, {"presence_penalty": 1e9}, {"num_predict": 0.5}, {"num_predict": 0}):  # checked, though unused
        with pytest.raises(InvalidRequest):
            parse_embed({"input": "a", "options": bad}, key="input")
    with pytest.raises(InvalidRequest):
        parse_embed({"input": []}, key="input")
    assert parse_model({"name": "x:latest"}) == "x" and parse_model({"model": "y"}) == "y"
