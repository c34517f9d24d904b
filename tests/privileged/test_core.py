"""test_core: the tests that load BPF programs (need root).

The rest, and the helpers both share, are in tests/unit/test_core.py.
"""

from __future__ import annotations

import json
import mmap
import os
import shutil
import signal
import subprocess
import time

import pytest
from conftest import PYTHON, ROOT, assert_count, fio_cmd, read_dumps, reaped, run_iotrace, series_of
from unit.test_core import (
    IOLOAD,
    assert_one_line_error,
    finish,
    start_tracer,
)

from tracer.sources.probe import USER_DROPS

bpf = pytest.mark.bpf


@pytest.fixture(autouse=True, params=["raw_tp", "tracepoint"])
def attach(request, monkeypatch):
    """Each test on both attach paths (the iotrace subprocesses follow $IOTRACE_ATTACH)."""
    monkeypatch.setenv("IOTRACE_ATTACH", request.param)
    return request.param


@bpf
def test_command_mode_counts_fio_job_exactly(loop, tmp_path):
    out = tmp_path / "out.jsonl"
    r = run_iotrace(["-o", str(out), "--", *fio_cmd(loop.path)])
    assert r.returncode == 0, r.stderr
    fio = json.loads(r.stdout[r.stdout.index("{"):r.stdout.rindex("}") + 1])
    fio_reads = fio["jobs"][0]["read"]
    dumps = read_dumps(out)
    assert [d["kind"] for d in dumps] == ["final"]
    rows = series_of(dumps[0], comm="fio", device=loop.name)
    assert len(rows) == 1, rows        # only fio's job process did I/O on the loop device
    row = rows[0]
    assert row["op"] == "read" and row["devno"].startswith("7:")
    assert fio_reads["total_ios"] == 4096 and fio_reads["io_bytes"] == 16 << 20
    # Exact, except for requests the kernel did not show any BPF program (it runs one tracepoint
    # program per CPU at a time; now and then a completion is lost before any), which iotrace
    # counts; the coverage against /proc/diskstats must agree.  Nothing else may be missing.
    skipped = sum(dumps[0]["dropped"][reason] for reason in USER_DROPS)
    assert_count(row["count"], 4096, dumps, device=loop.name)
    assert row["bytes"] == row["count"] * 4096
    # fio forks its job: the row's pid is a child of the command, which proves children are followed
    assert row["pid"] != int(r.stderr.split("(pid ")[1].split(")")[0])
    # the device's share of the latency cannot exceed what fio measured end to end
    lat = row["latency_us"]
    assert lat["device"]["p50"] * 1e3 <= fio_reads["clat_ns"]["percentile"]["50.000000"]
    assert lat["queue"]["count"] == lat["device"]["count"] == lat["total"]["count"] == row["count"]
    assert lat["total"]["min"] <= lat["total"]["p50"] <= lat["total"]["p99"] <= lat["total"]["max"]
    assert set(row["hdr"]) == {"queue", "device", "total"}
    assert not any(n for reason, n in dumps[0]["dropped"].items() if reason not in USER_DROPS), dumps[0]["dropped"]
    if skipped:
        assert "events not recorded" in r.stdout + r.stderr   # the user is told
    # the terminal table names the device as users know it
    assert any(line.split()[:4] == [str(row["pid"]), "fio", loop.name, "read"] for line in r.stdout.splitlines())


def _reader(device: str, blocks: int, **kw) -> subprocess.Popen:
    args = [PYTHON, IOLOAD, device, str(blocks)]
    for k, v in kw.items():
        args += [f"--{k.replace('_', '-')}", str(v)]
    return subprocess.Popen(args, stdout=subprocess.PIPE, text=True)


@bpf
@pytest.mark.parametrize("follow", [True, False], ids=["children", "no-children"])
def test_pid_filter_excludes_others_and_follows_forks(make_loop, tmp_path, follow):
    # the other process reads a device of its own: the target's device is the target's alone, so
    # its coverage shows any request the kernel lost; only the pid filter keeps the other out
    loop, elsewhere = make_loop(), make_loop()
    go = tmp_path / "go"
    target = _reader(loop.path, 300, child=200, wait=go)
    out = tmp_path / "out.jsonl"
    with reaped(target):    # a tracer that fails to start must not leave the reader waiting for `go`
        tracer = start_tracer(["--pid", str(target.pid), "-o", str(out), "-d", "60"]
                              + ([] if follow else ["--no-children"]))
        other = _reader(elsewhere.path, 100)
        assert other.wait(30) == 0
        go.touch()
        pid, child = map(int, target.communicate(timeout=30)[0].split())
        finish(tracer)      # ends by itself: its target exited
    final = read_dumps(out)[-1]
    by_pid = {s["pid"]: s for s in series_of(final, device=loop.name)}
    dumps = read_dumps(out)
    assert_count(by_pid[pid]["count"], 300, dumps, device=loop.name)
    assert by_pid[pid]["bytes"] == by_pid[pid]["count"] * 4096
    assert other.pid not in {s["pid"] for s in final["series"]}     # on no device at all
    if follow:
        assert_count(by_pid[child]["count"], 200, dumps, device=loop.name)
    else:
        assert child not in by_pid
    assert set(by_pid) <= {pid, child}


# A traced parent on CPU 0 whose forked child reads DEVICE and exits; the parent prints the child's pid
# and stays (the tracer's --pid) until a line comes on its stdin.
_FORKER = r"""
import mmap, os, sys, time
dev, go = sys.argv[1], sys.argv[2]
os.sched_setaffinity(0, {0})
while not os.path.exists(go):
    time.sleep(0.01)
child = os.fork()
if child == 0:
    fd, buf = os.open(dev, os.O_RDONLY | os.O_DIRECT), mmap.mmap(-1, 4096)
    for i in range(64):
        os.preadv(fd, [buf], i * 4096)
    os._exit(0)
os.waitpid(child, 0)
print(child, flush=True)
sys.stdin.readline()
"""


def _read_as(pid: int, device: str, blocks: int) -> bool:
    """Fork a process of this (untraced) one with id `pid`, on CPU 0, that reads `device` without an exec;
    whether the id was had (another fork on the machine may take it first)."""
    for _ in range(200):
        with open("/proc/sys/kernel/ns_last_pid", "w") as f:
            f.write(str(pid - 1))
        got = os.fork()
        if got == 0:
            try:
                if os.getpid() == pid:
                    os.sched_setaffinity(0, {0})
                    fd = os.open(device, os.O_RDONLY | os.O_DIRECT)
                    buf = mmap.mmap(-1, 4096)
                    for i in range(blocks):
                        os.preadv(fd, [buf], i * 4096)
            finally:
                os._exit(0)
        os.waitpid(got, 0)
        if got == pid:
            return True
    return False


@bpf
def test_a_traced_childs_id_taken_by_another_process_is_not_traced(make_loop, tmp_path):
    """The start programs keep on each CPU whether the pid filter holds a thread (struct iotrace_who): the
    entry of a traced child that exited must not say so for the next process given its id. The new
    process reads on the same CPU at once (the entry's age would otherwise expire it), forked without an
    exec (which alone makes every entry be read again)."""
    mine, elsewhere = make_loop(), make_loop()
    go, out = tmp_path / "go", tmp_path / "out.jsonl"
    target = subprocess.Popen([PYTHON, "-c", _FORKER, mine.path, str(go)], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True)
    with reaped(target):
        tracer = start_tracer(["--pid", str(target.pid), "-o", str(out), "-d", "60"])
        go.touch()
        child = int(target.stdout.readline())
        reused = _read_as(child, elsewhere.path, 32)
        target.stdin.write("\n")
        target.stdin.flush()
        assert target.wait(30) == 0
        finish(tracer)      # ends by itself: its target exited
    if not reused:
        pytest.skip(f"no process could be given the id {child} again: other forks took it first")
    dumps = read_dumps(out)
    assert_count(sum(s["count"] for s in series_of(dumps[-1], device=mine.name) if s["pid"] == child), 64,
                 dumps, device=mine.name)
    assert not [s for d in dumps for s in series_of(d, device=elsewhere.name)], "the new process was traced"


@bpf
def test_interval_dumps(loop, tmp_path):
    out = tmp_path / "out.jsonl"
    r = run_iotrace(["-i", "1", "-d", "3.5", "-o", str(out), "--dev", loop.name])
    assert r.returncode == 0, r.stderr
    kinds = [d["kind"] for d in read_dumps(out)]
    assert kinds == ["interval", "interval", "interval", "final"]
    assert r.stdout.count("interval:") == 3 and "whole run" in r.stdout


@bpf
def test_dev_filter_and_report_merge(make_loop, tmp_path):
    a, b = make_loop(), make_loop()
    out = tmp_path / "out.jsonl"
    tracer = start_tracer(["--dev", a.name, "-i", "0.5", "-o", str(out)])
    for dev in (a, b, a):
        assert _reader(dev.path, 64).wait(30) == 0
        time.sleep(0.3)
    tracer.send_signal(signal.SIGINT)
    finish(tracer)
    dumps = read_dumps(out)
    assert dumps[-1]["kind"] == "final"
    devices = {s["device"] for d in dumps for s in d["series"]}
    assert devices == {a.name}
    total = sum(s["count"] for d in dumps for s in series_of(d, device=a.name))
    assert_count(total, 128, dumps, device=a.name)
    # `report` merges every dump through the hdr histograms
    r = run_iotrace(["report", str(out)])
    assert r.returncode == 0, r.stderr
    rows = [line.split() for line in r.stdout.splitlines()
            if f" {a.name} " in f" {line} " and " requests on " not in line]    # not the coverage line
    assert sum(int(row[4]) for row in rows) == total


@bpf
def test_filters_hold_from_the_first_event(make_loop, tmp_path):
    """The programs attach before the filters are written; nothing may slip in meanwhile."""
    busy, quiet = make_loop(), make_loop()
    noise = subprocess.Popen(["sh", "-c", f"while :; do dd if={busy.path} of=/dev/null bs=4k count=256 "
                              "iflag=direct 2>/dev/null; done"])
    try:
        for _ in range(3):
            out = tmp_path / "out.jsonl"
            out.unlink(missing_ok=True)
            r = run_iotrace(["--dev", quiet.name, "-o", str(out), "--", "sleep", "0.2"])
            assert r.returncode == 0, r.stderr
            assert read_dumps(out)[-1]["series"] == []
    finally:
        noise.kill()
        noise.wait()


@bpf
def test_ctrl_c_still_writes_what_was_collected(loop, tmp_path):
    out = tmp_path / "out.jsonl"
    tracer = start_tracer(["-o", str(out), "--hist"])
    assert _reader(loop.path, 50).wait(30) == 0
    tracer.send_signal(signal.SIGINT)
    stdout, _ = finish(tracer)
    final = read_dumps(out)[-1]
    assert final["kind"] == "final"
    assert_count(sum(s["count"] for s in series_of(final, device=loop.name)), 50, [final], device=loop.name)
    assert "distribution" in stdout          # --hist bars
    assert loop.name in stdout


@bpf
def test_command_exit_code_and_user_under_sudo(tmp_path):
    r = run_iotrace(["--", "sh", "-c", "exit 3"])
    assert r.returncode == 3, r.stderr
    env = dict(os.environ, SUDO_UID="65534", SUDO_GID="65534", SUDO_USER="nobody")
    r = run_iotrace(["--", "id", "-u"], env=env)
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines()[0].strip() == "65534"


@bpf
def test_error_unknown_pid_and_device():
    gone = subprocess.Popen(["true"])
    gone.wait()
    assert_one_line_error(run_iotrace(["--pid", str(gone.pid)]), f"--pid {gone.pid}", "no such process")
    r = run_iotrace(["--dev", "nosuchdisk9"])
    assert_one_line_error(r, "no such block device", "known devices")


@bpf
def test_error_not_root():
    r = subprocess.run(["setpriv", "--reuid=nobody", "--regid=nogroup", "--clear-groups",
                        PYTHON, "-m", "tracer.cli", "-d", "1"], cwd=ROOT, capture_output=True, text=True,
                       timeout=60)
    assert_one_line_error(r, "root", "sudo")


@bpf
def test_error_no_bcc_and_no_headers():
    code = "import sys; sys.modules['bcc'] = None; from tracer.cli import main; sys.exit(main(['-d', '1']))"
    r = subprocess.run([PYTHON, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert_one_line_error(r, "bcc is not installed", "python3-bpfcc")
    r = run_iotrace(["-d", "1"], env=dict(os.environ, BCC_KERNEL_SOURCE="/nonexistent/headers"))
    assert_one_line_error(r, "no kernel headers", "/nonexistent/headers", "make setup")


@bpf
def test_coverage_matches_diskstats_exactly(loop, tmp_path):
    """Traced from start to end with no pid filter, the device's requests equal /proc/diskstats' completions."""
    if shutil.which("udevadm"):
        subprocess.run(["udevadm", "settle"], check=False)   # udev's own probe reads of the new device, done
    out = tmp_path / "out.jsonl"
    tracer = start_tracer(["--dev", loop.name, "-i", "0.5", "-o", str(out)])
    job = fio_cmd(loop.path, rw="randrw", size="8M", fsync=8, ioengine="psync")
    assert subprocess.run(job, capture_output=True).returncode == 0
    assert _reader(loop.path, 200).wait(30) == 0
    tracer.send_signal(signal.SIGINT)
    stdout, _ = finish(tracer)
    dumps = read_dumps(out)
    from tracer.model.dump import merge_coverage
    from tracer.model.sections import Coverage
    cov = merge_coverage([Coverage.from_json(d["coverage"]) for d in dumps])
    c = cov.devices[loop.name].to_json()
    ops = {s["op"] for d in dumps for s in series_of(d, device=loop.name)}
    assert {"read", "write"} <= ops
    # exact, but for requests iotrace counted as never shown it: completions found lost (this
    # device's, under --dev; tracepoint path) and skipped starts and completions (any device's: an upper bound)
    lost = sum(d["dropped"]["lost_completion"] for d in dumps)
    skipped = sum(d["dropped"]["skipped_start"] + d["dropped"]["skipped_complete"] for d in dumps)
    assert c["recorded"] + lost <= c["diskstats"] <= c["recorded"] + lost + skipped, (c, lost, skipped)
    assert c["diskstats"] > 2000
    assert not cov.filtered
    assert f"{loop.name} " in stdout and f"requests on {loop.name} were recorded" in stdout


@bpf
def test_flush_sequence_tails_are_no_lost_starts(ext4_mnt, tmp_path):
    """A preflush/FUA write (jbd2's commits under fsync) completes twice, the second time with no bytes
    once its flush sequence ends: traced with no filter, that tail is a note, never a lost start."""
    loop, mnt = ext4_mnt
    out = tmp_path / "out.jsonl"
    tracer = start_tracer(["-o", str(out)])
    job = fio_cmd(str(mnt / "f.dat"), rw="randwrite", size="2M", direct=0, fsync=4)
    assert subprocess.run(job, capture_output=True).returncode == 0
    tracer.send_signal(signal.SIGINT)
    finish(tracer)
    final = read_dumps(out)[-1]
    assert series_of(final, device=loop.name, op="flush") or series_of(final, device=loop.name, op="write")
    # 128 fsyncs: jbd2 commits a FUA block for each; only requests already in flight at attach lack a start
    assert final["events"]["flush_tail"] > 0, final["events"]
    assert final["dropped"]["no_start"] < final["events"]["flush_tail"], (final["dropped"], final["events"])
