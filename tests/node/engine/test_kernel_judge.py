"""The kernel probe's verdict from its two measured ways (node/engine/kernels.py `judge`), without
the model: close calls keep llama.cpp's default."""

from __future__ import annotations

from node.engine import kernels
from node.engine.cost_line import CostLine


def test_a_close_call_keeps_extra_buffers_on_and_a_clear_one_turns_them_off():
    """The probe's two ways measured within CLOSE_CALL of each other are what a busy host's
    noise decides: llama.cpp's default stays. A clear win either way decides."""

    def line(ms_per_step: float) -> CostLine:  # 1 + 8 rows cost 2 steps and 8 rows
        return CostLine(ms_per_step / 1000, 0.0)

    on, why = kernels.judge(line(10.0), line(12.0))
    assert on and "on is faster" in why
    on, why = kernels.judge(line(10.0), line(10.0 / (1 + kernels.CLOSE_CALL) + 0.01))
    assert on and "default" in why
    on, why = kernels.judge(line(10.0), line(9.0))
    assert not on and "off is faster" in why and "ms with" in why
