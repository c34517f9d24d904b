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
from tracer.marker import LOOP_KEYS, check_loop
from tracer.model.diskstats import DiskRow, Diskstats, ProcBytes
from tracer.model.histogram import Histogram

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

    @property
    def key(self) -> tuple[int, str, str]:
        return (self.pid, self.devno, self.op)

    def merge(self, other: Series) -> Series:
        phases = dict(self.phases)
        for name, st in other.phases.items():
            phases[name] = phases[name].merge(st) if name in phases else st
        return Series(self.pid, other.comm or self.comm, other.device, self.devno, self.op,
                      self.count + other.count, self.bytes + other.bytes, phases,
                      other.tgid or self.tgid, other.cgroup_id or self.cgroup_id, other.container or self.container)


@dataclass
class Dump:
    kind: str
    start: datetime
    end: datetime
    host: str
    kernel: str
    series: list[Series]
    dropped: dict[str, int] = field(default_factory=dict)
    events: dict[str, int] = field(default_factory=dict)
    label: str | None = None
    extra: dict = field(default_factory=dict)   # sections added by later features (coverage, ...)
    disks: Diskstats | None = None      # a --diskstats window (it has no series); None for a BPF dump
    # iostat -x rows of the same window (tracer.model.diskstats.IostatRow), sampled once by the pipeline
    # for --csv and --alert; not written to the file
    iostat: list | None = field(default=None, repr=False, compare=False)

    @property
    def duration_s(self) -> float:
        return max((self.end - self.start).total_seconds(), 0.0)

    @property
    def lost(self) -> int:
        return sum(self.dropped.values())


def merge_series(series: Iterable[Series], key: Callable[[Series], tuple] | None = None) -> list[Series]:
    """Merge rows with the same key, (pid, device, op) unless given, keeping first-seen order."""
    key = key or (lambda s: s.key)
    out: dict[tuple, Series] = {}
    for s in series:
        k = key(s)
        out[k] = out[k].merge(s) if k in out else s
    return list(out.values())


def fold_by_comm(series: Iterable[Series]) -> list[Series]:
    """One row per (comm, device, op): rows of several pids become pid 0."""
    def by_comm(s: Series) -> tuple:
        return (s.comm, s.devno, s.op)

    series = list(series)
    pids: dict[tuple, set[int]] = {}
    for s in series:
        pids.setdefault(by_comm(s), set()).add(s.pid)
    return [s if len(pids[by_comm(s)]) == 1 else replace(s, pid=0) for s in merge_series(series, by_comm)]


def merge_by_device_op(series: Iterable[Series]) -> list[Series]:
    """One row per (device, op), all processes merged (pid 0, no comm): what iostat, alerts and plots see."""
    return [Series(0, "", s.device, s.devno, s.op, s.count, s.bytes, s.phases)
            for s in merge_series(series, lambda s: (s.devno, s.op))]


def merge_dumps(dumps: list[Dump], kind: str = "final", label: str | None = None) -> Dump:
    """One dump covering all of `dumps` (which should be disjoint windows)."""
    if not dumps:
        raise ValueError("nothing to merge")
    if len({d.disks is None for d in dumps}) > 1:
        raise UserError("cannot merge BPF dumps with --diskstats windows (those have no latencies): "
                        "give them in separate commands")
    dropped: dict[str, int] = {}
    events: dict[str, int] = {}
    for d in dumps:
        for k, v in d.dropped.items():
            dropped[k] = dropped.get(k, 0) + v
        for k, v in d.events.items():
            events[k] = events.get(k, 0) + v
    merged = Dump(kind=kind, label=label, start=min(d.start for d in dumps), end=max(d.end for d in dumps),
                  host=dumps[-1].host, kernel=dumps[-1].kernel,
                  series=merge_series(s for d in dumps for s in d.series), dropped=dropped, events=events)
    # the windows' own lengths, not the span: a file may hold several runs
    merged.extra["duration_s"] = sum(duration_of(d) for d in dumps)
    if dumps[0].disks is not None:
        merged.disks = merge_diskstats([(d.disks, duration_of(d)) for d in dumps])
    cov = merge_coverage([d.extra["coverage"] for d in dumps if "coverage" in d.extra])
    if cov:
        merged.extra["coverage"] = cov
    bio = sorted({name for d in dumps for name in d.extra.get("bio_devices", [])})
    if bio:
        merged.extra["bio_devices"] = bio
    # a window's loop counts the steps of the windows nested in it: theirs are not added again
    labels = {d.label for d in dumps}
    loop = merge_loops([d.extra["loop"] for d in dumps if isinstance(d.extra.get("loop"), dict)
                        and (d.extra.get("enclosing") is None or d.extra["enclosing"] not in labels)])
    if loop:
        merged.extra["loop"] = loop
    enclosing = {d.extra.get("enclosing") for d in dumps if "enclosing" in d.extra}
    if len(enclosing) == 1:
        merged.extra["enclosing"] = enclosing.pop()
    senders = {d.extra["sender_pid"] for d in dumps if isinstance(d.extra.get("sender_pid"), int)}
    if len(senders) == 1:
        merged.extra["sender_pid"] = senders.pop()
    tasks = [d.extra["tasks"] for d in dumps if isinstance(d.extra.get("tasks"), list)]
    if tasks:
        merged.extra["tasks"] = merge_tasks(tasks)
    attach = sorted({d.extra["attach"] for d in dumps if "attach" in d.extra})
    if attach:
        merged.extra["attach"] = "+".join(attach)     # one, unless runs of both kinds were merged
    starts = [d.extra["start_event"] for d in dumps if isinstance(d.extra.get("start_event"), dict)]
    if starts:
        blind = sorted({n for s in starts for n in s.get("blind", ())})
        merged.extra["start_event"] = {"event": "+".join(sorted({s.get("event", "") for s in starts})),
                                 **({"blind": blind} if blind else {})}
    return merged


TASK_SUMS = ("io_wait_s", "io_waits", "read_bytes", "reads", "disk_read_bytes", "fsync_s", "fsyncs",
             "throttled_s", "throttles")


def merge_tasks(parts: list[list[dict]]) -> list[dict]:
    """Per-process rows of disjoint windows added up by pid (name and parent from the latest; started
    and exited if in any); rows that are not objects with a pid are left out."""
    out: dict[int, dict] = {}
    for rows in parts:
        for r in rows:
            if not isinstance(r, dict) or not isinstance(r.get("pid"), int):
                continue
            acc = out.get(r["pid"])
            if acc is None:
                out[r["pid"]] = dict(r)
                continue
            for k in TASK_SUMS:
                acc[k] = round(acc.get(k, 0) + r.get(k, 0), 6) if k.endswith("_s") else acc.get(k, 0) + r.get(k, 0)
            acc["comm"] = r.get("comm") or acc.get("comm", "")
            acc["ppid"] = r.get("ppid") or acc.get("ppid", 0)
            acc["started"] = bool(acc.get("started") or r.get("started"))
            acc["exited"] = bool(acc.get("exited") or r.get("exited"))
    return sorted(out.values(), key=lambda r: r["pid"])


def merge_loops(parts: list[dict]) -> dict | None:
    """The training loop's timing over several windows: each of data_wait_s, steps and wall_s added up
    (a part that is not such a timing, as in a hand-edited file, is left out)."""
    parts = [p for p in parts if check_loop(p) is None]
    if not parts:
        return None
    out = {k: sum(float(p.get(k, 0) or 0) for p in parts) for k in LOOP_KEYS}
    out["steps"] = int(out["steps"])
    return out


def merge_diskstats(parts: list[tuple[Diskstats, float]]) -> Diskstats:
    """Diskstats of disjoint windows, each with its length (s), as one window: counts and bytes added up,
    rates and busy shares averaged over the whole time (a device absent from a window was idle in it), awaits
    over the requests."""
    if len(parts) == 1:
        return parts[0][0]
    seconds = sum(s for _, s in parts)
    rows: dict[str, list[tuple[DiskRow, float]]] = {}
    for disks, s in parts:
        for r in disks.devices:
            rows.setdefault(r.device, []).append((r, s))

    def timed(rs: list[tuple[DiskRow, float]], attr: str) -> float:
        return sum(getattr(r, attr) * s for r, s in rs) / seconds if seconds > 0 else 0.0

    def per_request(rs: list[tuple[DiskRow, float]], attr: str, n: str) -> float:
        total = sum(getattr(r, n) for r, _ in rs)
        return sum(getattr(r, attr) * getattr(r, n) for r, _ in rs) / total if total else 0.0

    devices = [DiskRow(name, sum(r.reads for r, _ in rs), sum(r.writes for r, _ in rs),
                       sum(r.read_kb for r, _ in rs), sum(r.write_kb for r, _ in rs),
                       sum(r.discards for r, _ in rs), sum(r.flushes for r, _ in rs),
                       timed(rs, "r_s"), timed(rs, "w_s"), timed(rs, "rkb_s"), timed(rs, "wkb_s"),
                       per_request(rs, "r_await", "reads"), per_request(rs, "w_await", "writes"),
                       timed(rs, "aqu_sz"), timed(rs, "util"))
               for name, rs in rows.items()]
    procs: dict[int, ProcBytes] = {}
    for disks, _ in parts:
        for p in disks.processes:
            acc = procs.get(p.pid)
            procs[p.pid] = p if acc is None else ProcBytes(p.pid, p.comm or acc.comm, acc.read_bytes + p.read_bytes,
                                                           acc.write_bytes + p.write_bytes)
    return Diskstats(devices, list(procs.values()), max(d.unreadable for d, _ in parts))


def merge_coverage(parts: list[dict]) -> dict | None:
    """Coverage of disjoint windows added up, device by device."""
    if not parts:
        return None
    devs: dict[str, dict[str, int]] = {}
    for part in parts:
        for name, c in part.get("devices", {}).items():
            acc = devs.setdefault(name, {"recorded": 0, "diskstats": 0})
            acc["recorded"] += int(c.get("recorded", 0))
            acc["diskstats"] += int(c.get("diskstats", 0))
    return {"filtered": any(p.get("filtered") for p in parts), "devices": devs}


def unrecorded(coverage: dict | None, device: str | None = None) -> dict[str, int]:
    """Requests /proc/diskstats completed that iotrace did not record, per device that is short of them
    (`device`: that one only), from a "coverage" section (see merge_coverage)."""
    devs = (coverage or {}).get("devices", {})
    return {name: c["diskstats"] - c["recorded"] for name, c in devs.items()
            if (device is None or name == device) and c["diskstats"] > c["recorded"]}


def unexplained_loss(coverage: dict | None, dropped: dict[str, int] | int, device: str | None = None) -> int:
    """Requests the kernel completed that iotrace neither recorded nor counted as dropped: the unrecorded
    ones (every device's, or `device`'s) beyond `dropped` (a count, or {reason: n}); 0 if none.

    A pid or cgroup filter leaves requests out by design: the caller decides whether that counts.
    """
    lost = dropped if isinstance(dropped, int) else sum(dropped.values())
    return max(0, sum(unrecorded(coverage, device).values()) - lost)


def duration_of(d: Dump) -> float:
    return float(d.extra.get("duration_s", d.duration_s))


def summarize(series: Iterable[Series]) -> None:
    """Compute every phase's summary_us at once: per-histogram numpy calls would dominate a big dump."""
    todo = [st for s in series for st in s.phases.values() if st._summary is None and st.count]
    for st, pct in zip(todo, Histogram.percentiles_many([st.hist for st in todo], PERCENTILES), strict=True):
        st.summary_us(pct)
