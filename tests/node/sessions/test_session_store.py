"""Sessions without a model: the store on disk (bounds, expiry, restarts) and turns on the
fake engine's tokenizer (tests/node/fake_engine.py), since neither depends on what a model
answers. Sessions over HTTP on the real model are in tests/node/api/test_sessions.py."""

from __future__ import annotations

import dataclasses

import pytest

from node.models.templates import ChatTemplate
from node.serving.prompts import Prompts
from node.sessions.cuts import CutError, shared_prefix, turn_suffix
from node.sessions.store import SessionLimits, SessionNotFound, SessionStore
from node.sessions.turns import SessionTurns
from tests.node.fake_engine import BOS, FakeEngine


async def test_sessions_survive_a_reopen_and_unknown_ids_are_not_found(tmp_path):
    store = SessionStore.open(tmp_path)
    session = await store.create()
    await store.save(dataclasses.replace(session, tokens=(1, 2, 3)))
    reopened = SessionStore.open(tmp_path)
    assert (await reopened.get(session.id)).tokens == (1, 2, 3)
    for bad in ("sess_" + "0" * 24, "../etc/passwd", ""):
        with pytest.raises(SessionNotFound):
            await reopened.get(bad)
    await reopened.delete(session.id)
    with pytest.raises(SessionNotFound):
        await SessionStore.open(tmp_path).get(session.id)


async def test_the_least_recently_used_session_is_dropped_past_the_bound(tmp_path):
    store = SessionStore.open(tmp_path, SessionLimits(max_sessions=2))
    first, second = await store.create(), await store.create()
    await store.save(first)  # first is now the most recent
    await store.create()
    assert len(store) == 2 and await store.get(first.id)
    with pytest.raises(SessionNotFound):
        await store.get(second.id)


async def test_expired_sessions_are_gone(tmp_path):
    store = SessionStore.open(tmp_path, SessionLimits(ttl_s=0.0))
    session = await store.create()
    with pytest.raises(SessionNotFound):
        await store.get(session.id)


def test_cuts_follow_the_template():
    template = ChatTemplate.builtin("gemma")
    history = [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello"}]
    suffix = turn_suffix(template, history, [{"role": "user", "content": "Again"}])
    rendered = template.render([*history, {"role": "user", "content": "Again"}])
    assert rendered.endswith(suffix.closing + suffix.opening) and "Again" in suffix.opening
    assert shared_prefix(template, [{"role": "system", "content": "DOC"}]).endswith("DOC\n\n")
    with pytest.raises(CutError):
        turn_suffix(template, [{"role": "user", "content": "no answer yet"}], [])


async def test_a_turn_extends_the_session_by_prompt_answer_and_closing(tmp_path):
    engine = FakeEngine(tmp_path / "fake.gguf")
    template = ChatTemplate.builtin("gemma")
    prompts = Prompts(template, engine)

    async def no_warm(tokens):
        raise AssertionError("the cache is off")

    turns = SessionTurns(SessionStore.open(tmp_path / "s"), template, prompts, None, no_warm)
    session = await turns.store.create()
    turn = turns.begin(session, [{"role": "user", "content": "Hi"}])
    assert turn.prompt_tokens == prompts.chat([{"role": "user", "content": "Hi"}]) and turn.prompt_tokens[0] == BOS
    saved = await turns.complete(turn, "Yo", generated=tuple(b"Yo"))
    closing = turn_suffix(template, saved.messages, ()).closing
    assert saved.tokens == (*turn.prompt_tokens, *b"Yo", *closing.encode())
    following = turns.begin(saved, [{"role": "user", "content": "And?"}])
    assert following.prompt_tokens[:len(saved.tokens)] == saved.tokens
    assert await turns.load(saved) is None and await turns.save(saved) == 0
