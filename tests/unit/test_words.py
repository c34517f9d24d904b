"""The tables' words (tracer.views.words): plain by default, the block layer's with --hist.  No root, no BPF."""

from __future__ import annotations

import io

from tracer.model.sections import Coverage, DeviceCoverage
from tracer.views import report
from unit.test_report_views import dump, series


def _table(hist: bool = False, filtered: bool = True) -> str:
    d = dump("epoch 1", 0, 2, [series(7, "loader-0", "loop6", "read", [100_000, 200_000])])
    d.coverage = Coverage(filtered, {"loop6": DeviceCoverage(2057, 2058), "loop7": DeviceCoverage(0, 0)})
    out = io.StringIO()
    report.render_table(d, out, hist=hist)
    return out.getvalue()


def test_the_default_table_spells_queue_device_and_coverage_out():
    text = _table()
    head = next(line for line in text.splitlines() if line.lstrip().startswith("PID"))
    assert head.split()[-8:] == ["QUEUE", "p50", "QUEUE", "p99", "DEVICE", "p50", "DEVICE", "p99"], head
    assert "Q:" not in text and "D:" not in text and "Q2D" not in text, text
    # one line says how much of the disk's I/O was the job's; a disk with no request says nothing
    assert "2057 of 2058 requests on loop6 were this job's\n" in text, text
    assert "loop7" not in text and "coverage" not in text and "filter" not in text, text
    row = next(line for line in text.splitlines() if line.lstrip().startswith("7 "))
    assert len(row.split()) == len(head.split()) - 4, (row, head)     # 4 two-word heads


def test_a_system_wide_table_says_recorded_and_hist_keeps_the_jargon():
    assert "2057 of 2058 requests on loop6 were recorded\n" in _table(filtered=False)
    text = _table(hist=True)
    head = next(line for line in text.splitlines() if line.lstrip().startswith("PID"))
    assert head.split()[-4:] == ["Q:p50", "Q:p99", "D:p50", "D:p99"], head
    assert ("coverage: requests recorded / completed per /proc/diskstats: loop6 2057/2058 (100.0%); "
            "a pid or cgroup filter leaves the rest out\n") in text, text
    assert "Q = queue (~Q2D), D = device (D2C)" in text
