"""The one live loop of every live mode (trace, serve, top, --diskstats).

It owns time and events: interval ticks (a tick that falls behind is
skipped, never burst), the deadline (-d, or `count` reports), signals
(SIGUSR1: a report now; SIGINT/SIGTERM: end, or with a traced command,
forward the signal to it and end when it exits; a second signal ends the
command's whole tree: SIGTERM, then SIGKILL after child.KILL_GRACE_S; the
deadline sends the tree SIGTERM and waits for the command), markers from
the control socket, the traced command and --pid targets exiting, and
extra inputs (top's keys).  On each event it closes a
window through `windows` and hands the result to `sinks`.

It imports no source and no sink: it is given a `Windows` (the pipeline:
sources drained and turned into one dump or diskstats window) and a `Sinks`
(every output, in order).
"""

from __future__ import annotations

import math
import os
import select
import signal
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from tracer.model.slices import SliceFolder
from tracer.runtime.child import KILL_GRACE_S, exit_status


class Windows(Protocol):
    """Sources → one window.  cut() drains every source at once; build() turns a cut into a window."""

    def start(self) -> None: ...
    def cut(self, final: bool = False) -> Any: ...
    def build(self, cut: Any, kind: str, label: str | None = None, sections: tuple = (),
              began: float | None = None, manual: bool = False, owner: Any = None) -> Any: ...


class Sink(Protocol):
    """An output: on_dump(window) for every window, close(status) -> the exit status once at the end."""

    def on_dump(self, window: Any) -> None: ...
    def close(self, status: int) -> int: ...


@dataclass
class Schedule:
    """When reports are due: every `interval` seconds, until `duration` or `count` reports (the final included)."""

    interval: float | None = None
    duration: float | None = None
    count: int | None = None

    def deadline(self, start: float) -> float | None:
        """When the run ends (time.monotonic): after -d, or when `count` reports are due, whichever comes first."""
        ends = [start + self.duration] if self.duration else []
        if self.count and self.interval:
            ends.append(start + self.interval * self.count)
        return min(ends, default=None)


def next_tick_after(tick: float, now: float, interval: float) -> float:
    """The first tick of the grid tick + k*interval (k >= 1) that is after `now`: ticks that fell behind
    (a suspended machine, a slow sink) are skipped, never burst.  Computed, not counted up to: however
    far behind, and however small the interval, it takes one step; and it is always after `now`."""
    if not (math.isfinite(interval) and interval > 0):
        raise ValueError(f"interval {interval!r} is not a positive number of seconds")
    k = max(1, math.floor((now - tick) / interval) + 1)
    nxt = tick + k * interval
    if nxt <= now:      # rounding, or an interval too small to move a clock this large
        nxt = now + interval
    return nxt if nxt > now else math.nextafter(now, math.inf)


MAX_WAIT_S = 3600.0     # the longest select: a deadline years away (-i a year, count 1e9) must not overflow it


def wait_until(now: float, *times: float | None) -> float | None:
    """How long the loop may sleep before the first of `times` (None: no time is due, sleep until an event);
    never more than MAX_WAIT_S, which select can always take: the loop wakes, finds nothing due, sleeps on."""
    wake = [t for t in times if t is not None]
    return min(max(0.0, min(wake) - now), MAX_WAIT_S) if wake else None


def interval_due(now: float, next_tick: float | None, end: float | None) -> bool:
    """An interval report is due: its tick has come, and it is not (within a ms) the end, which the final covers."""
    return next_tick is not None and now >= next_tick and (end is None or next_tick < end - 1e-3)


# The exit status of a run that lost an output (a write to -o or --csv failed), unless its own is non-zero
LOST_OUTPUT_EXIT = 1


class Sinks:
    """Sinks in order; each window goes to all of them; close() chains the exit status through each.

    An output that cannot be written (ENOSPC, EIO: an OSError from its
    on_dump) is closed and dropped with one line on stderr, and the run goes
    on with the others; the exit status is LOST_OUTPUT_EXIT at the end (a
    non-zero status of the run's own wins).  A sink names itself for that
    line by `what` (e.g. "-o run.jsonl") and lets go of its file by
    `abandon()`.  A closed stdout (BrokenPipeError, `iotrace | head`) still
    ends the run, as a reader that went away always has.
    """

    def __init__(self, sinks: list[Sink]):
        self.sinks = [s for s in sinks if s is not None]
        self.lost: list[str] = []        # the outputs that failed, by `what`
        self.broken_pipe = False         # stdout's reader went away while closing

    def on_dump(self, window: Any) -> None:
        final = getattr(window, "kind", None) == "final"
        for s in list(self.sinks):
            try:
                s.on_dump(window)
            except BrokenPipeError:
                raise
            except OSError as exc:
                self._lose(s, exc, "it misses the final report" if final else
                           "that output is closed, the trace goes on")

    def _lose(self, s: Sink, exc: BaseException, then: str) -> None:
        what = getattr(s, "what", None) or type(s).__name__
        if s in self.sinks:
            self.sinks.remove(s)
        self.lost.append(what)
        why = getattr(exc, "strerror", None) or str(exc) or type(exc).__name__
        print(f"iotrace: {what}: write failed: {why}; {then} (exit {LOST_OUTPUT_EXIT} at the end)",
              file=sys.stderr, flush=True)
        abandon = getattr(s, "abandon", None)
        if abandon:
            try:
                abandon()
            except Exception:  # noqa: BLE001, S110 - its file is closed either way; the line above said it
                pass

    def close(self, status: int) -> int:
        """Every sink closes, even when one fails, and this never raises: a sink that fails to close is
        one line on stderr; a closed stdout is silent (broken_pipe).  Non-zero if an output was lost."""
        interrupt: BaseException | None = None
        for s in list(self.sinks):
            try:
                status = s.close(status)
            except BrokenPipeError:
                self.broken_pipe = True
            except OSError as exc:
                self._lose(s, exc, "that output is incomplete")
            except Exception as exc:  # noqa: BLE001 - the others' data must still be written
                self._lose(s, exc, "that output may be incomplete")
            except BaseException as exc:  # noqa: BLE001 - Ctrl-C while closing: close the rest first
                interrupt = interrupt or exc
        self.sinks = []
        if interrupt:
            raise interrupt
        if (self.lost or self.broken_pipe) and not status:
            status = LOST_OUTPUT_EXIT
        return status


@dataclass
class Live:
    """One run of the loop.  `reason` says why it ended: deadline, signal, command, pids or input."""

    windows: Windows
    sinks: Sinks
    schedule: Schedule
    signals: Any                                   # runtime.signals.Signals
    child: int | None = None                        # the traced command's pid: its exit ends the run
    tree: Any = None                               # runtime.cmdtree.CommandTree: what ending the command signals
    pidfds: list[int] = field(default_factory=list)  # --pid targets: the run ends when all have exited
    control: Any = None                            # runtime.control.ControlSocket: markers
    inputs: dict[int, Callable[[], bool]] = field(default_factory=dict)  # fd -> handler; True ends the run
    final: bool = True                             # close a "final" window at the end
    # runtime.wbwait.WritebackWait: once the traced processes have exited, the write-back of what they left
    # dirty is waited for (bounded) before the final window, which carries what was left unwritten
    after_exit: Any = None
    reason: str = ""
    end_at: float | None = None                    # the deadline (time.monotonic) the loop last had
    slices: SliceFolder = field(default_factory=SliceFolder)     # a window's slices around nested ones, as one

    def _hand_on(self, window: Any, continues: bool = False) -> None:
        for d in self.slices.add(window, continues):
            self.sinks.on_dump(d)

    def emit(self, kind: str, label: str | None = None) -> None:
        self._hand_on(self.windows.build(self.windows.cut(), kind, label))

    def take_markers(self) -> None:
        """Each queued marker closes a window carrying its label, handed on at once (a slice of a window
        around a nested one: once the window ends, tracer.model.slices)."""
        for m in self.control.receive():
            cut = self.windows.cut()
            self.control.ack(m)      # the window is closed: the sender's next I/O falls in the next one
            self._hand_on(self.windows.build(cut, "marker", m.label, m.sections(), began=m.began,
                                             manual=m.manual, owner=m.owner()), m.continues)

    def run(self) -> int:
        """Until the end; then the last markers and the final window.  Returns the command's exit status (or 0)."""
        self.windows.start()
        status = self._loop()
        if self.control:     # markers sent just before the command exited are still queued
            self.take_markers()
        sections: tuple = ()
        if self.after_exit is not None and self.reason in ("command", "pids"):
            sections = (self.after_exit.run(self.signals, self.end_at, on_report=lambda: self.emit("interval")),)
        if self.final:
            self._hand_on(self.windows.build(self.windows.cut(final=True), "final", sections=sections))
        for d in self.slices.flush():       # no final window (top, serve): the held ones still go on
            self.sinks.on_dump(d)
        return status

    def _signal_tree(self, sig: int) -> None:
        """`sig` to the command and everything it started (to the command alone without a tree)."""
        if self.tree is not None:
            self.tree.signal(sig, command=True)     # not reaped yet: its pid is still its own
        else:
            os.kill(self.child, sig)

    def _end(self, reason: str, status: int = 0) -> int:
        self.reason = reason
        return status

    def _loop(self) -> int:
        sched, sig, child = self.schedule, self.signals, self.child
        start = time.monotonic()
        end = self.end_at = sched.deadline(start)
        next_tick = start + sched.interval if sched.interval else None
        alive = set(self.pidfds)
        stopping = ""           # why the command was asked to end: "signal" or "deadline"; "" while it runs
        kill_at: float | None = None    # a second signal: SIGKILL then, if the command is still there
        while True:
            now = time.monotonic()
            timeout = wait_until(now, next_tick, end, kill_at)
            if stopping:        # the command's pidfd wakes us when it exits; this is only a backstop
                timeout = STOP_POLL_S if timeout is None else min(timeout, STOP_POLL_S)
            listen = [sig.r, *alive, *self.inputs] + ([self.control.fileno()] if self.control else [])
            ready, _, _ = select.select(listen, [], [], 0 if sig.pending else timeout)
            alive -= set(ready)
            if self.control and self.control.fileno() in ready:  # before the exit checks: no marker left behind
                self.take_markers()
            for fd in ready:
                if fd in self.inputs and self.inputs[fd]():
                    return self._end("input")
            if child is not None:
                done, st = os.waitpid(child, os.WNOHANG)
                if done:
                    return self._end("deadline" if stopping == "deadline" else
                                     "signal" if kill_at is not None else "command", exit_status(st))
            for s in sig.take():
                if s == signal.SIGUSR1:   # a report now, as an interval
                    self.emit("interval")
                    continue
                if child is None:
                    return self._end("signal")
                if not stopping:
                    # the command decides when we end: it gets our signal, and we wait for it
                    stopping = "signal"
                    if not _terminal_sent(s, child):
                        os.kill(child, s)
                elif kill_at is None:
                    # asked again: the command is ended (SIGTERM, SIGKILL after a grace), not left running
                    self._signal_tree(signal.SIGTERM)
                    kill_at = time.monotonic() + KILL_GRACE_S
                else:
                    self._signal_tree(signal.SIGKILL)
            if self.pidfds and child is None and not alive:
                return self._end("pids")       # every --pid target has exited
            now = time.monotonic()
            if kill_at is not None and now >= kill_at:
                self._signal_tree(signal.SIGKILL)
                kill_at = float("inf")      # killed: only its exit is awaited now
            if interval_due(now, next_tick, end):
                self.emit("interval")
                next_tick = next_tick_after(next_tick, now, sched.interval)
            if end is not None and now >= end:
                if child is None:
                    return self._end("deadline")
                # the command and all it started get SIGTERM, and we wait for the command (a signal then
                # ends it for good); what outlives it is ended as the run closes (CommandTree.end)
                if not stopping:
                    self._signal_tree(signal.SIGTERM)
                    stopping = "deadline"
                end = next_tick = None


# how often a loop waiting for the command to exit looks, should its pidfd not be listened to
STOP_POLL_S = 0.25


def _terminal_sent(sig: int, child: int) -> bool:
    """SIGINT that the terminal sent the command as well (Ctrl-C goes to its whole foreground process group):
    not forwarded, or the command would see two.  A SIGINT from kill(1) then reaches us only; SIGTERM never
    comes from a terminal."""
    if sig != signal.SIGINT:
        return False
    for fd in (0, 1, 2):
        try:
            if os.isatty(fd):
                return os.tcgetpgrp(fd) == os.getpgid(child)
        except OSError:
            continue
    return False
