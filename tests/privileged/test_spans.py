"""Every figure on the span it names, on real runs (need root, load BPF): --cgroup's start line and
per-process rows, coverage of the traced disks only, and --dev's file table (issue 30, item 2).
The pure logic is tested on fake drains in tests/unit/test_spans.py."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
from conftest import PYTHON, ROOT, make_ext4, read_dumps, umount

from privileged.test_cgroup import cgroup_tree  # noqa: F401  (a fixture)
from tracer.sources.cgroups import cgroup2_mount

bpf = pytest.mark.bpf

# Reads BLOCKS 4 KiB blocks O_DIRECT from DEVICE once GO exists, then waits (alive) until STOP exists
HOLDING_READER = """
import mmap, os, sys, time
device, blocks, go, stop = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4]
while not os.path.exists(go):
    time.sleep(0.01)
fd = os.open(device, os.O_RDONLY | os.O_DIRECT)
buf = mmap.mmap(-1, 4096)
for i in range(blocks):
    os.preadv(fd, [buf], i * 4096)
os.close(fd)
print("read", flush=True)
while not os.path.exists(stop):
    time.sleep(0.01)
"""


def _tracer(args: list[str]) -> tuple[subprocess.Popen, str]:
    """iotrace in the background, once attached, and its start line."""
    proc = subprocess.Popen([PYTHON, "-m", "tracer.cli", *args], cwd=ROOT, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    line = proc.stderr.readline()
    if "tracing block I/O" not in line:
        proc.kill()
        pytest.fail(f"iotrace did not start: {line}{proc.communicate()[1]}")
    return proc, line


@bpf
def test_cgroup_run_names_it_keeps_its_rows_and_covers_its_disks(make_loop, tmp_path, cgroup_tree):  # noqa: F811
    top, inner = cgroup_tree
    loop, elsewhere = make_loop(), make_loop()
    go, stop = tmp_path / "go", tmp_path / "stop"
    readers = [subprocess.Popen([PYTHON, "-c", HOLDING_READER, dev.path, str(n), str(go), str(stop)],
                                stdout=subprocess.PIPE, text=True) for dev, n in ((loop, 120), (elsewhere, 2000))]
    inside, outside = readers
    (inner / "cgroup.procs").write_text(str(inside.pid))
    rel = "/" + os.path.relpath(top, cgroup2_mount()[0])
    out = tmp_path / "out.jsonl"
    try:
        tracer, start = _tracer(["--cgroup", rel, "-o", str(out)])
        go.touch()
        assert [r.stdout.readline().strip() for r in readers] == ["read", "read"]
        tracer.send_signal(2)           # both readers alive at the final cut: placed by /proc/PID/cgroup
        _, err = tracer.communicate(timeout=60)
        assert tracer.returncode == 0, err
    finally:
        stop.touch()
        for r in readers:
            r.wait(30)
    assert f"of the processes of cgroup {rel}" in start and "all processes" not in start, start
    [final] = [d for d in read_dumps(out) if d["kind"] == "final"]
    pids = {r["pid"] for r in final["tasks"]}
    assert inside.pid in pids and outside.pid not in pids, final["tasks"]
    # the outsider kept `elsewhere` busy: no disk of the cgroup's, so no coverage of it
    assert loop.name in final["coverage"]["devices"], final["coverage"]
    assert elsewhere.name not in final["coverage"]["devices"], final["coverage"]


@bpf
def test_dev_file_table_shows_the_traced_disks_files_only(make_loop, tmp_path):
    mounts = []
    try:
        for name in ("traced", "other"):
            dev = make_loop(64)
            mnt = tmp_path / name
            make_ext4(dev.path, mnt, "noatime")
            mounts.append((dev, mnt))
            (mnt / f"{name}.dat").write_bytes(os.urandom(1 << 20))
        subprocess.run(["sync"], check=True)
        for _, mnt in mounts:        # every page out of the cache: reading them must go to the disks
            fd = os.open(mnt / f"{mnt.name}.dat", os.O_RDONLY)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            os.close(fd)
        (traced, tmnt), (_, omnt) = mounts
        out = tmp_path / "run.jsonl"
        script = f"open({str(tmnt / 'traced.dat')!r}, 'rb').read(); open({str(omnt / 'other.dat')!r}, 'rb').read()"
        r = subprocess.run([PYTHON, "-m", "tracer.cli", "--dev", traced.name, "-o", str(out), "--", PYTHON, "-c",
                            script], cwd=ROOT, capture_output=True, text=True, timeout=120)
        assert r.returncode == 0, r.stderr
    finally:
        for _, mnt in reversed(mounts):
            umount(mnt)
    table = r.stdout[r.stdout.index("\nfiles:"):]
    assert "traced.dat" in table and "other.dat" not in table, table
    report = subprocess.run([PYTHON, "-m", "tracer.cli", "report", "--by", "file", str(out)], cwd=ROOT,
                            capture_output=True, text=True, timeout=60)
    assert report.returncode == 0, report.stderr
    assert "traced.dat" in report.stdout and "other.dat" not in report.stdout, report.stdout
    paths = {Path(f["path"]).name for d in read_dumps(out) for f in d.get("files") or []}
    assert "traced.dat" in paths and "other.dat" not in paths, paths
