"""Admission classes on the real Gemma model: interactive requests are admitted before batch
lines queued earlier, and batch lines leave `interactive_slots` slots free.

Ordering properties only (which request finished first, what is active), never timings.
A small engine of its own: 2 slots, 1 kept for interactive work, a 256-token context.
"""

from __future__ import annotations

import threading

import pytest

from node.engine.types import BATCH, INTERACTIVE, Finished, GenerationRequest, SamplingParams

pytestmark = pytest.mark.model
GREEDY = SamplingParams(temperature=0.0)


@pytest.fixture(scope="module")
def engine(gemma_path):
    pytest.importorskip("llama_cpp", reason="node extra not installed")
    from node.engine.engine import Engine, EngineConfig

    eng = Engine(EngineConfig(model_path=gemma_path, n_ctx=256, n_parallel=2, n_batch=128, max_queue=16,
                              step_token_budget=64, interactive_slots=1))
    yield eng
    eng.close()


def request(engine, text: str, priority: int, max_tokens: int = 6) -> GenerationRequest:
    return GenerationRequest(prompt_tokens=tuple(engine.tokenize(text)), max_tokens=max_tokens, sampling=GREEDY,
                             priority=priority, request_id=text)


class Recorder:
    """The order in which handles' text arrived: their name per TextDelta, name:done at the end."""

    def __init__(self) -> None:
        self.events: list[str] = []
        self.lock = threading.Lock()

    def note(self, item: str) -> None:
        with self.lock:
            self.events.append(item)

    def drain(self, name: str, handle, first: threading.Event | None = None) -> None:
        for event in handle.iter_sync(180):
            self.note(f"{name}:done" if isinstance(event, Finished) else name)
            if first is not None and not isinstance(event, Finished):
                first.set()

    def reader(self, name: str, handle, first: threading.Event | None = None) -> threading.Thread:
        thread = threading.Thread(target=self.drain, args=(name, handle, first))
        thread.start()
        return thread


def run_all(handles) -> list[str]:
    """Drain every handle on its own thread; the order in which they finished."""
    order: list[str] = []
    lock = threading.Lock()

    def drain(name, handle):
        for event in handle.iter_sync(120):
            if isinstance(event, Finished):
                with lock:
                    order.append(name)

    threads = [threading.Thread(target=drain, args=item) for item in handles]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(180)
    return order


def test_an_interactive_request_overtakes_queued_batch_lines(engine):
    handles = [(f"batch{i}", engine.submit(request(engine, f"Line {i}: the weather is", BATCH))) for i in range(4)]
    handles.append(("live", engine.submit(request(engine, "Hello, my name is", INTERACTIVE))))
    order = run_all(handles)
    assert sorted(order) == sorted(name for name, _ in handles)
    # batch0 holds the one slot batch work may use; batch1 cannot start before it ends, the
    # live request takes the kept slot at once
    assert order.index("live") < order.index("batch1") < order.index("batch2") < order.index("batch3")


def test_batch_lines_leave_the_interactive_slot_free(engine):
    handles = [engine.submit(request(engine, f"Item {i} is", BATCH, max_tokens=12)) for i in range(3)]
    first = next(iter(handles[0].iter_sync(120)))  # batch0 is decoding: admission ran since
    assert not isinstance(first, Finished)
    stats = engine.stats()
    assert stats["active"] == 1 and stats["queued"] == 2 and stats["slots_free"] == 1
    order = run_all([(f"b{i}", h) for i, h in enumerate(handles)])
    assert order == ["b0", "b1", "b2"]  # arrival order within the class


def test_interactive_slots_must_leave_a_slot_for_batch_work(gemma_path):
    from node.engine.config import EngineConfig
    from node.engine.errors import InvalidRequest

    with pytest.raises(InvalidRequest, match="interactive_slots"):
        EngineConfig(model_path=gemma_path, n_parallel=2, interactive_slots=2).check()


def test_a_batch_prompt_waits_while_a_live_request_decodes(gemma_path):
    from node.engine.engine import Engine, EngineConfig

    eng = Engine(EngineConfig(model_path=gemma_path, n_ctx=256, n_parallel=2, n_batch=128, max_queue=16,
                              step_token_budget=64, interactive_slots=0))
    try:
        record = Recorder()
        decoding = threading.Event()
        reader = record.reader("live", eng.submit(request(eng, "Once upon a time", INTERACTIVE, max_tokens=12)),
                               decoding)
        assert decoding.wait(120)
        record.drain("batch", eng.submit(request(eng, "The weather today is", BATCH, max_tokens=4)))
        reader.join(120)
        # a free slot, yet the batch line's prompt went in only after the live request ended
        assert record.events.index("live:done") < record.events.index("batch")
    finally:
        eng.close()


def test_batch_sequences_sit_out_a_live_prompt(gemma_path):
    from node.engine.engine import Engine, EngineConfig

    eng = Engine(EngineConfig(model_path=gemma_path, n_ctx=512, n_parallel=2, n_batch=256, max_queue=16,
                              step_token_budget=16, interactive_slots=0))
    try:
        record = Recorder()
        long_batch = GenerationRequest(prompt_tokens=tuple(eng.tokenize("A list of fruits: apple, pear,")),
                                       max_tokens=80, sampling=GREEDY, priority=BATCH, speculation=False)
        decoding = threading.Event()
        reader = record.reader("batch", eng.submit(long_batch), decoding)
        assert decoding.wait(120)
        prompt = "Describe the harbour, the quay, the customs house and the pilots' tower. " * 6
        record.note("submit")
        record.drain("live", eng.submit(request(eng, prompt, INTERACTIVE, max_tokens=2)))
        reader.join(180)
        events = record.events
        between = events[events.index("submit"):events.index("live")]
        # with 16 tokens a step beside a decoding batch, the ~100-token prompt would take 7 steps,
        # the batch emitting a token in each; the batch sits them out, so only a step in flight counts
        assert between.count("batch") <= 2, between
    finally:
        eng.close()


def test_beside_a_live_request_one_batch_sequence_decodes_a_step(gemma_path):
    from node.engine.engine import Engine, EngineConfig

    eng = Engine(EngineConfig(model_path=gemma_path, n_ctx=512, n_parallel=3, n_batch=128, max_queue=16,
                              step_token_budget=64, interactive_slots=0))
    try:
        record = Recorder()
        started = [threading.Event(), threading.Event()]
        readers = []
        for i, text in enumerate(("Numbers: one, two, three,", "Colours: red, green, blue,")):
            line = GenerationRequest(prompt_tokens=tuple(eng.tokenize(text)), max_tokens=120, sampling=GREEDY,
                                     priority=BATCH, speculation=False)
            readers.append(record.reader(f"batch{i}", eng.submit(line), started[i]))
        assert all(event.wait(120) for event in started)
        record.drain("live", eng.submit(request(eng, "My favourite animal is", INTERACTIVE, max_tokens=16)))
        for reader in readers:
            reader.join(240)
        events = record.events
        span = events[events.index("live"):len(events) - events[::-1].index("live")]
        # two batch sequences decoding: beside the live one they take turns, one token a step
        batch_tokens = sum(name in ("batch0", "batch1") for name in span)
        assert batch_tokens <= span.count("live") + 1, span
    finally:
        eng.close()
