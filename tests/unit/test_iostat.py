"""iostat's numbers: diskstats windows, /proc/PID/io, --csv beside a real trace, and --diskstats as nobody."""

from __future__ import annotations

import csv
import json
import os
import pwd
import shutil
import subprocess
import tempfile
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from conftest import PYTHON, ROOT, run_iotrace

from tracer.model import diskstats as dsmodel
from tracer.model.diskstats import DiskCounters
from tracer.model.dump import Dump, PhaseStats, Series
from tracer.model.histogram import Histogram
from tracer.sinks import csv as csvsink
from tracer.sources import diskstats as dssource
from tracer.sources.devices import read_diskstats

TESTS = Path(__file__).resolve().parent.parent
needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="needs root (loop devices, setpriv)")
NOBODY = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"]


def stats(**kw) -> DiskCounters:
    base = dict.fromkeys(("reads", "read_sectors", "read_ms", "writes", "write_sectors", "write_ms", "in_flight",
                          "io_ms", "weighted_ms", "discards", "discard_sectors", "flushes"), 0)
    base.update(kw)
    return DiskCounters(**base)


# ---- the iostat columns ---------------------------------------------------------

def test_window_gives_iostat_columns():
    a = stats(reads=100, read_sectors=800, read_ms=50, writes=10, write_sectors=80, write_ms=30, io_ms=100,
              weighted_ms=200)
    b = stats(reads=300, read_sectors=2400, read_ms=450, writes=60, write_sectors=880, write_ms=130, io_ms=1600,
              weighted_ms=3200, in_flight=3)
    r = dsmodel.window("sdx", a, b, 2.0)
    assert r.columns() == {"r/s": 100.0, "w/s": 25.0, "rkB/s": 400.0, "wkB/s": 200.0, "r_await": 2.0,
                           "w_await": 2.0, "aqu-sz": 1.5, "%util": 75.0}
    assert r.active
    # io_ms beyond the window (clocks differ): capped, as iostat does; no requests: awaits are 0
    assert dsmodel.window("sdx", a, stats(io_ms=2200), 2.0).util == 100.0
    idle = dsmodel.window("sdx", a, a, 2.0)
    assert not idle.active and idle.r_await == 0 and idle.util == 0


def test_window_of_a_new_or_reattached_device_counts_from_zero():
    now = stats(reads=7, read_ms=14)
    assert dsmodel.window("loop9", None, now, 1.0).reads == 7
    # counters went back: detached and attached anew meanwhile
    assert dsmodel.window("loop9", stats(reads=1000, read_ms=5000), now, 1.0).reads == 7


def _diskstats_file(path: Path, reads: int, writes: int) -> None:
    path.write_text(f"   7       0 loop0 {reads} 0 {reads * 8} {reads} {writes} 0 {writes * 8} {writes} 0 "
                    f"{reads + writes} {reads + writes} 0 0 0 0 0 0\n"
                    "   7       1 loop1 5 0 40 5 0 0 0 0 0 5 5 0 0 0 0 0 0\n")


def test_disk_sampler_windows_and_whole_run(tmp_path):
    f = tmp_path / "diskstats"
    _diskstats_file(f, 10, 0)
    s = dssource.DiskSampler(["loop0"], path=str(f))
    _diskstats_file(f, 40, 5)
    [w1] = s.sample()
    _diskstats_file(f, 41, 25)
    [w2] = s.sample()
    assert (w1.device, w1.reads, w1.writes, w2.reads, w2.writes) == ("loop0", 30, 5, 1, 20)
    assert w1.seconds > 0 and w2.seconds > 0
    [whole] = s.whole()
    assert (whole.reads, whole.writes, whole.read_sectors) == (31, 25, 248)
    assert whole.seconds == pytest.approx(w1.seconds + w2.seconds)


# ---- /proc/PID/io ----------------------------------------------------------------

def _proc(root: Path, pid: int, comm: str, ppid: int, start: int, rb: int, wb: int) -> None:
    d = root / str(pid)
    d.mkdir(exist_ok=True)
    rest = ["S", str(ppid)] + ["0"] * 17 + [str(start)] + ["0"] * 10
    (d / "stat").write_text(f"{pid} ({comm}) {' '.join(rest)}\n")
    (d / "io").write_text(f"rchar: 1\nwchar: 2\nsyscr: 0\nsyscw: 0\nread_bytes: {rb}\nwrite_bytes: {wb}\n"
                          "cancelled_write_bytes: 0\n")


def test_proc_sampler_deltas_children_and_reused_pids(tmp_path):
    _proc(tmp_path, 10, "train (a) py", 1, 500, 4096, 0)     # a comm with spaces and parentheses
    _proc(tmp_path, 11, "worker", 10, 501, 0, 0)
    _proc(tmp_path, 20, "other", 1, 502, 100, 100)
    every = dssource.ProcSampler(proc=str(tmp_path))
    mine = dssource.ProcSampler([10], proc=str(tmp_path))
    alone = dssource.ProcSampler([10], children=False, proc=str(tmp_path))
    _proc(tmp_path, 10, "train (a) py", 1, 500, 8192, 4096)
    _proc(tmp_path, 11, "worker", 10, 501, 4096, 0)
    _proc(tmp_path, 20, "other", 1, 502, 100, 100)           # no I/O in the window: not listed
    _proc(tmp_path, 12, "late", 11, 600, 512, 0)             # started in the window: all of its bytes count
    want = [(10, "train (a) py", 4096, 4096), (11, "worker", 4096, 0), (12, "late", 512, 0)]
    assert [(p.pid, p.comm, p.read_bytes, p.write_bytes) for p in every.sample()] == want
    assert [(p.pid, p.comm, p.read_bytes, p.write_bytes) for p in mine.sample()] == want
    assert [p.pid for p in alone.sample()] == [10]
    # pid 11 exits and its pid is reused by an unrelated process: a new process, counted from 0
    _proc(tmp_path, 11, "reused", 1, 900, 1024, 0)
    assert [(p.pid, p.comm, p.read_bytes) for p in every.sample()] == [(11, "reused", 1024)]
    assert [p.pid for p in mine.sample()] == []
    assert {(p.pid, p.comm, p.read_bytes) for p in every.whole()} == {
        (10, "train (a) py", 4096), (11, "worker", 4096), (12, "late", 512), (11, "reused", 1024)}


# ---- --csv rows, crafted ---------------------------------------------------------

def _series(pid: int, device: str, devno: str, op: str, values_ns: list[int]) -> Series:
    st = PhaseStats(Histogram.from_values(values_ns), float(sum(values_ns)), min(values_ns), max(values_ns))
    return Series(pid, "app", device, devno, op, len(values_ns), 4096 * len(values_ns), {"total": st})


def test_csv_rows_merge_processes_and_keep_idle_devices(tmp_path):
    t0 = datetime(2026, 1, 1, tzinfo=UTC)
    d = Dump("interval", t0, t0 + timedelta(seconds=2), "h", "k",
             [_series(1, "loop0", "7:0", "read", [1000] * 50), _series(2, "loop0", "7:0", "read", [9000] * 50),
              _series(1, "loop0", "7:0", "write", [5000] * 10)])
    disk = [dsmodel.IostatRow("loop0", 2.0, reads=100, read_sectors=800, read_ms=20, writes=10, write_sectors=80,
                             write_ms=5, io_ms=500, weighted_ms=100),
            dsmodel.IostatRow("loop1", 2.0)]
    log = csvsink.CsvLog(str(tmp_path / "x.csv"))
    log.write_dump(d, disk, every_device=True)
    log.close()
    rows = list(csv.DictReader((tmp_path / "x.csv").open()))
    assert list(rows[0]) == list(csvsink.CSV_COLUMNS)
    assert [(r["device"], r["op"], r["count"]) for r in rows] == [("loop0", "read", "100"), ("loop0", "write", "10"),
                                                                  ("loop1", "-", "")]
    read = rows[0]
    assert (read["r/s"], read["w/s"], read["rkB/s"], read["r_await"], read["%util"]) == (
        "50.00", "5.00", "200.00", "0.20", "25.00")
    # both processes' requests in one distribution: half at 1 us, half at 9 us
    assert float(read["p50_us"]) == pytest.approx(1.0, rel=0.01) and float(read["p99_us"]) == pytest.approx(9, rel=.01)
    assert float(read["MiB/s"]) == pytest.approx(100 * 4096 / 2 / 2**20, abs=1e-3)    # MiB: 2^20 bytes
    assert rows[2]["%util"] == "0.00" and rows[2]["p99_us"] == ""
    # appending to the same file writes no second header
    log = csvsink.CsvLog(str(tmp_path / "x.csv"))
    log.write_dump(d, disk, every_device=False)      # an idle device without --dev: left out
    log.close()
    again = list(csv.DictReader((tmp_path / "x.csv").open()))
    assert len(again) == 5 and all(r["time"] != "time" for r in again)


# ---- --csv beside a real trace ------------------------------------------------------


# ---- iotrace --diskstats, as an ordinary user ------------------------------------------

READER = """\
import mmap, os, sys, time
def read_bytes():
    with open("/proc/self/io") as f:
        return int(next(x for x in f if x.startswith("read_bytes:")).split()[1])
fd, n = int(sys.argv[1]), int(sys.argv[2])
buf = mmap.mmap(-1, 4096)
before = read_bytes()       # a cold page cache: the interpreter's own loads (lib-dynload's mmap) count too
for i in range(n):
    os.preadv(fd, [buf], (1000 + i) * 4096)
print(os.getpid(), before, read_bytes(), flush=True)
time.sleep(1.5)        # alive at the next sample: /proc forgets a process that has exited
"""


def _rw_as_root(path: str, reads: int, writes: int) -> None:
    import mmap

    fd = os.open(path, os.O_RDWR | os.O_DIRECT)
    buf = mmap.mmap(-1, 4096)
    try:
        for i in range(reads):
            os.preadv(fd, [buf], i * 4096)
        for i in range(writes):
            os.pwritev(fd, [buf], (2000 + i) * 4096)
    finally:
        os.close(fd)


@pytest.fixture
def nobody_dir():
    """A directory the user nobody may write (pytest's own are closed to it)."""
    d = tempfile.mkdtemp(prefix="iotrace-nobody-")
    nobody = pwd.getpwnam("nobody")
    os.chown(d, nobody.pw_uid, nobody.pw_gid)
    yield Path(d)
    shutil.rmtree(d, ignore_errors=True)


@needs_root
def test_diskstats_mode_as_nobody(make_loop, nobody_dir):
    loop = make_loop()
    out, table = nobody_dir / "ds.jsonl", nobody_dir / "ds.csv"
    before = read_diskstats()[loop.name]
    tracer = subprocess.Popen([*NOBODY, PYTHON, "-m", "tracer.cli", "--diskstats", "-i", "0.5", "-d", "4",
                               "--dev", loop.name, "-o", str(out), "--csv", str(table)],
                              cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        # both start lines, before communicate(): it reads the pipe itself, past anything readline() buffered
        started = tracer.stderr.readline() + tracer.stderr.readline()
        assert "--diskstats" in started and "no percentiles" in started and "not root" in started, started
        time.sleep(0.3)
        _rw_as_root(loop.path, 50, 30)          # by this (root) process: nobody may not see it in /proc
        fd = os.open(loop.path, os.O_RDONLY | os.O_DIRECT)
        try:                                     # nobody reads through a descriptor root opened
            reader = subprocess.run([*NOBODY, PYTHON, "-c", READER, str(fd), "40"], pass_fds=[fd],
                                    capture_output=True, text=True, timeout=30, check=True)
        finally:
            os.close(fd)
        stdout, stderr = tracer.communicate(timeout=30)
    finally:
        if tracer.poll() is None:
            tracer.kill()
            tracer.wait()
    after = read_diskstats()[loop.name]
    assert tracer.returncode == 0 and "Traceback" not in stderr, stderr
    assert "no percentiles" in stdout and "readable only for your own processes" in stdout

    windows = [json.loads(x) for x in out.read_text().splitlines()]
    assert windows and all(w["kind"] == "diskstats" and w["percentiles"] is None for w in windows)
    assert [w["window"] for w in windows][-1] == "final"
    devs = [d for w in windows for d in w["devices"] if d["device"] == loop.name]
    assert len(devs) == len(windows)        # --dev: a row every window, busy or not
    assert sum(d["reads"] for d in devs) == after.reads - before.reads == 90
    assert sum(d["writes"] for d in devs) == after.writes - before.writes == 30
    assert sum(d["read_kB"] for d in devs) == (after.read_sectors - before.read_sectors) / 2
    assert sum(d["r/s"] * w["duration_s"] for w, d in zip(windows, devs, strict=True)) == pytest.approx(90, abs=0.5)
    # its own process is there with its bytes; root's (this test's) is not
    pid, own_before, own_after = map(int, reader.stdout.split())
    assert own_after - own_before == 40 * 4096
    procs = [p for w in windows for p in w["processes"]]
    # all it read since it started: the counters of a process first seen began at 0
    assert sum(p["read_bytes"] for p in procs if p["pid"] == pid) == own_after
    assert all(p["pid"] != os.getpid() for p in procs)
    assert all(w["unreadable_processes"] > 0 for w in windows)
    rows = list(csv.DictReader(table.open()))
    assert [r["device"] for r in rows] == [loop.name] * len(windows)
    assert all(r["op"] == "-" and r["p50_us"] == "" for r in rows)
    assert round(sum(float(r["w/s"]) * float(r["seconds"]) for r in rows)) == 30


@needs_root
def test_without_root_the_error_offers_diskstats(nobody_dir):
    r = subprocess.run([*NOBODY, PYTHON, "-m", "tracer.cli", "-d", "1"], cwd=ROOT, capture_output=True, text=True,
                       timeout=60)
    lines = [x for x in r.stderr.splitlines() if x.strip() and "markers are off" not in x]
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
    assert len(lines) == 1 and lines[0].startswith("iotrace: ") and "root" in lines[0], r.stderr
    assert "iotrace --diskstats" in lines[0]


@pytest.mark.parametrize("argv, needle", [
    (["--diskstats", "--", "true"], "--pid"),
    (["--diskstats", "--hist"], "needs BPF"),
    (["--diskstats", "--alert", "p99>1ms"], "percentiles need BPF"),
    (["--diskstats", "--dev", "nosuchdisk0"], "no such block device"),
])
def test_diskstats_bad_arguments(argv, needle):
    r = run_iotrace(argv, timeout=30)
    lines = [x for x in r.stderr.splitlines() if x.strip()]
    assert r.returncode == 2 and len(lines) == 1 and needle in lines[0] and "Traceback" not in r.stderr, r.stderr
