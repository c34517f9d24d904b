"""test_iostat: the tests that load BPF programs (need root).

The rest, and the helpers both share, are in tests/unit/test_iostat.py.
"""

from __future__ import annotations

import csv

import pytest
from conftest import PYTHON, assert_count, read_dumps, run_iotrace, series_of

from tracer.sinks import csv as csvsink
from tracer.sources.devices import read_diskstats

RW_SCRIPT = """\
import mmap, os, sys, time
fd = os.open(sys.argv[1], os.O_RDWR | os.O_DIRECT)
buf = mmap.mmap(-1, 4096)
for step in range(6):
    for i in range(50):
        os.preadv(fd, [buf], (step * 50 + i) * 4096)
    for i in range(20):
        os.pwritev(fd, [buf], (4000 + step * 20 + i) * 4096)
    time.sleep(0.25)
os.close(fd)
"""


@pytest.mark.bpf
def test_csv_matches_diskstats_and_the_dumps(loop, tmp_path):
    out, table = tmp_path / "run.jsonl", tmp_path / "run.csv"
    before = read_diskstats()[loop.name]
    r = run_iotrace(["-i", "0.5", "-o", str(out), "--csv", str(table), "--dev", loop.name, "--",
                     PYTHON, "-c", RW_SCRIPT, loop.path])
    after = read_diskstats()[loop.name]
    assert r.returncode == 0, r.stderr
    dumps = read_dumps(out)
    rows = list(csv.DictReader(table.open()))
    assert list(rows[0]) == list(csvsink.CSV_COLUMNS)
    assert {r["device"] for r in rows} == {loop.name}        # --dev: only that device
    assert len(dumps) >= 3 and {r["time"] for r in rows} == {d["end"] for d in dumps}   # a row (or more) per dump

    # iostat's side: the windows add up to the /proc/diskstats delta around the run (nobody else uses the device)
    windows = {(r["time"], r["device"]): r for r in rows}.values()

    def total(col: str, scale) -> float:
        return sum(float(w[col]) * scale(w) for w in windows)

    secs = lambda w: float(w["seconds"])       # noqa: E731
    assert round(total("r/s", secs)) == after.reads - before.reads == 300
    assert round(total("w/s", secs)) == after.writes - before.writes == 120
    assert round(total("rkB/s", secs)) == (after.read_sectors - before.read_sectors) / 2
    assert round(total("wkB/s", secs)) == (after.write_sectors - before.write_sectors) / 2
    n = len(windows)
    assert total("r_await", lambda w: float(w["r/s"]) * secs(w)) == pytest.approx(after.read_ms - before.read_ms,
                                                                                  abs=n * 0.5 + 1)
    assert total("%util", lambda w: secs(w) * 10) == pytest.approx(after.io_ms - before.io_ms, abs=n + 1)
    assert total("aqu-sz", lambda w: secs(w) * 1000) == pytest.approx(after.weighted_ms - before.weighted_ms,
                                                                      abs=n * 3 + 1)

    # iotrace's side: count, p50 and p99 are the dump's (one process, so its row is the device+op's)
    traced = {(r["time"], r["op"]): r for r in rows if r["op"] != "-"}
    for d in dumps:
        for s in series_of(d, device=loop.name):
            row = traced.pop((d["end"], s["op"]))
            assert int(row["count"]) == s["count"]
            assert float(row["p50_us"]) == s["latency_us"]["total"]["p50"]
            assert float(row["p99_us"]) == s["latency_us"]["total"]["p99"]
    assert traced == {}
    for op, want in (("read", 300), ("write", 120)):
        assert_count(sum(int(r["count"]) for r in rows if r["op"] == op), want, dumps, device=loop.name)
