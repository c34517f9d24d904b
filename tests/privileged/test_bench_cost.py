"""scripts/bench_cost.py's loader (needs root): the programs it holds run on the bench's fio requests, and when
it ends it hands back what they counted, from which the scaling rows say how many histogram samples
overflowed the cells (the rest of the script's verdicts: tests/unit/test_bench_cost.py)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts"))
import bench_cost  # noqa: E402

pytestmark = pytest.mark.bpf


@pytest.mark.parametrize("cells, overflows", [(4, True), (None, False)])
def test_the_loader_hands_back_its_notes_and_the_overflow_is_reported(make_loop, cells, overflows):
    loop = make_loop(size_mb=256)       # the bench's fio reads 256 MiB of the device
    opts = {"files": False} | ({"hist_cells": cells} if cells else {})
    run = bench_cost.together([bench_cost.Loaded(bench_cost.Config("request", opts))], [loop.path], 3000)["request"]
    assert run["requests"] >= 3000 and run["ns_per_request"] > 0
    # four cells a CPU hold a few buckets: the rest of a run's samples go to the hash, and the note says so
    assert "note_hist_overflow" in run["reasons"], sorted(run["reasons"])
    assert (run["reasons"]["note_hist_overflow"] > 0) == overflows, run["reasons"]
    assert ("overflowed the cells" in bench_cost.overflow([run])) == overflows
