"""Matching the recorded events into one exact record per request.

Matching, per request (the semantics iotrace promises, done exactly):
  start       the start event iotrace uses (`start_event`): block_io_start
              (Linux 6.5+), or block_getrq before it, which fires for the
              same requests in the same place (right before
              blk_mq_bio_to_request) but names the bio: its bytes are
              nr_sector * 512, its dev is a partition's where the bio was
              sent to one (the tests trace whole disks, where it is the
              disk's, as at issue and completion); submitter context: its
              tgid, tid and comm; op from its rwbs: a leading F with 0
              bytes is a flush, else the op letter after an optional
              leading F: R/W/D = read, write, discard, anything else "other"
  issue       the last block_rq_issue of that (dev, sector); its bytes are
              the request's bytes left (back merges grow it before issue)
  complete    the block_rq_complete that brings the bytes left to 0; a
              partial one moves the request's sector on by nr_sector
  merged      block_rq_merge: folded into another request, not accounted
  frontmerge  block_bio_frontmerge: the request starting right after the
              bio now starts at the bio's sector
  requeue     block_rq_requeue: the request waits to be issued again (only
              used to tell which of two requests at one sector was issued)
  write-back  a request started by a thread between writeback_single_inode_start
              and writeback_single_inode of an inode (bdi name, ino) is that
              inode's last dirtier's (writeback_dirty_folio or _page, not by a thread
              writing back), unless the dirtier's process is the thread's own:
              Request.dirtier; the comparison charges it to the dirtier where
              the dirtier is in its scope (comparison.compare), marked wb
  excluded    the flush machinery's own "FF" requests; zero-byte
              completions matching no zero-byte request (the tail of a
              preflush/FUA data write)
Requests with the same (dev, sector) in flight together are matched first
in, first out (preferring an unissued request for an issue); such overlaps
are counted in ``Truth.notes`` since the tracepoints cannot tell them apart.

queue = issue - start, device = complete - issue, total = complete - start;
a zero-byte flush is never issued itself and has only ``total``.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Sequence
from dataclasses import dataclass

from tracer import contract
from tracer.sources import probe

from .events import DEFAULT_START, Event, Stamp

SECTOR = contract.load().const("SECTOR_SIZE")   # bytes per sector in the tracepoints' nr_sector


def op_of(rwbs: str, nbytes: int) -> str:
    """The op of a request from the rwbs at its start (see the module docstring)."""
    if rwbs.startswith("F") and nbytes == 0:
        return "flush"
    c = rwbs[1:2] if rwbs.startswith("F") else rwbs[:1]
    return {"R": "read", "W": "write", "D": "discard", "F": "flush"}.get(c, "other")


@dataclass(frozen=True)
class Request:
    """One accounted request, exactly."""

    tgid: int
    tid: int
    comm: str
    dev: int
    op: str
    rwbs: str
    sector: int          # where it started
    bytes: int           # bytes completed
    start_ns: int
    issue_ns: int | None  # None: never issued itself (a zero-byte flush)
    complete_ns: int
    # the BPF stamps of its start, last issue and completion (None: no stamp, or
    # never issued); the tuple is None when the events were not stamped
    stamps: tuple[Stamp | None, Stamp | None, Stamp | None] | None = None
    # (tgid, tid, comm) of the last dirtier of the inode its (flusher) thread was writing back, if any
    dirtier: tuple[int, int, str] | None = None
    wb: bool = False     # charged to its dirtier (comparison.compare)

    @property
    def queue_ns(self) -> int | None:
        return None if self.issue_ns is None else self.issue_ns - self.start_ns

    @property
    def device_ns(self) -> int | None:
        return None if self.issue_ns is None else self.complete_ns - self.issue_ns

    @property
    def total_ns(self) -> int:
        return self.complete_ns - self.start_ns

    def phase_ns(self, phase: str) -> int | None:
        return {"queue": self.queue_ns, "device": self.device_ns, "total": self.total_ns}[phase]

    @property
    def bpf_seen(self) -> bool:
        """Whether BPF programs ran for its start and its completion (always, if not stamped)."""
        return self.stamps is None or (self.stamps[0].ts is not None and self.stamps[2].ts is not None)

    @property
    def bpf_maybe(self) -> bool:
        """Not bpf_seen, but iotrace may have seen it: its start and completion have a stamp or a window."""
        return not self.bpf_seen and all(s is not None and s.bounds() is not None
                                         for s in (self.stamps[0], self.stamps[2]))

    def phase_bounds(self, phase: str) -> tuple[int, int, int] | None:
        """(value, low, high) of a phase as iotrace could have measured it; None if it has no such phase.

        With stamps, the value is taken between the before-stamps, and where
        a bracket was disturbed iotrace's stamp may lie anywhere in it (as in
        the window of an event the before-copy missed).
        """
        if self.stamps is None:
            v = self.phase_ns(phase)
            return None if v is None else (v, v, v)
        start, issue, complete = self.stamps
        a, b = {"queue": (start, issue), "device": (issue, complete), "total": (start, complete)}[phase]
        a, b = (None if s is None else s.bounds() for s in (a, b))
        if a is None or b is None:
            return None
        return b[0] - a[0], b[1] - a[2], b[2] - a[1]


class _Live:
    __slots__ = ("bio", "comm", "dev", "dirtier", "done", "issue_ns", "issue_stamp", "issued", "op", "remaining",
                 "rq",
                 "rwbs", "sector", "start_ns", "start_sector", "start_stamp", "tgid", "tid")

    def __init__(self, ev: Event):
        f = ev.f
        self.tgid = ev.tgid if ev.tgid is not None else ev.pid
        self.tid = ev.pid
        self.comm = f.get("comm", "")
        self.dev = f["dev"]
        self.rwbs = f["rwbs"]
        # block_io_start gives the request's bytes; block_getrq, the bio's sectors (the same, at that point)
        nbytes = f["bytes"] if "bytes" in f else f["nr_sector"] * SECTOR
        self.op = op_of(f["rwbs"], nbytes)
        self.sector = self.start_sector = f["sector"]
        self.start_ns = ev.ts
        self.start_stamp = ev.stamp
        self.rq = ev.stamp.rq if ev.stamp else 0
        self.bio = ev.stamp.bio if ev.stamp else 0     # a block_getrq start's bio (raw tracepoints)
        self.issue_ns: int | None = None
        self.issue_stamp: Stamp | None = None   # of the last issue a BPF program saw
        self.issued = False            # issued and not requeued since
        self.remaining = nbytes
        self.done = 0
        self.dirtier: tuple[int, int, str] | None = None


@dataclass
class Truth:
    """Everything the reference saw: finished requests, leftovers, bookkeeping counts."""

    requests: list[Request]
    in_flight: list[Request]        # started, never completed before stop (complete_ns = stop)
    forks: list[tuple[int, int, int]]  # (ts, parent tgid, child pid)
    notes: Counter                  # merged, front_merge, partial, internal_flush, flush_tail, ...
    devs: list[int]
    started_ns: int
    stopped_ns: int
    events: int = 0
    start_event: str = DEFAULT_START   # the event the requests were started on

    @classmethod
    def from_events(cls, events: Sequence[Event], devs: Sequence[int] = (), started_ns: int = 0,
                    stopped_ns: int = 0, start_event: str = DEFAULT_START) -> Truth:
        pending: dict[tuple[int, int], list[_Live]] = defaultdict(list)
        done: list[Request] = []
        forks = []
        notes: Counter = Counter()
        recent_tail_keys: Counter = Counter()   # (dev, sector) of preflush/FUA data writes just completed
        dirtiers: dict[tuple[str, int], tuple[int, int, str]] = {}     # (bdi, ino) -> last dirtier (tgid, tid, comm)
        writing: dict[int, tuple[int, int, str]] = {}   # thread -> dirtier of the inode it is writing back

        def find(key, zero: bool, prefer_unissued: bool = False, stamp: Stamp | None = None) -> _Live | None:
            if stamp is not None and stamp.rq:
                # the request's own address, where the stamps carry it: exact
                same = [r for r in pending.get(key, ()) if r.rq == stamp.rq]
                if not same and (stamp.bio or stamp.bio_next):
                    # a start that named its bio (block_getrq): the issued request's first bio, or the
                    # one after it where a front merge put another first
                    same = [r for r in pending.get(key, ()) if not r.rq and r.bio
                            and r.bio in (stamp.bio, stamp.bio_next)]
                if same:
                    if len(pending[key]) > 1:
                        notes["same_sector_by_request"] += 1
                    return same[0]
            cands = [r for r in pending.get(key, ()) if (r.remaining == 0) == zero]
            if len(cands) > 1:
                notes["same_sector_overlap"] += 1
            if prefer_unissued:
                for r in cands:
                    if not r.issued:
                        return r
            return cands[0] if cands else None

        def drop(key, r: _Live) -> None:
            lst = pending[key]
            lst.remove(r)
            if not lst:
                del pending[key]

        for ev in events:
            f = ev.f
            if ev.name == "sched_process_fork":
                forks.append((ev.ts, ev.tgid if ev.tgid is not None else ev.pid, f["child_pid"]))
                continue
            if ev.name.startswith("writeback_"):
                tgid = ev.tgid if ev.tgid is not None else ev.pid
                if ev.name in probe.DIRTY_EVENTS:
                    if ev.pid not in writing:     # a flusher dirtying as it writes back is no writer
                        dirtiers[(f["name"], f["ino"])] = (tgid, ev.pid, f.get("comm", ""))
                elif ev.name == "writeback_single_inode_start":
                    writing.pop(ev.pid, None)
                    d = dirtiers.get((f["name"], f["ino"]))
                    if d is not None and d[0] != tgid:
                        writing[ev.pid] = d
                else:
                    writing.pop(ev.pid, None)
                continue
            if devs and f["dev"] not in devs:
                continue
            if ev.tgid is None and ev.name == start_event:
                notes["unknown_tgid"] += 1
            if ev.name == start_event:
                r = _Live(ev)
                r.dirtier = writing.get(ev.pid)
                pending[(r.dev, r.sector)].append(r)
            elif ev.name == "block_rq_issue":
                if f["rwbs"].startswith("FF"):
                    notes["internal_flush"] += 1
                    continue
                key = (f["dev"], f["sector"])
                r = find(key, f["bytes"] == 0, prefer_unissued=True, stamp=ev.stamp)
                if r is None:
                    notes["issue_no_start"] += 1
                    continue
                if r.issued:
                    notes["issue_of_issued"] += 1
                r.issue_ns = ev.ts
                if ev.stamp is not None and ev.stamp.bounds() is not None:
                    r.issue_stamp = ev.stamp
                if not r.rq and ev.stamp is not None:
                    # a start that named no request (block_getrq gives the bio): from its issue on, the
                    # request's address tells it from another at the same sector
                    r.rq = ev.stamp.rq
                r.issued = True
                r.remaining = f["bytes"]
            elif ev.name == "block_rq_complete":
                if f["rwbs"].startswith("FF"):
                    continue
                nbytes = f["nr_sector"] * SECTOR
                key = (f["dev"], f["sector"])
                r = find(key, nbytes == 0, stamp=ev.stamp)
                if r is None:
                    if nbytes == 0:
                        notes["flush_tail"] += 1
                        if recent_tail_keys[key]:
                            recent_tail_keys[key] -= 1
                    else:
                        notes["complete_no_start"] += 1
                    continue
                if nbytes == 0 and recent_tail_keys[key]:
                    # a zero-byte flush and the tail of a preflush/FUA write at the same sector
                    notes["ambiguous_zero_byte_completion"] += 1
                r.done += nbytes
                if nbytes and nbytes < r.remaining:
                    notes["partial"] += 1
                    r.remaining -= nbytes
                    drop(key, r)
                    r.sector = f["sector"] + f["nr_sector"]
                    pending[(r.dev, r.sector)].append(r)
                    continue
                drop(key, r)
                if nbytes and "F" in r.rwbs:
                    recent_tail_keys[key] += 1
                stamps = None if ev.stamp is None else (r.start_stamp, r.issue_stamp, ev.stamp)
                done.append(Request(r.tgid, r.tid, r.comm, r.dev, r.op, r.rwbs, r.start_sector, r.done,
                                    r.start_ns, r.issue_ns, ev.ts, stamps, r.dirtier))
            elif ev.name == "block_rq_merge":
                key = (f["dev"], f["sector"])
                r = find(key, f["bytes"] == 0, prefer_unissued=True)
                if r is None:
                    notes["merge_no_start"] += 1
                    continue
                notes["merged"] += 1
                drop(key, r)
            elif ev.name == "block_bio_frontmerge":
                key = (f["dev"], f["sector"] + f["nr_sector"])
                r = find(key, False, prefer_unissued=True)
                if r is None:
                    notes["front_merge_no_start"] += 1
                    continue
                notes["front_merge"] += 1
                drop(key, r)
                r.sector = f["sector"]
                pending[(r.dev, r.sector)].append(r)
            elif ev.name == "block_rq_requeue":
                issued = [r for r in pending.get((f["dev"], f["sector"]), ()) if r.issued]
                if issued:
                    notes["requeue"] += 1
                    issued[0].issued = False
        left = [Request(r.tgid, r.tid, r.comm, r.dev, r.op, r.rwbs, r.start_sector, r.done, r.start_ns,
                        r.issue_ns, stopped_ns, dirtier=r.dirtier) for lst in pending.values() for r in lst]
        return cls(done, left, forks, notes, list(devs), started_ns, stopped_ns, len(events), start_event)

    def descendants(self, root_tgid: int) -> set[int]:
        """root_tgid and every process (and thread id) forked from it or its descendants, as recorded."""
        out = {root_tgid}
        for _, parent, child in sorted(self.forks):
            if parent in out:
                out.add(child)
        return out
