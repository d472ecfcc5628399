"""The Conclave's run on its own: handles written here stand in for the engine's (a layer tested
alone), so the order in which candidates end is exact rather than left to a model's timing."""

from __future__ import annotations

from typing import AsyncIterator, Sequence

from node.engine.types import Event, Finished, GenerationRequest, SamplingParams, TextDelta
from node.serving.conclave.runner import ConclavePolicy, ConclaveRun


class Answered:
    """A handle whose whole answer is ready: it ends within the step its consumer first runs."""

    group = 1

    def __init__(self, text: str, reason: str = "stop") -> None:
        self.text, self.reason, self.cancels = text, reason, 0

    def cancel(self) -> None:
        self.cancels += 1

    async def __aiter__(self) -> AsyncIterator[Event]:
        yield TextDelta(self.text, (1,))
        yield Finished(self.reason, 3, 1, (1,))  # type: ignore[arg-type]


def request() -> GenerationRequest:
    return GenerationRequest(prompt_tokens=(1, 2, 3), max_tokens=8, sampling=SamplingParams(temperature=0.0))


async def test_a_candidate_ending_in_the_step_that_decided_still_votes():
    """Three candidates end together: the first two make the majority, the third's answer was
    ready before the run returned and was never stopped, so it shows in the votes."""
    handles = [Answered("yes"), Answered("yes"), Answered("yes")]

    def submit(requests: Sequence[GenerationRequest], spare: int, group: int | None) -> list[Answered]:
        return handles[:len(requests)]

    run = ConclaveRun(submit, request(), 3, ConclavePolicy(adaptive=False))
    run.start()
    outcome = await run.decide()
    assert outcome.verdict.method == "majority" and outcome.verdict.winner == 0
    assert outcome.summary()["votes"] == {"yes": 3} and outcome.verdict.consensus == 3
    assert outcome.stopped_early is False and outcome.cancelled == 0


async def test_a_late_ender_with_another_answer_votes_without_changing_the_winner():
    handles = [Answered("yes"), Answered("yes"), Answered("no")]
    run = ConclaveRun(lambda requests, spare, group: handles[:len(requests)], request(), 3,
                      ConclavePolicy(adaptive=False))
    run.start()
    outcome = await run.decide()
    assert outcome.verdict.winner == 0 and outcome.verdict.consensus == 2
    assert outcome.summary()["votes"] == {"yes": 2, "no": 1}
