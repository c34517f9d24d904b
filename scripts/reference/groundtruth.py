"""An exact, independent reference for iotrace: every block request from ftrace.

iotrace keeps histograms in the kernel and never sees single requests; this
package records every block tracepoint event into a private tracefs instance,
matches the events offline into one record per request, and computes exact
counts, bytes and nearest-rank percentiles, so iotrace's numbers can be
checked against them.  run_command() and run_system() do it all for one
workload; by hand:

    with TruthRecorder(devs=[kdev]) as rec:        # start before iotrace
        ... start iotrace; once it is attached: rec.bracket()
        ... run the workload ...
        truth = rec.stop()
    cmp = compare(truth.requests, iotrace_dumps, Scope(...))
    print(render(cmp)); assert cmp.ok

The reference is in four parts, each its own module: events (what one
recorded event is, and how precisely its BPF stamp times it), recorder (the
tracefs instance and the stamper, stamps.bpf.c), matcher (events -> exact
requests) and comparison (exact statistics against iotrace's dumps, and the
report).  This module runs iotrace against it and is the one import the
tests and scripts/verify.py need.
"""

from __future__ import annotations

import os
import re
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from tracer.sources.devices import devno

from .comparison import (
    Check,
    Comparison,
    Scope,
    SeriesResult,
    TruthSeries,
    aggregate,
    compare,
    nearest_rank,
    render,
    within,
)
from .events import START_EVENTS, Event, Stamp, TruthError, stamped
from .matcher import Request, Truth, op_of
from .recorder import Stamper, TruthRecorder, attach_stamps, iotrace_start_event, kdev_of_path

__all__ = [
    "START_EVENTS", "Check", "Comparison", "Event", "Request", "Run", "Scope", "SeriesResult", "Stamp", "Stamper",
    "Truth", "TruthError", "TruthRecorder", "TruthSeries", "aggregate", "attach_stamps", "check_start_event", "compare",
    "iotrace_start_event", "kdev_of_path", "nearest_rank", "op_of", "render", "run_command", "run_system",
    "stamped", "within",
]


# ---------------------------------------------------------------------------- running iotrace against the truth

def wall_to_mono_ns(dt) -> int:
    """A datetime from a dump (iotrace's wall clock) as CLOCK_MONOTONIC ns of this boot."""
    return int(dt.timestamp() * 1e9) - (time.time_ns() - time.monotonic_ns())


def dumps_end_mono_ns(dumps) -> int:
    from tracer.codec import jsonl
    from tracer.model import dump as dumpmod

    ds = [d if isinstance(d, dumpmod.Dump) else jsonl.from_json(d) for d in dumps]
    return max(wall_to_mono_ns(d.end) for d in ds)


_CHILD_PID = re.compile(r"tracing block I/O of command .*\(pid (\d+)\)")

#: Margin around the instants iotrace's window is known from (the wall-clock
#: round trip of a dump's end, a signal's delivery): requests that start or
#: complete this close to an edge are ambiguous rather than silently kept.
EDGE_NS = 2_000_000


def command_pid(stderr: str) -> int:
    """The pid of the command iotrace ran, from its start-up line on stderr."""
    m = _CHILD_PID.search(stderr)
    if not m:
        raise TruthError(f"iotrace did not say which pid it ran the command as; its stderr:\n{stderr}")
    return int(m.group(1))


def command_scope(truth: Truth, stderr: str, launched_ns: int, dumps, devs: Sequence[int]) -> Scope:
    """What `iotrace -- COMMAND` could see: the command's process tree, from launch to its final drain.

    The command is held before exec until iotrace is attached, so everything
    its processes started was traced; whatever completed after the final
    drain was not.
    """
    end = dumps_end_mono_ns(dumps)
    return Scope(surely_from=launched_ns, surely_until=end - EDGE_NS, maybe_from=launched_ns,
                 maybe_until=end + EDGE_NS, tgids=truth.descendants(command_pid(stderr)), devs=list(devs),
                 label="command")


def system_scope(launched_ns: int, ready_ns: int, stop_ns: int, dumps, devs: Sequence[int]) -> Scope:
    """What `iotrace --dev ...` (every process) could see: from attach to its final drain."""
    end = dumps_end_mono_ns(dumps)
    return Scope(surely_from=ready_ns, surely_until=stop_ns, maybe_from=launched_ns,
                 maybe_until=max(end, stop_ns) + EDGE_NS, tgids=None, devs=list(devs), label="system")


def wait_quiet(devs: Sequence[int], quiet_s: float = 0.15, timeout_s: float = 20.0) -> None:
    """Wait until `devs` have nothing in flight and no new I/O for `quiet_s` seconds."""
    paths = [Path(f"/sys/dev/block/{devno(d)}") for d in devs]

    def snapshot():
        return tuple((p / "stat").read_text() for p in paths)

    deadline = time.monotonic() + timeout_s
    last, since = snapshot(), time.monotonic()
    while time.monotonic() < deadline:
        time.sleep(0.02)
        now = snapshot()
        busy = any((p / "inflight").read_text().split() != ["0", "0"] for p in paths)
        if now != last or busy:
            last, since = now, time.monotonic()
        elif time.monotonic() - since >= quiet_s:
            return
    raise TruthError(f"devices {', '.join(map(devno, devs))} never went quiet for {quiet_s}s")


class SystemIotrace:
    """`iotrace --dev ... -o FILE` tracing every process, started and stopped around a workload.

    start() returns once iotrace says it is tracing; stop() sends SIGINT
    (the Ctrl-C path), waits, and returns its exit status.  The instants of
    launch, readiness and stop are kept for system_scope().
    """

    READY = "iotrace: tracing block I/O"

    def __init__(self, args: Sequence[str], python: str, cwd: str | Path, timeout_s: float = 120):
        self.argv = [python, "-m", "tracer.cli", *args]
        self.cwd = str(cwd)
        self.timeout_s = timeout_s
        self.proc = None
        self.stderr = ""
        self.stdout = ""
        self.launched_ns = self.ready_ns = self.stop_ns = 0

    def start(self) -> None:
        import subprocess
        import threading

        self.launched_ns = time.monotonic_ns()
        self.proc = subprocess.Popen(self.argv, cwd=self.cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                     text=True)
        lines: list[str] = []
        ready = threading.Event()

        def pump_err():
            for line in self.proc.stderr:
                lines.append(line)
                if self.READY in line:
                    ready.set()
            ready.set()

        out: list[str] = []
        self._threads = [threading.Thread(target=pump_err, daemon=True),
                         threading.Thread(target=lambda: out.extend(self.proc.stdout), daemon=True)]
        for t in self._threads:
            t.start()
        self._err_lines, self._out_lines = lines, out
        if not ready.wait(self.timeout_s) or self.proc.poll() is not None and not any(self.READY in x for x in lines):
            self.kill()
            raise TruthError("iotrace did not start tracing:\n" + "".join(lines))
        self.ready_ns = time.monotonic_ns()

    def stop(self) -> int:
        import signal

        self.stop_ns = time.monotonic_ns()
        self.proc.send_signal(signal.SIGINT)
        try:
            rc = self.proc.wait(self.timeout_s)
        except Exception:
            self.kill()
            raise
        for t in self._threads:
            t.join(5)
        self.stderr, self.stdout = "".join(self._err_lines), "".join(self._out_lines)
        return rc

    def kill(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


#: Holds a command until the file named by $0 exists, then becomes it (same pid).
_GATE = 'while [ ! -e "$0" ]; do sleep 0.005; done; exec "$@"'


@dataclass
class Run:
    """One workload traced by iotrace while the reference recorded it, compared."""

    comparison: Comparison
    truth: Truth
    dumps: list[dict]
    trace_text: str            # the reference's raw events, as tracefs prints them
    iotrace_stderr: str


def _attach_of(iotrace_args: Sequence[str]) -> str:
    """The --attach iotrace is given, else what it would default to."""
    args = list(iotrace_args)
    if "--attach" in args[:-1]:
        return args[args.index("--attach") + 1]
    return os.environ.get("IOTRACE_ATTACH", "auto")


def check_start_event(truth: Truth, dumps: Sequence[dict]) -> None:
    """The reference started its requests where iotrace did (block_io_start, or block_getrq before 6.5),
    else a TruthError: the two would be timing different things."""
    used = {d["start_event"]["event"] for d in dumps if "start_event" in d}
    if used - {truth.start_event}:
        raise TruthError(f"iotrace started requests on {', '.join(sorted(used))}, the reference on "
                         f"{truth.start_event} ($IOTRACE_START_EVENT, --attach and the kernel choose it)")


def _attach_args(rec: TruthRecorder) -> list[str]:
    """iotrace attaches as the stamper did, so that the stamps bracket its programs."""
    return ["--attach", rec.stamper.attach] if rec.stamper else []


def run_command(iotrace_args: Sequence[str], command: Sequence[str], devs: Sequence[int], python: str,
                cwd: str | Path, workdir: str | Path, timeout_s: float = 300) -> Run:
    """`iotrace ARGS -o FILE -- COMMAND` (its process tree) against the reference.

    The command waits, under iotrace, until the after-stamps are attached
    behind iotrace's programs (TruthRecorder.bracket).
    """
    import subprocess

    out, gate = Path(workdir) / "iotrace.jsonl", Path(workdir) / "gate"
    with TruthRecorder(devs, attach=_attach_of(iotrace_args)) as rec:
        argv = [python, "-m", "tracer.cli", "-o", str(out), *iotrace_args, *_attach_args(rec), "--",
                "sh", "-c", _GATE, str(gate), *command]
        launched = time.monotonic_ns()
        proc = subprocess.Popen(argv, cwd=str(cwd), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            head = []
            for line in proc.stderr:         # iotrace runs the command once attached, and says so
                head.append(line)
                if _CHILD_PID.search(line):
                    break
            rec.bracket()
            gate.touch()
            _, rest = proc.communicate(timeout=timeout_s)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        stderr = "".join(head) + rest
        if proc.returncode != 0:
            raise TruthError(f"iotrace exited {proc.returncode}:\n{stderr}")
        truth = rec.stop()
    dumps = load_jsonl(out)
    check_start_event(truth, dumps)
    scope = command_scope(truth, stderr, launched, dumps, devs)
    return Run(compare(truth.requests, dumps, scope, truth.notes), truth, dumps, rec.text, stderr)


def run_system(iotrace_args: Sequence[str], command: Sequence[str], devs: Sequence[int], python: str,
               cwd: str | Path, workdir: str | Path, timeout_s: float = 300) -> Run:
    """`iotrace ARGS -o FILE` tracing every process, from before COMMAND until its writes are on disk.

    Waits for the devices to be quiet around it, so that the window's edges
    cut no request in two.
    """
    import subprocess

    out = Path(workdir) / "iotrace.jsonl"
    subprocess.run(["sync"], check=True)
    wait_quiet(devs)
    with TruthRecorder(devs, attach=_attach_of(iotrace_args)) as rec:
        it = SystemIotrace(["-o", str(out), *iotrace_args, *_attach_args(rec)], python, cwd, timeout_s)
        it.start()
        try:
            rec.bracket()
            wait_quiet(devs)
            w = subprocess.run(list(command), capture_output=True, text=True, timeout=timeout_s)
            if w.returncode != 0:
                raise TruthError(f"the workload exited {w.returncode}:\n{w.stderr}")
            subprocess.run(["sync"], check=True)
            wait_quiet(devs)
        finally:
            rc = it.stop()
        if rc != 0:
            raise TruthError(f"iotrace exited {rc}:\n{it.stderr}")
        truth = rec.stop()
    dumps = load_jsonl(out)
    check_start_event(truth, dumps)
    scope = system_scope(it.launched_ns, it.ready_ns, it.stop_ns, dumps, devs)
    return Run(compare(truth.requests, dumps, scope, truth.notes), truth, dumps, rec.text, it.stderr)


def load_jsonl(path: str | Path) -> list[dict]:
    import json

    return [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()]
