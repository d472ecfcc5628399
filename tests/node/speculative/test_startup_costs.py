"""A node measures this host's step costs before it serves, and keeps them for its next start
(node/assembly.py `wait_for_costs`, node/speculative/cost_store.py), on the real model.

Without it, a node loaded from its first second plans every step on the default line, which
has no staircase (on a host whose kernels work in tiles of 4 rows, 5 rows cost what 8 do),
and is never idle to measure one."""

from __future__ import annotations

import logging

import pytest

from tests.node.api.live import LiveNode, node_settings

pytestmark = [pytest.mark.model]


def test_a_node_serves_once_its_step_costs_are_measured_and_the_next_start_reuses_them(gemma_path, tmp_path,
                                                                                       caplog):
    settings = node_settings(gemma_path, tmp_path, **{"speculative.measure_first": True})  # the default
    with caplog.at_level(logging.INFO):
        with LiveNode(settings) as node:
            controller = node.state.speculation
            assert controller is not None and controller.costs.measured  # before the first request
            assert controller.costs.calibrations == 1
        kept = list((tmp_path / "kernels").glob("costs-*.json"))
        assert len(kept) == 1
        assert "measuring this host's step costs before serving" in caplog.text
        caplog.clear()
        with LiveNode(settings):
            pass
        assert "as measured at an earlier start" in caplog.text
        assert "measuring this host's step costs before serving" not in caplog.text


def test_a_node_told_not_to_measure_first_serves_at_once(gemma_path, tmp_path, caplog):
    with caplog.at_level(logging.INFO):
        with LiveNode(node_settings(gemma_path, tmp_path)) as node:  # measure_first off (the tests' nodes)
            assert node.state.speculation is not None
    assert "measuring this host's step costs before serving" not in caplog.text
