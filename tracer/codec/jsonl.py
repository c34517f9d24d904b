"""iotrace's .jsonl files: one JSON object per line, each a dump of the model (tracer.model.dump).

Every line has "schema": 1 and a "kind"; each kind is registered once in
KINDS with its decoder and encoder, so that every file iotrace writes reads
back (`iotrace report`, diff, plot) through ``read``:

* "interval", "final", "marker": a trace-mode dump (BPF series):


    {"schema": 1, "kind": "interval" | "final" | "marker", "label": null,
     "start": ISO 8601, "end": ISO 8601, "duration_s": float,
     "host": str, "kernel": str, "dropped": {reason: n}, "events": {note: n},
     "series": [{"pid", "tgid", "comm", "device", "devno", "op", "cgroup_id",
                 "container", "count", "bytes",
                 "latency_us": {phase: {"count", "min", "mean", "p50", "p90",
                                        "p99", "p99.9", "max"}},
                 "hdr": {phase: HdrHistogram compressed base64, values in ns},
                 "wb": true (a write-back row; absent otherwise),
                 "dirtied": [{"window_seq", "label", "start", "count", "bytes"}]}]}

With --bio a line also has "submitted": rows of the same shape for the
traced processes' I/Os as they submitted them (bios on request-based disks,
block_bio_queue to the completion of the whole bio: a split I/O is one,
its wait for a request included); "series" stays the requests', which
every count, rate and coverage is of.  A "submitted" row's phases: "total"
the bio's latency, "queue" from its submission to the start of the request
that took it (its last part's, for a split bio), "device" from there to the
bio's completion (docs/design.md, "As submitted").

A write-back row's "dirtied" splits its requests and bytes by the window
their data was dirtied in (its "window_seq", label and start): the bytes are
credited there, written back during this dump's window; the row's latencies
are this window's (absent in files of an older iotrace: nothing is split).
Trace-mode dumps carry "window_seq", the window's number in its run (1 the
first), which those entries name.

"duration_s" is the window's own time: end - start, but less for a marker
window folded around the windows nested in it (tracer.model.slices: its
start and end span them, its time and rows do not); read back, a
duration_s that is not end - start is the dump's own time.  Older files
always hold end - start.

Marker dumps also carry "enclosing": the label of the window the marker's
stretch lay in (null at the top level, or from `iotrace mark`), and, when
the marker closed a window the training loop was timed in, "loop":
{"data_wait_s", "steps", "wall_s"} (seconds the loop waited for its batches,
batches, and the window's wall time), and "sender_pid": the process that
sent the marker (the trainer; tracer.views.verdict tells its rows from its
loaders' by it).  Merging dumps adds their loops up and keeps a sender_pid
they share.

Trace-mode dumps also carry "tasks" (unless --no-tasks): a row per traced
process of the window, exited ones included: {"pid", "ppid", "comm",
"io_wait_s" (its threads' time blocked in I/O wait, delay accounting's
block-I/O delay), "io_waits", "read_bytes" (read from files, page cache
included), "reads", "read_pages" and "missed_pages" (pages of those reads,
and pages they added to the page cache: the hit ratio is 1 - missed/read),
"disk_read_bytes" (its read series' bytes), "fsync_s", "fsyncs",
"throttled_s" (blocked by dirty-page throttling), "throttles", "started",
"exited"}, and "tasks_sources": {counter group: the event(s) it came from,
the syscalls (--tasks), or "unavailable: why"} for "io_wait", "throttled",
"reads", "cache" and "fsync".  Merging dumps adds the rows up per pid.

The final dump of a run that ended when its traced COMMAND or --pid tree
did carries "unwritten_at_exit": {"bytes" (what they dirtied that the kernel
had not written back when the trace stopped; 0: all of it is in the dumps),
"waited_s" (the time traced after they exited, for that write-back), "ended"
("written", "bound" (--wb-wait), "deadline" (-d), "signal", "not waited"
(--wb-wait 0))} (tracer.runtime.wbwait).

Raw-tracepoint dumps carry "files": a row per file and process of the window,
the top --files N by bytes moved (read from disk + written) and one "(other
files)" row summing the rest (tracer.model.files: "dev", "ino", "path",
"pid", "comm", "container", "cache_read_bytes" (null where unmeasurable), "disk_read_bytes",
"written_bytes", "requests", "p50_us", "p99_us", "hist", "files").
Merging dumps adds them up per (file, pid).

  Latencies in the JSON are microseconds; the hdr histograms count
  nanoseconds (tracer.codec.hdr).

  Beside these core keys a line holds the dump's sections (attach,
  start_event, coverage, bio_devices, tasks, tasks_sources, unavailable, files, enclosing, loop, sender_pid,
  owner, before_attach, bpf_programs, traced_pids, unwritten_at_exit, alerts, verdict, window_seq,
  written_back): each is a class in
  tracer.model.sections with its own from_json / to_json, walked here
  through SECTIONS.  Keys no section claims (a newer iotrace's) are kept on
  the dump (Dump.unknown) and written back as they were; merges leave them out.

* "diskstats": a window of `iotrace --diskstats` (no BPF), as its -o writes it:

    {"schema": 1, "kind": "diskstats", "window": "interval" | "final", "label": null,
     "start", "end", "duration_s", "host", "kernel", "percentiles": null,
     "source": "/proc/diskstats, /proc/PID/io",
     "devices": [{"device", "reads", "writes", "read_kB", "write_kB", "discards", "flushes",
                  "r/s", "w/s", "rkB/s", "wkB/s", "r_await", "w_await", "aqu-sz", "%util"}],
     "processes": [{"pid", "comm", "read_bytes", "write_bytes"}], "unreadable_processes": n,
     "alerts": [...] (with --alert)}

  It reads as a Dump of that window kind with no series and ``disks`` set.

API: to_json(dump) -> dict, from_json(obj) -> Dump, write(stream, dump),
read(path, follow=None) -> dumps (a last line cut short is left out with a
warning; a line longer than MAX_LINE, 16 MiB, is an error), register(kind, decode, encode).
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import datetime

from tracer.codec import hdr
from tracer.errors import UserError
from tracer.model.diskstats import IOSTAT_COLUMNS, DiskRow, Diskstats, ProcBytes
from tracer.model.dump import Dirtied, Dump, PhaseStats, Series, duration_of, summarize
from tracer.model.histogram import Histogram
from tracer.model.jsoncheck import array as _list
from tracer.model.jsoncheck import boolean as _bool
from tracer.model.jsoncheck import number as _num
from tracer.model.jsoncheck import obj as _obj
from tracer.model.jsoncheck import text as _str
from tracer.model.jsoncheck import whole as _int
from tracer.model.sections import read_sections, write_sections

SCHEMA = 1


# ---- the registry of kinds ---------------------------------------------------

@dataclass(frozen=True)
class Kind:
    """One kind of line: how to read it into a Dump, and how to write a Dump as one."""

    name: str
    decode: Callable[[dict], Dump]
    encode: Callable[[Dump], dict]


KINDS: dict[str, Kind] = {}


def register(name: str, decode: Callable[[dict], Dump], encode: Callable[[Dump], dict]) -> None:
    if name in KINDS:
        raise ValueError(f"JSON line kind {name!r} registered twice")
    KINDS[name] = Kind(name, decode, encode)


def kind_of(d: Dump) -> str:
    """The kind of line `d` is written as."""
    return DISKSTATS if d.disks is not None else d.kind


def to_json(d: Dump) -> dict:
    kind = KINDS.get(kind_of(d))
    if kind is None:
        raise ValueError(f"no JSON line kind {kind_of(d)!r} (known: {', '.join(KINDS)})")
    return kind.encode(d)


def from_json(obj: dict) -> Dump:
    """The Dump of one line's object; ValueError (or KeyError, TypeError) if it is none."""
    if not isinstance(obj, dict) or obj.get("schema") != SCHEMA or "kind" not in obj:
        raise ValueError(f"want an object with schema {SCHEMA} and a kind")
    kind = KINDS.get(obj["kind"])
    if kind is None:
        raise ValueError(f"unknown kind {obj['kind']!r}; iotrace writes {', '.join(KINDS)}")
    return kind.decode(obj)


# ---- trace-mode dumps: "interval", "final", "marker" -------------------------

def _encode_dump(d: Dump) -> dict:
    obj = {
        "schema": SCHEMA, "kind": d.kind, "label": d.label,
        # the window's own time: end - start, but less for a window folded around nested ones (tracer.model.slices)
        "start": d.start.isoformat(), "end": d.end.isoformat(),
        "duration_s": round(duration_of(d) if d.folded else d.duration_s, 6),
        "host": d.host, "kernel": d.kernel, "dropped": d.dropped, "events": d.events,
    }
    write_sections(d, obj)
    obj["series"] = _encode_series(d.series)
    if d.submitted:
        obj["submitted"] = _encode_series(d.submitted)
    return obj


def _encode_series(rows: list[Series]) -> list[dict]:
    # every histogram of the rows at once: per-histogram numpy calls would dominate
    summarize(rows)
    hdrs = iter(hdr.encode_many(st.hist for s in rows for st in s.phases.values() if st.count))
    out = []
    for s in rows:
        summaries = {name: st.summary_us() for name, st in s.phases.items()}
        out.append({
            "pid": s.pid, "tgid": s.tgid, "comm": s.comm, "device": s.device, "devno": s.devno, "op": s.op,
            "cgroup_id": s.cgroup_id, "container": s.container, "count": s.count, "bytes": s.bytes,
            "latency_us": summaries,
            "hdr": {name: next(hdrs) for name, st in s.phases.items() if st.count},
            **({"wb": True} if s.wb else {}),
            **({"dirtied": [_encode_dirtied(e) for e in s.dirtied]} if s.dirtied else {}),
        })
    return out


def _encode_dirtied(e: Dirtied) -> dict:
    return {"window_seq": e.window, "label": e.label, "start": e.start.isoformat() if e.start else None,
            "count": e.count, "bytes": e.bytes}


def _decode_dirtied(v) -> Dirtied:
    v = _obj(v, "a dirtied entry")
    start = v.get("start")
    return Dirtied(_int(v["window_seq"], "dirtied.window_seq"), _label(v.get("label")),
                   None if start is None else _time(start, "dirtied.start"), _int(v["count"], "dirtied.count"),
                   _int(v["bytes"], "dirtied.bytes"))


def _phase_from_json(summary: dict, text: str | None) -> PhaseStats:
    hist = hdr.decode(_str(text, "hdr")) if text else Histogram.empty()
    n = hist.total
    return PhaseStats(hist, _num(summary.get("mean", 0.0), "latency_us mean") * 1e3 * n,
                      round(_num(summary.get("min", 0.0), "latency_us min") * 1e3),
                      round(_num(summary.get("max", 0.0), "latency_us max") * 1e3))


def _decode_series(s) -> Series:
    s = _obj(s, "a series")
    hdrs = _obj(s.get("hdr", {}), "hdr")
    latency = _obj(s["latency_us"], "latency_us")
    phases = {_str(name, "a phase"): _phase_from_json(_obj(summary, f"latency_us.{name}"), hdrs.get(name))
              for name, summary in latency.items()}
    return Series(_int(s["pid"], "pid"), _str(s["comm"], "comm"), _str(s["device"], "device"),
                  _str(s["devno"], "devno"), _str(s["op"], "op"), _int(s["count"], "count"),
                  _int(s["bytes"], "bytes"), phases, _int(s.get("tgid", 0), "tgid"),
                  _int(s.get("cgroup_id", 0), "cgroup_id"), _str(s.get("container") or "", "container"),
                  _bool(s.get("wb", False), "wb"),
                  tuple(_decode_dirtied(e) for e in _list(s.get("dirtied", []), "dirtied")))


def _decode_dump(obj: dict) -> Dump:
    series = [_decode_series(s) for s in _list(obj["series"], "series")]
    submitted = [_decode_series(s) for s in _list(obj.get("submitted", []), "submitted")]
    sections, unknown = read_sections(obj, _DUMP_CORE)
    start, end = _time(obj["start"], "start"), _time(obj["end"], "end")
    own = None      # the window's own time when it is not end - start (older files: always end - start)
    if "duration_s" in obj:
        seconds = _num(obj["duration_s"], "duration_s")
        if abs(seconds - max((end - start).total_seconds(), 0.0)) > 2e-6:
            own = seconds
    return Dump(kind=obj["kind"], label=_label(obj.get("label")), start=start, window_s=own,
                end=end, host=_str(obj.get("host", ""), "host"),
                kernel=_str(obj.get("kernel", ""), "kernel"), series=series, submitted=submitted,
                dropped=_counts(obj.get("dropped", {}), "dropped"), events=_counts(obj.get("events", {}), "events"),
                unknown=unknown, **sections)


# a trace-mode line's own keys; the others are sections (tracer.model.sections) or kept as unknown
_DUMP_CORE = {"schema", "kind", "label", "start", "end", "duration_s", "host", "kernel", "dropped", "events", "series",
              "submitted"}


# ---- what a line's values may be (tracer.model.jsoncheck) ----------------------

def _label(v) -> str | None:
    return None if v is None else _str(v, "label")


def _counts(v, name: str) -> dict[str, int]:
    return {_str(k, name): _int(n, f"{name}.{k}") for k, n in _obj(v, name).items()}


def _time(v, name: str) -> datetime:
    t = datetime.fromisoformat(_str(v, name))
    return t if t.tzinfo else t.astimezone()     # a file's times compare with each other's


for _name in ("interval", "final", "marker"):
    register(_name, _decode_dump, _encode_dump)


# ---- `iotrace --diskstats` windows: "diskstats" -------------------------------

DISKSTATS = "diskstats"
DISKSTATS_SOURCE = "/proc/diskstats, /proc/PID/io"


def _encode_diskstats(d: Dump) -> dict:
    """The line `iotrace --diskstats -o` writes, for a Dump with disks."""
    disks = d.disks
    assert disks is not None
    devs = [{"device": r.device, "reads": r.reads, "writes": r.writes, "read_kB": r.read_kb, "write_kB": r.write_kb,
             "discards": r.discards, "flushes": r.flushes, **{k: round(v, 3) for k, v in r.columns().items()}}
            for r in disks.devices]
    obj = {"schema": SCHEMA, "kind": DISKSTATS, "window": d.kind, "label": d.label,
           "start": d.start.isoformat(), "end": d.end.isoformat(), "duration_s": round(duration_of(d), 6),
           "host": d.host, "kernel": d.kernel, "percentiles": None,
           "source": DISKSTATS_SOURCE, "devices": devs,
           "processes": [{"pid": p.pid, "comm": p.comm, "read_bytes": p.read_bytes, "write_bytes": p.write_bytes}
                         for p in disks.processes],
           "unreadable_processes": disks.unreadable}
    write_sections(d, obj)
    return obj


_DISK_COUNTS = {"reads": "reads", "writes": "writes", "read_kB": "read_kb", "write_kB": "write_kb",
                "discards": "discards", "flushes": "flushes"}


def _decode_diskstats(obj: dict) -> Dump:
    def number(attr: str, v, name: str) -> float | int:
        return _num(v, name) if attr.endswith("kb") else _int(v, name)

    devices = []
    for r in _list(obj["devices"], "devices"):
        r = _obj(r, "a device row")
        devices.append(DiskRow(_str(r["device"], "device"),
                               **{attr: number(attr, r.get(key, 0), key) for key, attr in _DISK_COUNTS.items()},
                               **{attr: _num(r.get(col, 0.0), col) for col, attr in IOSTAT_COLUMNS.items()}))
    processes = []
    for p in _list(obj.get("processes", []), "processes"):
        p = _obj(p, "a process row")
        processes.append(ProcBytes(_int(p["pid"], "pid"), _str(p.get("comm", ""), "comm"),
                                   _int(p.get("read_bytes", 0), "read_bytes"),
                                   _int(p.get("write_bytes", 0), "write_bytes")))
    sections, unknown = read_sections(obj, _DISKSTATS_CORE)
    return Dump(kind=_str(obj.get("window", "interval"), "window"), label=_label(obj.get("label")),
                start=_time(obj["start"], "start"), end=_time(obj["end"], "end"),
                host=_str(obj.get("host", ""), "host"), kernel=_str(obj.get("kernel", ""), "kernel"),
                series=[], window_s=_num(obj["duration_s"], "duration_s"),    # the window as sampled
                unknown=unknown, **sections,
                disks=Diskstats(devices, processes, _int(obj.get("unreadable_processes", 0), "unreadable_processes")))


_DISKSTATS_CORE = {"schema", "kind", "window", "label", "start", "end", "duration_s", "host", "kernel",
                   "percentiles", "source", "devices", "processes", "unreadable_processes"}

register(DISKSTATS, _decode_diskstats, _encode_diskstats)


# ---- files -------------------------------------------------------------------

def write(stream, d: Dump) -> None:
    """One dump as one JSON line, flushed."""
    stream.write(json.dumps(to_json(d), separators=(",", ":")) + "\n")
    stream.flush()


FOLLOW_POLL_S = 0.25
# The longest line read: a dump of the full series table is a few MB; a file with no newline
# (/dev/zero, a binary) must be an error, not a read that grows until memory runs out
MAX_LINE = 16 << 20


def _too_long(path: str, n: int) -> UserError:
    return UserError(f"{path}:{n}: a line longer than {MAX_LINE >> 20} MiB: not an iotrace dump file")


def _parse(path: str, n: int, line: bytes) -> Dump:
    try:
        return from_json(json.loads(line.decode()))
    except KeyError as exc:
        raise UserError(f"{path}:{n}: not an iotrace dump (no {exc})") from None
    except (ValueError, TypeError, AttributeError, OverflowError, RecursionError) as exc:
        # ValueError: a bad value (checked above); the others: a shape no check foresaw, or JSON nested
        # too deep to parse: still this line's error, not a traceback
        why = str(exc) or type(exc).__name__
        raise UserError(f"{path}:{n}: not an iotrace dump ({why[:200]})") from None


def _cut(line: bytes) -> bool:
    """A last line without its newline that is the start of a JSON object: a dump being written, or cut."""
    if not line.lstrip().startswith(b"{"):
        return False
    try:
        json.loads(line.decode(errors="replace"))
    except ValueError:
        return True
    return False


def _truncated(f) -> bool:
    """The open file is now shorter than what was read of it."""
    try:
        return os.fstat(f.fileno()).st_size < f.tell()
    except OSError:
        return False


def read(path: str, follow: Callable[[float], bool] | None = None) -> Iterator[Dump]:
    """Dumps of an iotrace .jsonl file; UserError naming the file and line on bad input.

    A last line cut short (the tracer is writing it, or was killed mid-write)
    is left out with one warning on stderr: the dumps before it are whole.
    `follow`: at the end of the file, called with how long to wait for more;
    it returns True to stop (tail -f until Ctrl-C).  A file that was truncated
    meanwhile is said so on stderr and read again from its start.
    """
    try:
        f = open(path, "rb")  # noqa: SIM115 - closed below; bytes, so bad encodings fail per line
    except (OSError, ValueError) as exc:     # ValueError: a NUL in the path
        raise UserError(f"cannot read {path}: {getattr(exc, 'strerror', None) or exc}") from None
    with f:
        n, line = 0, b""
        while True:
            line += f.readline(MAX_LINE + 1 - len(line))
            if len(line) > MAX_LINE:
                raise _too_long(path, n + 1)
            if line.endswith(b"\n"):
                n += 1
                if line.strip():
                    yield _parse(path, n, line)
                line = b""
            elif follow is None or follow(FOLLOW_POLL_S):
                break
            elif _truncated(f):
                # the file was cut (rewritten, truncated by hand): what follows is a new start, read whole
                print(f"iotrace: warning: {path} was truncated; reading it again from the start", file=sys.stderr)
                f.seek(0)
                n, line = 0, b""
        if not line.strip():
            return
        if _cut(line):
            print(f"iotrace: warning: {path}:{n + 1}: the last line is an incomplete dump (being written, or cut "
                  f"short): left out, the whole dumps before it are used", file=sys.stderr)
            return
        yield _parse(path, n + 1, line)
