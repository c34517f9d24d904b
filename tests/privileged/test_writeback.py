"""Write-back under its writer: a block write the kernel's flusher issues for a file a traced process
dirtied is that process's, in a row of its own marked write-back ("wb": true; "write-back" in the table's OP column).

Real processes (tests/wbload.py: buffered writes, no fsync, alive until the data is on disk), a real
ext4 on a loop device, real BPF on both attach paths.  The data is handed to the flusher with
`sync -f FILE` (syncfs: sync_inodes_sb queues the file system's inodes to its flusher and waits), not
a global `sync`, which would wait for every device of this shared machine.  How fsync's writes stay
the fsync caller's is test_attribution's test_writeback_shows_who_wrote_to_the_device.
"""

from __future__ import annotations

import os
import signal
import subprocess
import threading
import time
import uuid
from pathlib import Path

import pytest
from conftest import PYTHON, ROOT, read_dumps, reaped, run_iotrace, series_of, skipped_by_kernel
from unit.test_core import start_tracer

from tracer.sources.cgroups import cgroup2_mount
from tracer.sources.probe import USER_DROPS
from tracer.units import fmt_size

WBLOAD = str(Path(__file__).resolve().parent.parent / "wbload.py")
bpf = pytest.mark.bpf
MIB = 1 << 20
COMM = Path(PYTHON).name[:15]


def nothing_lost(dump: dict) -> None:
    """Only requests the kernel did not show iotrace may be missing (exact_bytes allows for them)."""
    lost = {reason: n for reason, n in dump["dropped"].items() if n and reason not in USER_DROPS}
    assert not lost, lost


def exact_bytes(got: int, want: int, dumps: list[dict], device: str) -> None:
    """got == want, less at most one maximal request for each request the kernel skipped."""
    skipped = skipped_by_kernel(dumps)
    largest = int(Path(f"/sys/block/{device}/queue/max_sectors_kb").read_text()) * 1024
    assert want - skipped * largest <= got <= want, (
        f"{got} bytes, expected {want} (kernel skipped {skipped} requests); events {[d['events'] for d in dumps]}, "
        f"series {[(s['pid'], s['comm'], s['op'], s.get('wb'), s['bytes']) for d in dumps for s in d['series']]}")


def wait_file(path: Path, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists():
        assert time.monotonic() < deadline, f"{path} never appeared"
        time.sleep(0.02)


def write_back(*files: Path) -> None:
    """Have the flusher write these files' dirty pages, and wait until it has."""
    for f in files:
        subprocess.run(["sync", "-f", str(f)], check=True, timeout=60)


def release_writers(start: Path, marks: list[Path], files: list[Path], go: Path, procs: list) -> None:
    """wbload writers waiting on `start`: let them write, wait until each has (`marks`), have their files
    written back, then let them exit, each with status 0."""
    start.touch()
    for m in marks:
        wait_file(m)
    write_back(*files)
    go.touch()
    for p in procs:
        assert p.wait(60) == 0


def traced_unsynced_writer(iotrace_args: list[str], target: Path, tmp_path: Path):
    """iotrace ARGS -- wbload: 64 MiB written to `target` without fsync, the writer living on until a
    thread here has had it written back (write_back); (iotrace's result, the writer's pid)."""
    written, go = tmp_path / "written", tmp_path / "go"
    failed: list[BaseException] = []

    def flusher() -> None:
        try:
            wait_file(written)
            write_back(target)
        except BaseException as exc:    # noqa: BLE001 - reported by the test's own thread
            failed.append(exc)
        finally:
            go.touch()

    t = threading.Thread(target=flusher)
    t.start()
    try:
        r = run_iotrace([*iotrace_args, "--", PYTHON, WBLOAD, str(target), "64", str(written), str(go)], timeout=120)
    finally:
        go.touch()
        t.join()
    assert not failed, failed
    assert r.returncode == 0, r.stderr
    return r, int(written.read_text())


def writes(dumps: list[dict], device: str, tgid: int, wb: bool) -> list[dict]:
    return [s for d in dumps for s in series_of(d, device=device, op="write")
            if s["tgid"] == tgid and s.get("wb", False) is wb]


def wb_bytes(dumps: list[dict], device: str, tgid: int, wb: bool = True) -> int:
    return sum(s["bytes"] for s in writes(dumps, device, tgid, wb))


@bpf
@pytest.mark.parametrize("attach", ["raw_tp", "tracepoint"])
def test_command_checkpoint_without_fsync_is_its_write_back(ext4_mnt, tmp_path, attach):
    """`iotrace -- COMMAND` where COMMAND writes 64 MiB without fsync and runs on until it is on disk:
    the 64 MiB are on the command's pid, comm and cgroup, marked write-back, none of it direct."""
    loop, mnt = ext4_mnt
    target, out = mnt / "ckpt", tmp_path / "out.jsonl"
    r, pid = traced_unsynced_writer(["--attach", attach, "--dev", loop.name, "-o", str(out)], target, tmp_path)
    dumps = read_dumps(out)
    for d in dumps:
        nothing_lost(d)
        assert d["attach"] == attach
    rows = writes(dumps, loop.name, pid, wb=True)
    assert rows and all(s["pid"] == pid and s["comm"] == COMM for s in rows), rows
    assert len({s["cgroup_id"] for s in rows}) == 1 and rows[0]["cgroup_id"], rows
    exact_bytes(wb_bytes(dumps, loop.name, pid), 64 * MIB, dumps, loop.name)
    assert wb_bytes(dumps, loop.name, pid, wb=False) < MIB, writes(dumps, loop.name, pid, wb=False)
    table = [line for line in r.stdout.splitlines() if line.split()[:1] == [str(pid)]]
    assert any(f" {COMM} " in line and " write-back " in line for line in table), r.stdout


@bpf
@pytest.mark.parametrize("mode", ["all", "pid"])
def test_two_writers_each_get_their_own_files_write_back(ext4_mnt, tmp_path, mode):
    """Two processes write one file each (24 and 40 MiB, no fsync); the flusher writes both back.
    Each gets exactly its own file's bytes as write-back; the flusher keeps none of them.  With
    --pid the flusher is no target, and its requests for the targets' files are traced all the same."""
    loop, mnt = ext4_mnt
    sizes = (24, 40)
    start, go, out = tmp_path / "start", tmp_path / "go", tmp_path / "out.jsonl"
    files = [mnt / f"w{i}" for i in range(len(sizes))]
    marks = [tmp_path / f"written{i}" for i in range(len(sizes))]
    procs = [subprocess.Popen([PYTHON, WBLOAD, str(f), str(mib), str(m), str(go), str(start)])
             for f, mib, m in zip(files, sizes, marks, strict=True)]
    with reaped(*procs):
        pids = [a for p in procs for a in ("--pid", str(p.pid))] if mode == "pid" else []
        tracer = start_tracer(["--dev", loop.name, "-o", str(out), *pids])
        with reaped(tracer):
            release_writers(start, marks, files, go, procs)
            if mode == "all":
                tracer.send_signal(signal.SIGINT)
            # with --pid the trace ends as its targets do
            _, err = tracer.communicate(timeout=60)
            assert tracer.returncode == 0, err
    dumps = read_dumps(out)
    for d in dumps:
        nothing_lost(d)
    for p, mib in zip(procs, sizes, strict=True):
        rows = writes(dumps, loop.name, p.pid, wb=True)
        assert rows and all(s["comm"] == COMM for s in rows), rows
        exact_bytes(wb_bytes(dumps, loop.name, p.pid), mib * MIB, dumps, loop.name)
        assert wb_bytes(dumps, loop.name, p.pid, wb=False) == 0
    flushers = [s for d in dumps for s in series_of(d, device=loop.name, op="write")
                if s["comm"].startswith("kworker/")]
    assert sum(s["bytes"] for s in flushers) < MIB, flushers


@pytest.fixture
def cgroup_dir():
    """A cgroup v2 X with a child X/inner, removed at teardown (after their processes exit)."""
    found = cgroup2_mount()
    if found is None:
        pytest.skip("no cgroup v2 hierarchy mounted")
    root = Path(found[0])
    top = root / f"iotrace-wb-{uuid.uuid4().hex[:8]}"
    inner = top / "inner"
    inner.mkdir(parents=True)
    yield root, top, inner
    for d in (inner, top):
        for pid in (d / "cgroup.procs").read_text().split():    # strays: back to the root
            try:
                (root / "cgroup.procs").write_text(pid)
            except OSError:
                pass
        d.rmdir()


@bpf
def test_cgroup_filter_charges_write_back_to_the_container(ext4_mnt, tmp_path, cgroup_dir):
    """--cgroup: the file a process inside the cgroup wrote is its write-back, with its cgroup; the one a
    process outside wrote is nobody's here (the flusher is outside the cgroup too)."""
    loop, mnt = ext4_mnt
    root, top, inner = cgroup_dir
    start, go, out = tmp_path / "start", tmp_path / "go", tmp_path / "out.jsonl"
    files, marks = [mnt / "inside", mnt / "outside"], [tmp_path / "written0", tmp_path / "written1"]
    procs = [subprocess.Popen([PYTHON, WBLOAD, str(f), str(mib), str(m), str(go), str(start)])
             for f, mib, m in zip(files, (16, 8), marks, strict=True)]
    with reaped(*procs):
        (inner / "cgroup.procs").write_text(str(procs[0].pid))
        tracer = start_tracer(["--cgroup", "/" + os.path.relpath(top, root), "--dev", loop.name, "-o", str(out)])
        with reaped(tracer):
            release_writers(start, marks, files, go, procs)
            tracer.send_signal(signal.SIGINT)
            _, err = tracer.communicate(timeout=60)
            assert tracer.returncode == 0, err
    dumps = read_dumps(out)
    for d in dumps:
        nothing_lost(d)
    inside, outside = procs
    rows = writes(dumps, loop.name, inside.pid, wb=True)
    assert rows and all(s["cgroup_id"] == os.stat(inner).st_ino for s in rows), rows
    exact_bytes(wb_bytes(dumps, loop.name, inside.pid), 16 * MIB, dumps, loop.name)
    others = [s for d in dumps for s in series_of(d, device=loop.name) if s["tgid"] != inside.pid]
    assert sum(s["bytes"] for s in others) < MIB, others


WBEPOCHS = str(Path(__file__).resolve().parent.parent / "wbepochs.py")


@bpf
@pytest.mark.parametrize("attach", ["raw_tp", "tracepoint"])
def test_a_checkpoint_written_back_an_epoch_later_is_credited_to_the_epoch_that_wrote_it(ext4_mnt, tmp_path,
                                                                                           attach):
    """tests/wbepochs.py: "epoch 1" writes 32 MiB without fsync, "epoch 2" has the flusher write them back.
    Epoch 2's dump holds the write-back row (its requests ran there) and says all of its bytes were dirtied
    in epoch 1 (its window_seq and label); `report --by label` credits them to epoch 1, "written back during
    epoch 2".  Tolerance: what the flusher wrote of the file before epoch 2 (none is expected: the dirty
    expiry is 30 s) and the requests the kernel skipped showing (exact_bytes)."""
    loop, mnt = ext4_mnt
    target, out, pidfile = mnt / "ckpt", tmp_path / "out.jsonl", tmp_path / "pid"
    # PYTHONPATH: the writer imports this checkout's tracer.marker (a guest's venv has no iotrace installed)
    r = run_iotrace(["--attach", attach, "--dev", loop.name, "-o", str(out), "--",
                     PYTHON, WBEPOCHS, str(target), "32", str(pidfile)], timeout=120,
                    env=dict(os.environ, PYTHONPATH=str(ROOT)))
    assert r.returncode == 0, r.stderr
    pid = int(pidfile.read_text())
    dumps = read_dumps(out)
    by_label = {d["label"]: d for d in dumps if d["kind"] == "marker"}
    assert {"epoch 1", "epoch 2"} <= set(by_label), [d["label"] for d in dumps]
    seqs = [d["window_seq"] for d in dumps]
    assert seqs == list(range(1, len(dumps) + 1)), seqs
    for d in dumps:
        nothing_lost(d)
    epoch1, epoch2 = by_label["epoch 1"], by_label["epoch 2"]
    rows = [s for s in series_of(epoch2, device=loop.name, op="write") if s.get("wb")]
    assert len(rows) == 1 and rows[0]["comm"] == COMM and rows[0]["tgid"] == pid, rows
    row = rows[0]
    credited = [e for e in row["dirtied"] if e["window_seq"] == epoch1["window_seq"]]
    assert len(credited) == 1 and credited[0]["label"] == "epoch 1", row["dirtied"]
    assert credited[0]["start"] == epoch1["start"], (credited, epoch1["start"])
    # the dirtied entries add up to the row, and epoch 1's are the file's 32 MiB
    assert sum(e["bytes"] for e in row["dirtied"]) == row["bytes"]
    assert sum(e["count"] for e in row["dirtied"]) == row["count"]
    early = sum(s["bytes"] for d in dumps if d is not epoch2 for s in series_of(d, device=loop.name, op="write")
                if s.get("wb"))
    assert early == 0, early
    exact_bytes(credited[0]["bytes"], 32 * MIB, dumps, loop.name)
    # the table of epoch 2 says whose window the bytes were
    assert "of 'epoch 1'" in r.stdout, r.stdout
    rep = run_iotrace(["report", str(out), "--by", "label"], timeout=60)
    assert rep.returncode == 0, rep.stderr
    line = [ln for ln in rep.stdout.splitlines() if ln.strip().startswith(f"epoch 1 / {COMM}:")]
    assert len(line) == 1 and "written back during epoch 2" in line[0], rep.stdout
    # a process's line adds up its write-back of every op (ext4 may read a bitmap block as it allocates)
    of_epoch1 = [e for s in epoch2["series"] if s.get("wb") for e in s["dirtied"] if e["label"] == "epoch 1"]
    want = f": {fmt_size(sum(e['bytes'] for e in of_epoch1))} ({sum(e['count'] for e in of_epoch1)} requests),"
    assert want in line[0], (line, want)
