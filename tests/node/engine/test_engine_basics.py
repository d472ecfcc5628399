"""The engine end to end on the real Gemma 3 270M: tokenizer, greedy, stops, UTF-8, errors."""

from __future__ import annotations

import asyncio

import pytest

from node.engine.errors import InvalidRequest, PromptTooLong
from node.engine.types import Finished, GenerationRequest, SamplingParams, TextDelta

GREEDY = SamplingParams(temperature=0.0)


def request(engine, text: str, max_tokens: int = 8, **kw) -> GenerationRequest:
    return GenerationRequest(tuple(engine.tokenize(text)), max_tokens=max_tokens, **kw)


def run(engine, req: GenerationRequest) -> tuple[list, Finished]:
    events = list(engine.submit(req).iter_sync(timeout=120))
    return events[:-1], events[-1]


def test_tokenizer_round_trip_with_special_tokens(engine):
    text = "<start_of_turn>user\nCafé ☕ 東京 — done<end_of_turn>\n"
    tokens = engine.tokenize(text, add_bos=False)
    assert engine.detokenize(tokens) == text.encode()
    start = engine.tokenize("<start_of_turn>", add_bos=False)
    assert len(start) == 1 and engine.token_piece(start[0]) == b"<start_of_turn>"
    as_text = engine.tokenize("<start_of_turn>", add_bos=False, special=False)
    assert len(as_text) > 1  # with special=False the control token is plain text
    info = engine.model_info
    assert engine.tokenize("hi")[0] == info.bos and info.add_bos
    assert info.eos in info.eog_tokens and start[0] + 1 in info.eog_tokens  # <end_of_turn> is EOG
    assert info.n_vocab == 262_144 and info.architecture == "gemma3"


def test_greedy_is_deterministic(engine):
    req = request(engine, "The capital of France is", max_tokens=8, sampling=GREEDY)
    first_deltas, first = run(engine, req)
    _, second = run(engine, req)
    assert first.reason == "length" and first.completion_tokens == 8
    assert first.generated == second.generated
    assert "".join(d.text for d in first_deltas) == engine.detokenize(first.generated).decode()


def test_seeded_sampling_is_reproducible(engine):
    sampling = SamplingParams(temperature=1.0, seed=1234)
    a = run(engine, request(engine, "Once upon a time", sampling=sampling))[1]
    b = run(engine, request(engine, "Once upon a time", sampling=sampling))[1]
    assert a.generated == b.generated


def test_stop_string_across_tokens_never_reaches_the_client(engine):
    # greedy continues " four, five, six": ", fi" spans the "," and " five" tokens
    deltas, fin = run(engine, request(engine, "One, two, three,", max_tokens=12, sampling=GREEDY,
                                      stop=(", fi",)))
    text = "".join(d.text for d in deltas)
    assert fin.reason == "stop"
    assert text == " four"
    assert engine.detokenize(fin.generated).decode().startswith(" four, fi")


async def test_async_iteration_streams_deltas_then_finished(engine):
    handle = engine.submit(request(engine, "One, two, three,", max_tokens=4, sampling=GREEDY))
    events = [event async for event in handle]
    assert all(isinstance(e, TextDelta) for e in events[:-1]) and len(events) > 2
    assert isinstance(events[-1], Finished) and events[-1].reason == "length"
    assert asyncio.get_running_loop() is not None


def byte_token(engine, byte: int) -> int:
    """The vocabulary's byte-fallback token for one byte (Gemma keeps them among the first ids)."""
    for token in range(1000):
        if engine.token_piece(token) == bytes([byte]):
            return token
    raise AssertionError(f"no byte-fallback token for 0x{byte:02X}")


def test_utf8_character_split_over_tokens_arrives_whole(engine):
    # force the three byte tokens of U+20AC (the euro sign) with descending biases; presence
    # penalty pushes each chosen one below the next
    e2, x82, xac = (byte_token(engine, b) for b in (0xE2, 0x82, 0xAC))
    sampling = SamplingParams(temperature=0.0, logit_bias={e2: 1000.0, x82: 900.0, xac: 800.0},
                              presence_penalty=250.0, repeat_last_n=-1)
    deltas, fin = run(engine, request(engine, "Price:", max_tokens=3, sampling=sampling))
    assert fin.generated == (e2, x82, xac)
    assert [(d.text, d.tokens) for d in deltas] == [("\u20ac", (e2, x82, xac))]


def test_logprobs_of_chosen_and_top_tokens(engine):
    deltas, fin = run(engine, request(engine, "The capital of France is", max_tokens=2,
                                      sampling=GREEDY, logprobs=3))
    logprobs = [lp for d in deltas for lp in d.logprobs]
    assert [lp.token for lp in logprobs] == list(fin.generated)
    for lp in logprobs:
        assert lp.top[0][0] == lp.token and lp.logprob == pytest.approx(lp.top[0][2])
        assert len(lp.top) == 3 and lp.top[0][2] >= lp.top[1][2] >= lp.top[2][2]


def test_bad_requests_are_refused_at_submit(engine):
    with pytest.raises(PromptTooLong):
        engine.submit(GenerationRequest((2,) * 100, max_tokens=engine.n_ctx))
    with pytest.raises(InvalidRequest):
        engine.submit(GenerationRequest(()))
    with pytest.raises(InvalidRequest):
        engine.submit(GenerationRequest((2, 10**9)))


def test_a_refused_request_leaves_the_others_running(engine):
    # sampling values are judged at submit; a request failing inside the engine thread is
    # test_engine_admission.py's
    good = [engine.submit(request(engine, p, max_tokens=6, sampling=GREEDY)) for p in ("Hello", "One, two,")]
    with pytest.raises(InvalidRequest, match="logit_bias"):
        engine.submit(request(engine, "Hi", sampling=SamplingParams(logit_bias={10**9: 1.0})))
    more = engine.submit(request(engine, "The sky is", max_tokens=6, sampling=GREEDY))
    for handle in (*good, more):
        assert list(handle.iter_sync(timeout=120))[-1].reason == "length"
    stats = engine.stats()
    assert stats["slots_free"] == stats["slots_total"] and stats["kv_cells_reserved"] == 0


def test_grammar_constrains_the_output(engine):
    yes_no = 'root ::= ("yes" | "no") "."'
    deltas, fin = run(engine, request(engine, "Is the sky green? Answer:", max_tokens=10,
                                      sampling=SamplingParams(temperature=0.0, grammar=yes_no)))
    text = "".join(d.text for d in deltas)
    assert text in ("yes.", "no.") and fin.reason == "stop"
    with pytest.raises(InvalidRequest, match="grammar"):  # refused at submit (the API's 400)
        engine.submit(request(engine, "Hi", sampling=SamplingParams(grammar="root ::= (")))


def test_the_thread_count_never_changes_the_output(engine):
    """The tuner (node/engine/threads.py) may switch counts between steps: greedy text must not move."""
    req = request(engine, "A list of the planets of the solar system:", max_tokens=24, sampling=GREEDY)
    _, two = run(engine, req)
    engine._ctx.set_threads(1)
    try:
        _, one = run(engine, req)
    finally:
        engine._ctx.set_threads(engine._ctx_threads)
    assert one.generated == two.generated
