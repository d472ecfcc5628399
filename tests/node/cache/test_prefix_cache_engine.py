"""The prefix cache inside the real engine on the real Gemma model: a restored prefix gives
exactly the greedy continuation a fresh prefill gives, for the same prompt and for another
prompt sharing the prefix, after a restart of the engine, and with four users interleaved."""

from __future__ import annotations

import pytest

pytest.importorskip("llama_cpp", reason="node extra not installed")

from node.cache import PrefixCache, PrefixCacheConfig, engine_identity
from node.engine.engine import Engine, EngineConfig
from node.models.fingerprint import model_fingerprint
from node.engine.types import Finished, GenerationRequest, SamplingParams
from tests.node.near_ties import assert_same_up_to_near_ties

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
CHECKPOINT = 4 * BLOCK
# resident prefixes off: these tests are about the cache's tiers, which a resident slot would answer first
CTX = dict(n_ctx=2048, n_threads=2, n_parallel=4, n_batch=512, n_ubatch=512, kv_type="f16", resident_prefixes=False)


class SwitchableHook:
    """Hands the engine's hook calls to `target`, a real PrefixCache the test swaps.

    llama.cpp's arithmetic depends on where prefill chunks end, and the cache makes a prefill
    end at the boundaries it stores. So the reference "fresh prefill" is the same engine
    prefilling through an empty cache (same split points, nothing to restore), and a restore
    must reproduce it exactly.
    """

    def __init__(self, target: PrefixCache):
        self.target = target

    def lookup(self, prompt_tokens, scope="", beyond=0):
        return self.target.lookup(prompt_tokens, scope, beyond)

    def boundaries_to_store(self, prompt_tokens, scope=""):
        return self.target.boundaries_to_store(prompt_tokens, scope)

    def store(self, prompt_tokens, n_tokens, state, scope=""):
        self.target.store(prompt_tokens, n_tokens, state, scope)

    def bind_window(self, n_swa):
        """The engine tells the model's sliding window once; each cache swapped in is told too."""
        self.window = n_swa
        self.target.bind_window(n_swa)


def new_cache(gemma_path, directory) -> PrefixCache:
    identity = engine_identity(model_fingerprint(gemma_path), CTX["kv_type"])
    config = PrefixCacheConfig(directory=directory, block_tokens=BLOCK, checkpoint_tokens=CHECKPOINT,
                               min_gain_tokens=0)
    return PrefixCache(identity, config)


@pytest.fixture(scope="module")
def engine(gemma_path):
    hook = SwitchableHook(new_cache(gemma_path, None))
    engine = Engine(EngineConfig(model_path=gemma_path, prefix_cache=hook, **CTX))
    engine.hook = hook
    yield engine
    engine.close()
    hook.target.close()


def use_cache(engine: Engine, cache: PrefixCache) -> PrefixCache:
    engine.hook.target = cache
    cache.bind_window(engine.hook.window)
    return cache


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


def restored_by(cache: PrefixCache, engine: Engine, prompt, expected_tokens) -> int:
    """Generate and compare; returns the tokens the cache restored for it."""
    before = cache.stats()["tokens_restored"]
    assert generate(engine, prompt) == expected_tokens
    return cache.stats()["tokens_restored"] - before


@pytest.fixture(scope="module")
def expected(gemma_path, engine):
    """Each prompt prefilled from scratch through an empty cache."""
    out = []
    for prompt in prompts(engine):
        fresh = use_cache(engine, new_cache(gemma_path, None))
        out.append(generate(engine, prompt))
        assert fresh.stats()["tokens_restored"] == 0
        fresh.close()
    return out


def test_restore_matches_fresh_prefill_and_survives_a_restart(gemma_path, tmp_path, engine, expected):
    ps = prompts(engine)
    shared = shared_blocks(ps)
    cache = use_cache(engine, new_cache(gemma_path, tmp_path))
    try:
        assert restored_by(cache, engine, ps[0], expected[0]) == 0
        tail = (len(ps[0]) - 1) // BLOCK * BLOCK
        assert restored_by(cache, engine, ps[0], expected[0]) == tail
        # another question on the same document: the first one's state, cut where they part (the
        # prompts are shorter than the model's sliding window, so the cut state is whole)
        parted = next(i for i, (a, b) in enumerate(zip(ps[0], ps[1])) if a != b)
        assert restored_by(cache, engine, ps[1], expected[1]) == parted
        assert cache.flush()
    finally:
        cache.close()

    # A second engine (a restarted node) over the same directory, its RAM tier empty.
    restarted_cache = new_cache(gemma_path, tmp_path)
    restarted = Engine(EngineConfig(model_path=gemma_path, prefix_cache=restarted_cache, **CTX))
    try:
        assert restored_by(restarted_cache, restarted, ps[2], expected[2]) == shared
        assert restarted_cache.stats()["disk_hits"] == 1
    finally:
        restarted.close()
        restarted_cache.close()


def together(engine: Engine, all_prompts, logprobs: int | None = None) -> list[tuple[Finished, list]]:
    """All prompts submitted at once, each for exactly 10 greedy tokens: end-of-generation
    tokens are biased out, so every divergence has a logprob entry to judge it by."""
    never_end = SamplingParams(temperature=0.0,
                               logit_bias={token: -100.0 for token in engine.model_info.eog_tokens})
    handles = [
        engine.submit(GenerationRequest(prompt_tokens=tuple(p), max_tokens=10, sampling=never_end,
                                        logprobs=logprobs))
        for p in all_prompts
    ]
    return [finished_with_logprobs(handle) for handle in handles]


def finished_with_logprobs(handle) -> tuple[Finished, list]:
    events = list(handle.iter_sync())
    final = events[-1]
    assert isinstance(final, Finished) and final.reason in ("stop", "length"), final.error
    return final, [lp for event in events[:-1] for lp in getattr(event, "logprobs", ())]


def test_four_interleaved_users_with_the_cache(gemma_path, tmp_path, engine):
    """Four users restoring the shared document while the others decode get what four users
    prefilling it from scratch in one batch get.

    The reference is an interleaved run, not each prompt alone, and the comparison allows a
    divergence only where the reference's two best tokens are nearly tied: llama.cpp's CPU
    kernels round differently depending on which sequences share a ubatch, and the four
    submits race the engine thread, so the batches of the two runs need not form alike (see
    tests/node/engine/test_engine_batching.py for the measurement). A restore that brought
    back the wrong state diverges at a clear margin and fails.
    """
    ps = prompts(engine)
    shared = shared_blocks(ps)
    # The reference never restores: a user admitted one step after another would otherwise
    # restore what the first one just stored.
    fresh = use_cache(engine, new_cache(gemma_path, None))
    fresh.lookup = lambda prompt_tokens, beyond=0: None  # same split points, nothing restored
    reference = together(engine, ps, logprobs=2)
    fresh.close()
    cache = use_cache(engine, new_cache(gemma_path, tmp_path))
    try:
        generate(engine, ps[0][: shared + 1], max_tokens=1)  # warm: stores the shared prefix
        for expected, (final, _) in zip(reference, together(engine, ps)):
            assert_same_up_to_near_ties(expected, final)
        assert cache.stats()["tokens_restored"] >= 4 * shared
    finally:
        cache.close()


def test_four_users_sending_one_document_at_once_compute_it_once(gemma_path, engine):
    """Four questions over one document submitted together to a cold cache: the first prefills
    the document, the other three wait for it to store the shared boundary and restore it
    (node/engine/admission.py `prefix_wait`), so the batch computes the document once instead
    of four times; the answers are what the same four get when the document is restored from
    a cache that held it already, up to near-ties (the reference test above compares those to
    prefilling from scratch)."""
    ps = prompts(engine)
    shared = shared_blocks(ps)
    warm = use_cache(engine, new_cache(gemma_path, None))
    generate(engine, ps[0][: shared + 1], max_tokens=1)  # stores the shared prefix
    reference = together(engine, ps, logprobs=2)
    warm.close()
    cold = use_cache(engine, new_cache(gemma_path, None))
    try:
        before = engine.stats()
        answers = together(engine, ps)
        after = engine.stats()
        assert after["prefix_waits"] - before["prefix_waits"] >= 1
        prefilled = after["prefill_tokens"] - before["prefill_tokens"]
        assert prefilled <= sum(len(p) for p in ps) - 3 * shared  # the document once, then each question
        assert cold.stats()["tokens_restored"] >= 3 * shared
        for expected, (final, _) in zip(reference, answers):
            assert_same_up_to_near_ties(expected, final)
    finally:
        cold.close()


def test_questions_on_one_document_restore_it_to_the_token(gemma_path):
    """Questions on a document longer than the model's sliding window, one after another
    (resident slots off): the second departs from the first a few tokens past the last block
    boundary they share; the first's state cannot be cut there (it holds only the window before
    its own end), so the second's prefill stores the state at that point (node/cache/forks.py),
    and the third restores everything it shares with them, to the token, not only to the block
    boundary; its answer is a fresh prefill's, up to near-ties (the prefill chunks end
    elsewhere)."""
    hook = SwitchableHook(new_cache(gemma_path, None))
    engine = Engine(EngineConfig(model_path=gemma_path, prefix_cache=hook, **{**CTX, "n_parallel": 2}))
    engine.hook = hook
    try:
        ps = [engine.tokenize(DOCUMENT * 2 + question) for question in QUESTIONS]
        fork = next(i for i, (a, b) in enumerate(zip(ps[0], ps[1])) if a != b)
        assert fork % BLOCK and all(p[:fork] == ps[0][:fork] for p in ps)  # the document and "Question:"
        assert fork > hook.window == 512
        fresh = use_cache(engine, new_cache(gemma_path, None))
        fresh.lookup = lambda prompt_tokens, scope="", beyond=0: None
        reference = together(engine, [ps[2]], logprobs=2)
        fresh.close()
        identity = engine_identity(model_fingerprint(gemma_path), CTX["kv_type"])
        cache = use_cache(engine, PrefixCache(identity, PrefixCacheConfig(
            block_tokens=BLOCK, checkpoint_tokens=0, min_gain_tokens=0, exact_min_gain_tokens=1)))
        generate(engine, ps[0], max_tokens=2)
        generate(engine, ps[1], max_tokens=2)
        assert cache.stats()["exact_stores"] == 1
        before = cache.stats()["tokens_restored"]
        (final, _), = together(engine, [ps[2]])
        assert cache.stats()["tokens_restored"] - before == fork
        assert cache.stats()["exact_hits"] == 1
        assert_same_up_to_near_ties(reference[0], final)
        cache.close()
    finally:
        engine.close()
        hook.target.close()


def test_a_state_is_cut_where_a_short_prompt_parts_from_it(gemma_path, engine):
    """A short prompt sent again with another order number shares its first tokens with the
    first one, whose state is stored at its last block boundary, past where they part: the
    cache hands that state over and the engine cuts it there (the model's sliding window of 512
    tokens holds all of a state this short), so the second prefills only its own tokens; its
    answer is a fresh prefill's, up to near-ties."""
    text = ("You are a careful assistant for a chain of restaurants. Classify the sentiment of the customer "
            "review below as positive or negative, and give a one-line reason.\nReview (order {}): The soup was "
            "cold and the waiter ignored us, and the bill took half an hour to arrive.\nSentiment:")
    first, second = (engine.tokenize(text.format(n)) for n in (2000, 2008))
    shared = next(i for i, (a, b) in enumerate(zip(first, second)) if a != b)
    stored = (len(first) - 1) // BLOCK * BLOCK
    assert shared % BLOCK and shared // BLOCK * BLOCK < shared < stored < 512
    fresh = use_cache(engine, new_cache(gemma_path, None))
    fresh.lookup = lambda prompt_tokens, scope="", beyond=0: None
    reference = together(engine, [second], logprobs=2)
    fresh.close()
    cache = use_cache(engine, new_cache(gemma_path, None))
    assert cache.window == 512  # Gemma 3's sliding window, as the engine told it
    try:
        generate(engine, first, max_tokens=2)
        (final, _), = together(engine, [second])
        assert final.cached_tokens == shared and cache.stats()["exact_hits"] == 1
        assert_same_up_to_near_ties(reference[0], final)
    finally:
        cache.close()
