"""test_bench: the tests that load BPF programs (need root).

The rest, and the helpers both share, are in tests/unit/test_bench.py.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import time
from pathlib import Path

import pytest
from conftest import NOBODY, PYTHON, ROOT, SUDO_ENV, run_iotrace

from tracer.model import benchresult as br
from tracer.sources.probe import USER_DROPS

bpf = pytest.mark.bpf


TINY = ["fio", "--rw=randread", "--bs=4k", "--size=4M", "--ioengine=psync"]     # 1024 reads, a few 100 ms


def loops_over(backing: str) -> list[str]:
    """Loop devices still attached to `backing` (sysfs shows a deleted file with a suffix)."""
    out = []
    for f in Path("/sys/block").glob("loop*/loop/backing_file"):
        try:
            if f.read_text().strip().removesuffix(" (deleted)") == backing:
                out.append(f.parent.parent.name)
        except OSError:
            pass    # detached meanwhile
    return out


def assert_torn_down(backing: str) -> None:
    assert backing.startswith(("/dev/shm/iotrace-bench-", "/tmp")), backing
    assert not os.path.exists(backing), f"backing file {backing} left behind"
    assert loops_over(backing) == [], f"loop device(s) {loops_over(backing)} still attached to {backing}"


@bpf
def test_bench_custom_workload(nobody_dir):
    out = nobody_dir / "r.json"
    # as under `sudo` by user nobody: fio must still run as root (nobody may not open the loop
    # device), and the result is written by the user, in the user's directory
    r = run_iotrace(["bench", "--repeat", "2", "-o", str(out), "--", *TINY], env={**os.environ, **SUDO_ENV})
    assert r.returncode == 0, r.stderr
    assert out.stat().st_uid == NOBODY and not list(nobody_dir.glob("*.tmp*"))
    raw = json.loads(out.read_text())
    res = br.read(str(out))
    assert (raw["kind"], raw["schema"]) == ("iotrace-bench", 1)
    assert res.suite == "custom" and res.version.startswith("sha") and res.repeat == 2
    assert set(raw["env"]) >= {"kernel", "cpu", "nproc", "device", "iotrace", "fio", "date"}
    assert res.env["kernel"] == os.uname().release and res.env["nproc"] == os.cpu_count()
    assert res.env["fio"].startswith("fio-") and res.env["device"]["kind"] == "loop"
    [w] = res.workloads
    assert w.name == "fio-args" and len(w.reps) == 2
    for rep in w.reps:
        assert list(rep.ops) == ["read"], rep.ops      # only fio's reads, only on the scratch device
        o = rep.ops["read"]
        # exact, short only by requests the kernel skipped (counted), or lost uncounted (the coverage's)
        skipped = sum(rep.dropped.get(reason, 0) for reason in (*USER_DROPS, "unseen"))
        assert 1024 - skipped <= o.count <= 1024, (o.count, rep.dropped)
        assert o.mb == pytest.approx(o.count * 4096 / 1e6, abs=1e-3)
        assert o.iops and o.iops > 0
        for phase in ("queue", "device", "total"):
            st = o.latency_us[phase]
            assert st["count"] == o.count
            assert 0 < st["min"] <= st["p50"] <= st["p90"] <= st["p99"] <= st["p99.9"] <= st["max"], (phase, st)
        assert o.latency_us["device"]["p50"] <= o.latency_us["total"]["p50"]
    # the summary is the reps' median and range
    p99 = raw["workloads"][0]["summary"]["read"]["latency_us"]["total"]["p99"]
    values = sorted(rep.ops["read"].latency_us["total"]["p99"] for rep in w.reps)
    assert p99["n"] == 2 and p99["min"] == values[0] and p99["max"] == values[1]
    assert p99["median"] == pytest.approx(sum(values) / 2, abs=1e-3)
    assert "fio-args" in r.stdout and "read" in r.stdout        # the table of medians
    assert_torn_down(res.env["device"]["backing"])


def _start_line(proc: subprocess.Popen) -> tuple[str, str]:
    line = proc.stderr.readline()
    m = re.match(r"bench: \S+ on (/dev/loop\d+) \(backing (\S+)\)", line)
    if not m:
        proc.kill()
        pytest.fail(f"bench did not start: {line}{proc.communicate()[1]}")
    return m.group(1), m.group(2)


def _reads(loop: str) -> int:
    return int((Path("/sys/block") / Path(loop).name / "stat").read_text().split()[0])


# Another BPF tracer on the block tracepoints, counting every event, as a second tool on the machine
OTHER_TRACER = """
import sys, time
from bcc import BPF
b = BPF(text='''
BPF_ARRAY(n, u64, 1);
static int one(void) { int k = 0; u64 *v = n.lookup(&k); if (v) __sync_fetch_and_add(v, 1); return 0; }
TRACEPOINT_PROBE(block, block_rq_issue) { return one(); }
TRACEPOINT_PROBE(block, block_rq_complete) { return one(); }
''')
print("attached", flush=True)
while True:
    time.sleep(1)
"""


@pytest.fixture
def other_tracer():
    proc = subprocess.Popen([PYTHON, "-c", OTHER_TRACER], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        if proc.stdout.readline().strip() != "attached":
            pytest.fail(f"the second tracer did not attach: {proc.communicate(timeout=30)[1]}")
        yield proc
    finally:
        proc.kill()
        proc.wait()


def _ignore_sigint() -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)


@bpf
@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_bench_interrupted_tears_down(tmp_path, sig, other_tracer):
    """Stopped mid-run while another BPF tracer is attached, the bench exits within seconds, torn down.

    Started with SIGINT ignored, as a background job of a script or a CI runner starts it: Python then
    installs no KeyboardInterrupt, and a bench that relied on it ignored Ctrl-C until killed.
    """
    long = ["--rw=randread", "--bs=4k", "--size=16M", "--time_based=1", "--runtime=60"]
    proc = subprocess.Popen([PYTHON, "-m", "tracer.cli", "bench", "--repeat", "3", "-o", str(tmp_path / "r.json"),
                             "--", *long], cwd=ROOT, stderr=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                            preexec_fn=_ignore_sigint)
    loop, backing = _start_line(proc)
    try:
        deadline = time.monotonic() + 60
        while _reads(loop) == 0:        # until fio is running under the tracer
            assert time.monotonic() < deadline, "fio never read from the scratch device"
            time.sleep(0.1)
        proc.send_signal(sig)
        # a few seconds: the bench stops its run (SIGTERM, then KILL after 3 s) and detaches
        _, err = proc.communicate(timeout=20)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 130, err
    assert "Traceback" not in err, err
    assert not (tmp_path / "r.json").exists()      # no result from an interrupted run
    assert_torn_down(backing)
    assert other_tracer.poll() is None      # the other tool was left alone


@bpf
def test_bench_failing_workload_is_one_line_and_tears_down(tmp_path):
    r = run_iotrace(["bench", "--repeat", "2", "-o", str(tmp_path / "r.json"), "--", *TINY, "--rw=sideways"])
    assert r.returncode != 0
    assert "Traceback" not in r.stderr, r.stderr
    start, last = r.stderr.splitlines()[0], r.stderr.splitlines()[-1]
    assert last.startswith("iotrace: workload fio-args, repetition 1, failed") and "sideways" in last, r.stderr
    assert_torn_down(re.search(r"\(backing (\S+)\)", start).group(1))
