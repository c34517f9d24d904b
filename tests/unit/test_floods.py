"""A marker flood and processes that come and go do not grow the tracer (issue 32, item 3).

The live table (tracer.sinks.table) keeps, per label, what the end-of-run
verdicts need (tracer.views.report.LabelWindows).  It kept whole dumps:
their drop counters, events, file rows and sections, ~5 KB a label (a
blocking sender at 40 markers/s grew the tracer 79 -> 86.7 MB), and a
label's task rows grew with every loader started anew.  Measured with
tracemalloc over 10,000 marker dumps, as a flood of `iotrace mark` makes
them.
"""

from __future__ import annotations

import io
import tracemalloc
from datetime import UTC, datetime, timedelta

from tracer.model.dump import Dump
from tracer.model.files import FileRow, Files
from tracer.model.sections import Loop, SenderPid, TaskRow, Tasks
from tracer.views.report import LabelWindows

T0 = datetime(2026, 1, 3, tzinfo=UTC)
MARKERS = 10_000
# what the live table may hold after a flood of 10,000 markers, beyond what it holds after the first 10
FLOOD_BUDGET = 5e6       # bytes: 5 KB a label, LabelWindows.MAX labels kept (whole dumps took 18.8 MB)
CHURN = 1_000            # epochs' dumps with 8 new loaders each: 8,000 processes
CHURN_BUDGET = 1e6       # bytes: five labels' folded rows (their rows unfolded took 8.8 MB at 600 dumps)


class Null(io.TextIOBase):
    def write(self, s: str) -> int:
        return len(s)


def marker_dump(i: int, label: str, loaders: range) -> Dump:
    """A marker dump as the tracer makes one: the trainer (pid 100) and its loaders, file rows, the
    drop and event counters (as many as the probe has), the loop's timing."""
    t = T0 + timedelta(seconds=i)
    rows = [TaskRow(pid=100, ppid=1, comm="python", io_wait_s=0.1, read_bytes=1 << 20)]
    rows += [TaskRow(pid=p, ppid=100, comm="pt_data_worker", io_wait_s=0.5, read_bytes=1 << 20, exited=True,
                     started=True) for p in loaders]
    files = [FileRow(dev="7:0", ino=1000 + k, path=f"/data/shard-{k:05d}.tar", pid=loaders.start,
                     comm="pt_data_worker", disk_read_bytes=4096 * k, requests=k, hist={10: k, 12: 1})
             for k in range(20)]
    return Dump("marker", t, t + timedelta(seconds=1), "host", "6.18", [], label=label,
                dropped={f"reason_{k}": 0 for k in range(26)}, events={f"event_{k}": k for k in range(12)},
                tasks=Tasks(rows), files=Files(files), loop=Loop(0.2, 10, 1.0), sender_pid=SenderPid(100))


def held(label_of, markers: int = MARKERS) -> tuple[int, LabelWindows]:
    """Bytes the table's label windows hold after `markers` marker dumps beyond what they held after 10."""
    lw = LabelWindows()
    tracemalloc.start()
    try:
        for i in range(markers):
            if i == 10:
                base = tracemalloc.get_traced_memory()[0]
            # 8 loaders per window, new pids each time (workers started anew each epoch)
            d = marker_dump(i, label_of(i), range(1000 + 8 * i, 1008 + 8 * i))
            lw.add(d)
            del d
        return tracemalloc.get_traced_memory()[0] - base, lw
    finally:
        tracemalloc.stop()


def test_a_flood_of_distinct_labels_is_held_in_a_bounded_space():
    grown, lw = held(lambda i: f"step {i}")
    assert grown < FLOOD_BUDGET, f"{grown / 1e6:.1f} MB held after {MARKERS} markers"
    assert len(lw.windows) == LabelWindows.MAX and lw.skipped == MARKERS - LabelWindows.MAX


def test_epochs_whose_loaders_come_and_go_are_held_in_a_bounded_space():
    grown, lw = held(lambda i: f"epoch {i % 5}", CHURN)
    assert grown < CHURN_BUDGET, f"{grown / 1e6:.1f} MB held after {CHURN} markers"
    for w in lw.windows.values():
        assert len(w.tasks.rows) <= LabelWindows.MAX_ROWS + 1


def test_folded_loaders_still_count_as_the_trainers_and_keep_their_sums():
    lw = LabelWindows()
    for i in range(100):        # 800 loaders that came and went in "epoch 1"
        lw.add(marker_dump(i, "epoch 1", range(1000 + 8 * i, 1008 + 8 * i)))
    w = lw.windows["epoch 1"]
    assert len(w.tasks.rows) <= LabelWindows.MAX_ROWS
    loaders = [r for r in w.tasks.rows if r.pid != 100]
    assert all(r.ppid == 100 for r in loaders)      # each sum still a child of the trainer
    assert sum(r.read_bytes for r in loaders) == 800 << 20
    assert round(sum(r.io_wait_s for r in loaders), 6) == 400.0
    out = io.StringIO()
    lw.render(out)
    text = out.getvalue()
    assert f"x{len(loaders)}" in text         # the loaders still judged, each sum as one
    assert "summed per parent and name" in text
