"""The dump: iotrace's unit of output, its records and its JSONL schema.

A dump covers one window of time (an interval, a labelled epoch, or the
final stretch of a run); dumps of one run cover disjoint windows, so
merging all of a file's dumps gives the whole run.  Each line of an
iotrace .jsonl file is one dump:

    {"schema": 1, "kind": "interval" | "final" | "marker", "label": null,
     "start": ISO 8601, "end": ISO 8601, "duration_s": float,
     "host": str, "kernel": str, "dropped": {reason: n}, "events": {note: n},
     "series": [{"pid", "tgid", "comm", "device", "devno", "op", "cgroup_id",
                 "container", "count", "bytes",
                 "latency_us": {phase: {"count", "min", "mean", "p50", "p90",
                                        "p99", "p99.9", "max"}},
                 "hdr": {phase: HdrHistogram compressed base64, values in ns}}]}

Marker dumps also carry "enclosing": the label of the window the marker's
stretch lay in (null at the top level, or from `iotrace mark`), and, when
the marker closed a window the training loop was timed in, "loop":
{"data_wait_s", "steps", "wall_s"} (seconds the loop waited for its batches,
batches, and the window's wall time), and "sender_pid": the process that
sent the marker (the trainer; tracer.verdict tells its rows from its
loaders' by it).  Merging dumps adds their loops up and keeps a sender_pid
they share.

Trace-mode dumps also carry "tasks": a row per traced process of the window,
exited ones included: {"pid", "ppid", "comm", "io_wait_s" (its threads'
time blocked in I/O wait, delay accounting's block-I/O delay), "io_waits",
"read_bytes" (returned by reads of regular files, page cache included),
"reads", "disk_read_bytes" (its read series' bytes), "fsync_s" (in fsync,
fdatasync, sync_file_range), "fsyncs", "throttled_s" (blocked by dirty-page
throttling), "throttles", "started", "exited"}.  Merging dumps adds them up
per pid.

Latencies in the JSON are microseconds; the hdr histograms count
nanoseconds.  min, max and mean are exact (kept by the kernel), the
percentiles are read from the histograms (within 0.4%).
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field, replace
from datetime import datetime

from .errors import UserError
from .histogram import Histogram
from .marker import LOOP_KEYS, check_loop

SCHEMA = 1
PERCENTILES = (50.0, 90.0, 99.0, 99.9)
PCT_KEYS = ("p50", "p90", "p99", "p99.9")
KINDS = ("interval", "final", "marker")


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
    container: str = ""     # tracer.cgroups.container_of its cgroup; "" for a host process or unknown

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


def duration_of(d: Dump) -> float:
    return float(d.extra.get("duration_s", d.duration_s))


# ---- JSON --------------------------------------------------------------------

def summarize(series: Iterable[Series]) -> None:
    """Compute every phase's summary_us at once: per-histogram numpy calls would dominate a big dump."""
    todo = [st for s in series for st in s.phases.values() if st._summary is None and st.count]
    for st, pct in zip(todo, Histogram.percentiles_many([st.hist for st in todo], PERCENTILES), strict=True):
        st.summary_us(pct)


def to_json(d: Dump) -> dict:
    obj = {
        "schema": SCHEMA, "kind": d.kind, "label": d.label,
        "start": d.start.isoformat(), "end": d.end.isoformat(), "duration_s": round(d.duration_s, 6),
        "host": d.host, "kernel": d.kernel, "dropped": d.dropped, "events": d.events,
    }
    obj.update({k: v for k, v in d.extra.items() if k != "duration_s"})
    # every histogram of the dump at once: per-histogram numpy calls would dominate
    summarize(d.series)
    hdrs = iter(Histogram.to_hdr_many(st.hist for s in d.series for st in s.phases.values() if st.count))
    obj["series"] = []
    for s in d.series:
        summaries = {name: st.summary_us() for name, st in s.phases.items()}
        obj["series"].append({
            "pid": s.pid, "tgid": s.tgid, "comm": s.comm, "device": s.device, "devno": s.devno, "op": s.op,
            "cgroup_id": s.cgroup_id, "container": s.container, "count": s.count, "bytes": s.bytes,
            "latency_us": summaries,
            "hdr": {name: next(hdrs) for name, st in s.phases.items() if st.count},
        })
    return obj


def _phase_from_json(summary: dict, hdr: str | None) -> PhaseStats:
    hist = Histogram.from_hdr(hdr) if hdr else Histogram.empty()
    n = hist.total
    return PhaseStats(hist, float(summary.get("mean", 0.0)) * 1e3 * n,
                      round(float(summary.get("min", 0.0)) * 1e3), round(float(summary.get("max", 0.0)) * 1e3))


def from_json(obj: dict) -> Dump:
    if not isinstance(obj, dict) or obj.get("schema") != SCHEMA or obj.get("kind") not in KINDS:
        raise ValueError(f"not an iotrace dump (want an object with schema {SCHEMA} and a kind)")
    series = []
    for s in obj["series"]:
        hdr = s.get("hdr", {})
        phases = {name: _phase_from_json(summary, hdr.get(name)) for name, summary in s["latency_us"].items()}
        series.append(Series(int(s["pid"]), s["comm"], s["device"], s["devno"], s["op"], int(s["count"]),
                             int(s["bytes"]), phases, int(s.get("tgid", 0)), int(s.get("cgroup_id", 0)),
                             str(s.get("container") or "")))
    known = {"schema", "kind", "label", "start", "end", "duration_s", "host", "kernel", "dropped", "events", "series"}
    return Dump(kind=obj["kind"], label=obj.get("label"), start=datetime.fromisoformat(obj["start"]),
                end=datetime.fromisoformat(obj["end"]), host=obj.get("host", ""), kernel=obj.get("kernel", ""),
                series=series, dropped=dict(obj.get("dropped", {})), events=dict(obj.get("events", {})),
                extra={k: v for k, v in obj.items() if k not in known})


def write(stream, d: Dump) -> None:
    stream.write(json.dumps(to_json(d), separators=(",", ":")) + "\n")
    stream.flush()


FOLLOW_POLL_S = 0.25


def _parse(path: str, n: int, line: bytes) -> Dump:
    try:
        return from_json(json.loads(line.decode()))
    except (ValueError, KeyError, TypeError) as exc:
        raise UserError(f"{path}:{n}: not an iotrace dump ({exc})") from None


def _cut(line: bytes) -> bool:
    """A last line without its newline that is the start of a JSON object: a dump being written, or cut."""
    if not line.lstrip().startswith(b"{"):
        return False
    try:
        json.loads(line.decode(errors="replace"))
    except ValueError:
        return True
    return False


def read(path: str, follow: Callable[[float], bool] | None = None) -> Iterator[Dump]:
    """Dumps of an iotrace .jsonl file; UserError naming the file and line on bad input.

    A last line cut short (the tracer is writing it, or was killed mid-write)
    is left out with one warning on stderr: the dumps before it are whole.
    `follow`: at the end of the file, called with how long to wait for more;
    it returns True to stop (tail -f until Ctrl-C).
    """
    try:
        f = open(path, "rb")  # noqa: SIM115 - closed below; bytes, so bad encodings fail per line
    except OSError as exc:
        raise UserError(f"cannot read {path}: {exc.strerror}") from None
    with f:
        n, line = 0, b""
        while True:
            line += f.readline()
            if line.endswith(b"\n"):
                n += 1
                if line.strip():
                    yield _parse(path, n, line)
                line = b""
            elif follow is None or follow(FOLLOW_POLL_S):
                break
        if not line.strip():
            return
        if _cut(line):
            print(f"iotrace: warning: {path}:{n + 1}: the last line is an incomplete dump (being written, or cut "
                  f"short): left out, the whole dumps before it are used", file=sys.stderr)
            return
        yield _parse(path, n + 1, line)
