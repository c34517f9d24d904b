"""The pipeline: sources drained at one instant (a cut), then turned into a window in declared stages.

DumpWindows (trace, serve, top): the BPF probe and, unless --no-tasks, the
per-process tracer; a window is a tracer.model.dump.Dump built from both
(tracer.pipeline.aggregate.build_dump), then, in order:
  0. with --cgroup, the per-process rows of the cgroup's processes only (CgroupRows);
  1. containers from cgroup ids (tracer.sources.cgroups);
  2. with --csv or --alert, iostat's rows of the same window (`Dump.iostat`:
     the probe's own /proc/diskstats reads at the window's edges, over the
     dump's duration, so both sides cover one span);
  3. with several training loops marking, the window of the one whose
     marker closed it (tracer.pipeline.senders.SenderWindows: its own
     processes' I/O since its last marker; the rest is kept for the next
     window that closes them all);
  4. marker fields (label, loop timing), whether the marker's window began
     before the tracer attached (before_attach, below) and, on the final
     window, what the sources say about themselves (BPF program costs, pid
     filter size);
  5. the --alert checks (tracer.pipeline.alerts.AlertCheck), so each JSON
     line carries its own alerts.
Before the attach: the tracer's first window begins when it attached (for
--pid, once the filters hold the whole tree).  A marker dump whose window
began earlier, as its marker says ("began", the sender's CLOCK_MONOTONIC),
holds only the part after that: it carries BeforeAttach(by how much).  A
training loop's marker that does not say when its window began (an older
tracer.marker's) closing the first window of a tracer that attached to
running processes (`attached`: --pid or every process, not a COMMAND, which
starts inside the trace) closed the stretch since its last marker, which
came before the tracer: BeforeAttach(None).  A person's `iotrace mark`
("manual") closes the stretch since the trace began, whole.
DiskWindows (--diskstats): /proc/diskstats and /proc/PID/io samplers; a
window is a Dump with no series and its `disks` (tracer.model.diskstats.
Diskstats), then the --alert stage.
"""

from __future__ import annotations

import platform
import socket
from datetime import datetime

from tracer.model.diskstats import Diskstats, window
from tracer.model.dump import Dump, duration_of
from tracer.model.files import fill_containers
from tracer.model.sections import (
    BeforeAttach,
    BpfPrograms,
    Owner,
    Section,
    Tasks,
    TasksSources,
    TracedPids,
    Unavailable,
)
from tracer.pipeline.aggregate import Clock, WindowNames, build_dump
from tracer.pipeline.senders import SenderWindows
from tracer.sources.tasks import UNAVAILABLE


def unavailable(probe_missing: dict[str, str], tasks_sources: dict[str, str] | None) -> dict[str, str]:
    """Everything the run's sources lack, as said at start and in every dump's "unavailable": the block-layer
    probe's ({source: why}, tracer.sources.probe.unavailable), then the per-process rows' sources the
    kernel has not ("tasks.<counter group>"; with --tasks the page-cache misses are not counted by design,
    as reads are timed at the syscalls: not a lack)."""
    out = dict(probe_missing)
    syscalls = (tasks_sources or {}).get("reads", "").startswith("syscalls:")
    for name, src in (tasks_sources or {}).items():
        if src.startswith(UNAVAILABLE) and not (syscalls and name == "cache"):
            out[f"tasks.{name}"] = src.removeprefix(UNAVAILABLE).lstrip(": ")
    return out


class DumpWindows:
    """`probe` (tracer.sources.probe.Probe) and `tasks` (tracer.sources.tasks.TaskTracer or None) → Dumps."""

    def __init__(self, probe, tasks=None, alerts=None, containers: bool = True, traced: bool = False,
                 iostat: bool = False, devices: list[str] | None = None, attached: bool = False,
                 cgroup: str | None = None):
        self.probe = probe
        self.tasks = tasks
        self.alerts = alerts            # AlertCheck or None
        self.containers = containers
        self.traced = traced            # a pid filter is on: the final dump says how many pids it held
        self.iostat = iostat or alerts is not None      # sample /proc/diskstats per window (--csv, --alert)
        self.devices = devices          # whose rows: these disks, or None for every whole disk
        self.sampler = None
        self.clock = Clock()
        self.attached = attached        # the traced processes ran before the trace (see the module docstring)
        self.first_ns: int | None = None    # when the first window began (CLOCK_MONOTONIC): the attach
        # --cgroup (its path as /proc/PID/cgroup names it): the kernel filters the requests, this the rows
        self.cgroup = CgroupRows(cgroup) if cgroup is not None else None
        # in every dump, {} included: a source named there is missing, not zero
        self.unavailable = Unavailable.of(unavailable(getattr(probe, "unavailable", {}),
                                                      tasks.sources if tasks is not None else None))
        self.senders = SenderWindows()
        # the windows built so far: a later write-back names the one that dirtied its data by these
        self.names = WindowNames()

    def start(self) -> None:
        """The diskstats baseline, when the first window begins."""
        if self.iostat:
            from tracer.sources.diskstats import DiskSampler

            self.sampler = DiskSampler(self.devices)

    def cut(self, final: bool = False):
        """Close the window on both BPF objects: (raw interval, task rows or None, their drops, final).

        One after the other, the per-process counters first: a read's
        request completes before the read returns (and its I/O wait ends), so
        whatever happens between the two drains puts a process's block I/O in
        this window and its counters in the next, never the reverse.  serve
        counts a process's counters under its own labels only once its block
        I/O has earned them (sinks.taskmetrics); the other order sent every
        counter of a reader that ran between the two drains (under load, a
        drain can take a few hundred ms) to comm="other" for good.
        """
        if self.tasks is None:
            return self.probe.drain(final=final), None, None, final
        tasks = self.tasks.drain(final)
        dropped = self.tasks.dropped()
        return self.probe.drain(final=final), tasks, dropped, final

    def build(self, cut, kind: str, label: str | None = None, sections: tuple[Section, ...] = (),
              began: float | None = None, manual: bool = False, owner: Owner | None = None):
        """The window of `cut`; a marker's: its `sections`, `began` (when its window opened) and `manual`
        (`iotrace mark`'s), for before_attach (see the module docstring); `owner`: the training loop that sent
        it, whose window it closes (stage 3)."""
        raw, tasks, dropped, final = cut
        first = self.first_ns is None
        if first:
            self.first_ns = raw.start_ns
        d = build_dump(raw, self.clock, kind, label=label, tasks=tasks, tasks_dropped=dropped, windows=self.names)
        self.names.add(raw.window, label, d.start)
        d.put(self.unavailable)
        if tasks is not None:
            d.put(TasksSources.of(self.tasks.sources))
            if self.cgroup is not None:
                self.cgroup.apply(d)
        if self.containers:
            from tracer.sources.cgroups import resolve_containers

            resolve_containers(d)
            fill_containers(d)
        if self.iostat:
            d.iostat = self.iostat_rows(raw, d)
        # several training loops: the window of the one that marked (tracer.pipeline.senders)
        d = self.senders.route(d, kind, owner)
        d.put(*sections)
        if kind == "marker":
            late = before_attach(self.first_ns, began, first and self.attached and not manual, raw.end_ns)
            if late is not None:
                d.put(late)
        if final:
            d.put(*self.final_sections())
        if self.alerts:
            self.alerts.apply(d)
        return d

    def iostat_rows(self, raw, d: Dump) -> list:
        """iostat's rows of the dump's own window: the probe's /proc/diskstats reads at its edges, over its
        duration; a sample of our own where the probe read none (its first sample starts once the loop
        runs, after the programs load: up to a second into the first window)."""
        start, end = getattr(raw, "diskstats_start", None), getattr(raw, "diskstats_end", None)
        if start is None or end is None:
            return self.sampler.sample() if self.sampler else []
        if self.sampler:
            self.sampler.sample()       # keeps its baseline at this edge, for a window the probe misses
        return edge_rows(start, end, duration_of(d), self.devices)

    def final_sections(self) -> list[Section]:
        costs = self.probe.program_costs()
        if self.tasks:
            costs.update({f"tasks:{name}": cost for name, cost in self.tasks.program_costs().items()})
        out: list[Section] = [BpfPrograms(costs)]
        if self.traced:    # the pid filter's size at the end: flat over a long run
            out.append(TracedPids(len(self.probe.traced_pids())))
        return out


def before_attach(attach_ns: int, began: float | None, first_of_attached: bool, now_ns: int) -> BeforeAttach | None:
    """Whether a marker's window began before the tracer attached at `attach_ns` (CLOCK_MONOTONIC), and by
    how much: by its `began` (seconds, the same clock; one after `now_ns` is no time and is not believed),
    else only when it is the first window of a tracer that attached to running processes (how long: unknown)."""
    if began is not None and began * 1e9 <= now_ns:
        late_ns = attach_ns - began * 1e9
        return BeforeAttach(round(late_ns / 1e9, 3)) if late_ns > 0 else None
    return BeforeAttach(None) if first_of_attached else None


class CgroupRows:
    """--cgroup on the per-process rows: a dump keeps the rows of processes in the cgroup or below it.

    The per-process tracer counts every process (its BPF filter knows pids, not
    cgroups); each row's process is placed by its /proc/PID/cgroup at the cut
    (`cgroup_of`), so a process moved in or out counts where it is now.  One
    gone by then is placed where it was last seen, and one whose requests the
    window recorded (the kernel's cgroup filter let them through) is inside.
    A process that came and went between two cuts without block I/O cannot be
    placed, and is left out.
    """

    def __init__(self, path: str, cgroup_of=None):
        from tracer.sources import cgroups

        self.path = path
        self.cgroup_of = cgroup_of or cgroups.cgroup_of
        self.within = cgroups.within
        self.known: dict[int, bool] = {}    # pid -> inside, when last placed (while it lives)

    def apply(self, d: Dump) -> None:
        if d.tasks is None:
            return
        submitted = {s.tgid or s.pid for s in d.series}
        keep = []
        for r in d.tasks.rows:
            where = self.cgroup_of(r.pid)
            if where is not None:
                inside = self.within(where, self.path)
            else:
                inside = not r.started and self.known.get(r.pid, False)
            inside = inside or r.pid in submitted
            if r.exited:
                self.known.pop(r.pid, None)
            else:
                self.known[r.pid] = inside
            if inside:
                keep.append(r)
        d.tasks = Tasks(keep)


class DiskWindows:
    """`disks` (DiskSampler) and `procs` (ProcSampler) → Dumps with `disks`; devices shown: every one given
    with --dev (`every_device`), else those that did I/O in the window."""

    def __init__(self, disks, procs, every_device: bool, alerts=None):
        self.disks = disks
        self.procs = procs
        self.every_device = every_device
        self.alerts = alerts
        self.started = self.last = datetime.now().astimezone()

    def start(self) -> None:
        pass

    def cut(self, final: bool = False):
        rows = self.disks.sample()
        end = datetime.now().astimezone()
        cut = (rows, self.procs.sample(), self.last, end,
               rows[0].seconds if rows else (end - self.last).total_seconds())
        self.last = end
        return cut

    def build(self, cut, kind: str, label: str | None = None, sections: tuple[Section, ...] = (),
              began: float | None = None, manual: bool = False, owner: Owner | None = None) -> Dump:
        rows, procs, start, end, seconds = cut
        d = disk_dump(kind, start, end, seconds, self._shown(rows), procs, self.procs.unreadable)
        if self.alerts:
            self.alerts.apply(d)
        return d

    def whole(self) -> Dump:
        """The whole run as one window, for the last table."""
        return disk_dump("final", self.started, self.last, self.disks.last[0] - self.disks.first[0],
                         self._shown(self.disks.whole()), self.procs.whole(), self.procs.unreadable)

    def _shown(self, rows: list) -> list:
        return rows if self.every_device else [r for r in rows if r.active]


def disk_dump(kind: str, start: datetime, end: datetime, seconds: float, rows: list, procs: list,
              unreadable: int) -> Dump:
    """A --diskstats window: sampler rows (tracer.model.diskstats.IostatRow) and processes (ProcBytes)."""
    return Dump(kind=kind, start=start, end=end, host=socket.gethostname(), kernel=platform.release(),
                series=[], window_s=seconds,      # the window as sampled, not end - start
                disks=Diskstats([r.row() for r in rows], list(procs), unreadable))


def edge_rows(start: dict, end: dict, seconds: float, names: list[str] | None) -> list:
    """iostat rows (tracer.model.diskstats.IostatRow) of `names` (None: every whole disk) between two
    /proc/diskstats reads ({name: DiskCounters}) `seconds` apart; a disk absent from `end` has none."""
    if names is None:
        from tracer.sources.devices import whole_disks

        disks = whole_disks()
        names = [n for n in end if n in disks]
    return [window(n, start.get(n), end[n], seconds) for n in names if n in end]
