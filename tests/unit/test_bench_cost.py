"""scripts/bench_cost.py's gate: this tree's request path against a base revision's, within the noise band."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts"))
from bench_cost import GATE_BAND, gate  # noqa: E402


@pytest.mark.parametrize("mine, base, failed, band", [
    ([500, 510, 505], [500, 502, 498], False, GATE_BAND),      # the same: passes, the least band
    ([560, 555, 570], [500, 502, 498], True, GATE_BAND),       # +11%: past 10%
    ([540, 545, 548], [500, 502, 498], False, GATE_BAND),      # +9%: within
    ([560, 555, 570], [400, 500, 600], False, 0.4),            # a noisy base widens the band (spread 200/500)
    ([800, 810, 790], [400, 500, 600], True, 0.4),             # and a real growth still fails it
    ([300, 310, 290], [500, 502, 498], False, GATE_BAND),      # cheaper is never a failure
])
def test_the_gate_fails_only_past_the_noise_band(mine, base, failed, band):
    got_failed, got_band = gate(mine, base)
    assert got_failed is failed and got_band == pytest.approx(band)
