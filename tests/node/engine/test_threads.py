"""The thread tuner on simulated step times (no model: the decision logic alone)."""

import logging

from node.engine.threads import FIRST_TRIAL_STEPS, ThreadTuner


def run(tuner: ThreadTuner, seconds_for, steps: int, sizes=(1,)) -> list[int]:
    used = []
    for i in range(steps):
        threads = tuner.threads()
        used.append(threads)
        n = sizes[i % len(sizes)]
        tuner.observe(threads, n, seconds_for(threads, n, i))
    return used


def test_fewer_threads_win_when_a_neighbour_holds_a_core(caplog):
    tuner = ThreadTuner(2)
    assert tuner.candidates == [2, 1]
    with caplog.at_level(logging.INFO, logger="node.engine.threads"):
        # the load moves during the trial; pairs still compare like with like
        run(tuner, lambda t, n, i: (0.050 if t == 2 else 0.030) * (1 + (i % 7) / 10), FIRST_TRIAL_STEPS + 40)
    assert tuner.current == 1 and tuner.switches == 1
    assert "threads 2 -> 1" in caplog.text


def test_the_count_holds_when_the_other_is_no_faster_and_trials_back_off():
    tuner = ThreadTuner(4)
    assert tuner.candidates == [4, 3, 2, 1]
    used = run(tuner, lambda t, n, i: 0.02 * (4 / t) ** 0.5, 3000, sizes=(1, 1, 5))
    assert tuner.current == 4 and tuner.switches == 0
    trial_steps = sum(1 for t in used if t != 4)
    assert 0 < trial_steps < 0.2 * len(used)
    assert tuner.state()["trials"] >= 3


def test_steps_of_different_sizes_are_never_compared():
    tuner = ThreadTuner(2)
    # 1 thread only looks faster because its steps happen to be the small ones
    run(tuner, lambda t, n, i: 0.01 * n, FIRST_TRIAL_STEPS + 80, sizes=(1, 8, 8))
    assert tuner.current == 2
