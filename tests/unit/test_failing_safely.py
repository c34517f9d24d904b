"""Failing safely (issue 19): a lost output, a teardown step that fails, the traced command ended and reaped,
a COMMAND that cannot run refused as a shell would (issue 32), stale control sockets, and coverage across a
disk that appears or goes away.  No BPF, no root needed."""

from __future__ import annotations

import errno
import os
import signal
import socket
import sys
import time
import types
from datetime import UTC, datetime

import pytest
from conftest import run_iotrace

from tracer import marker
from tracer.errors import UserError
from tracer.model.diskstats import DiskCounters
from tracer.model.dump import Dump
from tracer.pipeline.aggregate import coverage
from tracer.runtime import child as childmod
from tracer.runtime import control
from tracer.runtime.loop import LOST_OUTPUT_EXIT, Sinks
from tracer.runtime.teardown import run_steps
from tracer.sinks.jsonl import JsonlSink


class Recorder:
    what = "recorder"

    def __init__(self):
        self.windows = []
        self.closed = None

    def on_dump(self, window):
        self.windows.append(window)

    def close(self, status):
        self.closed = status
        return status


class Failing(Recorder):
    """An output whose writes fail as a full disk's do."""

    what = "-o full.jsonl"

    def __init__(self, err=errno.ENOSPC, on_close=False):
        super().__init__()
        self.err = err
        self.on_close = on_close
        self.abandoned = False

    def on_dump(self, window):
        if not self.on_close:
            raise OSError(self.err, os.strerror(self.err))

    def close(self, status):
        if self.on_close:
            raise OSError(self.err, os.strerror(self.err))
        return status

    def abandon(self):
        self.abandoned = True


def window(kind="interval"):
    return types.SimpleNamespace(kind=kind)


def test_a_failed_write_drops_that_output_the_others_go_on(capsys):
    ok, bad = Recorder(), Failing()
    sinks = Sinks([bad, ok])
    sinks.on_dump(window())
    sinks.on_dump(window("final"))
    assert len(ok.windows) == 2 and bad.abandoned
    err = capsys.readouterr().err.splitlines()
    assert err == ["iotrace: -o full.jsonl: write failed: No space left on device; that output is closed, "
                   f"the trace goes on (exit {LOST_OUTPUT_EXIT} at the end)"]
    assert sinks.close(0) == LOST_OUTPUT_EXIT
    assert ok.closed == 0           # the others close as ever
    assert sinks.close(5) == 5      # closing again is a no-op; a status of the run's own wins


def test_a_command_status_wins_over_a_lost_output():
    sinks = Sinks([Failing(errno.EIO)])
    sinks.on_dump(window())
    assert sinks.close(7) == 7


def test_close_never_raises(capsys):
    ok, bad = Recorder(), Failing(on_close=True)

    class Broken(Recorder):
        def close(self, status):
            raise ValueError("bad state")

    sinks = Sinks([bad, Broken(), ok])
    assert sinks.close(0) == LOST_OUTPUT_EXIT
    assert ok.closed == 0
    err = capsys.readouterr().err
    assert "-o full.jsonl: write failed: No space left on device; that output is incomplete" in err
    assert "recorder: write failed: bad state" in err
    assert "Traceback" not in err


def test_a_closed_stdout_still_ends_the_run_and_is_silent_at_close(capsys):
    class Pipe(Recorder):
        def on_dump(self, window):
            raise BrokenPipeError(errno.EPIPE, "Broken pipe")

        def close(self, status):
            raise BrokenPipeError(errno.EPIPE, "Broken pipe")

    sinks = Sinks([Pipe()])
    try:
        sinks.on_dump(window())
        raise AssertionError("BrokenPipeError must end the run")
    except BrokenPipeError:
        pass
    assert sinks.close(0) == 1 and sinks.broken_pipe
    assert capsys.readouterr().err == ""


def test_jsonl_sink_on_a_full_file_drops_its_buffer(tmp_path, capsys):
    """abandon() closes a file whose flush fails again, without raising."""
    class Full:
        closed = False

        def write(self, text):
            return len(text)

        def flush(self):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

        def close(self):
            self.closed = True
            self.flush()

    stream = Full()
    sinks = Sinks([JsonlSink(stream, own=True, what="-o x.jsonl")])
    now = datetime.now(UTC)
    sinks.on_dump(Dump(kind="interval", start=now, end=now, host="h", kernel="k", series=[]))
    assert stream.closed
    assert sinks.close(0) == LOST_OUTPUT_EXIT
    assert "-o x.jsonl: write failed: No space left on device" in capsys.readouterr().err


def test_teardown_runs_every_step(capsys):
    done = []

    def fail():
        raise OSError(errno.EIO, "Input/output error")

    run_steps(("a", lambda: done.append("a")), ("the probe", fail), ("skipped", None), ("c", lambda: done.append("c")))
    assert done == ["a", "c"]
    assert capsys.readouterr().err == "iotrace: while ending, the probe failed: [Errno 5] Input/output error\n"


def test_end_terminates_then_kills_and_reaps():
    pid = os.fork()
    if pid == 0:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)   # a command that will not end on SIGTERM
        os.execv(sys.executable, [sys.executable, "-c", "import time; time.sleep(60)"])
    time.sleep(0.3)
    t = time.monotonic()
    assert childmod.end(pid, grace=0.5) == 128 + signal.SIGKILL
    assert time.monotonic() - t < 5
    assert childmod.end(pid) is None        # reaped already: never signalled again


def test_end_of_an_exited_child_is_its_status():
    pid = os.fork()
    if pid == 0:
        os._exit(3)
    time.sleep(0.2)
    assert childmod.end(pid) == 3


def test_a_command_that_cannot_run_is_refused_as_a_shell_would(tmp_path):
    plain = tmp_path / "plain"
    plain.write_text("not a program\n")
    plain.chmod(0o644)
    runnable = tmp_path / "runnable"
    runnable.write_text("#!/bin/sh\n")
    runnable.chmod(0o755)
    for name, path, status, message in [
        (str(plain), None, 126, f"cannot run {plain}: it is not executable"),
        (str(tmp_path), None, 126, f"cannot run {tmp_path}: it is a directory"),
        (str(tmp_path / "gone"), None, 127, f"cannot run {tmp_path / 'gone'}: no such file"),
        ("plain", [str(tmp_path)], 126, f"cannot run plain: {plain} is not executable"),
        ("no-such-command-for-iotrace", [str(tmp_path)], 127, "command not found: no-such-command-for-iotrace"),
    ]:
        with pytest.raises(UserError) as exc:
            childmod.check_command(name, path)
        assert (str(exc.value), exc.value.exit_code) == (message, status)
    childmod.check_command(str(runnable))
    childmod.check_command("runnable", [str(tmp_path)])


def test_iotrace_says_why_a_command_cannot_run_and_exits_as_a_shell(tmp_path):
    plain = tmp_path / "plain"
    plain.write_text("not a program\n")
    plain.chmod(0o644)
    for argv, status, line in [
        ([str(plain)], 126, f"iotrace: cannot run {plain}: it is not executable"),
        ([str(tmp_path)], 126, f"iotrace: cannot run {tmp_path}: it is a directory"),
        (["no-such-command-for-iotrace"], 127, "iotrace: command not found: no-such-command-for-iotrace"),
    ]:
        r = run_iotrace(["-d", "1", "--", *argv], timeout=60)
        assert (r.returncode, r.stderr) == (status, line + "\n")


def test_a_killed_tracers_command_gets_the_death_signal(tmp_path):
    """PR_SET_PDEATHSIG: the middle process (the tracer) is SIGKILLed; the command it spawned ends too."""
    pidfile = tmp_path / "pid"
    code = (f"import sys; sys.path.insert(0, {os.getcwd()!r})\n"
            "from tracer.runtime import child\n"
            f"pid, w = child.spawn_held([{sys.executable!r}, '-c', 'import time; time.sleep(60)'])\n"
            f"open({str(pidfile)!r}, 'w').write(str(pid)); child.release(w)\n"
            "import time; time.sleep(60)\n")
    env = {k: v for k, v in os.environ.items() if k not in ("SUDO_UID", "SUDO_USER")}
    tracer = os.fork()
    if tracer == 0:
        os.setsid()
        os.execve(sys.executable, [sys.executable, "-c", code], env)
    try:
        for _ in range(200):
            if pidfile.exists() and pidfile.read_text():
                break
            time.sleep(0.05)
        cmd = int(pidfile.read_text())
        time.sleep(0.3)
        os.kill(tracer, signal.SIGKILL)
        os.waitpid(tracer, 0)
        for _ in range(100):
            try:
                with open(f"/proc/{cmd}/stat") as f:
                    gone = f.read().rsplit(")", 1)[1].split()[0] == "Z"
            except FileNotFoundError:
                gone = True
            if gone:
                break
            time.sleep(0.05)
        assert gone, "the command outlived its killed tracer"
    finally:
        try:
            os.killpg(tracer, signal.SIGKILL)
        except ProcessLookupError:
            pass


def test_stale_sockets_are_removed_live_ones_and_others_are_not(tmp_path):
    run = tmp_path / "run"
    run.mkdir(mode=0o755)
    live = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    live.bind(str(run / f"111{marker.SOCKET_SUFFIX}"))
    dead = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    dead.bind(str(run / f"222{marker.SOCKET_SUFFIX}"))
    dead.close()                                    # its tracer died: the file stays, nothing listens
    (run / f"333{marker.SOCKET_SUFFIX}").write_text("not a socket")
    os.symlink(run / f"222{marker.SOCKET_SUFFIX}", run / f"444{marker.SOCKET_SUFFIX}")
    (run / "notes.sock").touch()
    try:
        removed = control.remove_stale(str(run))
        assert removed == [str(run / f"222{marker.SOCKET_SUFFIX}")]
        assert sorted(os.listdir(run)) == [f"111{marker.SOCKET_SUFFIX}", f"333{marker.SOCKET_SUFFIX}",
                                           f"444{marker.SOCKET_SUFFIX}", "notes.sock"]
        ours = control.ControlSocket.open(directory=str(run))     # a start removes them too
        ours.close()
    finally:
        live.close()


def _stats(reads=0, writes=0):
    return DiskCounters(reads, 0, 0, writes, 0, 0, 0, 0, 0, 0, 0, 0)


def _raw(start, end, devs=None):
    return types.SimpleNamespace(diskstats_start=start, diskstats_end=end, traced_devs=devs, filtered=False)


def test_coverage_leaves_out_a_disk_that_appeared_went_away_or_was_attached_anew(monkeypatch):
    from tracer.sources import devices

    monkeypatch.setattr(devices, "whole_disks", lambda: {"sda": 1, "loop7": 2, "loop8": 3, "loop9": 4})
    start = {"sda": _stats(10, 10), "loop7": _stats(500, 500), "loop9": _stats(900, 0)}
    end = {"sda": _stats(12, 11), "loop8": _stats(40, 40), "loop9": _stats(3, 0)}
    # loop7 went away, loop8 appeared with counts from before the window, loop9 was attached anew
    series = [types.SimpleNamespace(device="sda", op="read", count=2), types.SimpleNamespace(device="sda", op="write",
                                                                                            count=1)]
    cov = coverage(_raw(start, end), series)
    assert cov.to_json()["devices"] == {"sda": {"recorded": 3, "diskstats": 3}}
