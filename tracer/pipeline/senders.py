"""Per-sender windows: several training loops marking one trace (ranks under a launcher, two jobs).

One training loop (the usual case): its markers cut every traced process's
I/O, as a marker always has, and this stage passes each window through.

Several: each sender's windows are its own.  This stage starts once a
marker says its rank (tracer.marker.set_rank, $RANK: torchrun's) or a
second training loop's marker is taken, and from then on:

- a training loop's marker closes a dump of *its* processes only: the
  sender and its descendants (its DataLoader workers), since its previous
  marker; the dump carries Owner(pid, rank) and is named "rank 1: epoch 2"
  (pid instead of rank for a sender that gave none);
- a process belongs to the nearest sender among itself and its ancestors;
  the I/O of processes that belong to none (the launcher, its resource
  tracker, a system-wide tracer's other processes), and each cut's
  disk-wide figures (coverage, dropped events), are kept for the next
  interval dump, `iotrace mark` (a person's mark) or the final dump, which
  close every sender's window and take all that is left;
- so each request is in exactly one dump: the dumps of a run add up to the
  whole run, as before.

How: every event drains the sources at once (a cut, one Dump of everyone's
I/O).  Cuts are kept while some of their I/O is unclaimed; a sender's
marker takes its processes' series, rows and files out of every kept cut
its window spans (the cuts since its previous marker) and merges them; its
dump's length is the sum of those cuts', its window's own.  Kept cuts whose
remaining I/O the same senders have claimed from are merged into one, so
what is kept is bounded by the number of senders, not of markers.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from tracer.model.dump import Dump, DumpMerger
from tracer.model.files import Files
from tracer.model.sections import Owner, Tasks
from tracer.sources.proctree import stat_of

MAX_DEPTH = 64          # ancestors walked to find a process's sender
MAX_PARENTS = 100_000   # pid -> ppid entries remembered (forgotten all at once past it)


@dataclass
class _Cut:
    """A cut's I/O not yet claimed, and the senders whose windows took their part of it already."""

    dump: Dump
    taken: frozenset[int] = field(default_factory=frozenset)


class SenderWindows:
    """The per-sender stage of tracer.pipeline.windows.DumpWindows (see the module docstring).

    `parent_of(pid)`: the pid's parent, for processes the dumps' rows do not
    name (default: /proc; None when it is gone).
    """

    def __init__(self, parent_of=None):
        self.parent_of = parent_of or _proc_parent
        self.senders: dict[int, Owner] = {}     # pid -> the sender, as its last marker said
        self.parents: dict[int, int] = {}
        self.cuts: list[_Cut] = []
        self.on = False

    def route(self, d: Dump, kind: str, owner: Owner | None) -> Dump:
        """The dump to hand on for cut `d`, closed by a `kind` event; `owner`: the training loop whose marker
        closed it (None: an interval, the final dump, a person's mark)."""
        if owner is not None:
            self.senders[owner.pid] = owner
            self.on = self.on or owner.rank is not None or len(self.senders) > 1
        if not self.on:
            return d
        self._learn(d)
        self.cuts.append(_Cut(d))
        if owner is None:
            out = self._take_all(d, kind)
        else:
            out = self._take(owner, d, kind)
            out.owner = owner
        self._compact()
        return out

    # ---- who owns a process -------------------------------------------------------

    def _learn(self, d: Dump) -> None:
        if len(self.parents) > MAX_PARENTS:
            self.parents.clear()
        if d.tasks is not None:
            for r in d.tasks.rows:
                if r.ppid:
                    self.parents[r.pid] = r.ppid

    def owner_of(self, pid: int) -> int | None:
        """The pid of the nearest sender among `pid` and its ancestors, or None."""
        p = pid
        for _ in range(MAX_DEPTH):
            if p in self.senders:
                return p
            parent = self.parents.get(p)
            if parent is None:
                parent = self.parent_of(p)
                if parent is None:
                    return None
                self.parents[p] = parent
            if parent in (0, p):
                return None
            p = parent
        return None

    # ---- taking a sender's part out of the kept cuts ------------------------------

    def _take(self, owner: Owner, last: Dump, kind: str) -> Dump:
        merger = DumpMerger()
        for c in self.cuts:
            if owner.pid in c.taken:
                continue
            mine, rest = self._split(c.dump, owner.pid)
            merger.add(mine)
            c.dump, c.taken = rest, c.taken | {owner.pid}
        return merger.result(kind=kind, label=last.label)

    def _take_all(self, last: Dump, kind: str) -> Dump:
        merger = DumpMerger()
        for c in self.cuts:
            merger.add(c.dump)
        self.cuts = []
        out = merger.result(kind=kind, label=last.label)
        out.iostat = last.iostat
        return out

    def _split(self, d: Dump, pid: int) -> tuple[Dump, Dump]:
        """(the part of `d` that is sender `pid`'s processes', the rest): series, task rows and file rows by
        their process; the disk-wide figures (coverage, drops, events) stay with the rest."""
        def mine(p: int) -> bool:
            return self.owner_of(p) == pid

        ours = [s for s in d.series if mine(s.tgid or s.pid)]
        theirs = [s for s in d.series if not mine(s.tgid or s.pid)]
        part = Dump(kind=d.kind, label=d.label, start=d.start, end=d.end, host=d.host, kernel=d.kernel,
                    series=ours, window_s=d.window_s, attach=d.attach, start_event=d.start_event,
                    bio_devices=d.bio_devices, tasks_sources=d.tasks_sources,
                    submitted=[s for s in d.submitted if mine(s.tgid or s.pid)])
        rest = replace(d, series=theirs, submitted=[s for s in d.submitted if not mine(s.tgid or s.pid)])
        if d.tasks is not None:
            part.tasks = Tasks([r for r in d.tasks.rows if mine(r.pid)])
            rest.tasks = Tasks([r for r in d.tasks.rows if not mine(r.pid)])
        if d.files is not None:
            # the row of the files past the top ones has no process: it stays with the rest
            part.files = Files([r for r in d.files.rows if r.pid and mine(r.pid)])
            rest.files = Files([r for r in d.files.rows if not (r.pid and mine(r.pid))])
        return part, rest

    def _compact(self) -> None:
        """Merge neighbouring kept cuts that the same senders took from: their remaining I/O is claimed alike."""
        out: list[_Cut] = []
        for c in self.cuts:
            if out and out[-1].taken == c.taken:
                merger = DumpMerger()
                merger.add(out[-1].dump)
                merger.add(c.dump)
                out[-1].dump = merger.result(kind=c.dump.kind)
            else:
                out.append(c)
        self.cuts = out


def _proc_parent(pid: int) -> int | None:
    try:
        return stat_of(pid).ppid
    except (OSError, ValueError):
        return None
