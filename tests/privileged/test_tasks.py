"""test_tasks: the tests that load BPF programs (need root).

The rest, and the helpers both share, are in tests/unit/test_tasks.py.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
from contextlib import contextmanager
from pathlib import Path

import pytest
from conftest import PYTHON, ROOT, evict, mount_ext4, read_dumps, run_traced_group, traced_event

bpf = pytest.mark.bpf


MiB = 1 << 20


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
    mount_ext4(loop.path, mnt, "noatime,no_prefetch_block_bitmaps")
    return data


def _reads_counted(dumps: list[dict]) -> bool:
    """Whether the default mode's rows count reads: the kernel has the page cache's read event (6.12+), or the
    dumps name the one it lacks."""
    reads = {d["tasks_sources"]["reads"] for d in dumps}
    assert reads in ({"filemap:mm_filemap_get_pages"}, {"unavailable: raw tracepoint mm_filemap_get_pages"}), reads
    return reads == {"filemap:mm_filemap_get_pages"}


def _rows(dumps: list[dict], pids: set[int]) -> list[dict]:
    return [r for d in dumps for r in d["tasks"] if r["pid"] in pids]


def _remount(loop, mnt: Path) -> None:
    """Cold again: none of the files left in the page cache."""
    subprocess.run(["umount", str(mnt)], check=True)
    mount_ext4(loop.path, mnt, "noatime,no_prefetch_block_bitmaps")


# the per-process rows' two modes: by default from the page cache's and ext4's events, with --tasks the syscalls'
MODES = {"default": [], "syscalls": ["--tasks"]}


@bpf
@pytest.mark.parametrize("mode", list(MODES))
def test_epochs_cold_then_warm_against_delay_accounting(ext4_mnt, tmp_path, delayacct, mode):
    loop, mnt = ext4_mnt
    data = _cold_files(loop, mnt)
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    # kernel.task_delayacct is machine-wide: another test run may turn it off (or off and on) while ours
    # runs; then run again.  And the reference itself is not always right: now and then the kernel (seen on
    # 6.18) adds the whole time since boot to a fresh worker's block-I/O delay (a wait ended with no start
    # recorded).  Such a worker's delay exceeds the window it lived in; it is left out of the comparison,
    # said so, and a run where every cold worker's reference is broken is run again.  (A CI run on 6.18 saw the
    # figure broken in 3 runs of 3 for both cold workers: after 5 the rest is checked, and the test says it
    # could not compare, as a skip.)
    unusable = ""
    for attempt in range(1, 6):
        results, out = tmp_path / f"workers{attempt}.jsonl", tmp_path / f"run{attempt}.jsonl"
        _sysctl("kernel.task_delayacct", "1")
        code, stdout, stderr = run_traced_group([*MODES[mode], "-o", str(out), "--", PYTHON,
                                                 str(ROOT / "tests" / "tasksload.py"), str(data), str(results)],
                                                env, timeout=300)
        assert code == 0, stderr
        windows = {d["label"]: d["duration_s"] for d in read_dumps(out) if d["kind"] == "marker"}
        broken = {w["pid"] for w in read_dumps(results)
                  if w["blkio_ns"] / 1e9 > windows.get(f"epoch {w['epoch']}", 0.0)}
        cold = {w["pid"] for w in read_dumps(results) if w["epoch"] == 1}
        toggled = _sysctl("kernel.task_delayacct") != "1"
        if not toggled and cold - broken:
            break
        print(f"attempt {attempt}: " + ("kernel.task_delayacct was changed during the run by someone else"
                                        if toggled else "every cold worker's delay-accounting figure is broken")
              + f" (workers' block-I/O delay {[w['blkio_ns'] / 1e9 for w in read_dumps(results)]} s)")
        subprocess.run(["umount", str(mnt)], check=True)     # cold again
        mount_ext4(loop.path, mnt, "noatime,no_prefetch_block_bitmaps")
    else:
        unusable = (f"no usable delay-accounting reference in {attempt} runs (the captured output says why): the "
                    "cold epoch's io_wait_s was compared with nothing")
    assert "no per-process rows" not in stderr, stderr
    dumps = read_dumps(out)
    assert all(isinstance(d.get("tasks"), list) for d in dumps)
    # a kernel without the page cache's read event (before 6.12) counts no reads by default, and says so
    reads_counted = mode == "syscalls" or _reads_counted(dumps)
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
        sane = [w for w in mine if w["pid"] not in broken]
        delay = sum(w["blkio_ns"] for w in sane) / 1e9
        wait_sane = sum(rows[w["pid"]]["io_wait_s"] for w in sane)
        report.append(f"epoch {epoch}: read {read} (workload {counted}), disk {disk}, io_wait {wait:.4f}s; of the "
                      f"{len(sane)} worker(s) with a usable reference {wait_sane:.4f}s (taskstats {delay:.4f}s, "
                      f"stat ticks {sum(w['blkio_ticks'] for w in sane)})"
                      + (f"; left out, delay accounting broken: {len(mine) - len(sane)}" if len(sane) < len(mine)
                         else ""))
        assert counted == FILES * FILE_MB * MiB
        # the page cache's reads are the files' pages; the syscalls' also count the workers' reads of /proc
        if not reads_counted:
            assert read == 0, report
        elif mode == "default":
            assert read == counted, report
        else:
            assert abs(read - counted) <= 0.02 * counted, report
        # io_wait_s against delay accounting's block-I/O delay of the same processes and window
        assert abs(wait_sane - delay) <= max(0.10 * delay, 0.020), report
        for w in mine:
            r = rows[w["pid"]]
            if w in sane:
                assert abs(r["io_wait_s"] - w["blkio_ns"] / 1e9) <= max(0.10 * w["blkio_ns"] / 1e9, 0.020), \
                    report
            # disk_read_bytes is the process's read series, and what /proc/PID/io says it fetched
            series = sum(s["bytes"] for s in window["series"] if s["op"] == "read" and s["tgid"] == w["pid"])
            assert r["disk_read_bytes"] == series
            assert abs(r["disk_read_bytes"] - w["proc_read_bytes"]) <= 0.05 * max(w["proc_read_bytes"], MiB), \
                (r, w)
        totals[epoch] = (read if reads_counted else counted, disk, wait)
    print("\n".join(report))
    (read1, disk1, wait1), (read2, disk2, wait2) = totals[1], totals[2]
    assert abs(read1 - 64 * MiB) <= 0.02 * 64 * MiB and disk1 >= 0.9 * read1 and wait1 > 0, report
    assert disk2 <= 0.05 * read2 and wait2 <= wait1 / 5, report
    if unusable:
        pytest.skip(unusable)


def _run_pcload(mode: str, loop, mnt: Path, data: Path, tmp_path: Path) -> tuple[dict, dict[str, dict], dict]:
    """pcload.py traced cold in `mode`: (what it did, its row per window label, the dumps' tasks_sources)."""
    _remount(loop, mnt)
    results, out = tmp_path / f"{mode}.json", tmp_path / f"{mode}.jsonl"
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    code, _, stderr = run_traced_group([*MODES[mode], "-o", str(out), "--", PYTHON, str(ROOT / "tests" / "pcload.py"),
                                        str(data), str(results)], env, timeout=300)
    assert code == 0, stderr
    did = read_dumps(results)[0]
    dumps = read_dumps(out)
    assert not any(k.startswith("tasks_") and n for d in dumps for k, n in d["dropped"].items())
    assert all("tasks" in d for d in dumps), f"{mode}: dumps without per-process rows; iotrace said:\n{stderr}"
    rows = {d["label"]: r for d in dumps if d["kind"] == "marker" for r in d["tasks"] if r["pid"] == did["pid"]}
    sources = {json.dumps(d["tasks_sources"], sort_keys=True) for d in dumps}
    assert len(sources) == 1, sources
    programs = next(d["bpf_programs"] for d in dumps if d["kind"] == "final")
    return did, rows, {"sources": json.loads(sources.pop()), "programs": programs}


@bpf
def test_page_cache_rows_match_the_syscall_rows_on_the_same_workload(ext4_mnt, tmp_path):
    """Default (page-cache and ext4 events) against --tasks (the syscalls): bytes exact, fsyncs and their time,
    page-cache hits ~0% cold and ~100% warm; and the default mode hooks no syscall."""
    loop, mnt = ext4_mnt
    data = _cold_files(loop, mnt)
    runs = {mode: _run_pcload(mode, loop, mnt, data, tmp_path) for mode in MODES}
    report = {m: {label: {k: r[k] for k in ("read_bytes", "reads", "read_pages", "missed_pages", "disk_read_bytes",
                                            "io_wait_s", "fsync_s", "fsyncs") if k in r} for label, r in rows.items()}
              for m, (_, rows, _) in runs.items()}
    print(json.dumps(report, indent=1))
    whole = FILES * FILE_MB * MiB
    (did, rows, info), (sdid, srows, sinfo) = runs["default"], runs["syscalls"]
    assert did["cold"] == did["warm"] == sdid["cold"] == whole
    # where each counter came from, in every dump
    assert info["sources"]["fsync"].startswith("ext4:ext4_sync_file_enter")
    assert info["sources"]["throttled"] == sinfo["sources"]["throttled"] == "writeback:balance_dirty_pages"
    assert sinfo["sources"]["reads"].startswith("syscalls:read,")
    # the cost promise: no program of the default mode runs for a syscall
    assert not [p for p in info["programs"] if "sys_" in p or "syscalls" in p], info["programs"]
    assert [p for p in sinfo["programs"] if "sys_" in p or "syscalls" in p]
    _compare_with_the_syscall_rows(rows, srows, did, sdid, info["sources"])


def _compare_with_the_syscall_rows(rows: dict, srows: dict, did: dict, sdid: dict, sources: dict) -> None:
    """The default mode's rows (`rows`, by window label) against --tasks' (`srows`) on the same workload."""
    report = {"default": rows, "syscalls": srows}
    whole = FILES * FILE_MB * MiB
    if sources["reads"] != "filemap:mm_filemap_get_pages":
        # Linux before 6.12 (Debian 12's 6.1): no page-cache read event, so no reads and no misses by default,
        # said in the dump; what the kernel has is compared below all the same
        assert sources["reads"] == "unavailable: raw tracepoint mm_filemap_get_pages", sources
        assert sources["cache"].startswith("unavailable: needs filemap:mm_filemap_get_pages"), sources
        assert all(rows[label].get("read_bytes", 0) == 0 for label in ("cold", "warm")), report
        assert srows["cold"]["read_bytes"] == srows["warm"]["read_bytes"] == whole, report
    else:
        _compare_reads(rows, srows, report)
    assert rows["cold"]["disk_read_bytes"] >= 0.95 * whole and rows["warm"]["disk_read_bytes"] <= 0.05 * whole
    # I/O wait: the cold reads waited in both modes, the warm ones hardly
    for r in (rows, srows):
        assert r["cold"]["io_wait_s"] > 0 and r["warm"]["io_wait_s"] <= r["cold"]["io_wait_s"] / 5, report
    # fsync: as many in both modes, each mode's time against what the writer timed around its calls
    n = len(did["fsync_s"])
    assert rows["fsync"]["fsyncs"] == srows["fsync"]["fsyncs"] == n, report
    for r, d in ((rows, did), (srows, sdid)):
        assert abs(r["fsync"]["fsync_s"] - sum(d["fsync_s"])) <= max(0.10 * sum(d["fsync_s"]), 0.005), report
        assert all(r[label].get("fsyncs", 0) == 0 for label in ("cold", "warm")), report


def _compare_reads(rows: dict, srows: dict, report: dict) -> None:
    """Reads from the page cache's event against the syscalls': bytes, pages, reads and misses."""
    whole = FILES * FILE_MB * MiB
    for label in ("cold", "warm"):
        # bytes exact: page-aligned whole-file buffered reads, both modes, against what the reader counted
        assert rows[label]["read_bytes"] == srows[label]["read_bytes"] == whole, report
        assert rows[label]["read_pages"] == whole // os.sysconf("SC_PAGESIZE"), report
    # one read per chunk (the 0-byte read at EOF is none: the syscalls count reads that returned bytes, and it
    # reaches no page-cache batch); a chunk's later batches are the same read
    assert rows["cold"]["reads"] == srows["cold"]["reads"] == FILES * FILE_MB, report
    # page-cache hits: ~0% cold (every page read added by readahead), ~100% warm
    assert rows["cold"]["missed_pages"] >= 0.95 * rows["cold"]["read_pages"], report
    assert rows["warm"].get("missed_pages", 0) <= 0.05 * rows["warm"]["read_pages"], report


@contextmanager
def dirty_limited(loop):
    """The writer to `loop` throttled early by balance_dirty_pages: the loop device's bdi given a strict 2 MiB
    dirty limit of its own (Linux 6.2+: strict_limit, max_bytes), else, as on 6.1, the machine's dirty limit
    lowered to 4 MiB for the block (vm.dirty_bytes); then as it was."""
    devno = os.stat(loop.path).st_rdev
    bdi = Path(f"/sys/class/bdi/{os.major(devno)}:{os.minor(devno)}")
    if (bdi / "strict_limit").exists() and (bdi / "max_bytes").exists():
        # max_bytes is a view of max_ratio_fine (parts per million of the dirty limit): put that back exactly,
        # or the loop device, which outlives the test, keeps a rounded limit for the next user
        saved = {f: (bdi / f).read_text().strip() for f in ("max_ratio_fine", "strict_limit")}
        (bdi / "max_bytes").write_text(f"{2 * MiB}\n")
        (bdi / "strict_limit").write_text("1\n")
        try:
            yield
        finally:
            for f, v in saved.items():
                (bdi / f).write_text(v + "\n")
        return
    # dirty_bytes and dirty_ratio are one setting (writing one zeroes the other): put back the one that was set
    ratio, nbytes = _sysctl("vm.dirty_ratio"), _sysctl("vm.dirty_bytes")
    _sysctl("vm.dirty_bytes", str(4 * MiB))
    try:
        yield
    finally:
        if nbytes != "0":
            _sysctl("vm.dirty_bytes", nbytes)
        else:
            _sysctl("vm.dirty_ratio", ratio)


@bpf
def test_dirty_page_throttling_is_each_pause_the_kernel_traced(ext4_mnt, tmp_path):
    """A copy held back by balance_dirty_pages: its row's throttles are the pauses the kernel's own event announced
    for it, and its throttled time at least their length, while its waits for the cold source's reads are not
    throttling.  On either prototype of the event (6.18: pause is the 7th argument; 6.1: the 11th): an argument
    read in the wrong place (always > 0) would mark every wait that follows a call, the reads' too."""
    loop, mnt = ext4_mnt
    src, out = mnt / "src", tmp_path / "run.jsonl"
    src.write_bytes(os.urandom(64 * MiB))
    evict(src)
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    # the kernel's own list of the pauses it decided to sleep (ms), from its balance_dirty_pages event
    with dirty_limited(loop), traced_event("writeback/balance_dirty_pages", "pause > 0") as lines:
        # the source read O_DIRECT: an I/O wait or more per 4 MiB read, none of them throttling; each read's
        # 4 MiB dirtied at once is past either limit
        code, _, stderr = run_traced_group(["-o", str(out), "--", "dd", f"if={src}", "iflag=direct",
                                            f"of={mnt / 'ckpt'}", "bs=4M", "status=none"], env, timeout=300)
    assert code == 0, stderr
    dumps = read_dumps(out)
    final = next(d for d in dumps if d["kind"] == "final")
    assert final["tasks_sources"]["throttled"] == "writeback:balance_dirty_pages", stderr
    # the final dump's rows are the whole run's
    (row,) = [r for r in final["tasks"] if r["comm"] == "dd"]
    pause = re.compile(r"-(\d+)\s+\[\d+\].*? balance_dirty_pages: .*? pause=(\d+) ")
    mine = [int(m[2]) for m in map(pause.search, lines) if m and int(m[1]) == row["pid"]]
    print(f"kernel: {len(mine)} pauses, {sum(mine)} ms; iotrace: {row['throttles']} throttles, "
          f"{row['throttled_s']:.3f} s, of {row['io_waits']} I/O waits, {row['io_wait_s']:.3f} s")
    assert len(mine) >= 10, "the writer was hardly throttled: the set-up did not hold it back"
    # each pause marks the one wait that follows it, so none extra; a few may be missing (seen once: 88 of 89,
    # nothing skipped: likely a one-tick pause whose timer fired before the thread switched out, never asleep)
    assert len(mine) - max(2, len(mine) // 20) <= row["throttles"] <= len(mine)
    # the waits for the source's reads are not throttling
    assert row["io_waits"] - row["throttles"] >= 10, row
    # each pause sleeps at least its length (a timer: never woken early, at most a tick's rounding) ...
    assert row["throttled_s"] >= 0.9 * sum(mine) / 1000
    # ... and is I/O wait too
    assert row["throttled_s"] <= row["io_wait_s"] + 1e-6
