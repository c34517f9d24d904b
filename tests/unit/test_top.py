"""iotrace top: the screen text from crafted dumps, and the real thing driven in tmux."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from conftest import run_iotrace

from tracer.model.dump import Dump, PhaseStats, Series
from tracer.model.histogram import Histogram
from tracer.views import top

T0 = datetime(2026, 1, 1, 8, 30, tzinfo=UTC)


def _series(pid: int, comm: str, count: int, latency_ns: int, size: int = 4096) -> Series:
    st = PhaseStats(Histogram.from_values([latency_ns] * count), float(latency_ns * count), latency_ns, latency_ns)
    return Series(pid, comm, "loop0", "7:0", "read", count, size * count, {"total": st})


def _dump(*series: Series) -> Dump:
    return Dump("interval", T0, T0 + timedelta(seconds=2), "h", "k", list(series))


def test_rows_sort_by_p99_bytes_or_iops():
    d = _dump(_series(1, "slow", 10, 9_000_000), _series(2, "big", 20, 100_000, size=1 << 20),
              _series(3, "many", 400, 50_000))
    assert [r.comm for r in top.top_rows(d, "p99")] == ["slow", "big", "many"]
    assert [r.comm for r in top.top_rows(d, "bytes")] == ["big", "many", "slow"]
    assert [r.comm for r in top.top_rows(d, "iops")] == ["many", "big", "slow"]
    many = top.top_rows(d, "iops")[0]
    assert many.iops == 200 and many.cells()[6] == "4.0KiB" and many.cells()[9] == "50us"


def test_screen_fits_the_height_and_says_what_is_left_out():
    d = _dump(*(_series(pid, f"p{pid}", pid, 1000 * pid) for pid in range(1, 31)))
    lines = top.screen_lines(d, "p99", 1.0, "every device", height=12)
    assert len(lines) == 12 and lines[3].split()[:4] == ["PID", "COMM", "DEVICE", "OP"]
    assert lines[4].split()[:2] == ["30", "p30"]        # highest p99 first
    assert "more rows" in lines[-1] and "23 more" in lines[-1]
    assert "30 rows" in lines[1]
    assert top.screen_lines(None, "p99", 1.0, "loop0", 10)[-1].strip().startswith("waiting")
    assert "no block I/O" in top.screen_lines(_dump(), "bytes", 1.0, "loop0", 10)[-1]


def test_top_without_a_terminal_is_one_line():
    r = run_iotrace(["top"], timeout=30)
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and "needs a terminal" in r.stderr, r.stderr


# ---- in a real terminal: tmux ----------------------------------------------------
