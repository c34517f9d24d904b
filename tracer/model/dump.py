"""The dump: iotrace's unit of output, and the merges of dumps.

A dump covers one window of time (an interval, a labelled epoch, or the
final stretch of a run); dumps of one run cover disjoint windows, so
merging all of a file's dumps gives the whole run.  A trace-mode dump holds
BPF series (per process, device and op: counts, bytes, latency histograms);
a `--diskstats` one holds what /proc alone shows (Diskstats: iostat -x per
device, bytes per process) and no series.  Their file format, one JSON line
per dump, is tracer.codec.jsonl's.

Latencies are integer nanoseconds in the histograms; min, max and mean are
exact (kept by the kernel), the percentiles are read from the histograms
(within 0.4%).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace
from datetime import datetime

from tracer.errors import UserError
from tracer.model.diskstats import DiskRow, Diskstats, ProcBytes
from tracer.model.files import Files
from tracer.model.histogram import Histogram
from tracer.model.sections import (
    SECTIONS,
    Alerts,
    Attach,
    BeforeAttach,
    BioDevices,
    BpfPrograms,
    Coverage,
    Credit,
    Enclosing,
    Loop,
    Merger,
    Owner,
    Section,
    SenderPid,
    StartEvent,
    TaskMerger,
    TaskRow,
    Tasks,
    TasksSources,
    TracedPids,
    Unavailable,
    UnwrittenAtExit,
    VerdictSection,
    WindowSeq,
    WrittenBack,
)

PERCENTILES = (50.0, 90.0, 99.0, 99.9)
PCT_KEYS = ("p50", "p90", "p99", "p99.9")


@dataclass
class PhaseStats:
    """One latency phase of a series: the histogram plus exact totals (ns)."""

    hist: Histogram
    sum_ns: float = 0.0
    min_ns: int = 0
    max_ns: int = 0
    # summary_us(), once computed: reports and the JSON line both ask for it
    _summary: dict | None = field(default=None, repr=False, compare=False)

    @property
    def count(self) -> int:
        return self.hist.total

    def merge(self, other: PhaseStats) -> PhaseStats:
        if not other.count:
            return self
        if not self.count:
            return other
        return PhaseStats(self.hist.merge(other.hist), self.sum_ns + other.sum_ns,
                          min(self.min_ns, other.min_ns), max(self.max_ns, other.max_ns))

    def summary_us(self, pct=None) -> dict[str, float]:
        """min / mean / percentiles / max in microseconds; percentiles held within [min, max].

        `pct`: this histogram's PERCENTILES, when the caller computed many at
        once (see summarize).  The result is kept: a PhaseStats never changes.
        """
        if self._summary is not None:
            return self._summary
        n = self.count
        if not n:
            return {"count": 0}
        if pct is None:
            pct = self.hist.percentiles(PERCENTILES)
        lo, hi = self.min_ns, self.max_ns
        out = {"count": n, "min": round(lo / 1e3, 3), "mean": round(self.sum_ns / n / 1e3, 3)}
        for key, v in zip(PCT_KEYS, pct.tolist(), strict=True):
            out[key] = round(min(max(v, lo), hi) / 1e3, 3)
        out["max"] = round(hi / 1e3, 3)
        self._summary = out
        return out


@dataclass(frozen=True)
class Dirtied:
    """Of a write-back row's requests, those whose data was dirtied in one window (the dirtier's last window on
    that file before the write-back, bpf/writeback.bpf.h): its bytes are credited to that window, as "written
    back later"; the requests' latencies stay in the row, in the window where they ran."""

    window: int                 # the dirtying window's sequence number in its run (WindowSeq); 0: unknown
    label: str | None           # that window's label (None: unlabelled, or no longer known)
    start: datetime | None      # when that window began (None: not known)
    count: int
    bytes: int

    @property
    def key(self) -> tuple:
        return (self.window, self.label, self.start)


def merge_dirtied(*parts: Iterable[Dirtied]) -> tuple[Dirtied, ...]:
    """Dirtied entries added up per dirtying window, first-seen order."""
    acc: dict[tuple, Dirtied] = {}
    for part in parts:
        for e in part:
            old = acc.get(e.key)
            acc[e.key] = e if old is None else replace(old, count=old.count + e.count, bytes=old.bytes + e.bytes)
    return tuple(acc.values())


@dataclass
class Series:
    """One row: a process's requests of one op on one device."""

    pid: int
    comm: str
    device: str
    devno: str
    op: str
    count: int
    bytes: int
    phases: dict[str, PhaseStats]
    tgid: int = 0
    cgroup_id: int = 0
    container: str = ""     # tracer.sources.cgroups.container_of its cgroup; "" for a host process or unknown
    # write-back: requests the kernel's flusher wrote for files this process dirtied (charged to it),
    # a row of its own beside the process's direct I/O of the same op
    wb: bool = False
    # of a write-back row: its requests and bytes by the window their data was dirtied in; () when not known
    dirtied: tuple[Dirtied, ...] = ()

    @property
    def key(self) -> tuple[int, str, str, bool]:
        return (self.pid, self.devno, self.op, self.wb)

    def merge(self, other: Series) -> Series:
        phases = dict(self.phases)
        for name, st in other.phases.items():
            phases[name] = phases[name].merge(st) if name in phases else st
        return Series(self.pid, other.comm or self.comm, other.device, self.devno, self.op,
                      self.count + other.count, self.bytes + other.bytes, phases,
                      other.tgid or self.tgid, other.cgroup_id or self.cgroup_id, other.container or self.container,
                      self.wb, merge_dirtied(self.dirtied, other.dirtied))


# slots: a long run holds a Dump per label window (views.report.LabelWindows); weakref: tests watch them go
@dataclass(slots=True, weakref_slot=True)
class Dump:
    kind: str
    start: datetime
    end: datetime
    host: str
    kernel: str
    series: list[Series]
    dropped: dict[str, int] = field(default_factory=dict)
    # --bio: the same processes' I/Os as they submitted them (bios on request-based disks: a split I/O whole,
    # its wait for a request included), rows apart from the requests', which every count and rate is of
    events: dict[str, int] = field(default_factory=dict)
    label: str | None = None
    submitted: list[Series] = field(default_factory=list)
    disks: Diskstats | None = None      # a --diskstats window (it has no series); None for a BPF dump
    # the window's own length when it is not end - start (a --diskstats sample's, a merge's sum of its windows')
    window_s: float | None = None
    # the optional sections (tracer.model.sections: one attribute per class in SECTIONS, named by its key);
    # None: the dump has none
    attach: Attach | None = None
    start_event: StartEvent | None = None
    coverage: Coverage | None = None
    bio_devices: BioDevices | None = None
    tasks: Tasks | None = None
    files: Files | None = None
    tasks_sources: TasksSources | None = None
    unavailable: Unavailable | None = None
    enclosing: Enclosing | None = None
    loop: Loop | None = None
    sender_pid: SenderPid | None = None
    owner: Owner | None = None
    before_attach: BeforeAttach | None = None
    bpf_programs: BpfPrograms | None = None
    traced_pids: TracedPids | None = None
    unwritten_at_exit: UnwrittenAtExit | None = None
    alerts: Alerts | None = None
    verdict: VerdictSection | None = None
    window_seq: WindowSeq | None = None
    written_back: WrittenBack | None = None
    # a line's keys no section claims (a newer iotrace's): kept, written back with this dump, not merged
    unknown: dict = field(default_factory=dict)
    # iostat -x rows of the same window (tracer.model.diskstats.IostatRow), sampled once by the pipeline
    # for --csv and --alert; not written to the file
    iostat: list | None = field(default=None, repr=False, compare=False)
    # a marker window's slices around its nested windows merged (tracer.model.slices): its file line's
    # duration_s is then its own time (window_s), not end - start
    folded: bool = field(default=False, repr=False, compare=False)

    @property
    def duration_s(self) -> float:
        return max((self.end - self.start).total_seconds(), 0.0)

    @property
    def lost(self) -> int:
        return sum(self.dropped.values())

    def put(self, *sections: Section) -> Dump:
        """Set these sections (each in its own attribute, Section.key)."""
        for s in sections:
            setattr(self, s.key, s)
        return self


def merge_series(series: Iterable[Series], key: Callable[[Series], tuple] | None = None) -> list[Series]:
    """Merge rows with the same key, (pid, device, op) unless given, keeping first-seen order."""
    acc = SeriesMerger(key)
    acc.add(series)
    return acc.result()


def fold_by_comm(series: Iterable[Series]) -> list[Series]:
    """One row per (comm, device, op): rows of several pids become pid 0."""
    by_comm = _comm_key
    series = list(series)
    pids: dict[tuple, set[int]] = {}
    for s in series:
        pids.setdefault(by_comm(s), set()).add(s.pid)
    return [s if len(pids[by_comm(s)]) == 1 else replace(s, pid=0) for s in merge_series(series, by_comm)]


def _comm_key(s: Series) -> tuple:
    return (s.comm, s.devno, s.op, s.wb)


def merge_by_device_op(series: Iterable[Series]) -> list[Series]:
    """One row per (device, op), all processes merged (pid 0, no comm): what iostat, alerts and plots see."""
    return [Series(0, "", s.device, s.devno, s.op, s.count, s.bytes, s.phases)
            for s in merge_series(series, lambda s: (s.devno, s.op))]


def merge_dumps(dumps: Iterable[Dump], kind: str = "final", label: str | None = None, whole: bool = False) -> Dump:
    """One dump covering all of `dumps` (which should be disjoint windows; `whole`: a run's, see DumpMerger)."""
    acc = DumpMerger(whole=whole)
    for d in dumps:
        acc.add(d)
    if not acc.count:
        raise ValueError("nothing to merge")
    return acc.result(kind, label)


class _PhaseAcc:
    """PhaseStats.merge over a sequence, with the histograms added up in batches (PENDING at a time)."""

    PENDING = 4
    __slots__ = ("first", "hists", "max_ns", "merged", "min_ns", "sum_ns")

    def __init__(self, st: PhaseStats) -> None:
        self.first = st                 # the result while at most one of the phases had samples
        self.hists: list[Histogram] = [st.hist] if st.count else []
        self.sum_ns, self.min_ns, self.max_ns = st.sum_ns, st.min_ns, st.max_ns
        self.merged = False

    def add(self, st: PhaseStats) -> None:
        if not st.count:
            return
        if not self.hists:
            self.first, self.hists = st, [st.hist]
            self.sum_ns, self.min_ns, self.max_ns = st.sum_ns, st.min_ns, st.max_ns
            return
        self.merged = True
        self.hists.append(st.hist)
        # the same left fold as PhaseStats.merge, so the float sum comes out bit for bit the same
        self.sum_ns = self.sum_ns + st.sum_ns
        self.min_ns, self.max_ns = min(self.min_ns, st.min_ns), max(self.max_ns, st.max_ns)
        if len(self.hists) >= self.PENDING:
            self.hists = [Histogram.merge_all(self.hists)]

    def result(self) -> PhaseStats:
        if not self.merged:
            return self.first
        return PhaseStats(Histogram.merge_all(self.hists), self.sum_ns, self.min_ns, self.max_ns)


class _SeriesAcc:
    """Series.merge over a sequence of rows with one key, without building a Series at every step."""

    __slots__ = ("bytes", "cgroup_id", "comm", "container", "count", "device", "dirtied", "first", "n", "phases",
                 "tgid")

    def __init__(self, s: Series) -> None:
        self.first, self.n = s, 1
        self.comm, self.device, self.count, self.bytes = s.comm, s.device, s.count, s.bytes
        self.tgid, self.cgroup_id, self.container = s.tgid, s.cgroup_id, s.container
        self.phases = {name: _PhaseAcc(st) for name, st in s.phases.items()}
        self.dirtied = s.dirtied

    def add(self, s: Series) -> None:
        self.n += 1
        if s.dirtied:
            self.dirtied = merge_dirtied(self.dirtied, s.dirtied)
        self.comm, self.device = s.comm or self.comm, s.device
        self.count, self.bytes = self.count + s.count, self.bytes + s.bytes
        self.tgid, self.cgroup_id = s.tgid or self.tgid, s.cgroup_id or self.cgroup_id
        self.container = s.container or self.container
        for name, st in s.phases.items():
            acc = self.phases.get(name)
            if acc is None:
                self.phases[name] = _PhaseAcc(st)
            else:
                acc.add(st)

    def result(self) -> Series:
        if self.n == 1:
            return self.first
        f = self.first
        return Series(f.pid, self.comm, self.device, f.devno, f.op, self.count, self.bytes,
                      {name: acc.result() for name, acc in self.phases.items()}, self.tgid, self.cgroup_id,
                      self.container, f.wb, self.dirtied)


class SeriesMerger:
    """merge_series as rows come: rows with the same key merged, first-seen order; holds one row per key."""

    def __init__(self, key: Callable[[Series], tuple] | None = None) -> None:
        self.key = key or (lambda s: s.key)
        self.rows: dict[tuple, _SeriesAcc] = {}

    def add(self, series: Iterable[Series]) -> None:
        for s in series:
            k = self.key(s)
            acc = self.rows.get(k)
            if acc is None:
                self.rows[k] = _SeriesAcc(s)
            else:
                acc.add(s)

    def result(self) -> list[Series]:
        return [acc.result() for acc in self.rows.values()]


class DumpMerger:
    """merge_dumps one dump at a time: what the merged dump needs is kept, the dumps themselves are not.

    Memory is bounded by the merged dump (one row per series key, the labels
    seen), not by how many dumps went in; the result is the one merge_dumps
    gives for the same dumps in the same order, float sums included.  The
    sections merge by their own mergers (tracer.model.sections.SECTIONS);
    a section that has none, and keys no section claims, are left out.
    """

    def __init__(self, max_rows: int | None = None, whole: bool = False) -> None:
        """`max_rows`: past that many series rows, rows of the same command are folded together (pid 0), and
        every later row joins its command's: what the live whole-run table does (`folded` says it happened).
        `whole`: the dumps are a run's (or runs'), merged as one: a rank's window (an `owner`'s, per-sender
        windows: tracer.pipeline.senders) lies inside the windows of the rest, which tile the run, so its
        time is not added again, and the result is nobody's window."""
        self.max_rows = max_rows
        self.whole = whole
        self.folded = 0         # distinct series rows there were when the rows were folded; 0: never
        self.count = 0
        self.kind: str | None = None        # the last dump's
        self.bpf: bool | None = None        # a BPF dump (no disks), as the first one
        self.start: datetime | None = None
        self.end: datetime | None = None
        self.host = self.kernel = ""
        self.series = SeriesMerger()
        self.submitted = SeriesMerger()
        self.dropped: dict[str, int] = {}
        self.events: dict[str, int] = {}
        self.duration_s = 0
        self.disks = DiskstatsMerger()
        self.sections: dict[str, Merger] = {}
        for cls in SECTIONS:
            m = cls.merger()
            if m is not None:
                self.sections[cls.key] = m

    def add(self, d: Dump) -> None:
        if self.bpf is None:
            self.bpf = d.disks is None
        elif self.bpf != (d.disks is None):
            raise UserError("cannot merge BPF dumps with --diskstats windows (those have no latencies): "
                            "give them in separate commands")
        self.count += 1
        self.kind, self.host, self.kernel = d.kind, d.host, d.kernel
        self.start = d.start if self.start is None else min(self.start, d.start)
        self.end = d.end if self.end is None else max(self.end, d.end)
        for k, v in d.dropped.items():
            self.dropped[k] = self.dropped.get(k, 0) + v
        for k, v in d.events.items():
            self.events[k] = self.events.get(k, 0) + v
        self.submitted.add(d.submitted)
        if self.folded:
            self.series.add(replace(s, pid=0) for s in d.series)
        else:
            self.series.add(d.series)
            if self.max_rows is not None and len(self.series.rows) > self.max_rows:
                self.folded = len(self.series.rows)
                rows = [replace(s, pid=0) for s in self.series.result()]
                self.series = SeriesMerger(_comm_key)
                self.series.add(rows)
        seconds = duration_of(d)
        if not (self.whole and d.owner is not None):
            self.duration_s = self.duration_s + seconds
        if d.disks is not None:
            self.disks.add(d.disks, seconds)
        for m in self.sections.values():
            m.add(d)

    def result(self, kind: str = "final", label: str | None = None) -> Dump:
        if not self.count:
            raise ValueError("nothing to merge")
        assert self.start is not None and self.end is not None
        merged = Dump(kind=kind, label=label, start=self.start, end=self.end, host=self.host, kernel=self.kernel,
                      series=self.series.result(), dropped=dict(self.dropped), events=dict(self.events),
                      submitted=self.submitted.result(),
                      # the windows' own lengths, not the span: a file may hold several runs
                      window_s=self.duration_s)
        if not self.bpf:
            merged.disks = self.disks.result()
        for key, m in self.sections.items():
            setattr(merged, key, m.result())
        if self.whole:
            merged.owner = None
        return merged


class WritebackCredit:
    """Write-back bytes credited to the window (label) that dirtied the data, from dumps as they come: for
    every write-back row's Dirtied entry, (dirtying label, process, label of the dump it was written back in)
    -> requests, bytes, and the first and last such dump's edges.  Bounded: past MAX keys, new ones are
    counted in `skipped`, not kept."""

    MAX = 10000

    def __init__(self) -> None:
        self.rows: dict[tuple[str | None, str, str | None], list] = {}
        self.skipped = 0

    def add(self, d: Dump) -> None:
        for s in d.series:
            for e in s.dirtied:
                key = (e.label, s.comm, d.label)
                acc = self.rows.get(key)
                if acc is None:
                    if len(self.rows) >= self.MAX:
                        self.skipped += 1
                        continue
                    acc = self.rows[key] = [0, 0, d.start, d.end]
                acc[0] += e.count
                acc[1] += e.bytes
                acc[2], acc[3] = min(acc[2], d.start), max(acc[3], d.end)

    def of(self, label: str | None) -> WrittenBack:
        """The write-back of data dirtied in windows labelled `label`, most bytes first."""
        credits = [Credit(comm, written, n, b, start.isoformat(), end.isoformat())
                   for (dirtied, comm, written), (n, b, start, end) in self.rows.items() if dirtied == label]
        return WrittenBack(tuple(sorted(credits, key=lambda c: (-c.bytes, c.comm, str(c.written_in)))))


def merge_tasks(parts: list[list[TaskRow]]) -> list[TaskRow]:
    """Per-process rows of disjoint windows added up by pid (name and parent from the latest; started
    and exited if in any)."""
    acc = TaskMerger()
    for rows in parts:
        acc.add_rows(rows)
    got = acc.result()
    return got.rows if got is not None else []


_DISK_SUMS = ("reads", "writes", "read_kb", "write_kb", "discards", "flushes")
_DISK_TIMED = ("r_s", "w_s", "rkb_s", "wkb_s")
_DISK_PER_REQUEST = (("r_await", "reads"), ("w_await", "writes"))


class DiskstatsMerger:
    """Diskstats of disjoint windows, each with its length (s), merged one window at a time into one: per
    device counts and bytes added up, rates and busy shares averaged over the whole time (a device absent
    from a window was idle in it), awaits over the requests; per pid the bytes."""

    def __init__(self) -> None:
        self.n = 0
        self.first: Diskstats | None = None
        self.seconds = 0
        self.devices: dict[str, dict[str, float]] = {}
        self.procs: dict[int, ProcBytes] = {}
        self.unreadable = 0

    def add(self, disks: Diskstats, seconds: float) -> None:
        self.n += 1
        if self.first is None:
            self.first = disks
        self.seconds = self.seconds + seconds
        for r in disks.devices:
            acc = self.devices.setdefault(r.device, dict.fromkeys(
                (*_DISK_SUMS, *_DISK_TIMED, "aqu_sz", "util", "r_await", "w_await"), 0))
            for attr in _DISK_SUMS:
                acc[attr] = acc[attr] + getattr(r, attr)
            for attr in (*_DISK_TIMED, "aqu_sz", "util"):
                acc[attr] = acc[attr] + getattr(r, attr) * seconds
            for attr, n in _DISK_PER_REQUEST:
                acc[attr] = acc[attr] + getattr(r, attr) * getattr(r, n)
        for p in disks.processes:
            acc = self.procs.get(p.pid)
            self.procs[p.pid] = p if acc is None else ProcBytes(p.pid, p.comm or acc.comm,
                                                                acc.read_bytes + p.read_bytes,
                                                                acc.write_bytes + p.write_bytes)
        self.unreadable = disks.unreadable if self.n == 1 else max(self.unreadable, disks.unreadable)

    def result(self) -> Diskstats:
        if self.n == 1 and self.first is not None:
            return self.first
        seconds = self.seconds

        def timed(acc: dict, attr: str) -> float:
            return acc[attr] / seconds if seconds > 0 else 0.0

        def per_request(acc: dict, attr: str, n: str) -> float:
            return acc[attr] / acc[n] if acc[n] else 0.0

        devices = [DiskRow(name, *(acc[a] for a in _DISK_SUMS), *(timed(acc, a) for a in _DISK_TIMED),
                           per_request(acc, "r_await", "reads"), per_request(acc, "w_await", "writes"),
                           timed(acc, "aqu_sz"), timed(acc, "util"))
                   for name, acc in self.devices.items()]
        return Diskstats(devices, list(self.procs.values()), self.unreadable)


def merge_coverage(parts: Iterable[Coverage]) -> Coverage | None:
    """Coverage of disjoint windows added up, device by device."""
    acc = Coverage.merger()
    for part in parts:
        acc.add_section(part)
    return acc.result()


def unrecorded(coverage: Coverage | None, device: str | None = None) -> dict[str, int]:
    """Requests /proc/diskstats completed that iotrace did not record, per device that is short of them
    (`device`: that one only); none without coverage."""
    return coverage.unrecorded(device) if coverage is not None else {}


def unexplained_loss(coverage: Coverage | None, dropped: dict[str, int] | int, device: str | None = None) -> int:
    """Requests the kernel completed that iotrace neither recorded nor counted as dropped: the unrecorded
    ones (every device's, or `device`'s) beyond `dropped` (a count, or {reason: n}); 0 if none.

    A pid or cgroup filter leaves requests out by design: the caller decides whether that counts.
    """
    lost = dropped if isinstance(dropped, int) else sum(dropped.values())
    return max(0, sum(unrecorded(coverage, device).values()) - lost)


def duration_of(d: Dump) -> float:
    """The window's length: its own (a --diskstats sample's, a merge's sum) when it has one, else end - start."""
    return float(d.window_s if d.window_s is not None else d.duration_s)


def summarize(series: Iterable[Series]) -> None:
    """Compute every phase's summary_us at once: per-histogram numpy calls would dominate a big dump."""
    todo = [st for s in series for st in s.phases.values() if st._summary is None and st.count]
    for st, pct in zip(todo, Histogram.percentiles_many([st.hist for st in todo], PERCENTILES), strict=True):
        st.summary_us(pct)
