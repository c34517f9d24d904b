"""The loss ledger of the request tracer: what the kernel did not show iotrace in a window, counted.

Owns every count of a window's `reasons` (RawInterval.reasons) and the
kernel's own counts it is checked against:
- the BPF programs' per-reason counters (the per-CPU array `reasons`, named
  by the contract's reasons), read as totals since load and handed over as
  the delta since the last window;
- the events the kernel skipped per program (recursion misses, through
  BpfObject.skipped), under the short name each program's skips are
  reported as (PROGRAMS: drop_skipped_<short>);
- stale slots of the in-flight table (`tags`, `inflight`): requests whose
  completion never reached the programs, found and counted once each as
  drop_lost_completion (the perf-event path every window, the raw path at
  the last one), with the heuristics that tell a lost request from a slow
  one (LOST_MIN_AGE_NS, an idle device, IOTRACE_STALE_NS);
- /proc/diskstats at each window's edges, what coverage is measured against.

It reads no recorded series or histograms (tracer.sources.drain does).
"""

from __future__ import annotations

import time
from collections.abc import Sequence

import numpy as np

from tracer import contract
from tracer.sources import devices
from tracer.sources.bpfobject import BpfObject
from tracer.sources.drain import read_array

# Each program by the short name its skipped events are reported under: "skipped_<name>"
PROGRAMS = {e.name: e.short for e in contract.load().events}
# Drop reasons found by user space rather than counted by the BPF programs (see Ledger.dropped): every
# program's events the kernel skipped, and (tracepoint path) completions found lost in the in-flight table
USER_DROPS = (*dict.fromkeys(f"skipped_{name}" for name in PROGRAMS.values()), "lost_completion")
# A request left in the in-flight table is taken for lost only this long after its start:
# long past any plug or scheduler delay on a device with nothing in flight
LOST_MIN_AGE_NS = 100_000_000


def read_diskstats() -> dict | None:
    """/proc/diskstats now, or None where unreadable."""
    try:
        return devices.read_diskstats()
    except (OSError, ValueError):
        return None


def reason_deltas(names: Sequence[str], totals: np.ndarray, seen: np.ndarray) -> dict[str, int]:
    """The BPF side's counts per reason since `seen` (both totals since load, in the order of `names`), with
    every USER_DROPS reason present as drop_*, 0 unless counted (lost_completion is counted by the BPF side
    too, on the raw path)."""
    reasons = {name: int(n) for name, n in zip(names, totals - seen, strict=True)}
    for reason in USER_DROPS:
        reasons.setdefault(f"drop_{reason}", 0)
    return reasons


def stale_slots(indices: Sequence[int], starts: Sequence[int], devs: Sequence[int], before_ns: int,
                idle: set[int], stale_ns: int) -> set[tuple[int, int]]:
    """(slot, start_ns) of the taken slots that are lost requests, as of `before_ns`: at least
    LOST_MIN_AGE_NS old, and their device idle or the slot older than `stale_ns`."""
    return {(i, start) for i, start, dev in zip(indices, starts, devs, strict=True)
            if start < before_ns - LOST_MIN_AGE_NS and (dev in idle or before_ns - start > stale_ns)}


def count_new(lost: set[tuple[int, int]], present: set[tuple[int, int]],
              seen: set[tuple[int, int]]) -> tuple[int, set[tuple[int, int]]]:
    """(how many of `lost` were not counted before, what is counted from now on): a slot stays counted
    while it is `present`, taken by the same request."""
    return len(lost - seen), (seen & present) | lost


class Ledger:
    """The dropped counts of each window of one loaded BpfObject of the request tracer."""

    def __init__(self, bpf: BpfObject, attach: str, reasons: Sequence[str], stale_ns: int):
        self.bpf, self.attach, self.names, self.stale_ns = bpf, attach, tuple(reasons), stale_ns
        self._reasons_seen = np.zeros(len(self.names), dtype=np.uint64)
        slots, groups = bpf["inflight"], bpf["tags"]
        # the tags map holds a group's tags in one value: read as rows of them, a row a group
        self._slot_buffers = (np.zeros(slots.max_entries, np.uint32),
                              np.zeros((groups.max_entries, slots.max_entries // groups.max_entries), np.uint64),
                              np.zeros(slots.max_entries, np.dtype(slots.Leaf)))
        self._lost_seen: set[tuple[int, int]] = set()    # (slot, start_ns) already counted lost
        self._diskstats: dict | None = None

    # -- /proc/diskstats at the windows' edges

    def open_window(self) -> None:
        """The first window starts now (diskstats read)."""
        self._diskstats = read_diskstats()

    def diskstats_window(self) -> tuple[dict | None, dict | None]:
        """(diskstats at the window's start, now); the next window starts now."""
        start, self._diskstats = self._diskstats, read_diskstats()
        return start, self._diskstats

    # -- the reasons of a window

    def reason_totals(self) -> np.ndarray:
        """Events per reason since load (per-CPU counters summed)."""
        return np.array(self.bpf.counters("reasons", len(self._reasons_seen)), dtype=np.uint64)

    def dropped(self, final: bool = False) -> dict[str, int]:
        """The window's events per reason, USER_DROPS (as drop_*) included; `final`: the last window."""
        totals = self.reason_totals()
        reasons = reason_deltas(self.names, totals, self._reasons_seen)
        self._reasons_seen = totals
        reasons.update(self.skipped())
        if self.attach == "tracepoint":
            reasons["drop_lost_completion"] += self.lost_completions(final)
        elif final:
            reasons["drop_lost_completion"] += self.lost_at_end()
        return reasons

    def skipped(self) -> dict[str, int]:
        """Events the kernel skipped since the last drain, per program: {"drop_skipped_<name>": n}.

        A program runs with a recursion guard, and the kernel skips (and
        counts, in the program's recursion_misses) an event that fires while
        the guard is held on that CPU: on raw tracepoints only while the same
        program runs there (one completion interrupting another's program);
        on perf-event tracepoints while any perf-event or kprobe program runs
        there, any tool's, or a task was preempted while a BPF map syscall
        held the same guard.  A skipped start or completion loses its
        request; a skipped issue its queue/device split.  The counts include
        events of processes and devices the filters would have left out: an
        upper bound.  On the tracepoint path skipped completions are left to
        lost_completions(), which also finds those lost without a count.
        """
        def short(event: str) -> str | None:
            name = PROGRAMS.get(event)
            return None if name is None or (name == "complete" and self.attach == "tracepoint") else name

        return {f"drop_skipped_{name}": n for name, n in self.bpf.skipped(short).items()}

    # -- stale slots of the in-flight table

    def taken_slots(self) -> tuple[np.ndarray, np.ndarray]:
        """(indices, slots) of the in-flight table's taken slots: a tag, and a life started that has not ended
        (a request object's slot keeps its tag between lives: bpf/core.bpf.h, the in-flight table)."""
        idx, tags, slots = self._slot_buffers
        lib = self.bpf.lib
        t = np.flatnonzero(read_array(self.bpf["tags"], idx, tags, lib).reshape(-1))
        if not len(t):
            return t, slots[:0]
        sl = read_array(self.bpf["inflight"], idx, slots, lib)[t]
        live = sl["life"] != sl["ended"]
        return t[live], sl[live]

    def lost_at_end(self) -> int:
        """Raw path, last drain: slots whose completion never came and whose request object was not
        reused since (a reuse counts them in the kernel).  The disk is only known at completion, so
        they are counted only when no disk has anything in flight, before and after the table is
        read; a slot under LOST_MIN_AGE_NS old may be a request still on its way."""
        def idle() -> bool:
            return all(devices.in_flight(dev) in (0, None) for dev in devices.whole_disks().values())

        before_ns = time.monotonic_ns()
        if not idle():
            return 0
        _, sl = self.taken_slots()
        old = sl["start_ns"] < before_ns - LOST_MIN_AGE_NS
        # a slot's lives not ended: the last, and any before it whose completion never came either
        lost = int((sl["life"][old] - sl["ended"][old]).astype(np.uint32).sum())
        return lost if lost and idle() else 0

    def lost_completions(self, final: bool = False) -> int:
        """Requests newly found to have completed without iotrace seeing it.

        Their slots stay taken: the kernel ran no block_rq_complete program
        for them, either skipping it as above (and counting a miss) or, now
        and then, losing it on its perf-event path without a trace (README,
        Dropped events).  A taken slot at least LOST_MIN_AGE_NS old is such a
        request when its device had nothing in flight both before and after
        the table was read, or when it is older than IOTRACE_STALE_NS.  Each
        is counted once; the BPF side reuses the slot once it is stale.
        """
        taken = self.taken_slots
        before_ns = time.monotonic_ns()
        t, sl = taken()
        old = sl["start_ns"] < before_ns - LOST_MIN_AGE_NS
        if final and not old.all():
            young = sl["start_ns"][~old]
            if any(devices.in_flight(int(d)) == 0 for d in set(sl["dev"][~old].tolist())):
                time.sleep(max(0, int(young.max()) + LOST_MIN_AGE_NS - before_ns) / 1e9)
                return self.lost_completions()
        devs = {int(d) for d in sl["dev"][old]}
        idle = {d for d in devs if devices.in_flight(d) == 0}
        if idle:
            t, sl = taken()     # anything started before the idle reading and still taken after it is lost
            idle &= {d for d in devs if devices.in_flight(d) == 0}
        present = set(zip(t.tolist(), sl["start_ns"].tolist(), strict=True))
        lost = stale_slots(t.tolist(), sl["start_ns"].tolist(), sl["dev"].tolist(), before_ns, idle, self.stale_ns)
        new, self._lost_seen = count_new(lost, present, self._lost_seen)
        return new
