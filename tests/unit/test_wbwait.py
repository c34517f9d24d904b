"""The wait for the traced processes' write-back at the run's end (tracer.runtime.wbwait, tracer.sources.meminfo):
what counts as unwritten, why the wait stops, the end line, and the wait itself over a fake clock and real
signals' fd."""

from __future__ import annotations

import os
import signal

from tracer.model.sections import UnwrittenAtExit
from tracer.runtime import wbwait
from tracer.runtime.signals import Signals
from tracer.runtime.wbwait import WritebackWait, end_line, pending, why_stop
from tracer.sources.meminfo import unwritten_bytes

MIB = 1 << 20


def test_unwritten_is_the_programs_count_bounded_by_the_machines_dirty_pages():
    assert pending(32 * MIB, 40 * MIB) == 32 * MIB
    assert pending(32 * MIB, 4096) == 4096          # a deleted file's dropped pages do not hold the wait
    assert pending(32 * MIB, None) == 32 * MIB      # no /proc/meminfo: the programs' count alone
    assert pending(0, 40 * MIB) == 0


def test_meminfo_dirty_and_writeback_are_summed_and_a_bad_text_is_unknown():
    text = "MemTotal:  100 kB\nDirty:     1016 kB\nWriteback:    4 kB\nWritebackTmp: 9 kB\n"
    assert unwritten_bytes(text) == 1020 * 1024
    assert unwritten_bytes("Dirty: 5 kB\n") is None
    assert unwritten_bytes("Dirty: x kB\nWriteback: 0 kB\n") is None
    assert unwritten_bytes("Dirty: 5 MB\nWriteback: 0 kB\n") is None


def test_why_the_wait_stops():
    assert why_stop(0, 5.0, 30.0, None, True) == "written"        # all written wins, whatever else
    assert why_stop(MIB, 5.0, 30.0, None, True) == "signal"
    assert why_stop(MIB, 5.0, 30.0, None, False) is None
    assert why_stop(MIB, 30.0, 30.0, None, False) == "bound"
    assert why_stop(MIB, 12.0, 30.0, 12.0, False) == "deadline"   # -d came first
    assert why_stop(MIB, 30.0, 30.0, 40.0, False) == "bound"


def test_the_end_line_says_how_much_and_why_and_nothing_when_all_was_written():
    assert end_line(UnwrittenAtExit(0, 2.5, "written"), 30) is None
    line = end_line(UnwrittenAtExit(32 * MIB, 0.0, "not waited"), 0)
    assert "32.0 MiB" in line and "--wb-wait 0" in line and "\n" not in line
    assert "bound of 30 s" in end_line(UnwrittenAtExit(3 * MIB, 30.0, "bound"), 30)
    assert "signal" in end_line(UnwrittenAtExit(3 * MIB, 1.0, "signal"), 30)


class Clock:
    def __init__(self):
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


def waiter(owed, bound, clock, machine=lambda: None):
    said: list[str] = []
    return WritebackWait(owed, bound, machine, clock=clock, say=said.append), said


def test_the_wait_ends_when_the_owed_bytes_are_written(monkeypatch):
    monkeypatch.setattr(wbwait, "POLL_S", 0.0)
    monkeypatch.setattr(wbwait, "SETTLE_S", 0.0)
    clock, left = Clock(), [8 * MIB, 8 * MIB, 4 * MIB, 0]

    def owed():
        clock.t += 1.0
        return left.pop(0) if len(left) > 1 else left[0]

    w, said = waiter(owed, 30.0, clock)
    sig = Signals()
    try:
        u = w.run(sig)
    finally:
        sig.restore()
    assert (u.bytes, u.ended) == (0, "written") and 0 < u.waited_s < 30 and w.line is None
    assert len(said) == 1 and "8.0 MiB" in said[0]


def test_the_wait_stops_at_its_bound_or_not_at_all(monkeypatch):
    monkeypatch.setattr(wbwait, "POLL_S", 0.0)
    clock = Clock()

    def owed():
        clock.t += 2.0
        return 5 * MIB

    sig = Signals()
    try:
        u = waiter(owed, 10.0, clock)[0].run(sig)
        assert (u.bytes, u.ended) == (5 * MIB, "bound") and u.waited_s >= 10
        none, said = waiter(lambda: 5 * MIB, 0.0, clock)
        u = none.run(sig)
        assert (u.bytes, u.ended, u.waited_s, said) == (5 * MIB, "not waited", 0.0, [])
        assert "5.0 MiB" in none.line
    finally:
        sig.restore()


def test_sigterm_ends_the_wait_and_sigusr1_still_reports(monkeypatch):
    monkeypatch.setattr(wbwait, "POLL_S", 0.0)
    clock, reports, calls = Clock(), [], [0]

    def owed():
        calls[0] += 1
        if calls[0] == 2:
            os.kill(os.getpid(), signal.SIGUSR1)
        if calls[0] == 3:
            os.kill(os.getpid(), signal.SIGTERM)
        return 2 * MIB

    sig = Signals()
    try:
        u = waiter(owed, 30.0, clock)[0].run(sig, on_report=lambda: reports.append(1))
    finally:
        sig.restore()
    assert (u.bytes, u.ended, reports) == (2 * MIB, "signal", [1])
