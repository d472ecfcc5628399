"""The prefix cache inside the real engine on the real Gemma model: a restored prefix gives
exactly the greedy continuation a fresh prefill gives, for the same prompt and for another
prompt sharing the prefix, after a restart of the engine, and with four users interleaved."""

from __future__ import annotations

import pytest

pytest.importorskip("llama_cpp", reason="node extra not installed")

from node.cache import PrefixCache, PrefixCacheConfig, engine_identity
from node.engine.engine import Engine, EngineConfig
from node.engine.fingerprint import model_fingerprint
from node.engine.types import Finished, GenerationRequest, SamplingParams

pytestmark = [pytest.mark.model, pytest.mark.slow]

DOCUMENT = (
    "Harbour log, north basin. The ferry Aurora left at six with forty passengers and two "
    "cars. The ferry Bellamy was held in dock for a broken winch until noon. Fuel was taken "
    "on by the tug Corin at eight; the pilot boat Dunmore stayed on station all day. Wind "
    "from the west at twelve knots, rising to twenty by evening. The harbour master noted "
    "that the east pier lights need new bulbs and that the fish market opens late on Friday. "
) * 3
QUESTIONS = (
    "Question: which ferry was held in dock? Answer:",
    "Question: what was the wind speed by evening? Answer:",
    "Question: which boat stayed on station? Answer:",
    "Question: when does the fish market open late? Answer:",
)
GREEDY = SamplingParams(temperature=0.0)
BLOCK = 32
CTX = dict(n_ctx=2048, n_threads=2, n_parallel=4, n_batch=512, n_ubatch=512, kv_type="f16")


@pytest.fixture(scope="module")
def baseline(gemma_path):
    engine = Engine(EngineConfig(model_path=gemma_path, **CTX))
    yield engine
    engine.close()


def open_cached(gemma_path, directory) -> tuple[Engine, PrefixCache]:
    identity = engine_identity(model_fingerprint(gemma_path), CTX["kv_type"])
    config = PrefixCacheConfig(directory=directory, block_tokens=BLOCK, checkpoint_tokens=4 * BLOCK)
    cache = PrefixCache(identity, config)
    return Engine(EngineConfig(model_path=gemma_path, prefix_cache=cache, **CTX)), cache


def generate(engine: Engine, tokens, max_tokens: int = 10) -> tuple[int, ...]:
    handle = engine.submit(GenerationRequest(prompt_tokens=tuple(tokens), max_tokens=max_tokens, sampling=GREEDY))
    return finished(handle).generated


def finished(handle) -> Finished:
    final = [event for event in handle.iter_sync() if isinstance(event, Finished)][-1]
    assert final.reason in ("stop", "length"), final.error
    return final


def prompts(engine: Engine) -> list[list[int]]:
    return [engine.tokenize(DOCUMENT + question) for question in QUESTIONS]


def shared_blocks(all_prompts) -> int:
    """Tokens of the longest whole-block prefix every prompt shares."""
    common = 0
    while all(p[common] == all_prompts[0][common] for p in all_prompts):
        common += 1
    return common // BLOCK * BLOCK


def restored_by(cache: PrefixCache, run) -> int:
    before = cache.stats()["tokens_restored"]
    run()
    return cache.stats()["tokens_restored"] - before


@pytest.fixture(scope="module")
def expected(baseline):
    return [generate(baseline, prompt) for prompt in prompts(baseline)]


def test_restore_matches_fresh_prefill_and_survives_a_restart(gemma_path, tmp_path_factory, baseline, expected):
    directory = tmp_path_factory.mktemp("prefix-cache")
    ps = prompts(baseline)
    shared = shared_blocks(ps)
    engine, cache = open_cached(gemma_path, directory)
    try:
        assert restored_by(cache, lambda: assert_generates(engine, ps[0], expected[0])) == 0
        tail = (len(ps[0]) - 1) // BLOCK * BLOCK
        assert restored_by(cache, lambda: assert_generates(engine, ps[0], expected[0])) == tail
        # another question on the same document: restores the last checkpoint inside it
        assert restored_by(cache, lambda: assert_generates(engine, ps[1], expected[1])) == shared // (4 * BLOCK) * 4 * BLOCK
        assert cache.flush()  # the second question stored the fork point at `shared`
    finally:
        engine.close()
        cache.close()

    engine, cache = open_cached(gemma_path, directory)  # a new engine over the same directory
    try:
        assert restored_by(cache, lambda: assert_generates(engine, ps[2], expected[2])) == shared
        assert cache.stats()["disk_hits"] == 1
    finally:
        engine.close()
        cache.close()


def assert_generates(engine: Engine, prompt, expected_tokens) -> None:
    assert generate(engine, prompt) == expected_tokens


def test_four_interleaved_users_with_the_cache(gemma_path, tmp_path, expected):
    engine, cache = open_cached(gemma_path, tmp_path)
    try:
        ps = prompts(engine)
        shared = shared_blocks(ps)
        generate(engine, ps[0][: shared + 1], max_tokens=1)  # warm: stores the shared prefix
        handles = [
            engine.submit(GenerationRequest(prompt_tokens=tuple(p), max_tokens=10, sampling=GREEDY)) for p in ps
        ]
        results = [finished(handle).generated for handle in handles]
        assert results == expected
        assert cache.stats()["tokens_restored"] >= 4 * shared
    finally:
        engine.close()
        cache.close()
