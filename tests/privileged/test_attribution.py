"""Attribution: whose row a request lands in, through loop devices, threads,
multiprocessing workers, writeback and pre-existing children.

The rule iotrace implements (docs/design.md, 'Attribution'): a request belongs to the
task in whose context it was *made* (block_io_start), folded to its process
unless --threads.  These tests pin down what that rule means on a real kernel,
with exact counts (conftest.assert_count) and real BPF.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from conftest import (
    PYTHON,
    LoopDevice,
    assert_count,
    fio_cmd,
    make_ext4,
    read_dumps,
    run_iotrace,
    series_of,
    skipped_by_kernel,
    umount,
)
from unit.test_core import start_tracer

from tracer.model.diskstats import DiskCounters
from tracer.sources.devices import read_diskstats
from tracer.sources.probe import USER_DROPS

ATTRLOAD = str(Path(__file__).resolve().parent.parent / "attrload.py")
bpf = pytest.mark.bpf
MIB = 1 << 20
# Kernel threads that submit I/O for others: workqueue workers (the loop driver, writeback).
WORKER_PREFIXES = ("kworker/", "loop")


# ---- helpers -----------------------------------------------------------------

def stop_tracer(proc: subprocess.Popen) -> str:
    proc.send_signal(signal.SIGINT)
    return wait_tracer(proc)


def wait_tracer(proc: subprocess.Popen, timeout: float = 60) -> str:
    out, err = proc.communicate(timeout=timeout)
    assert proc.returncode == 0, err
    return out


def trace_held(tmp_path: Path, load: list[str], tracer_args) -> tuple[dict, dict, subprocess.Popen, Path]:
    """Run `attrload.py LOAD --go FILE`, which prints its first line and waits for FILE; start
    the tracer with tracer_args(that line), release the load and wait for it to end.

    Returns the load's first and last lines, the tracer (still running) and its output file.
    """
    go, out = tmp_path / "go", tmp_path / "out.jsonl"
    target = subprocess.Popen([PYTHON, ATTRLOAD, *load, "--go", str(go)], stdout=subprocess.PIPE, text=True)
    try:
        started = json.loads(target.stdout.readline())
        tracer = start_tracer([*tracer_args(started), "-o", str(out)])
        go.touch()
        done = json.loads(target.stdout.readline())
        assert target.wait(30) == 0
    finally:
        target.kill()
        target.wait()
    return started, done, tracer, out


def final_dump(path: Path) -> tuple[dict, list[dict]]:
    dumps = read_dumps(path)
    assert [d["kind"] for d in dumps] == ["final"], [d["kind"] for d in dumps]
    nothing_lost(dumps[0])
    return dumps[0], dumps


def nothing_lost(dump: dict) -> None:
    """Only requests the kernel did not show iotrace may be missing (assert_count allows for them)."""
    lost = {reason: n for reason, n in dump["dropped"].items() if n and reason not in USER_DROPS}
    assert not lost, lost


def exact(got: int, want: int, dumps: list[dict], device: str | None = None) -> None:
    """conftest.assert_count, and on failure the dumps' drop and event counters, to tell why.

    `device`: one only this workload uses, so the coverage deficit there counts as seen missing.
    """
    try:
        assert_count(got, want, dumps, device)
    except AssertionError as exc:
        raise AssertionError(f"{exc}; dropped {[d['dropped'] for d in dumps]}, "
                             f"events {[d['events'] for d in dumps]}") from None


def exact_bytes(got: int, want: int, dumps: list[dict], device: str) -> None:
    """Like exact(), for bytes: each request the kernel skipped may take up to one maximal request."""
    skipped = skipped_by_kernel(dumps)
    largest = int(Path(f"/sys/block/{device}/queue/max_sectors_kb").read_text()) * 1024
    assert want - skipped * largest <= got <= want, (
        f"{got} bytes, expected {want} (kernel skipped {skipped} requests of at most {largest} bytes); "
        f"dropped {[d['dropped'] for d in dumps]}, events {[d['events'] for d in dumps]}, "
        f"series {[(s['pid'], s['comm'], s['op'], s['count'], s['bytes']) for d in dumps for s in d['series']]}")


def json_lines(text: str) -> list[dict]:
    """The JSON objects a workload printed (its stdout may be shared with iotrace's table)."""
    return [json.loads(line) for line in text.splitlines() if line.startswith("{")]


def by_pid(rows: list[dict]) -> dict[int, dict]:
    out: dict[int, dict] = {}
    for s in rows:
        assert s["pid"] not in out, f"two rows for pid {s['pid']}: {rows}"
        out[s["pid"]] = s
    return out


def is_worker(comm: str) -> bool:
    return comm.startswith(WORKER_PREFIXES)


def write_cold(path: Path, mib: int) -> None:
    """A file of `mib` MiB on disk and not in the page cache, so reading it reaches the device."""
    chunk = os.urandom(MIB)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        for _ in range(mib):
            os.write(fd, chunk)
        os.fsync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def settled(name: str, timeout: float = 5) -> DiskCounters:
    """The device's counters once nothing is in flight (readahead may outlive its reader)."""
    end = time.monotonic() + timeout
    while True:
        stats = read_diskstats()[name]
        if not stats.in_flight or time.monotonic() > end:
            return stats
        time.sleep(0.01)


# ---- fixtures ----------------------------------------------------------------

@dataclass
class Ext4:
    """A fresh ext4 on a loop device, mounted; loop devices over files in it are detached first."""

    dev: LoopDevice
    mnt: Path
    inner: list[LoopDevice] = field(default_factory=list)

    def loop_file(self, name: str, size_mib: int, direct_io: str) -> LoopDevice:
        backing = self.mnt / name
        write_cold(backing, size_mib)
        path = subprocess.run(["losetup", "--find", "--show", f"--direct-io={direct_io}", str(backing)],
                              check=True, capture_output=True, text=True).stdout.strip()
        dev = LoopDevice(path, backing)
        self.inner.append(dev)
        if direct_io == "off":
            # losetup read the file's head to probe it: make it cold again
            fd = os.open(backing, os.O_RDONLY)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            os.close(fd)
        return dev


@pytest.fixture
def ext4(make_loop, tmp_path):
    """Factory: ext4(size_mb=128) -> Ext4; unmounted at teardown (before make_loop detaches)."""
    made: list[Ext4] = []

    def make(size_mb: int = 128) -> Ext4:
        dev = make_loop(size_mb)
        mnt = tmp_path / f"mnt{len(made)}"
        make_ext4(dev.path, mnt)
        fs = Ext4(dev, mnt)
        made.append(fs)
        return fs

    yield make
    for fs in reversed(made):
        for inner in reversed(fs.inner):
            subprocess.run(["losetup", "-d", inner.path], check=False, capture_output=True)
        umount(fs.mnt)


# ---- 1. a loop device over a file on another device -------------------------

FIO_JOB_PID = "echo $PPID"     # fio runs exec_prerun in the job process; $PPID is the job's pid


def fio_job_pid(cwd: Path) -> int:
    return int((cwd / "job.prerun.txt").read_text().split()[0])


@bpf
@pytest.mark.parametrize("direct_io", ["on", "off"], ids=["backing-dio", "backing-buffered"])
def test_loop_over_file_on_loop_all_processes(ext4, tmp_path, direct_io):
    """Tracing everything on both devices: B's reads are fio's, A's (the backing file's) the loop worker's.

    B is a loop device over a file in an ext4 on loop device A.  fio reads B;
    the loop driver's worker (a workqueue kworker) reads the file, so A's
    requests are made in the worker's context: they must never be fio's.
    """
    fs = ext4()
    a = fs.dev
    b = fs.loop_file("backing.img", 32, direct_io)
    out = tmp_path / "out.jsonl"
    tracer = start_tracer(["--dev", a.name, "--dev", b.name, "-o", str(out)])
    before = read_diskstats()[a.name]
    fio = subprocess.Popen(fio_cmd(b.path, exec_prerun=FIO_JOB_PID), cwd=tmp_path, stdout=subprocess.PIPE, text=True)
    fio_out, _ = fio.communicate(timeout=120)
    after = settled(a.name)
    table = stop_tracer(tracer)
    assert fio.returncode == 0
    assert json.loads(fio_out[fio_out.index("{"):])["jobs"][0]["read"]["total_ios"] == 4096
    job = fio_job_pid(tmp_path)
    final, dumps = final_dump(out)

    rows_b = series_of(final, device=b.name)
    assert len(rows_b) == 1, rows_b
    row = rows_b[0]
    assert (row["pid"], row["tgid"], row["comm"], row["op"]) == (job, job, "fio", "read"), row
    exact(row["count"], 4096, dumps, b.name)
    assert row["bytes"] == row["count"] * 4096

    rows_a = series_of(final, device=a.name)
    reads_a = [s for s in rows_a if s["op"] == "read"]
    assert reads_a, f"no reads on the backing device {a.name}: {final['series']}"
    for s in rows_a:
        assert s["pid"] not in (job, fio.pid) and s["comm"] != "fio", s
        assert is_worker(s["comm"]) or s["comm"].startswith("jbd2/"), s
        assert s["tgid"] == s["pid"], s        # kernel threads are their own process
    for s in reads_a:
        assert is_worker(s["comm"]), s
    # every read A completed in the window is in a worker's row: none went to someone else
    exact(sum(s["count"] for s in reads_a), after.reads - before.reads, dumps)
    if direct_io == "on":
        # direct I/O on the backing file: one 4 KiB read of A per 4 KiB read of B
        exact(sum(s["count"] for s in reads_a), 4096, dumps, a.name)
        assert sum(s["bytes"] for s in reads_a) == 4096 * sum(s["count"] for s in reads_a)
    assert a.name in table and b.name in table


@bpf
@pytest.mark.parametrize("direct_io", ["on", "off"], ids=["backing-dio", "backing-buffered"])
def test_loop_over_file_on_loop_command_mode(ext4, tmp_path, direct_io):
    """Command mode traces fio's process tree only: the loop worker's reads of A are not in it.

    /proc/diskstats shows that A *was* read meanwhile, so an empty A is the
    filter at work, not an idle device.
    """
    fs = ext4()
    a = fs.dev
    b = fs.loop_file("backing.img", 32, direct_io)
    out = tmp_path / "out.jsonl"
    before = read_diskstats()[a.name]
    # env -C: fio writes job.prerun.txt into its working directory
    r = run_iotrace(["-o", str(out), "--dev", a.name, "--dev", b.name, "--", "env", "-C", str(tmp_path),
                     *fio_cmd(b.path, exec_prerun=FIO_JOB_PID)])
    after = read_diskstats()[a.name]
    assert r.returncode == 0, r.stderr
    assert after.reads > before.reads, "the loop worker never read the backing device"
    job = fio_job_pid(tmp_path)
    command = int(r.stderr.split("(pid ")[1].split(")")[0])
    assert job != command          # fio forks its job: followed as a child of the command
    final, dumps = final_dump(out)
    assert {s["device"] for s in final["series"]} == {b.name}, final["series"]
    (row,) = final["series"]
    assert (row["pid"], row["tgid"], row["comm"], row["op"]) == (job, job, "fio", "read"), row
    exact(row["count"], 4096, dumps, b.name)


# ---- 2. threads --------------------------------------------------------------

@bpf
@pytest.mark.parametrize("per_thread", [False, True], ids=["folded", "threads"])
def test_threads_fold_into_their_process(loop, tmp_path, per_thread):
    """Three named threads read 100, 200 and 300 blocks: one row of 600, or (--threads) one row each.

    A thread's row carries the thread's id as pid, its process as tgid, and
    the thread's own name (prctl PR_SET_NAME) as comm.
    """
    counts = [100, 200, 300]
    out = tmp_path / "out.jsonl"
    r = run_iotrace(["-o", str(out), "--dev", loop.name, *(["--threads"] if per_thread else []),
                     "--", PYTHON, ATTRLOAD, "threads", loop.path, *map(str, counts)])
    assert r.returncode == 0, r.stderr
    (info,) = json_lines(r.stdout)
    pid = info["pid"]
    threads = {t["tid"]: t for t in info["threads"]}
    assert len(threads) == len(counts) and pid not in threads
    final, dumps = final_dump(out)
    rows = by_pid(series_of(final, device=loop.name))
    assert all(s["op"] == "read" and s["tgid"] == pid for s in rows.values()), rows
    if per_thread:
        assert set(rows) == set(threads), rows
        for tid, t in threads.items():
            exact(rows[tid]["count"], t["count"], dumps, loop.name)
            assert rows[tid]["comm"] == t["name"], rows[tid]
    else:
        assert set(rows) == {pid}, rows
        exact(rows[pid]["count"], sum(counts), dumps, loop.name)
        # The folded row is named by whichever thread's request was recorded last on some CPU
        # (series values keep the latest comm), not by the process: here one of the threads.
        assert rows[pid]["comm"] in {t["name"] for t in threads.values()} | {info["comm"]}, rows[pid]


# ---- 3. multiprocessing workers ----------------------------------------------

@bpf
@pytest.mark.parametrize("method", ["fork", "spawn", "forkserver"])
def test_multiprocessing_workers_are_followed(make_loop, tmp_path, method):
    """Workers started by fork, spawn (fork + exec of a fresh interpreter) and forkserver (forked by
    a server process the parent started) all have exact rows; a process reading another device
    meanwhile, outside the command, has none (the pid filter, not a device filter, keeps it out).
    """
    loop, other = make_loop(), make_loop()
    counts = [100, 200, 300]
    parent_blocks = 50
    # Unrelated I/O from before the trace to after it.  On a device of its own, so that the
    # workers' device is theirs alone and its coverage can show any request the kernel lost.
    noise = subprocess.Popen(["sh", "-c", f"while :; do dd if={other.path} of=/dev/null bs=4k count=64 "
                              "skip=8192 iflag=direct 2>/dev/null; done"], start_new_session=True)
    try:
        out = tmp_path / "out.jsonl"
        r = run_iotrace(["-o", str(out), "--", PYTHON, ATTRLOAD, "mp", method, loop.path,
                         *map(str, counts), "--parent", str(parent_blocks)])
    finally:
        os.killpg(noise.pid, signal.SIGKILL)
        noise.wait()
    assert r.returncode == 0, r.stderr
    (info,) = json_lines(r.stdout)
    workers = {w["pid"]: w["count"] for w in info["workers"]}
    assert len(workers) == len(counts)
    final, dumps = final_dump(out)
    rows = by_pid(series_of(final, device=loop.name))
    assert set(rows) == {info["pid"], *workers}, (rows.keys(), info)
    exact(rows[info["pid"]]["count"], parent_blocks, dumps, loop.name)
    for pid, count in workers.items():
        exact(rows[pid]["count"], count, dumps, loop.name)
        assert rows[pid]["tgid"] == pid and rows[pid]["op"] == "read"
        assert rows[pid]["comm"] == rows[info["pid"]]["comm"], rows[pid]   # the same interpreter
    # nothing of the noise anywhere, on any device
    assert not [s for s in final["series"] if s["comm"] in ("dd", "sh")], final["series"]


# ---- 4. writeback ------------------------------------------------------------

@bpf
@pytest.mark.parametrize("who", ["writer-fsync", "other-fsync", "syncfs"])
def test_writeback_shows_who_wrote_to_the_device(ext4, tmp_path, who):
    """16 MiB of buffered writes to a fresh ext4; the data reaches the disk in one of three ways.

    What the kernel allows: block_io_start runs in the context of whoever turns
    dirty pages into requests, and that is what iotrace records.
    - writer-fsync: the writer's fsync writes its pages itself (ext4_sync_file ->
      filemap_write_and_wait_range): the data is the writer's.
    - other-fsync: the writer exits; `sync FILE` (an fsync from another process)
      writes them in *its* context: the data is sync's, none of it the writer's.
    - syncfs: the writer exits; `sync -f FILE` (syncfs) hands the inodes to the
      bdi flusher (sync_inodes_sb queues writeback work and waits): the flusher
      kworker makes the requests, between writeback_single_inode_start and its
      end for the writer's inode, which the writer dirtied: the data is the
      writer's, in rows marked write-back ("wb"); sync itself writes only
      block-device metadata.
    An fsync's writes are never write-back: in the first two cases no row is.
    The journal (jbd2) and metadata writes are allowed beside the data.
    A global `sync` is not used: it waits for every device of this shared machine.
    (Another process's global sync between the write and our sync would hand the
    data to the flusher, and fail other-fsync: the machine must not be syncing.)
    """
    fs = ext4(256)
    target = fs.mnt / "data"
    out = tmp_path / "out.jsonl"
    tracer = start_tracer(["--dev", fs.dev.name, "-o", str(out)])
    try:
        before = read_diskstats()[fs.dev.name]
        fsync = ["--fsync"] if who == "writer-fsync" else []
        w = subprocess.run([PYTHON, ATTRLOAD, "write", str(target), "16", *fsync],
                           capture_output=True, text=True, timeout=60, check=True)
        writer = json.loads(w.stdout)
        syncer = None
        if who != "writer-fsync":
            sync = subprocess.Popen(["sync", *(["-f"] if who == "syncfs" else []), str(target)])
            assert sync.wait(60) == 0
            syncer = sync.pid
        after = read_diskstats()[fs.dev.name]
    finally:
        stop_tracer(tracer)
    final, dumps = final_dump(out)
    writes = [s for s in series_of(final, device=fs.dev.name) if s["op"] == "write"]
    wbytes = {s["pid"]: s["bytes"] for s in writes}
    by_kind = {"writer": 0, "sync": 0, "flusher": 0, "journal": 0, "other": 0}
    for s in writes:
        kind = ("writer" if s["pid"] == writer["pid"] and s.get("wb", False) == (who == "syncfs") else
                "sync" if s["pid"] == syncer else
                "flusher" if s["comm"].startswith("kworker/") else
                "journal" if s["comm"].startswith("jbd2/") else "other")
        by_kind[kind] += s["bytes"]
    # a global `sync` run meanwhile by anyone on this machine writes every file system's metadata
    # in its own context; that is right, and small
    assert by_kind["other"] < MIB, writes
    data = 16 * MIB
    dev = fs.dev.name
    # every byte the device wrote while we watched is in some row (the rows cover a longer window)
    written = (after.write_sectors - before.write_sectors) * 512
    assert written >= data
    exact_bytes(min(sum(wbytes.values()), written), written, dumps, dev)
    if who == "writer-fsync":
        row = next(s for s in writes if s["pid"] == writer["pid"])
        assert row["comm"] == writer["comm"] and row["tgid"] == writer["pid"], row
        exact_bytes(by_kind["writer"], data, dumps, dev)
        assert by_kind["flusher"] == 0 and by_kind["sync"] == 0, wbytes
        assert not any(s.get("wb") for s in writes), writes
    elif who == "other-fsync":
        assert writer["pid"] not in wbytes, wbytes
        row = next(s for s in writes if s["pid"] == syncer)
        assert row["comm"] == "sync", row
        exact_bytes(by_kind["sync"], data, dumps, dev)
        assert by_kind["flusher"] == 0, wbytes
        assert not any(s.get("wb") for s in writes), writes
    else:
        rows = [s for s in writes if s["pid"] == writer["pid"]]
        assert rows and all(s.get("wb") and s["comm"] == writer["comm"] for s in rows), rows
        exact_bytes(by_kind["writer"], data, dumps, dev)
        assert by_kind["flusher"] < MIB, wbytes
        assert by_kind["sync"] < MIB, wbytes          # its own metadata, not the data


# ---- 5. --pid and what existed before tracing started -------------------------

@bpf
@pytest.mark.parametrize("name_early", [False, True], ids=["parent-only", "early-child-named"])
def test_pid_follows_the_children_it_had_and_the_ones_it_forks(loop, tmp_path, name_early):
    """`--pid P` traces P's threads (all of them: the filter is P's tgid, old threads included),
    the children P forked *before* the tracer started (the tree walk at attach adds them) and
    those it forks from then on (sched_process_fork adds them).  Naming the early child with a
    second --pid as well changes nothing.
    """
    counts = {"early": 100, "late": 200, "parent": 300, "thread": 50}
    _, done, tracer, out = trace_held(
        tmp_path, ["prefork", loop.path, *(f"--{k}={v}" for k, v in counts.items())],
        lambda started: ["--pid", str(started["pid"])] + (["--pid", str(started["early"])] if name_early else []))
    wait_tracer(tracer)        # ends by itself: every target exited
    final, dumps = final_dump(out)
    rows = by_pid(series_of(final, device=loop.name))
    want = {done["pid"]: counts["parent"] + counts["thread"], done["late"]: counts["late"],
            done["early"]: counts["early"]}
    assert set(rows) == set(want), (rows.keys(), done)
    for pid, count in want.items():
        exact(rows[pid]["count"], count, dumps)
        assert rows[pid]["tgid"] == pid


@bpf
@pytest.mark.parametrize("follow", [True, False], ids=["children", "no-children"])
@pytest.mark.parametrize("how", ["leader-exit", "thread-exec"])
def test_pid_survives_its_main_thread_exiting(loop, tmp_path, follow, how):
    """A process whose main thread ends while the process lives on is still the traced process.

    leader-exit: the main thread calls pthread_exit and another thread goes on
    reading (the leader stays a zombie until the group ends).  thread-exec: a
    second thread execs a reader; the kernel ends the other threads, leader
    included, and the process continues under the same pid.  Either way the
    reads are the traced process's and belong in its row.
    """
    started, done, tracer, out = trace_held(
        tmp_path, [how, loop.path, "100"],
        lambda started: ["--pid", str(started["pid"]), *([] if follow else ["--no-children"])])
    pid = started["pid"]
    assert done["pid"] == pid
    wait_tracer(tracer)
    final, dumps = final_dump(out)
    rows = by_pid(series_of(final, device=loop.name))
    assert set(rows) == {pid}, f"rows {rows}; the reader was thread {done['tid']} of {pid}"
    exact(rows[pid]["count"], 100, dumps, loop.name)
