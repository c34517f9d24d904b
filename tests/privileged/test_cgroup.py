"""test_cgroup: the tests that load BPF programs (need root).

The rest, and the helpers both share, are in tests/unit/test_cgroup.py.
"""

from __future__ import annotations

import os
import subprocess
import uuid
from pathlib import Path

import pytest
from conftest import PYTHON, assert_count, read_dumps, series_of
from unit.test_core import IOLOAD, finish, start_tracer

from tracer.sources.cgroups import cgroup2_mount

bpf = pytest.mark.bpf


@pytest.fixture
def cgroup_tree():
    """A cgroup v2 X with a child X/inner, removed at teardown (after their processes exit)."""
    found = cgroup2_mount()
    if found is None:
        pytest.skip("no cgroup v2 hierarchy mounted")
    root = found[0]
    top = Path(root) / f"iotrace-test-{uuid.uuid4().hex[:8]}"
    inner = top / "inner"
    inner.mkdir(parents=True)
    yield top, inner
    for d in (inner, top):
        for pid in (d / "cgroup.procs").read_text().split():    # strays: back to the root
            try:
                (Path(root) / "cgroup.procs").write_text(pid)
            except OSError:
                pass
        d.rmdir()


def _held_reader(device: str, blocks: int, go: Path, offset: int) -> subprocess.Popen:
    return subprocess.Popen([PYTHON, IOLOAD, device, str(blocks), "--wait", str(go), "--offset-blocks", str(offset)],
                            stdout=subprocess.PIPE, text=True)


@bpf
def test_cgroup_filter_keeps_the_cgroup_and_its_descendants(make_loop, tmp_path, cgroup_tree):
    top, inner = cgroup_tree
    # the outsider reads a device of its own: the insider's device is its alone, so that device's
    # coverage shows any request the kernel lost; only the cgroup filter keeps the outsider out
    loop, elsewhere = make_loop(), make_loop()
    go = tmp_path / "go"
    inside = _held_reader(loop.path, 120, go, 0)
    outside = _held_reader(elsewhere.path, 80, go, 1000)
    (inner / "cgroup.procs").write_text(str(inside.pid))     # a descendant of the filtered cgroup
    out = tmp_path / "out.jsonl"
    root = cgroup2_mount()[0]
    tracer = start_tracer(["--cgroup", "/" + os.path.relpath(top, root), "-o", str(out)])
    go.touch()
    assert inside.wait(30) == 0 and outside.wait(30) == 0
    tracer.send_signal(2)
    finish(tracer)
    dumps = read_dumps(out)
    rows = {s["pid"]: s for s in series_of(dumps[-1], device=loop.name)}
    assert set(rows) == {inside.pid}, rows
    assert outside.pid not in {s["pid"] for s in dumps[-1]["series"]}   # never recorded, on any device
    assert_count(rows[inside.pid]["count"], 120, dumps, device=loop.name)
    # the cgroup id captured at submission is the reader's own cgroup (the inode of its directory)
    assert rows[inside.pid]["cgroup_id"] == os.stat(inner).st_ino
