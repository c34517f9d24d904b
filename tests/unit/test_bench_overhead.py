"""scripts/overhead/report.py's verdict on the IOPS target: judged only where the run can resolve it (three
empty programs' own ratio within the target's margin of 1), table-tested on crafted rows (no root, no fio)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts"))
from overhead.report import TARGET_IOPS_RATIO, TARGET_MIN_ROUNDS, TARGET_WORKLOAD, verdict  # noqa: E402
from overhead.run import Result  # noqa: E402

IOPS = f"iotrace {TARGET_WORKLOAD} IOPS >= {TARGET_IOPS_RATIO:.2f} of untraced"
BPFTRACE = f"iotrace {TARGET_WORKLOAD} IOPS above bpftrace's"


def row(tracer: str, ratio: float, rounds: int = TARGET_MIN_ROUNDS) -> dict:
    return {"workload": TARGET_WORKLOAD, "tracer": tracer, "ratio": ratio, "ratio_min": ratio - 0.01,
            "ratio_max": ratio + 0.01, "ratio_rounds": rounds}


def judged(rows: list[dict]) -> dict[str, bool | None]:
    res = Result(environment={}, seconds=1, reps=TARGET_MIN_ROUNDS)
    return {c["target"]: c["met"] for c in verdict(res, rows, {}) if "IOPS" in c["target"]}


@pytest.mark.parametrize("iotrace, floor, bpftrace, want_iops, want_bt", [
    (0.985, 1.00, 0.95, True, True),       # a quiet run: the floor at 1, iotrace above the target and bpftrace
    (0.95, 0.99, 0.97, False, False),      # a quiet run and iotrace under the target: not met
    (0.985, 1.125, 0.999, None, None),     # the floor 12% off 1 (make bench, 2026-12-07): noise, not judged
    (0.95, 0.90, 0.97, None, None),        # noise downwards too: a miss is not judged either
    (0.985, None, 0.95, None, None),       # no floor measured: nothing shows the noise
])
def test_iops_target_is_judged_only_where_the_floor_shows_the_run_can_resolve_it(iotrace, floor, bpftrace,
                                                                                  want_iops, want_bt):
    rows = [row("none", 1.0), row("iotrace", iotrace), row("bpftrace", bpftrace)]
    if floor is not None:
        rows.append(row("empty_raw", floor))
    got = judged(rows)
    assert got[IOPS] is want_iops and got[BPFTRACE] is want_bt


def test_too_few_rounds_still_fail_a_resolved_miss_but_do_not_pass():
    floor = row("empty_raw", 1.0, rounds=3)
    assert judged([row("iotrace", 0.90, rounds=3), floor])[IOPS] is False
    assert judged([row("iotrace", 0.99, rounds=3), floor])[IOPS] is None
