"""test_serve: the tests that load BPF programs (need root).

The rest, and the helpers both share, are in tests/unit/test_serve.py.
"""

from __future__ import annotations

import csv
import json
import os
import signal
import subprocess
import time

import numpy as np
import pytest
from conftest import PYTHON, ROOT, reaped
from unit.test_serve import (
    by_comm,
    children_of,
    exposition,
    free_port,
    get,
    gone,
)

from tracer.sinks import prometheus as serve


@pytest.mark.bpf
def test_real_serve_goes_from_0_to_1_and_ready():
    port = free_port()
    proc = subprocess.Popen([PYTHON, "-m", "tracer.cli", "serve", "--listen", f"127.0.0.1:{port}", "--interval", "1"],
                            cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    states = []     # (/ready status, attached) of each round that answered, in order; /ready asked first
    with reaped(proc):
        deadline = time.monotonic() + 120
        while not states or states[-1] != (200, 1):
            assert proc.poll() is None and time.monotonic() < deadline, states
            ready = get(port, serve.READY_PATH)[0]
            code, text = get(port, "/metrics")
            if ready and code == 200:
                states.append((ready, exposition(text)[(serve.ATTACHED, ())]))
            time.sleep(0.05)
        proc.send_signal(signal.SIGTERM)
        proc.communicate(timeout=60)
    assert proc.returncode == 0
    # not ready (503) until attached; attached goes from 0 to 1 and never back
    assert (200, 0) not in states and {r for r, _ in states} <= {200, 503}, states
    attached = [a for _, a in states]
    assert attached == sorted(attached) and attached[-1] == 1


@pytest.mark.bpf
@pytest.mark.parametrize("how", ["SIGTERM", "SIGKILL"])
def test_real_serves_server_process_ends_with_it(how):
    """/metrics is answered by a process of serve's own (tracer.sinks.promserver): it is gone once serve has
    exited, whether serve ended normally (SIGTERM: its final dump, then the server) or was killed."""
    port = free_port()
    proc = subprocess.Popen([PYTHON, "-m", "tracer.cli", "serve", "--listen", f"127.0.0.1:{port}", "--interval", "1"],
                            cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    with reaped(proc):
        deadline = time.monotonic() + 120
        while get(port, serve.READY_PATH)[0] != 200:
            assert proc.poll() is None and time.monotonic() < deadline, proc.stderr.read() if proc.poll() else ""
            time.sleep(0.1)
        servers = children_of(proc.pid)
        assert len(servers) == 1, servers
        proc.send_signal(getattr(signal, how))
        _, stderr = proc.communicate(timeout=60)
    assert proc.returncode == (0 if how == "SIGTERM" else -signal.SIGKILL), stderr
    assert gone(servers[0]), f"serve's server process {servers[0]} outlived it ({how})"
    assert get(port, "/metrics")[0] == 0


@pytest.mark.bpf
def test_real_serve_writes_jsonl_csv_and_alerts_through_the_trace_modes_sinks(loop, tmp_path):
    """serve takes -o, --csv, --alert and --fail-on-alert as trace mode does: each interval folded into the
    metrics is also a JSON line carrying its alerts and CSV rows beside iostat's columns; exit 3 at the end."""
    out, csv_path = tmp_path / "fold.jsonl", tmp_path / "io.csv"
    port = free_port()
    proc = subprocess.Popen([PYTHON, "-m", "tracer.cli", "serve", "--listen", f"127.0.0.1:{port}", "--interval", "1",
                             "--dev", loop.name, "-o", str(out), "--csv", str(csv_path), "--alert", "p99>1ns",
                             "--fail-on-alert"], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    with reaped(proc):
        deadline = time.monotonic() + 120
        while get(port, serve.READY_PATH)[0] != 200:
            assert proc.poll() is None and time.monotonic() < deadline, proc.stderr.read() if proc.poll() else ""
            time.sleep(0.1)
        with open(loop.path, "rb", buffering=0) as f:
            for i in range(64):
                os.pread(f.fileno(), 4096, i * 8192)
                os.posix_fadvise(f.fileno(), 0, 0, os.POSIX_FADV_DONTNEED)
        time.sleep(2.5)
        proc.send_signal(signal.SIGTERM)
        _, stderr = proc.communicate(timeout=60)
    assert proc.returncode == 3, stderr
    dumps = [json.loads(line) for line in out.read_text().splitlines()]
    assert dumps[-1]["kind"] == "final" and len(dumps) >= 2
    reads = sum(s["count"] for d in dumps for s in d["series"] if s["device"] == loop.name and s["op"] == "read")
    assert reads >= 64
    fired = [a for d in dumps for a in d.get("alerts", [])]
    assert fired and all(a["device"] == loop.name for a in fired)
    assert "iotrace: alert:" in stderr and "exit 3 (--fail-on-alert)" in stderr
    with open(csv_path) as f:
        rows = list(csv.DictReader(f))
    mine = [r for r in rows if r["device"] == loop.name and r["op"] == "read"]
    assert sum(int(r["count"]) for r in mine) == reads and all(r["r/s"] != "" for r in mine)


@pytest.mark.bpf
def _evict(path) -> None:
    """`path` written back and dropped from the page cache: the next buffered read of it comes from the disk."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def test_real_serve_exports_a_readers_task_counters(tmp_path):
    from tracer.sinks import taskmetrics

    data = tmp_path / "data.bin"
    data.write_bytes(np.random.default_rng(1).bytes(8 << 20))
    port = free_port()
    # --top 500: dd keeps labels of its own even when other processes on a busy machine do more I/O
    proc = subprocess.Popen([PYTHON, "-m", "tracer.cli", "serve", "--tasks", "--listen", f"127.0.0.1:{port}",
                             "--interval", "0.5", "--top", "500"], cwd=ROOT, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    names = {field: name for field, name, _ in taskmetrics.FIELDS}
    READ, DISK, IOW = names["read_bytes"], names["disk_read_bytes"], names["io_wait_s"]
    with reaped(proc):
        deadline = time.monotonic() + 120
        while get(port, serve.READY_PATH)[0] != 200:
            assert proc.poll() is None and time.monotonic() < deadline, proc.stderr.read() if proc.poll() else ""
            time.sleep(0.1)
        # out of the page cache first: every byte from the disk, in a buffered reader of our own name (the
        # default per-process rows count the page cache's reads; O_DIRECT is not in them)
        _evict(data)
        reader = subprocess.run(["dd", f"if={data}", "of=/dev/null", "bs=256k", "status=none"])
        assert reader.returncode == 0
        got = {}
        while time.monotonic() < deadline:
            time.sleep(0.6)
            s = exposition(get(port, "/metrics")[1])
            got = {name: by_comm(s, name).get(("dd", ""), 0) for name in (READ, DISK, IOW)}
            if got[READ] >= 8 << 20 and got[DISK] >= 8 << 20:
                break
        proc.send_signal(signal.SIGTERM)
        proc.communicate(timeout=60)
    assert proc.returncode == 0
    assert got[READ] >= 8 << 20 and got[DISK] >= 8 << 20, got
    assert got[IOW] > 0, got


@pytest.mark.bpf
def test_a_reader_between_the_two_drains_of_a_cut_keeps_its_own_task_counters(ext4_mnt, tmp_path):
    """A cut drains the per-process counters and the block-I/O probe one after the other.  A reader that runs
    start to end between the two (a drain can take a few hundred ms under load) must have its counters in the
    same window as its block I/O or in a later one, never an earlier: serve labels a process by its block I/O,
    so counters a window ahead went to comm="other" for good (the test above, flaky under load, read 0)."""
    import shutil

    from reference.recorder import kdev_of_path

    from tracer.pipeline.windows import DumpWindows
    from tracer.sinks import taskmetrics
    from tracer.sources.probe import Probe, ProbeOptions
    from tracer.sources.tasks import TaskTracer

    loop, mnt = ext4_mnt
    data = mnt / "data.bin"
    data.write_bytes(np.random.default_rng(2).bytes(1 << 20))
    os.sync()
    reader = tmp_path / "iotrace-gap"       # its comm
    shutil.copy("/usr/bin/dd", reader)
    probe = Probe(ProbeOptions(devs=[kdev_of_path(loop.path)]))
    try:
        tasks = TaskTracer()
        try:
            windows = DumpWindows(probe, tasks)
            windows.start()
            exporter = serve.Exporter(top=500)
            counters = taskmetrics.TaskCounters(exporter)

            def fold() -> None:
                d = windows.build(windows.cut(), "interval")
                exporter.fold(d)
                counters.fold(d)

            fold()
            ran = []
            for source in (probe, tasks):      # whichever the cut drains first, the reader runs right after it
                def drain(*args, _drain=source.drain, **kwargs):
                    out = _drain(*args, **kwargs)
                    if not ran:
                        _evict(data)
                        ran.append(subprocess.run([str(reader), f"if={data}", "of=/dev/null", "bs=256k",
                                                   "status=none"]).returncode)
                    return out
                source.drain = drain
            fold()      # the reader runs inside this cut
            fold()      # what of it the cut's second drain did not see
        finally:
            tasks.close()
    finally:
        probe.close()
    assert ran == [0]
    fields = [f for f, _, _ in taskmetrics.FIELDS]
    mine = {ctr: dict(zip(fields, values, strict=True)) for comm, ctr, values in counters.snapshot()
            if comm == "iotrace-gap"}
    assert len(mine) == 1, counters.snapshot()
    got = next(iter(mine.values()))
    assert got["read_bytes"] >= 1 << 20 and got["disk_read_bytes"] >= 1 << 20, got
    assert got["io_wait_s"] > 0, got
