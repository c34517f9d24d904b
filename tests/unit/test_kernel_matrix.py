"""The kernel matrix's fio gate (scripts/kernels/run.py fio_problems): iotrace must record every
request the disk completed, and the disk's requests plus its merges must be fio's I/Os."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts" / "kernels"))
from run import fio_problems  # noqa: E402


def run(fio=4096, recorded=4096, reads=4096, merges=0, **extra):
    stat = {"read": reads} if merges is None else {"read": reads, "read_merges": merges}
    return {"scheduler": "mq-deadline", "attach": "raw_tp", "fio_total_ios": fio, "iotrace_recorded": recorded,
            "diskstats": stat, **extra}


@pytest.mark.parametrize("r, problem", [
    (run(), None),
    (run(recorded=4095, reads=4095, merges=1), None),          # a scheduler merged two reads: 4095 requests
    (run(recorded=4094, reads=4095, merges=1), "recorded 4094 of the disk's 4095"),
    (run(recorded=4095), "recorded 4095 of the disk's 4096"),
    (run(recorded=4095, reads=4095, merges=None), "4095 requests, ? merged"),   # old logs: merges unknown
    (run(recorded=4095, reads=4095, merges=0), "4095 requests, 0 merged, for fio's 4096"),
    (run(error="fio failed"), "fio failed"),
    ({"scheduler": "none", "attach": "tracepoint"}, "recorded None"),
])
def test_fio_gate(r, problem):
    out = fio_problems({"runs": [r]})
    if problem is None:
        assert out == []
    else:
        assert len(out) == 1 and problem in out[0], out
