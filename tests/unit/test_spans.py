"""Every figure on the span it names (issue 30, item 2), on fake drains and dumps (no root, no BPF):
the --csv row's `seconds` and iostat columns over its dump's window, --cgroup's per-process rows,
--dev's file rows, coverage of the traced disks only, and one unit for sizes and rates."""

from __future__ import annotations

import csv
import io
import types

import pytest

from tracer.model.diskstats import DiskCounters
from tracer.model.dump import duration_of
from tracer.model.sections import TaskRow, Tasks
from tracer.pipeline import aggregate
from tracer.pipeline.aggregate import Clock, build_dump, coverage, on_disks
from tracer.pipeline.windows import CgroupRows, DumpWindows
from tracer.sinks.csv import CsvLog
from tracer.sources.cgroups import within
from tracer.sources.files import FileRaw
from unit.test_writeback import raw

LOOP0, LOOP1 = 7 << 20, (7 << 20) | 1     # the kernel's dev_t of 7:0 and 7:1
READ = 0


@pytest.fixture(autouse=True)
def loop_names(monkeypatch):
    """7:0 and 7:1 are loop0 and loop1 whether or not this machine has them attached now (sysfs names them
    only while they exist: a fresh machine, or one whose tests detached them, would call them 7:0)."""
    from tracer.sources import devices

    names = {LOOP0: "loop0", LOOP1: "loop1"}
    real = devices.name_of
    monkeypatch.setattr(devices, "name_of", lambda dev: names.get(dev) or real(dev))


def stats(reads: int = 0, writes: int = 0, io_ms: int = 0) -> DiskCounters:
    return DiskCounters(reads, reads * 8, reads, writes, writes * 8, writes, 0, io_ms, io_ms, 0, 0, 0)


# ---- 2. the --csv row: its dump's seconds, iostat's columns over the same window ------------------

class _Probe:
    def __init__(self, interval):
        self.interval = interval

    def drain(self, final=False):
        return self.interval


def test_csv_seconds_and_iostat_columns_are_the_dumps_window(tmp_path):
    # the probe read /proc/diskstats at the window's edges: 400 reads on loop0 in its 2 s
    r = raw([(100, READ, 400, 400 * 4096)])
    r.end_ns = 2_000_000_000
    r.diskstats_start, r.diskstats_end = {"loop0": stats(1000)}, {"loop0": stats(1400, io_ms=1000)}
    windows = DumpWindows(_Probe(r), iostat=True, devices=["loop0"], containers=False)
    windows.start()
    d = windows.build(windows.cut(), "final")
    assert duration_of(d) == pytest.approx(2.0, abs=1e-5)
    path = tmp_path / "run.csv"
    log = CsvLog(str(path))
    log.write_dump(d, d.iostat, every_device=True)
    log.close()
    [row] = list(csv.DictReader(path.open()))
    assert float(row["seconds"]) == pytest.approx(2.0, abs=1e-5)
    assert float(row["r/s"]) == pytest.approx(200.0, abs=0.01)       # 400 reads / the dump's 2 s
    assert float(row["%util"]) == pytest.approx(50.0, abs=0.01)
    assert int(row["count"]) == 400


# ---- 4. --cgroup: the per-process rows of the cgroup's processes -----------------------------------

def test_cgroup_paths_within():
    assert within("/a/b", "/a") and within("/a", "/a") and within("/a/b/c", "/a/b/")
    assert not within("/ab", "/a") and not within("/", "/a")
    assert within("/anything", "/")


def test_cgroup_rows_keep_the_cgroups_processes_only():
    places = {10: "/job", 11: "/job/inner", 12: "/system.slice/other.service", 14: "/jobless"}
    rows = CgroupRows("/job", cgroup_of=places.get)
    d = build_dump(raw([(13, READ, 5, 5 * 4096)]), Clock(), "interval")     # pid 13 did block I/O (filtered)
    d.tasks = Tasks([TaskRow(pid) for pid in (10, 11, 12, 13, 14, 15)])
    rows.apply(d)
    # 13 is gone from /proc, but its requests passed the kernel's cgroup filter; 15 is gone, never placed
    assert [r.pid for r in d.tasks.rows] == [10, 11, 13]

    # a process placed once and gone by the next cut stays where it was (and is forgotten when it exits)
    del places[10]
    d2 = build_dump(raw([]), Clock(), "final")
    d2.tasks = Tasks([TaskRow(10, exited=True), TaskRow(12)])
    rows.apply(d2)
    assert [r.pid for r in d2.tasks.rows] == [10] and 10 not in rows.known


def test_the_cgroup_stage_runs_in_the_pipeline(monkeypatch):
    from tracer.sources import cgroups

    monkeypatch.setattr(cgroups, "cgroup_of", {20: "/job", 21: "/elsewhere"}.get)
    tasks = types.SimpleNamespace(drain=lambda final: [], dropped=lambda: {}, sources={})
    windows = DumpWindows(_Probe(raw([])), tasks, containers=False, cgroup="/job")
    cut = windows.cut()
    from tracer.sources.tasks import TaskRaw

    counts = dict.fromkeys(("io_wait_ns", "io_waits", "read_bytes", "reads", "fsync_ns", "fsyncs", "throttle_ns",
                            "throttles"), 0)
    cut = (cut[0], [TaskRaw(20, 1, "in", dict(counts)), TaskRaw(21, 1, "out", dict(counts))], {}, False)
    d = windows.build(cut, "final")
    assert [r.pid for r in d.tasks.rows] == [20]


# ---- 5. --dev: file rows of the traced disks only ------------------------------------------------

def test_file_rows_keep_the_traced_disks_files():
    part = (8 << 20) | 1            # sda1, a partition of sda (8:0)
    rows = [FileRaw(LOOP0, 1, 1, cache_bytes=4096), FileRaw(LOOP1, 2, 1, cache_bytes=8192),
            FileRaw(part, 3, 1, cache_bytes=4096), FileRaw(0x2d, 4, 1, requests=3, disk_read_bytes=12288)]
    parts = {part: 8 << 20}
    # loop1's file was read from the page cache only: no request of loop1 was traced, the row is not its
    assert [r.ino for r in on_disks(rows, [LOOP0], parts)] == [1, 4]
    assert [r.ino for r in on_disks(rows, [8 << 20], parts)] == [3, 4]       # a partition counts as its disk
    assert on_disks(rows, None, parts) == rows


def test_the_dumps_files_are_the_traced_disks(monkeypatch):
    monkeypatch.setattr(aggregate.devices, "partitions", lambda: {})
    r = raw([(1, READ, 1, 4096)])
    r.files = [FileRaw(LOOP0, 1, 1, cache_bytes=4096, path="/mnt/a"),
               FileRaw(LOOP1, 2, 1, cache_bytes=4096, path="/other/b")]
    r.files_top, r.files_cache, r.traced_devs = 10, True, [LOOP0]
    d = build_dump(r, Clock(), "final")
    assert [f.path for f in d.files.rows] == ["/mnt/a"]
    from tracer.views.files import render_files

    out = io.StringIO()
    render_files(d, out)
    assert "/mnt/a" in out.getvalue() and "/other/b" not in out.getvalue()


# ---- 6. coverage: the traced disks only ----------------------------------------------------------

def _cov_raw(filtered: bool, devs=None):
    start = {"loop0": stats(100), "loop1": stats(0)}
    end = {"loop0": stats(150), "loop1": stats(114033)}
    return types.SimpleNamespace(diskstats_start=start, diskstats_end=end, traced_devs=devs, filtered=filtered)


def test_coverage_under_a_pid_filter_names_the_traced_processes_disks(monkeypatch):
    monkeypatch.setattr(aggregate.devices, "whole_disks", lambda: {"loop0": LOOP0, "loop1": LOOP1})
    series = [types.SimpleNamespace(device="loop0", op="read", count=50)]
    # --pid: loop1 was busy with another process's requests, none of the traced processes'
    assert list(coverage(_cov_raw(True), series).devices) == ["loop0"]
    # no filter: every disk is traced, and a busy one with nothing recorded is what coverage is for
    assert list(coverage(_cov_raw(False), series).devices) == ["loop0", "loop1"]
    assert coverage(_cov_raw(False), series).devices["loop1"].recorded == 0


def test_the_start_line_names_the_cgroup(capsys):
    from tracer.cli.trace import TraceArgs, _announce

    probe = types.SimpleNamespace(attach_note="", attach="raw_tp", start_note="", bio_note="", stamps_note="")
    control = types.SimpleNamespace(path="/run/iotrace/1.sock")
    _announce(TraceArgs(cgroup="/system.slice/job.scope"), None, probe, control, None)
    first = capsys.readouterr().err.splitlines()[0]
    assert first.startswith("iotrace: tracing block I/O of the processes of cgroup /system.slice/job.scope")
    assert "all processes" not in first
    _announce(TraceArgs(cgroup="/job", command=["fio", "x.fio"]), 42, probe, control, None)
    assert "command 'fio x.fio' (pid 42) in cgroup /job" in capsys.readouterr().err


# ---- 1 and 3: rates over the window, said so; one binary unit in every view ------------------------

def _two_mib_dump():
    from unit.test_report_views import dump, series

    # 512 reads of 4 KiB (2 MiB) in a 2 s window
    return dump(None, 0, 2.0, [series(7, "fio", "loop0", "read", [100_000] * 512)])


def _cells(text: str, head: str) -> dict[str, str]:
    lines = text.splitlines()
    i = next(n for n, line in enumerate(lines) if line.split()[:1] == [head])
    return dict(zip(lines[i].split(), lines[i + 1].split(), strict=False))


def test_the_table_gives_rates_over_the_window_in_mib():
    from tracer.views.report import render_table

    out = io.StringIO()
    render_table(_two_mib_dump(), out)
    text = out.getvalue()
    assert "IOPS, MiB/s over the window's 2.0s" in text.splitlines()[1]
    row = _cells(text, "PID")
    assert row["IOPS"] == "256" and row["MiB/s"] == "1.00" and row["AVGSZ"] == "4.0KiB"


def test_by_label_and_diff_count_mib():
    from tracer.views.diff import Side, diff_json
    from tracer.views.report import render_by_label

    out = io.StringIO()
    render_by_label([_two_mib_dump()], out, layout="long")
    text = out.getvalue()
    assert "MiB = 2^20 bytes" in text
    head = next(line for line in text.splitlines() if line.startswith("ROW / LABEL")).split()
    values = [line for line in text.splitlines() if line.strip().startswith("(unlabelled)")][-1].split()
    assert dict(zip(head[3:], values[1:], strict=False))["MiB"] == "2.00"
    d = _two_mib_dump()
    [row] = diff_json(Side("A", "a.jsonl", None, 1, d), Side("B", "b.jsonl", None, 1, d))["rows"]
    assert row["a"]["MiB"] == 2.0


def test_sizes_read_in_binary_units_everywhere():
    from tracer.model.files import FileRow, Files
    from tracer.units import fmt_size
    from tracer.views.files import render_files

    assert [fmt_size(n) for n in (512, 4096, 1 << 20, 142 << 20, 3 << 30)] == [
        "512B", "4.0KiB", "1.0MiB", "142MiB", "3.0GiB"]
    d = _two_mib_dump()
    d.files = Files([FileRow("7:0", 1, "/data/shard0", 7, "fio", cache_read_bytes=0, disk_read_bytes=2 << 20,
                             requests=4)])
    out = io.StringIO()
    render_files(d, out)
    assert _cells(out.getvalue(), "FILE")["DISK"] == "2.0MiB"
