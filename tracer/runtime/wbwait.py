"""The run's end after the traced processes exit: the write-back of what they dirtied, waited for or said.

A buffered write is on disk only when the kernel writes the dirty pages
back: its flusher, seconds later (vm.dirty_expire_centisecs, 30 s by
default), or a later sync.  When the traced COMMAND or --pid tree has
exited with pages of theirs still dirty, that write-back would come after
the trace ended and be in no figure (a checkpoint saved without fsync: a
sixth of a run's writes, issue 29).  So the trace goes on until it is
written (the BPF programs charge it to the dirtier, bpf/writeback.bpf.h),
for at most --wb-wait seconds (and never past -d); Ctrl-C or SIGTERM ends
the wait at once.  The final dump says what was left (UnwrittenAtExit),
and if any was, one line on stderr does too.

"Still unwritten" is the BPF programs' per-inode account (Probe.owed_bytes),
bounded by the machine's Dirty + Writeback (tracer.sources.meminfo), which
no process can exceed: an inode the kernel dropped without writing back
(a deleted file's dirty pages) then does not hold the wait up on a machine
with little else dirty.
"""

from __future__ import annotations

import select
import signal
import time
from collections.abc import Callable

from tracer.model.sections import UnwrittenAtExit

POLL_S = 0.1        # how often the owed bytes are read while waiting (a map walk of at most WB_INODES entries)
SETTLE_S = 0.25     # once nothing is owed: the last write-back's requests are submitted; their completions follow
MIB = 1 << 20


def pending(owed: int, machine: int | None) -> int:
    """Bytes still unwritten: the programs' count, never more than the machine's dirty + writeback."""
    if owed <= 0:
        return 0
    return owed if machine is None else min(owed, machine)


def why_stop(left: int, now: float, bound_at: float, deadline: float | None, signalled: bool) -> str | None:
    """Why the wait ends now (UnwrittenAtExit.ended), or None to wait on."""
    if left == 0:
        return "written"
    if signalled:
        return "signal"
    if deadline is not None and now >= deadline and deadline < bound_at:
        return "deadline"
    return "bound" if now >= bound_at else None


def end_line(u: UnwrittenAtExit, bound_s: float) -> str | None:
    """The one line for stderr when the run stopped with write-back of the traced processes still to come."""
    if u.bytes == 0:
        return None
    why = {"not waited": "--wb-wait 0: not waited for",
           "bound": f"waited {u.waited_s:.1f} s, the --wb-wait bound of {bound_s:g} s",
           "deadline": f"waited {u.waited_s:.1f} s, up to -d",
           "signal": f"the wait was ended by a signal after {u.waited_s:.1f} s"}[u.ended]
    return (f"iotrace: the traced processes left {u.bytes / MIB:.1f} MiB dirty that the kernel had not written "
            f"back; that write-back is not in these figures ({why})")


class WritebackWait:
    """At the run's end, once the traced processes have exited: `run()` waits (see the module docstring), then
    `section` is the final dump's UnwrittenAtExit and `line` the end line (None when all was written)."""

    def __init__(self, owed: Callable[[], int], bound_s: float, machine: Callable[[], int | None],
                 clock: Callable[[], float] = time.monotonic, say: Callable[[str], None] | None = None):
        self.owed, self.bound_s, self.machine, self.clock = owed, bound_s, machine, clock
        self.say = say or (lambda _line: None)
        self.section: UnwrittenAtExit | None = None

    def left(self) -> int:
        return pending(self.owed(), self.machine())

    def run(self, sig, deadline: float | None = None, on_report: Callable[[], None] | None = None) -> UnwrittenAtExit:
        """Wait; `sig`: tracer.runtime.signals.Signals (SIGUSR1 still asks for a report: `on_report`)."""
        start = self.clock()
        left = self.left()
        if left and self.bound_s > 0 and (deadline is None or start < deadline):
            self.say(f"iotrace: the traced processes have exited; waiting up to {self.bound_s:g} s for the "
                     f"write-back of the {left / MIB:.1f} MiB they left dirty (Ctrl-C ends the wait; --wb-wait)")
        ended = "written" if not left else "not waited" if self.bound_s <= 0 else None
        bound_at = start + self.bound_s
        signalled = False
        while ended is None:
            now = self.clock()
            ended = why_stop(left, now, bound_at, deadline, signalled)
            if ended is not None:
                break
            until = min(bound_at, deadline) if deadline is not None else bound_at
            ready, _, _ = select.select([sig.r], [], [], max(0.0, min(POLL_S, until - now)))
            for s in sig.take() if ready or sig.pending else ():
                if s == signal.SIGUSR1:
                    if on_report:
                        on_report()
                else:
                    signalled = True
            left = self.left()
            if left == 0 and not signalled:
                select.select([sig.r], [], [], SETTLE_S)
        self.section = UnwrittenAtExit(left, max(0.0, self.clock() - start), ended)
        return self.section

    @property
    def line(self) -> str | None:
        return end_line(self.section, self.bound_s) if self.section else None
