"""Per-process rows ("tasks") of every dump: I/O wait, file reads, disk reads, fsync, throttling.

The BPF test runs a trainer whose forked workers read 64 MiB of files cold in
epoch 1 and warm in epoch 2, and checks the rows against references: delay
accounting's block-I/O delay (taskstats) for io_wait_s, the bytes the workers
counted for read_bytes, the read series and /proc/PID/io for disk_read_bytes.
The rest needs no root.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
from conftest import PYTHON, ROOT, read_dumps, run_traced_group

from tracer import contract
from tracer.model import dump
from tracer.pipeline import aggregate
from tracer.sources import kernel
from tracer.sources.btf import Member
from tracer.sources.tasks import COUNTERS, TaskRaw, Window, reason_names

bpf = pytest.mark.bpf
MiB = 1 << 20


# ---- pure parts -----------------------------------------------------------

def counts(**kw) -> tuple[int, ...]:
    return tuple(kw.get(c, 0) for c in COUNTERS)


def test_window_takes_differences_and_forgets_exited_processes():
    w = Window()
    rows, gone = w.take([(10, 1, 100, 0, "a", counts(read_bytes=5)), (11, 1, 100, 0, "b", counts())],
                        start_ns=50, keep_idle=False)
    # a process first seen in the window is in it, idle or not
    assert [(r.pid, r.counts["read_bytes"], r.started) for r in rows] == [(10, 5, True), (11, 0, True)]
    assert gone == []
    rows, gone = w.take([(10, 1, 100, 900, "a", counts(read_bytes=12, io_wait_ns=3)),
                         (11, 1, 100, 0, "b", counts())], start_ns=500, keep_idle=True)
    a, b = rows
    assert (a.counts["read_bytes"], a.counts["io_wait_ns"], a.exited, a.started) == (7, 3, True, False)
    assert (b.pid, any(b.counts.values()), b.started) == (11, False, False)    # kept: keep_idle
    assert gone == [10] and 10 not in w.seen
    rows, _ = w.take([(11, 1, 100, 0, "b", counts())], start_ns=900, keep_idle=False)
    assert rows == []       # nothing new, not started here, no pid filter: no row


def test_a_reused_pid_counts_from_zero():
    w = Window()
    w.take([(10, 1, 100, 0, "a", counts(reads=9))], 0, False)
    rows, _ = w.take([(10, 2, 700, 0, "b", counts(reads=2))], 600, False)
    assert rows[0].counts["reads"] == 2 and rows[0].started


def raw(pid, **kw) -> TaskRaw:
    return TaskRaw(pid, 1, f"p{pid}", {c: kw.get(c, 0) for c in COUNTERS}, exited=True)


def series(pid, op, nbytes, tgid=None):
    return dump.Series(pid=pid, comm=f"p{pid}", device="loop0", devno="7:0", op=op, count=1, bytes=nbytes,
                       phases={}, tgid=tgid if tgid is not None else pid)


def test_task_rows_take_disk_reads_from_the_read_series_of_the_process():
    rows = aggregate.task_rows([raw(5, read_bytes=100, io_wait_ns=2_500_000_000), raw(6)],
                               [series(5, "read", 40), series(5, "write", 99), series(7, "read", 8, tgid=5),
                                series(9, "read", 3)])
    by = {r["pid"]: r for r in rows}
    assert by[5]["disk_read_bytes"] == 48 and by[5]["read_bytes"] == 100 and by[5]["io_wait_s"] == 2.5
    assert by[6]["disk_read_bytes"] == 0 and by[6]["exited"]
    assert by[9]["disk_read_bytes"] == 3 and by[9]["read_bytes"] == 0     # disk reads without a row of its own


def test_merged_dumps_add_task_rows_by_pid():
    merged = dump.merge_tasks([[{"pid": 5, "comm": "a", "io_wait_s": 0.1, "read_bytes": 10, "exited": False}],
                               [{"pid": 5, "comm": "b", "io_wait_s": 0.2, "read_bytes": 5, "exited": True},
                                {"pid": 6, "comm": "c", "read_bytes": 1}, "junk"]])
    assert merged[0] == {"pid": 5, "comm": "b", "io_wait_s": 0.3, "read_bytes": 15, "exited": True,
                         "io_waits": 0, "reads": 0, "disk_read_bytes": 0, "fsync_s": 0, "fsyncs": 0,
                         "throttled_s": 0, "throttles": 0, "ppid": 0, "started": False}
    assert [r["pid"] for r in merged] == [5, 6]


def test_the_header_and_the_kernel_table_parse():
    assert reason_names() == ["tasks_full", "threads_full", "pids_full", "kernel_read"]
    con = contract.load()
    reads = con.kernel_tasks
    assert reads.bits == {"TASK_IN_IOWAIT": ("task_struct", "in_iowait")}
    assert {"sched_switch", "sched_wakeup", "balance_dirty_pages"} <= reads.raw_tps.keys()
    assert "TASK_FILES" in reads.members
    # the block-layer programs' table holds none of them: a kernel without one costs them nothing
    assert not (reads.members.keys() | reads.raw_tps.keys() | reads.bits.keys()) & \
        (con.kernel.members.keys() | con.kernel.raw_tps.keys() | con.kernel.bits.keys())


class BitBtf:
    def __init__(self, bit_offset: int, bits: int):
        self.m = Member(bit_offset // 8, 4, bit_offset, bits)

    def member(self, struct, path):
        return self.m


def test_a_one_bit_field_becomes_its_byte_and_mask():
    reads = contract.KernelReads({}, {}, {}, {}, {"X": ("task_struct", "in_iowait")})
    assert kernel.resolve_bits(BitBtf(8 * 1193 + 3, 1), reads) == {"X": 1193, "X_MASK": 8}
    with pytest.raises(kernel.LayoutError, match="one-bit"):
        kernel.resolve_bits(BitBtf(80, 2), reads)


# ---- the trainer, traced --------------------------------------------------

FILES, FILE_MB, WORKERS = 16, 4, 2


def _sysctl(name: str, value: str | None = None) -> str:
    path = Path("/proc/sys") / name.replace(".", "/")
    old = path.read_text().strip()
    if value is not None:
        path.write_text(value + "\n")
    return old


@pytest.fixture
def delayacct():
    """kernel.task_delayacct on for the test, then as it was."""
    old = _sysctl("kernel.task_delayacct", "1")
    try:
        yield
    finally:
        _sysctl("kernel.task_delayacct", old)


def _cold_files(loop, mnt: Path) -> Path:
    data = mnt / "data"
    data.mkdir()
    for i in range(FILES):
        (data / f"f{i:02d}").write_bytes(os.urandom(FILE_MB * MiB))
    subprocess.run(["sync"], check=True)
    # remounting leaves none of the files in the page cache: epoch 1 reads them from the device
    subprocess.run(["umount", str(mnt)], check=True)
    subprocess.run(["mount", "-o", "noatime,no_prefetch_block_bitmaps", loop.path, str(mnt)], check=True)
    return data


def _rows(dumps: list[dict], pids: set[int]) -> list[dict]:
    return [r for d in dumps for r in d["tasks"] if r["pid"] in pids]


@bpf
def test_epochs_cold_then_warm_against_delay_accounting(ext4_mnt, tmp_path, delayacct):
    loop, mnt = ext4_mnt
    data = _cold_files(loop, mnt)
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    # kernel.task_delayacct is machine-wide: another test run may turn it off (or off and on, which
    # makes the kernel count a wait from 0, i.e. from boot) while ours runs; then run again
    for attempt in range(1, 4):
        results, out = tmp_path / f"workers{attempt}.jsonl", tmp_path / f"run{attempt}.jsonl"
        _sysctl("kernel.task_delayacct", "1")
        code, stdout, stderr = run_traced_group(["--tasks", "-o", str(out), "--", PYTHON,
                                                 str(ROOT / "tests" / "tasksload.py"), str(data), str(results)],
                                                env, timeout=300)
        assert code == 0, stderr
        span = sum(d["duration_s"] for d in read_dumps(out))
        if _sysctl("kernel.task_delayacct") == "1" and all(w["blkio_ns"] / 1e9 <= span
                                                           for w in read_dumps(results)):
            break
        print(f"attempt {attempt}: kernel.task_delayacct was changed during the run by someone else (traced "
              f"{span:.2f} s; workers' block-I/O delay {[w['blkio_ns'] / 1e9 for w in read_dumps(results)]} s)")
        subprocess.run(["umount", str(mnt)], check=True)     # cold again
        subprocess.run(["mount", "-o", "noatime,no_prefetch_block_bitmaps", loop.path, str(mnt)], check=True)
    else:
        pytest.fail("kernel.task_delayacct kept being changed by another process during the run")
    assert "no per-process rows" not in stderr, stderr
    dumps = read_dumps(out)
    assert all(isinstance(d.get("tasks"), list) for d in dumps)
    assert not any(k.startswith("tasks_") and n for d in dumps for k, n in d["dropped"].items()), \
        [d["dropped"] for d in dumps]
    workers = read_dumps(results)
    assert sorted(w["epoch"] for w in workers) == [1] * WORKERS + [2] * WORKERS
    by_label = {d["label"]: d for d in dumps if d["kind"] == "marker"}
    assert list(by_label) == ["before epoch 1", "epoch 1", "epoch 2"]
    report = []
    totals = {}
    for epoch in (1, 2):
        mine = [w for w in workers if w["epoch"] == epoch]
        window = by_label[f"epoch {epoch}"]
        rows = {r["pid"]: r for r in _rows([window], {w["pid"] for w in mine})}
        # each worker is in its epoch's window, started and exited there, and in no other window
        assert rows.keys() == {w["pid"] for w in mine}, window["tasks"]
        assert all(r["started"] and r["exited"] for r in rows.values())
        assert not _rows([d for d in dumps if d is not window], set(rows))
        read = sum(r["read_bytes"] for r in rows.values())
        disk = sum(r["disk_read_bytes"] for r in rows.values())
        wait = sum(r["io_wait_s"] for r in rows.values())
        counted = sum(w["read"] for w in mine)
        delay = sum(w["blkio_ns"] for w in mine) / 1e9
        report.append(f"epoch {epoch}: read {read} (workload {counted}), disk {disk}, io_wait {wait:.4f}s "
                      f"(taskstats {delay:.4f}s, stat ticks {sum(w['blkio_ticks'] for w in mine)})")
        assert counted == FILES * FILE_MB * MiB
        assert abs(read - counted) <= 0.02 * counted, report
        # io_wait_s against delay accounting's block-I/O delay of the same processes and window
        assert abs(wait - delay) <= max(0.10 * delay, 0.020), report
        for w in mine:
            r = rows[w["pid"]]
            assert abs(r["io_wait_s"] - w["blkio_ns"] / 1e9) <= max(0.10 * w["blkio_ns"] / 1e9, 0.020), report
            # disk_read_bytes is the process's read series, and what /proc/PID/io says it fetched
            series = sum(s["bytes"] for s in window["series"] if s["op"] == "read" and s["tgid"] == w["pid"])
            assert r["disk_read_bytes"] == series
            assert abs(r["disk_read_bytes"] - w["proc_read_bytes"]) <= 0.05 * max(w["proc_read_bytes"], MiB), \
                (r, w)
        totals[epoch] = (read, disk, wait)
    print("\n".join(report))
    (read1, disk1, wait1), (read2, disk2, wait2) = totals[1], totals[2]
    assert abs(read1 - 64 * MiB) <= 0.02 * 64 * MiB and disk1 >= 0.9 * read1 and wait1 > 0, report
    assert disk2 <= 0.05 * read2 and wait2 <= wait1 / 5, report
