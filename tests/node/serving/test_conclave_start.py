"""How an adaptive Conclave starts, learned from the ones before it (node/serving/conclave/start.py):
the rule alone, and through the service on the fake engine (tests/node/fake_engine.py), which
answers each candidate by its seed."""

from __future__ import annotations

import logging

import pytest

from node.api.schemas import parse_chat
from node.serving.conclave.runner import ConclavePolicy
from node.serving.conclave.start import MIN_SEEN, WINDOW, StartRecord, first_sufficed
from node.serving.conclave.vote import Verdict
from tests.node.serving.test_conclave_service import CHAT, by_seed, done_of, make_service
from tests.node.serving.test_service import answer


def verdict(method: str, winner: int = 0) -> Verdict:
    return Verdict(winner, method, 3)


@pytest.mark.parametrize("method,winner,keys,first,sufficed", [
    ("majority", 0, {0: "a", 1: "a", 2: "a"}, 3, True),                   # the first three agreed
    ("majority", 1, {1: "a", 2: "a", 3: "a"}, 3, True),                   # 0 stopped unfinished: not held against them
    ("majority", 1, {0: "b", 1: "a", 2: "a", 3: "a"}, 3, False),          # 0 gave another answer: the rest were needed
    ("majority", 0, {0: "a", 1: "a", 2: None, 3: "a"}, 3, False),         # 2 wrote prose
    ("plurality", 0, {0: "a", 1: "a", 2: "b", 3: "c", 4: "d"}, 3, False),
    ("medoid", 0, {0: None, 1: None, 2: None, 3: None, 4: None}, 3, False),
    ("majority", 0, {0: "a", 1: "a", 2: "a"}, 2, False),                  # two of five can never be a majority
])
def test_the_first_candidates_sufficed_only_where_their_majority_needed_no_one_else(method, winner, keys, first,
                                                                                   sufficed):
    assert first_sufficed(verdict(method, winner), keys, 5, first) is sufficed


def test_the_record_starts_all_once_enough_recent_conclaves_needed_their_rest():
    record = StartRecord()
    for _ in range(MIN_SEEN - 1):
        record.record(5, needed=True, first=3)
    assert not record.all_at_once(5)  # too few known
    record.record(5, needed=True, first=3)
    assert record.all_at_once(5) and not record.all_at_once(3)  # per N
    for _ in range(WINDOW // 2 + 1):  # the workload turns agreeable: the window forgets the rest
        record.record(5, needed=False, first=3)
    assert not record.all_at_once(5)
    assert record.snapshot()[5] == {"seen": WINDOW, "needed_rest": WINDOW // 2 - 1, "all_at_once": False}


@pytest.mark.parametrize("window,min_seen,share", [(0, 1, 0.5), (4, 5, 0.5), (4, 0, 0.5), (4, 2, 0.0), (4, 2, 1.5)])
def test_a_record_with_impossible_bounds_is_refused(window, min_seen, share):
    with pytest.raises(ValueError):
        StartRecord(window, min_seen, share)


async def test_a_node_whose_conclaves_disagree_starts_them_whole_and_returns_to_adaptive(tmp_path):
    service = make_service(tmp_path)
    body = {**CHAT, "conclave": 5, "temperature": 0.5}  # sampled: L1 never answers, every Conclave runs
    service.engine.answers = by_seed({None: "It is 42", 1: "It is 41", 2: "It is 42", 3: "It is 42", 4: "It is 42"})
    for _ in range(MIN_SEEN):
        _, events = await answer(service, service.plan_chat(parse_chat(body)))
        assert done_of(events).consensus["decision"] == "majority"
    assert [len(group) for group in service.engine.groups] == [3, 2] * MIN_SEEN  # two rounds each
    _, events = await answer(service, service.plan_chat(parse_chat(body)))
    assert [len(group) for group in service.engine.groups][-1] == 5  # one round: all five at once
    verdict = done_of(events).consensus
    assert verdict["decision"] == "majority" and verdict["votes"]["42"] >= 3  # the same answer
    service.engine.answers = lambda request: "It is 7"  # now the first three agree every time
    started = []
    for _ in range(WINDOW):
        await answer(service, service.plan_chat(parse_chat(body)))
        started.append(len(service.engine.groups[-1]))
    assert started[0] == 5 and started[-1] == 3  # whole while the record said so, then the majority first
    metrics = service.metrics.render().decode()
    assert f'reame_conclave_starts_total{{start="all_at_once"}} {float(started.count(5) + 1)}' in metrics
    await service.drain()
    await service.archive.close()


async def test_a_node_that_does_not_start_adaptively_learns_nothing(tmp_path):
    service = make_service(tmp_path, ConclavePolicy(adaptive=False))
    service.engine.answers = by_seed({None: "It is 42", 1: "It is 41", 2: "It is 40", 3: "It is 42", 4: "It is 42"})
    for _ in range(MIN_SEEN + 1):
        await answer(service, service.plan_chat(parse_chat({**CHAT, "conclave": 5, "temperature": 0.5})))
    assert [len(group) for group in service.engine.groups] == [5] * (MIN_SEEN + 1)
    assert service.jobs.conclave_starts.snapshot() == {}
    await service.drain()
    await service.archive.close()


def test_the_switch_is_logged_with_the_first_candidates_the_policy_starts(caplog):
    """The log line names the candidates the Conclave started first: a majority of N unless its
    policy starts another count."""
    record = StartRecord(window=4, min_seen=2, share=0.5)
    with caplog.at_level(logging.INFO, logger="node.serving.conclave.start"):
        record.record(7, needed=True, first=2)
        record.record(7, needed=True, first=2)
    assert "needed more than their first 2 candidates; they start all 7 at once" in caplog.text
