"""How often a slot freed mid-batch is taken again at once (node/engine/refill.py), with the
times given, as the scheduler gives them."""

from node.engine.refill import WINDOW, Refill


def test_a_slot_taken_within_the_window_counts_and_one_left_past_it_does_not():
    refill = Refill()
    assert refill.share == 0.0  # nothing seen: draining batches weigh as before
    for i in range(4):  # four clients, each sending its next request 20 ms after its answer
        refill.freed(10.0 * i)
        refill.arrived(10.0 * i + 0.02)
    assert refill.share == 4 / 5
    refill.freed(50.0)
    refill.arrived(50.0 + WINDOW + 0.1)  # later than a client's round trip: not an answer's successor
    assert refill.share == 4 / 6


def test_openings_the_batch_outlives_are_not_taken():
    """Requests sent together, the next round after the last answer: the first answers free
    slots nobody takes before the batch empties, and the next round takes none of them."""
    refill = Refill()
    for round_start in (0.0, 1.0, 2.0):
        refill.arrived(round_start)  # a round of four arrives at once: no opening to take
        for end in (0.3, 0.32, 0.34):  # three end while the fourth goes on
            refill.freed(round_start + end)
        refill.emptied()  # the fourth ends at round_start + 0.36
    assert refill.share == 0.0


def test_one_arrival_takes_one_opening():
    refill = Refill()
    refill.freed(1.0)
    refill.freed(1.01)
    refill.arrived(1.05)
    refill.emptied()
    assert refill.share == 1 / 3  # one taken, one not, in 2 + 1
