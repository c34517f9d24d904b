"""scripts/bench_cost.py's verdicts: the gate (this tree's request path against a base revision's, within the noise
band), the targets, each beside the least work of its design, and the pairs' order that cancels its own cost."""

from __future__ import annotations

import statistics
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts"))
import bench_cost  # noqa: E402
from bench_cost import GATE_BAND, gate, targets  # noqa: E402


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


# medians of one run (ns per request): the floor 240, the peer 1000
RUN = {"empty_raw": 240.0, "reference": 1000.0, "lean": 590.0, "lean_kernel": 410.0}


@pytest.mark.parametrize("ns, want", [
    # own stamps at 3x and 0.72x the peer, kernel stamps under 2x: only the kernel-stamped targets met
    ({"request": 720.0, "kernel": 470.0},
     {"request path <= 2.0x the floor": False, "request path <= 0.7x the libbpf-tools design": False,
      "request path, --stamps kernel <= 2.0x the floor": True,
      "request path, --stamps kernel <= 0.7x the libbpf-tools design": True}),
    # exactly at the bounds: met
    ({"request": 480.0, "kernel": 700.0},
     {"request path <= 2.0x the floor": True, "request path <= 0.7x the libbpf-tools design": True,
      "request path, --stamps kernel <= 2.0x the floor": False,
      "request path, --stamps kernel <= 0.7x the libbpf-tools design": True}),
    # a run that priced only the request path
    ({"request": 500.0},
     {"request path <= 2.0x the floor": False, "request path <= 0.7x the libbpf-tools design": True}),
])
def test_targets_are_judged_from_the_same_run(ns, want):
    got = {what: ok for what, ok, _ in targets({**RUN, **ns})}
    assert got == want


def test_a_target_beneath_the_designs_least_work_says_so():
    details = {what: detail for what, _, detail in targets({**RUN, "request": 720.0, "kernel": 470.0})}
    own = details["request path <= 2.0x the floor"]
    assert own.startswith("720 ns = 3.00x 240") and "lean, this design's least work, 2.46x" in own
    assert own.endswith("the target is beneath it here)")
    kern = details["request path, --stamps kernel <= 2.0x the floor"]
    assert "lean_kernel, this design's least work, 1.71x)" in kern and "beneath" not in kern


def test_without_a_floor_or_peer_there_is_nothing_to_judge():
    assert targets({"request": 700.0}) == []
    assert [w for w, _, _ in targets({"request": 700.0, "reference": 1000.0})] == [
        "request path <= 0.7x the libbpf-tools design"]


class _Named:
    def __init__(self, name):
        self.name = name


def test_pairs_alternate_which_attaches_first_so_its_extra_cost_cancels(monkeypatch):
    # a program set's true ns a request, and what attaching first adds to whichever set it is (measured ~100)
    true, first_extra, orders = {"request": 700.0, "+files": 810.0, "request again": 700.0}, 120.0, []

    def together(tracers, devices, ios, depth=32, jobs=1):
        orders.append([t.name for t in tracers])
        return {t.name: {"ns_per_request": true[t.name] + (first_extra if i == 0 else 0.0)}
                for i, t in enumerate(tracers)}

    monkeypatch.setattr(bench_cost, "together", together)
    got = bench_cost.in_pairs(_Named("request"), [_Named("request again"), _Named("+files")], 4, ["/dev/loopX"], 1000)
    assert orders[:4] == [["request", "request again"], ["request again", "request"]] * 2
    assert statistics.median(got["request again"]) == pytest.approx(0.0)
    assert statistics.median(got["+files"]) == pytest.approx(110.0)
    # each single run is off by the order's extra, one way or the other
    assert sorted(got["+files"]) == pytest.approx([-10.0, -10.0, 230.0, 230.0])


@pytest.mark.parametrize("runs, said", [
    ([], ""),                                                                   # nothing measured
    ([{"seen": 1000, "reasons": {}}], ""),                                      # a tree that does not say
    ([{"seen": 1000, "reasons": {"note_hist_overflow": 0}}], ""),               # none overflowed
    ([{"seen": 1000, "reasons": {"note_hist_overflow": 500}}], "0.5 "),
    ([{"seen": 100000, "reasons": {"note_hist_overflow": 120}}], "0.0012 "),     # few, and still said
    # the median of the runs, each per its own requests
    ([{"seen": 1000, "reasons": {"note_hist_overflow": 100}}, {"seen": 2000, "reasons": {"note_hist_overflow": 3000}},
      {"seen": 1000, "reasons": {"note_hist_overflow": 1000}}], "1 "),
])
def test_the_scaling_rows_say_how_many_samples_overflowed_the_cells(runs, said):
    got = bench_cost.overflow(runs)
    assert (said in got and "--hist-cells" in got) if said else got == ""
