"""test_markers: the tests that load BPF programs (need root).

The rest, and the helpers both share, are in tests/unit/test_markers.py.
"""

from __future__ import annotations

import json
import os
import pwd
import re
import signal
import subprocess
from datetime import datetime
from pathlib import Path

import pytest
from conftest import PYTHON, ROOT, assert_count, read_dumps, run_iotrace, series_of
from unit.test_markers import (
    _env,
)

from tracer import marker

TESTS = Path(__file__).resolve().parent.parent


bpf = pytest.mark.bpf


EPOCH_SCRIPT = """\
import sys
sys.path[:0] = [{tests!r}, {root!r}]   # ioload, and this checkout's tracer (a guest's venv has none installed)
from ioload import read_blocks
from tracer import marker

dev, at = sys.argv[1], 0
for i, n in enumerate({blocks}, 1):
    read_blocks(dev, n, at)
    at += n
    if not marker.mark(f"epoch {{i}}", wait=10):      # waited: the next reads go in the next dump
        sys.exit("epoch marker not confirmed")
marker.mark("quick 1")                                # not waited: a few ms late, but never lost
marker.mark("quick 2")
read_blocks(dev, {tail}, at)
"""


def _control_path(stderr: str) -> str:
    m = re.search(r"control socket (\S+)\)", stderr)
    assert m, stderr
    return m.group(1)


@bpf
def test_command_markers_make_one_dump_per_epoch(loop, tmp_path):
    blocks, tail = [30, 50, 70], 20
    script = tmp_path / "epochs.py"
    script.write_text(EPOCH_SCRIPT.format(tests=str(TESTS), root=str(ROOT), blocks=blocks, tail=tail))
    out = tmp_path / "out.jsonl"
    r = run_iotrace(["-o", str(out), "--dev", loop.name, "--", PYTHON, str(script), loop.path],
                    env=_env(tmp_path / "run"))
    assert r.returncode == 0, r.stderr
    dumps = read_dumps(out)
    assert [(d["kind"], d["label"]) for d in dumps] == [
        ("marker", "epoch 1"), ("marker", "epoch 2"), ("marker", "epoch 3"),
        ("marker", "quick 1"), ("marker", "quick 2"), ("final", None)]
    for d, want in zip(dumps, blocks, strict=False):
        rows = series_of(d, device=loop.name)
        assert {s["op"] for s in rows} == {"read"}
        assert_count(sum(s["count"] for s in rows), want, [d], device=loop.name)
        assert sum(s["bytes"] for s in rows) == 4096 * sum(s["count"] for s in rows)
    assert_count(sum(s["count"] for d in dumps for s in series_of(d, device=loop.name)), sum(blocks) + tail, dumps,
                 device=loop.name)
    # one process across dumps: each dump's histograms hold its own requests, none carried over
    for d in dumps:
        for s in d["series"]:
            assert s["latency_us"]["total"]["count"] == s["count"], (d["label"], s["latency_us"]["total"], s["count"])
    # each marker's table is printed as it comes, before the end of the run
    assert r.stdout.index("marker 'epoch 1'") < r.stdout.index("marker 'epoch 3'") < r.stdout.index("final")
    path = _control_path(r.stderr)
    assert path.startswith(str(tmp_path / "run")) and not os.path.exists(path)     # removed at exit


@bpf
def test_mark_from_a_shell_against_a_running_tracer(loop, tmp_path):
    env = _env(tmp_path / "run")
    out = tmp_path / "out.jsonl"
    tracer = subprocess.Popen([PYTHON, "-m", "tracer.cli", "--dev", loop.name, "-o", str(out)], cwd=ROOT, env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        started = tracer.stderr.readline() + tracer.stderr.readline()
        assert "tracing block I/O" in started, started
        path = _control_path(started)
        read = [PYTHON, str(TESTS / "ioload.py"), loop.path]
        subprocess.run([*read, "40"], check=True, capture_output=True, timeout=60)
        m = run_iotrace(["mark", "load A"], env=env)        # found in the run dir: the only tracer there
        assert m.returncode == 0 and "marked 'load A'" in m.stdout, m.stderr
        subprocess.run([*read, "25", "--offset-blocks", "100"], check=True, capture_output=True, timeout=60)
        m = run_iotrace(["mark", "load B", "--control", path], env=env)
        assert m.returncode == 0, m.stderr
        tracer.send_signal(signal.SIGINT)
        _, err = tracer.communicate(timeout=60)
    finally:
        if tracer.poll() is None:
            tracer.kill()
            tracer.wait()
    assert tracer.returncode == 0, err
    dumps = read_dumps(out)
    assert [(d["kind"], d["label"]) for d in dumps] == [("marker", "load A"), ("marker", "load B"), ("final", None)]
    for d, want in zip(dumps, [40, 25, 0], strict=True):
        assert_count(sum(s["count"] for s in series_of(d, device=loop.name)), want, [d], device=loop.name)
    assert not os.path.exists(path)         # Ctrl-C removes the socket too


@bpf
def test_command_run_as_an_unprivileged_user_can_mark(tmp_path, nobody_dir):
    """Under sudo the command runs as SUDO_UID; the socket is that user's, and only theirs."""
    nobody = pwd.getpwnam("nobody")
    code = ("import os; from tracer.marker import mark, ENV_CONTROL; st = os.stat(os.environ[ENV_CONTROL]); "
            "said = mark('as nobody', wait=10); "
            # one write: the tracer's tables share this stdout
            "os.write(1, f'{os.getuid()} {st.st_uid} {oct(st.st_mode & 0o777)} {said}\\n'.encode())")
    out = nobody_dir / "out.jsonl"     # -o is opened as nobody: not in pytest's tmp dirs
    env = _env(tmp_path / "run", SUDO_UID=str(nobody.pw_uid), SUDO_GID=str(nobody.pw_gid), SUDO_USER="nobody")
    env.pop(marker.ENV_RUN_DIR)     # the default run dir: pytest's tmp dirs are closed to nobody
    r = run_iotrace(["-o", str(out), "--", PYTHON, "-c", code], env=env)
    assert r.returncode == 0, r.stderr
    # the command's line and the tracer's tables share stdout, in either order
    said = re.search(r"^(\d+) (\d+) (0o\d+) (True|False)$", r.stdout, re.M)
    assert said and said.groups() == (str(nobody.pw_uid), str(nobody.pw_uid), "0o600", "True"), r.stdout
    assert [(d["kind"], d["label"]) for d in read_dumps(out)] == [("marker", "as nobody"), ("final", None)]
    assert not os.path.exists(_control_path(r.stderr))


NESTED_SCRIPT = """\
import mmap, os, sys
from tracer import marker
from tracer.integrations.torch import timed

MIB, CHUNK = 1 << 20, 256 << 10
dev, plan, writes, write_at = sys.argv[1], {plan}, {writes}, {write_at}
fd = os.open(dev, os.O_RDWR | os.O_DIRECT)
buf = mmap.mmap(-1, CHUNK)          # page-aligned, as O_DIRECT wants

def batches(first, mib):            # a stand-in data loader: each batch one direct read
    for i in range(mib * MIB // CHUNK):
        if os.preadv(fd, [buf], first * MIB + i * CHUNK) != CHUNK:
            sys.exit("short read")
        yield i

at = 0
for e in marker.epochs(len(plan)):  # no explicit waits: the default boundaries must be exact
    before, after = plan[e]
    for _ in timed(batches(at, before)):
        pass
    at += before
    with marker.phase("checkpoint"):
        for i in range(writes[e] * MIB // CHUNK):
            os.pwritev(fd, [buf], (write_at + sum(writes[:e])) * MIB + i * CHUNK)
        os.fsync(fd)
    for _ in timed(batches(at, after)):
        pass
    at += after
"""


def _bytes_by_op(d: dict, device: str) -> dict[str, int]:
    out: dict[str, int] = {}
    for s in series_of(d, device=device):
        out[s["op"]] = out.get(s["op"], 0) + s["bytes"]
    return out


@bpf
def test_nested_epochs_and_checkpoints_with_the_real_tracer(make_loop, tmp_path):
    """The issue's loop, traced: each epoch's direct reads under its label (before and after its
    checkpoint), each checkpoint's writes under "epoch N / checkpoint", the loop's batches counted."""
    loop = make_loop(128)
    mib = 1 << 20
    plan, writes, write_at = [(8, 4), (12, 4), (16, 2)], [2, 3, 4], 96
    script = tmp_path / "nested.py"
    script.write_text(NESTED_SCRIPT.format(plan=plan, writes=writes, write_at=write_at))
    out = tmp_path / "run.jsonl"
    r = run_iotrace(["-o", str(out), "--dev", loop.name, "--", PYTHON, str(script), loop.path],
                    env=_env(tmp_path / "run", PYTHONPATH=str(ROOT)))
    assert r.returncode == 0, r.stderr
    rep = run_iotrace(["report", str(out), "--by", "label", "--json"])
    assert rep.returncode == 0, rep.stderr
    windows = {w["label"]: w for w in map(json.loads, rep.stdout.splitlines())}
    dumps = read_dumps(out)
    for n, ((before, after), wrote) in enumerate(zip(plan, writes, strict=True), 1):
        epoch, ckpt = windows[f"epoch {n}"], windows[f"epoch {n} / checkpoint"]
        got = _bytes_by_op(epoch, loop.name)
        assert got.get("read", 0) == pytest.approx((before + after) * mib, rel=0.02), (n, got)
        assert got.get("write", 0) == 0, (n, got)
        got = _bytes_by_op(ckpt, loop.name)
        assert got.get("write", 0) == pytest.approx(wrote * mib, rel=0.02), (n, got)
        assert got.get("read", 0) == 0, (n, got)
        assert epoch["loop"]["steps"] == (before + after) * mib // (256 << 10), epoch["loop"]
        assert 0 < epoch["loop"]["data_wait_s"] <= epoch["loop"]["wall_s"], epoch["loop"]
        # the dumps say which window encloses them
        assert {d["enclosing"] for d in dumps if d["label"] == f"epoch {n} / checkpoint"} == {f"epoch {n}"}
        assert {d["enclosing"] for d in dumps if d["label"] == f"epoch {n}"} == {None}
        # the epoch's slices before and after its checkpoint are one dump, handed on after the checkpoint's
        # (tracer.model.slices); its time is its own, without the checkpoint's
        labels = [d["label"] for d in dumps]
        assert labels.count(f"epoch {n}") == 1, labels
        assert labels.index(f"epoch {n}") == labels.index(f"epoch {n} / checkpoint") + 1, labels
        whole = next(d for d in dumps if d["label"] == f"epoch {n}")
        span = (datetime.fromisoformat(whole["end"]) - datetime.fromisoformat(whole["start"])).total_seconds()
        inner = next(d for d in dumps if d["label"] == f"epoch {n} / checkpoint")["duration_s"]
        assert whole["duration_s"] == pytest.approx(span - inner, abs=0.05), (whole["duration_s"], span, inner)
    # nothing of the loop's I/O was left for the windows around it
    for name in ("before epoch 1", None):
        rest = _bytes_by_op(windows.get(name, {"series": []}), loop.name)
        assert sum(rest.values()) <= 0.02 * mib, (name, rest)


EVIL_SCRIPT = """\
import json, os, socket, sys, time
path = os.environ["IOTRACE_CONTROL"]
s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
huge = "9" * 900
# the datagram that killed the tracer (OverflowError in merge_loops), and other bad ones
s.sendto(('{"v":1,"label":"evil","loop":{"data_wait_s":1,"steps":' + huge + ',"wall_s":1}}').encode(), path)
s.sendto(b'{"v":1,"label":"nan","loop":{"data_wait_s":NaN,"steps":1,"wall_s":Infinity}}', path)
s.sendto(b"[" * 1000, path)
s.sendto(b"\\xff" * 100, path)
s.sendto(json.dumps({"v": 1, "label": "good", "loop": {"data_wait_s": 0.5, "steps": 2, "wall_s": 1.0}}).encode(), path)
time.sleep(1)
"""


@bpf
def test_a_hostile_datagram_does_not_end_the_trace(tmp_path):
    """Issue 19 item 3, end to end: the traced command sends a datagram with a 900-digit step count (and
    other bad ones) to its tracer; the tracer goes on, writes its final dump, exits 0, and the file reads."""
    script = tmp_path / "evil.py"
    script.write_text(EVIL_SCRIPT)
    out = tmp_path / "out.jsonl"
    r = run_iotrace(["-d", "20", "-o", str(out), "--", PYTHON, str(script)], timeout=120)
    assert r.returncode == 0, r.stderr
    assert "Traceback" not in r.stderr, r.stderr
    assert "ignored a bad control message" in r.stderr and "left out" in r.stderr, r.stderr
    dumps = read_dumps(out)
    assert [d["kind"] for d in dumps][-1] == "final"
    markers = {d["label"]: d for d in dumps if d["kind"] == "marker"}
    assert set(markers) == {"evil", "nan", "good"}, markers.keys()
    assert "loop" not in markers["evil"] and "loop" not in markers["nan"]
    assert markers["good"]["loop"] == {"data_wait_s": 0.5, "steps": 2, "wall_s": 1.0}
    rep = run_iotrace(["report", str(out), "--by", "label"], timeout=60)
    assert rep.returncode == 0 and "Traceback" not in rep.stderr, rep.stderr
