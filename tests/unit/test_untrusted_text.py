"""Every text view shows untrusted names (comm, container, label, device, path) made safe (tracer.text).

Any process may name itself "\\x1b[2J..." (prctl PR_SET_NAME) and a saved
file may hold anything: no view may hand an escape sequence, a newline or a
backspace from a name to the terminal.  Each view is fed the names and every
line it prints must be printable, with the escaped form of the name shown.
JSON keeps the exact text.  (A real process renaming itself:
tests/privileged/test_untrusted_names.py.)
"""

from __future__ import annotations

import csv
import io
import json
from datetime import UTC, datetime, timedelta

import numpy as np
import pytest
from conftest import put_json, run_iotrace

from tracer.codec import jsonl
from tracer.model import benchresult as br
from tracer.model.diskstats import DiskRow, Diskstats, ProcBytes
from tracer.model.dump import Dump, PhaseStats, Series
from tracer.model.histogram import Histogram
from tracer.text import safe

COMM = "\x1b[2J\x1b[31mPWN\n"                       # 14 characters: a comm the kernel allows
LABEL = "\x1b]0;title\x07epoch\r\x08\nfake row"
CONTAINER = "ctr\x1b[H\x9b2J"
DEVICE = "loop\x1b[7m0"
T0 = datetime(2026, 1, 1, 8, 0, tzinfo=UTC)


def assert_clean(text: str, *shown: str) -> None:
    """No control character on any line, and each of `shown` (escaped forms) somewhere in `text`."""
    for line in text.split("\n"):
        assert line.isprintable(), repr(line)
    for s in shown:
        assert s in text, (s, text)


def _phase(n: int = 10, ns: int = 2_000_000) -> PhaseStats:
    v = np.full(n, ns, dtype=np.int64)
    return PhaseStats(Histogram.from_values(v), float(v.sum()), int(v.min()), int(v.max()))


def _series(comm: str = COMM, device: str = DEVICE, container: str | None = CONTAINER, pid: int = 101) -> Series:
    ph = _phase()
    return Series(pid, comm, device, "7:0", "read", 10, 40960, {"total": ph, "queue": ph, "device": ph}, tgid=pid,
                  container=container)


def _dump(label: str | None = LABEL, at: float = 0, rows=None, **extra) -> Dump:
    d = Dump("marker" if label else "final", T0 + timedelta(seconds=at), T0 + timedelta(seconds=at + 10), "host",
             "6.18", [_series()] if rows is None else rows, dropped={"evil\x1b[2Jreason": 3}, label=label)
    return put_json(d, extra)


def _tasks_extra() -> dict:
    return {"sender_pid": 100, "loop": {"data_wait_s": 4.0, "steps": 10, "wall_s": 10.0},
            "tasks": [{"pid": 100, "ppid": 1, "io_wait_s": 0.0, "read_bytes": 0, "disk_read_bytes": 0},
                      {"pid": 101, "ppid": 100, "io_wait_s": 8.0, "read_bytes": 100, "disk_read_bytes": 100}],
            "coverage": {"devices": {DEVICE: {"recorded": 10, "diskstats": 12}}},
            "bio_devices": [DEVICE]}


def test_table_and_bars():
    from tracer.views.report import render_table

    out = io.StringIO()
    render_table(_dump(**_tasks_extra()), out, hist=True)
    assert_clean(out.getvalue(), "\\x1b[2J\\x1b[31", safe(CONTAINER), safe(DEVICE)[:9], safe(LABEL)[:20],
                 "\\x1b[2J\\x1b[31mPWN\\x0a " + safe(DEVICE), "evil\\x1b[2Jreason=3")


def test_report_by_label_wide_long_and_waits():
    from tracer.views.report import render_by_label

    dumps = [_dump(at=0, **_tasks_extra()), _dump("epoch 2\x1b[5m", at=10, **_tasks_extra())]
    for layout in ("wide", "long"):
        for per_pid in (False, True):
            out = io.StringIO()
            render_by_label(dumps, out, layout=layout, per_pid=per_pid)
            assert_clean(out.getvalue(), safe(LABEL)[:12], "epoch 2\\x1b[5m", "\\x1b[2J\\x1b[31")
    assert "verdict per window" in out.getvalue()


def test_live_table_sink_label_windows():
    from tracer.views.report import LabelWindows

    lw = LabelWindows()
    lw.add(_dump(**_tasks_extra()))
    out = io.StringIO()
    lw.render(out)
    assert_clean(out.getvalue(), safe(LABEL)[:12])


def test_top_screen():
    from tracer.views.top import screen_lines

    lines = screen_lines(_dump(), "p99", 1.0, f"pid 5 on {DEVICE}", 30)
    assert_clean("\n".join(lines), "\\x1b[2J\\x1b[31", safe(DEVICE)[:9], f"on {safe(DEVICE)}")


def test_diskstats_table():
    from tracer.views.diskstats import render

    d = Dump("final", T0, T0 + timedelta(seconds=1), "host", "6.18", [],
             disks=Diskstats([DiskRow(DEVICE, reads=3, r_s=3.0)], [ProcBytes(7, COMM, 4096, 0)]))
    out = io.StringIO()
    render(d, out)
    assert_clean(out.getvalue(), safe(DEVICE), "\\x1b[2J\\x1b[31")


def test_report_and_diff_from_files(tmp_path):
    path = tmp_path / "run.jsonl"
    with open(path, "w") as f:
        for d in (_dump(at=0), _dump("epoch 2", at=10, rows=[_series(comm="other", pid=202)])):
            jsonl.write(f, d)
    for args in (["report", str(path)], ["report", "--by", "label", str(path)],
                 ["diff", str(path), "--labels", LABEL, "epoch 2"], ["diff", str(path), str(path)]):
        r = run_iotrace(args, timeout=60)
        assert r.returncode == 0, (args, r.stderr)
        assert_clean(r.stdout + r.stderr, "\\x1b[2J\\x1b[31")
    # the JSON keeps the exact names
    r = run_iotrace(["report", "--json", str(path)], timeout=60)
    assert r.returncode == 0, r.stderr
    assert {s["comm"] for line in r.stdout.splitlines() for s in json.loads(line)["series"]} >= {COMM}


def test_an_error_naming_a_path_is_one_safe_line(tmp_path):
    r = run_iotrace(["report", str(tmp_path / "no\x1b[2Jsuch\nfile.jsonl")], timeout=60)
    assert r.returncode != 0
    assert r.stderr.count("\n") == 1 and "\x1b" not in r.stderr and "no\\x1b[2Jsuch\\x0afile" in r.stderr


def test_compare_and_bench_views():
    from tracer.views import bench as benchview
    from tracer.views import compare as cmpview

    def result(p99: float) -> br.BenchResult:
        lat = {"total": {"count": 10, "p50": p99 / 2, "p90": p99, "p99": p99, "p99.9": p99, "max": p99,
                         "min": 1.0, "mean": p99 / 2}}
        reps = [br.Rep(ops={"read": br.OpRun(10, 1.0, 100.0, lat)}) for _ in range(2)]
        return br.BenchResult("quick", "v1", [br.WorkloadResult("wl\x1b[2J\n", [], reps)],
                              {"host": "h\x1b]0;x\x07", "kernel": "6.18\r"}, 2)

    out = io.StringIO()
    benchview.render(result(100.0), out)
    assert_clean(out.getvalue(), "wl\\x1b[2J\\x0a")
    c = cmpview.compare(result(100.0), result(300.0), {"p99": 0.1}, {"total"})
    out = io.StringIO()
    cmpview.render(c, cmpview.describe("base\x1b[2J.json", result(1.0)), "new.json", out)
    assert_clean(out.getvalue(), "wl\\x1b[2J\\x0a", "base\\x1b[2J.json", "h\\x1b]0;x\\x07")


def test_csv_cells(tmp_path):
    from tracer.sinks.csv import CsvLog

    log = CsvLog(str(tmp_path / "o.csv"))
    log.write_dump(_dump(), [], every_device=False)
    log.close()
    text = (tmp_path / "o.csv").read_text()
    assert_clean(text, safe(LABEL), safe(DEVICE))
    rows = list(csv.reader(io.StringIO(text)))
    assert len(rows) == 2 and rows[1][2] == safe(LABEL)      # one row: no newline made a second


def test_alert_lines():
    from tracer.pipeline.alerts import AlertCheck, parse_rules

    err = io.StringIO()
    AlertCheck(parse_rules(["p99>1ms"]), err=err).apply(_dump())
    assert err.getvalue().count("\n") == 1
    assert_clean(err.getvalue(), safe(repr(LABEL)), safe(DEVICE))


def test_plot_titles_and_legends(tmp_path):
    plot = pytest.importorskip("tracer.views.plot")
    pytest.importorskip("matplotlib")
    dumps = [_dump(LABEL + " $x", at=0, **_tasks_extra()), _dump("epoch $2", at=10, **_tasks_extra())]
    res = plot.render(dumps, str(tmp_path / "p.png"), source="run\x1b[2J.jsonl")
    assert res.panels[-1] == plot.TITLE_WAITS
    assert plot.shown(LABEL + " $x") == safe(LABEL) + r" \$x"
    assert plot.shown("a\nb").isprintable()
