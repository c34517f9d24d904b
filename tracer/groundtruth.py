"""An exact, independent reference for iotrace: every block request from ftrace.

iotrace keeps histograms in the kernel and never sees single requests; this
module records every block tracepoint event into a private tracefs instance
(no BPF, no bcc), matches the events offline into one record per request,
and computes exact counts, bytes and nearest-rank percentiles, so iotrace's
numbers can be checked against them:

    with TruthRecorder(devs=[kdev]) as rec:        # start before iotrace
        ... run the workload under iotrace ...
    truth = rec.result                             # stopped and read after
    cmp = compare(truth.requests, iotrace_dumps, Scope(...))
    print(render(cmp)); assert cmp.ok

Recording.  A tracefs instance ``instances/iotrace-truth-<pid>`` with
``trace_clock`` mono (the clock of bpf_ktime_get_ns), ``record-tgid`` on, a
large per-CPU buffer and the events block_io_start, block_rq_issue,
block_rq_complete, block_rq_merge, block_bio_frontmerge, block_rq_requeue (filtered to
the devices given) and sched_process_fork (to know a command's process tree).
The text ``trace`` file prints times in microseconds only, so the events
are read in binary from ``per_cpu/cpuN/trace_pipe_raw`` (nanoseconds) and
the text file is used for the tgid column and as a cross-check of the
binary decoding: per CPU both must list the same events, pids and times.
Any overrun, dropped event or missed page fails loudly (TruthError).

Matching, per request (the semantics iotrace promises, done exactly):
  start       block_io_start (submitter context: its tgid, tid and comm);
              op from its rwbs: a leading F with 0 bytes is a flush, else
              the op letter after an optional leading F: R/W/D = read,
              write, discard, anything else "other"
  issue       the last block_rq_issue of that (dev, sector); its bytes are
              the request's bytes left (back merges grow it before issue)
  complete    the block_rq_complete that brings the bytes left to 0; a
              partial one moves the request's sector on by nr_sector
  merged      block_rq_merge: folded into another request, not accounted
  frontmerge  block_bio_frontmerge: the request starting right after the
              bio now starts at the bio's sector
  requeue     block_rq_requeue: the request waits to be issued again (only
              used to tell which of two requests at one sector was issued)
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

import heapq
import math
import os
import re
import struct
import time
from collections import Counter, defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from fractions import Fraction
from pathlib import Path

import numpy as np

TRACEFS = Path("/sys/kernel/tracing")
BLOCK_EVENTS = ("block_io_start", "block_rq_issue", "block_rq_complete", "block_rq_merge",
                "block_bio_frontmerge", "block_rq_requeue")
FORK_EVENT = ("sched", "sched_process_fork")
DEFAULT_BUFFER_KB = 64 * 1024          # per CPU
SECTOR = 512
PHASES = ("queue", "device", "total")
PCTS = (50.0, 90.0, 99.0, 99.9)
PCT_KEYS = ("p50", "p90", "p99", "p99.9")
REL_TOL = 0.02                         # percentiles: within 2% of the exact value, or the same bucket
#: An allowance for the reference's own timing error, in ns: a percentile or
#: max also passes when it is at most this far from the exact value.  0, the
#: specified bound.  The reference's stamps are ftrace's, taken at the same
#: tracepoints as iotrace's BPF programs but not at the same instant: they
#: differ by ~100-800 ns depending on the event and on which probe the
#: kernel calls first (measured: a BPF program attached to the same tracepoints
#: stamps block_io_start ~110 ns and block_rq_issue ~60 ns later than ftrace).
SKEW_NS = 0
#: The two observers' systematic offset, measured per series and phase as the
#: difference of the two means (both exact: iotrace keeps the sum of its
#: latencies, the reference has every sample).  Percentiles and the max are
#: compared with the exact values shifted by it, so that ftrace running
#: before or after the BPF program does not count as iotrace's error; the
#: offset itself must stay within this bound, so it cannot hide a real bias.
OFFSET_MAX_NS = 1000
MINOR_BITS = 20                        # the kernel's dev_t: major << 20 | minor


class TruthError(RuntimeError):
    """The reference could not be recorded exactly (lost events, bad decode, no tracefs)."""


def kdev(major: int, minor: int) -> int:
    return (major << MINOR_BITS) | minor


def devno(dev: int) -> str:
    return f"{dev >> MINOR_BITS}:{dev & ((1 << MINOR_BITS) - 1)}"


def kdev_of_path(path: str) -> int:
    """Kernel dev_t of a block device node such as /dev/loop3."""
    rdev = os.stat(path).st_rdev
    return kdev(os.major(rdev), os.minor(rdev))


def device_name(dev: int) -> str:
    try:
        for line in Path(f"/sys/dev/block/{devno(dev)}/uevent").read_text().splitlines():
            if line.startswith("DEVNAME="):
                return line.split("=", 1)[1]
    except OSError:
        pass
    return devno(dev)


# ---------------------------------------------------------------------------- event formats

@dataclass(frozen=True)
class _Field:
    name: str
    offset: int
    size: int
    signed: bool
    kind: str            # "int", "str" (char array) or "loc" (__data_loc string)


@dataclass(frozen=True)
class EventFormat:
    system: str
    name: str
    id: int
    fields: tuple[_Field, ...]

    @classmethod
    def parse(cls, system: str, name: str, text: str) -> EventFormat:
        ev_id = None
        fields = []
        for line in text.splitlines():
            line = line.strip()
            if line.startswith("ID:"):
                ev_id = int(line.split()[1])
            if not line.startswith("field:"):
                continue
            parts = dict(p.strip().split(":", 1) for p in line.split(";") if ":" in p)
            decl = parts["field"].strip()
            fname = decl.split()[-1]
            kind = "int"
            if decl.startswith("__data_loc"):
                kind = "loc"
            elif "[" in fname:
                kind = "str"
            fname = fname.split("[")[0]
            if fname.startswith("common_") and fname != "common_pid":
                continue
            fields.append(_Field(fname, int(parts["offset"]), int(parts["size"]),
                                 parts.get("signed", "0").strip() == "1", kind))
        if ev_id is None:
            raise TruthError(f"no ID in the format of {system}:{name}")
        return cls(system, name, ev_id, tuple(fields))

    def decode(self, data: bytes) -> dict:
        out = {}
        for f in self.fields:
            raw = data[f.offset:f.offset + f.size]
            if f.kind == "int":
                out[f.name] = int.from_bytes(raw, "little", signed=f.signed)
            elif f.kind == "str":
                out[f.name] = raw.split(b"\0", 1)[0].decode(errors="replace")
            else:
                loc = int.from_bytes(raw, "little")
                off, ln = loc & 0xFFFF, loc >> 16
                out[f.name] = data[off:off + ln].split(b"\0", 1)[0].decode(errors="replace")
        return out


# ---------------------------------------------------------------------------- raw ring-buffer pages

_RB_PADDING, _RB_TIME_EXTEND, _RB_TIME_STAMP = 29, 30, 31
_RB_MISSED_EVENTS = 1 << 31
_RB_MISSED_STORED = 1 << 30
_TS_BITS = 59


def parse_pages(blob: bytes, page_size: int, formats: dict[int, EventFormat]) -> list[tuple[int, str, dict]]:
    """Events of one CPU's trace_pipe_raw: (ts_ns, event name, fields) in buffer order.

    The layout is the one described by events/header_page and header_event:
    a page is a u64 timestamp, a local_t commit (data size, plus flags for
    missed events in its top bits) and the data; each event starts with a
    u32 of type_len:5, time_delta:27.
    """
    out: list[tuple[int, str, dict]] = []
    u32 = struct.Struct("<I").unpack_from
    for base in range(0, len(blob), page_size):
        page = blob[base:base + page_size]
        if len(page) < 16:
            raise TruthError("truncated trace_pipe_raw page")
        ts, commit = struct.unpack_from("<QQ", page)
        if commit & (_RB_MISSED_EVENTS | _RB_MISSED_STORED):
            raise TruthError("the ring buffer lost events before a page (missed-events flag set)")
        size = commit & 0x0FFFFFFF
        pos, end = 16, 16 + size
        if end > len(page):
            raise TruthError(f"trace_pipe_raw page says {size} bytes of data, holds {len(page) - 16}")
        while pos < end:
            hdr = u32(page, pos)[0]
            type_len, delta = hdr & 0x1F, hdr >> 5
            if type_len == _RB_PADDING:
                if delta == 0:      # the rest of the page is padding
                    break
                # a discarded event: array[0] is its length; its delta counts (libtraceevent's kbuffer)
                ts += delta
                pos += 4 + u32(page, pos + 4)[0]
                continue
            if type_len == _RB_TIME_EXTEND:
                ts += (u32(page, pos + 4)[0] << 27) | delta
                pos += 8
                continue
            if type_len == _RB_TIME_STAMP:
                abs_ts = (u32(page, pos + 4)[0] << 27) | delta
                top = ts & ~((1 << _TS_BITS) - 1)
                ts = top | abs_ts
                pos += 8
                continue
            ts += delta
            if type_len == 0:
                length = u32(page, pos + 4)[0] - 4
                data = page[pos + 8:pos + 8 + length]
                pos += 8 + ((length + 3) & ~3)
            else:
                length = type_len * 4
                data = page[pos + 4:pos + 4 + length]
                pos += 4 + length
            ev_type = int.from_bytes(data[:2], "little")
            fmt = formats.get(ev_type)
            if fmt is None:
                raise TruthError(f"unknown event type {ev_type} in the truth instance")
            out.append((ts, fmt.name, fmt.decode(data)))
    return out


_TEXT_LINE = re.compile(r"^\s*(?P<comm>.*?)-(?P<pid>\d+)\s+\(\s*(?P<tgid>-+|\d+)\)\s+\[(?P<cpu>\d+)\]\s+"
                        r"(?P<flags>\S+)\s+(?P<sec>\d+)\.(?P<usec>\d{6}):\s+(?P<event>\w+):")


def parse_text(text: str) -> dict[int, list[tuple[int, int, int | None, str]]]:
    """Per CPU, the events of a text `trace` file: (time in us, pid, tgid or None, event name)."""
    out: dict[int, list] = defaultdict(list)
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        if "LOST" in line and "EVENTS" in line and line.lstrip().startswith("CPU:"):
            raise TruthError(f"the trace says events were lost: {line.strip()}")
        m = _TEXT_LINE.match(line)
        if not m:
            raise TruthError(f"cannot parse trace line: {line!r}")
        tgid = None if m["tgid"].startswith("-") else int(m["tgid"])
        us = int(m["sec"]) * 1_000_000 + int(m["usec"])
        out[int(m["cpu"])].append((us, int(m["pid"]), tgid, m["event"]))
    return out


# ---------------------------------------------------------------------------- recording

@dataclass(frozen=True)
class Event:
    ts: int              # ns, CLOCK_MONOTONIC
    cpu: int
    seq: int             # position in its CPU's buffer
    name: str
    pid: int             # thread that was current
    tgid: int | None     # its process (from record-tgid), None if unknown
    f: dict              # the tracepoint's fields


class TruthRecorder:
    """A private tracefs instance recording every block event on `devs` (kernel dev_t; all if empty).

    Use as a context manager (the instance is always removed) or call
    start() / stop() / close().  stop() returns and keeps the Truth.
    """

    def __init__(self, devs: Iterable[int] = (), buffer_kb: int = DEFAULT_BUFFER_KB,
                 tracefs: Path = TRACEFS, name: str | None = None):
        self.devs = sorted(set(devs))
        self.buffer_kb = buffer_kb
        self.tracefs = Path(tracefs)
        self.dir = self.tracefs / "instances" / (name or f"iotrace-truth-{os.getpid()}")
        self.result: Truth | None = None
        self.text = ""                 # the text `trace` of the last stop(), for a look at the raw events
        self._made = False
        self.started_ns = 0
        self.stopped_ns = 0

    # -- lifecycle

    def __enter__(self) -> TruthRecorder:
        self.start()
        return self

    def __exit__(self, *exc) -> None:
        try:
            if self._made and self.result is None and exc[0] is None:
                self.stop()
        finally:
            self.close()

    def _write(self, rel: str, value: str) -> None:
        try:
            (self.dir / rel).write_text(value)
        except OSError as e:
            raise TruthError(f"cannot write {value!r} to {self.dir / rel}: {e.strerror}") from None

    def start(self) -> None:
        if not (self.tracefs / "events" / "block").is_dir():
            raise TruthError(f"no block events under {self.tracefs} (tracefs not mounted, or not root)")
        if self.dir.exists():      # left by a crashed run of a process with our pid
            self._remove()
        try:
            self.dir.mkdir()
        except OSError as e:
            raise TruthError(f"cannot create tracefs instance {self.dir}: {e.strerror}") from None
        self._made = True
        self._write("tracing_on", "0")
        self._write("trace_clock", "mono")
        self._write("options/record-tgid", "1")
        self._write("buffer_size_kb", str(self.buffer_kb))
        flt = " || ".join(f"dev == {d}" for d in self.devs)
        for ev in BLOCK_EVENTS:
            if flt:
                self._write(f"events/block/{ev}/filter", flt)
            self._write(f"events/block/{ev}/enable", "1")
        self._write(f"events/{FORK_EVENT[0]}/{FORK_EVENT[1]}/enable", "1")
        self._write("trace", "")       # empty
        self.started_ns = time.monotonic_ns()
        self._write("tracing_on", "1")

    def stop(self) -> Truth:
        """Stop recording, read and check everything, match it; the instance stays until close()."""
        self._write("tracing_on", "0")
        self.stopped_ns = time.monotonic_ns()
        events = self._read_all()
        self.result = Truth.from_events(events, self.devs, self.started_ns, self.stopped_ns)
        return self.result

    def close(self) -> None:
        if self._made:
            self._remove()
            self._made = False

    def _remove(self) -> None:
        # disable first: rmdir of an instance with enabled events is refused on some kernels
        try:
            (self.dir / "tracing_on").write_text("0")
            for ev in BLOCK_EVENTS:
                (self.dir / f"events/block/{ev}/enable").write_text("0")
            (self.dir / f"events/{FORK_EVENT[0]}/{FORK_EVENT[1]}/enable").write_text("0")
        except OSError:
            pass
        try:
            self.dir.rmdir()
        except OSError as e:
            raise TruthError(f"cannot remove tracefs instance {self.dir}: {e.strerror}") from None

    # -- reading

    def _formats(self) -> dict[int, EventFormat]:
        out = {}
        for system, name in [("block", e) for e in BLOCK_EVENTS] + [FORK_EVENT]:
            fmt = EventFormat.parse(system, name, (self.dir / "events" / system / name / "format").read_text())
            out[fmt.id] = fmt
        return out

    def _page_size(self) -> int:
        for line in (self.tracefs / "events" / "header_page").read_text().splitlines():
            if "char data;" in line:
                parts = dict(p.strip().split(":", 1) for p in line.split(";") if ":" in p)
                return int(parts["offset"]) + int(parts["size"])
        raise TruthError("cannot read the ring-buffer page size from events/header_page")

    def _check_stats(self) -> list[int]:
        cpus = sorted(int(p.name[3:]) for p in (self.dir / "per_cpu").iterdir() if p.name.startswith("cpu"))
        lost = []
        for cpu in cpus:
            stats = {}
            for line in (self.dir / f"per_cpu/cpu{cpu}/stats").read_text().splitlines():
                k, _, v = line.partition(":")
                stats[k.strip()] = v.strip()
            for key in ("overrun", "commit overrun", "dropped events"):
                if int(stats.get(key, "0") or 0):
                    lost.append(f"cpu{cpu} {key}={stats[key]}")
        if lost:
            raise TruthError("the truth recorder lost events (" + ", ".join(lost) +
                             "): raise buffer_kb or trace a shorter workload")
        return cpus

    def _read_all(self) -> list[Event]:
        cpus = self._check_stats()
        self.text = (self.dir / "trace").read_text(errors="replace")
        text = parse_text(self.text)
        formats = self._formats()
        page = self._page_size()
        streams = []
        for cpu in cpus:
            fd = os.open(self.dir / f"per_cpu/cpu{cpu}/trace_pipe_raw", os.O_RDONLY | os.O_NONBLOCK)
            chunks = []
            try:
                while True:
                    try:
                        b = os.read(fd, page)
                    except BlockingIOError:
                        break
                    if not b:
                        break
                    chunks.append(b.ljust(page, b"\0"))
            finally:
                os.close(fd)
            raw = parse_pages(b"".join(chunks), page, formats)
            txt = text.get(cpu, [])
            if len(raw) != len(txt):
                raise TruthError(f"cpu{cpu}: {len(raw)} events in trace_pipe_raw but {len(txt)} in trace")
            evs = []
            for seq, ((ts, name, f), (us, pid, tgid, tname)) in enumerate(zip(raw, txt, strict=True)):
                # the text prints ns2usecs(ts) = (ts + 500) / 1000
                if name != tname or f["common_pid"] != pid or (ts + 500) // 1000 != us:
                    raise TruthError(f"cpu{cpu} event {seq}: binary {name} pid {f['common_pid']} at {ts} ns "
                                     f"disagrees with text {tname} pid {pid} at {us} us")
                evs.append(Event(ts, cpu, seq, name, pid, tgid, f))
            streams.append(evs)
        self._check_stats()
        return list(heapq.merge(*streams, key=lambda e: (e.ts, e.cpu, e.seq)))


# ---------------------------------------------------------------------------- matching

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


class _Live:
    __slots__ = ("comm", "dev", "done", "issue_ns", "issued", "op", "remaining", "rwbs", "sector", "start_ns",
                 "start_sector", "tgid", "tid")

    def __init__(self, ev: Event):
        f = ev.f
        self.tgid = ev.tgid if ev.tgid is not None else ev.pid
        self.tid = ev.pid
        self.comm = f.get("comm", "")
        self.dev = f["dev"]
        self.rwbs = f["rwbs"]
        self.op = op_of(f["rwbs"], f["bytes"])
        self.sector = self.start_sector = f["sector"]
        self.start_ns = ev.ts
        self.issue_ns: int | None = None
        self.issued = False            # issued and not requeued since
        self.remaining = f["bytes"]
        self.done = 0


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

    @classmethod
    def from_events(cls, events: Sequence[Event], devs: Sequence[int] = (), started_ns: int = 0,
                    stopped_ns: int = 0) -> Truth:
        pending: dict[tuple[int, int], list[_Live]] = defaultdict(list)
        done: list[Request] = []
        forks = []
        notes: Counter = Counter()
        recent_tail_keys: Counter = Counter()   # (dev, sector) of preflush/FUA data writes just completed

        def find(key, zero: bool, prefer_unissued: bool = False) -> _Live | None:
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
            if devs and f["dev"] not in devs:
                continue
            if ev.tgid is None and ev.name == "block_io_start":
                notes["unknown_tgid"] += 1
            if ev.name == "block_io_start":
                r = _Live(ev)
                pending[(r.dev, r.sector)].append(r)
            elif ev.name == "block_rq_issue":
                if f["rwbs"].startswith("FF"):
                    notes["internal_flush"] += 1
                    continue
                key = (f["dev"], f["sector"])
                r = find(key, f["bytes"] == 0, prefer_unissued=True)
                if r is None:
                    notes["issue_no_start"] += 1
                    continue
                if r.issued:
                    notes["issue_of_issued"] += 1
                r.issue_ns = ev.ts
                r.issued = True
                r.remaining = f["bytes"]
            elif ev.name == "block_rq_complete":
                if f["rwbs"].startswith("FF"):
                    continue
                nbytes = f["nr_sector"] * SECTOR
                key = (f["dev"], f["sector"])
                r = find(key, nbytes == 0)
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
                done.append(Request(r.tgid, r.tid, r.comm, r.dev, r.op, r.rwbs, r.start_sector, r.done,
                                    r.start_ns, r.issue_ns, ev.ts))
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
                        r.issue_ns, stopped_ns) for lst in pending.values() for r in lst]
        return cls(done, left, forks, notes, list(devs), started_ns, stopped_ns, len(events))

    def descendants(self, root_tgid: int) -> set[int]:
        """root_tgid and every process (and thread id) forked from it or its descendants, as recorded."""
        out = {root_tgid}
        for _, parent, child in sorted(self.forks):
            if parent in out:
                out.add(child)
        return out


# ---------------------------------------------------------------------------- statistics

def nearest_rank(sorted_vals: np.ndarray, q: float) -> int:
    """The nearest-rank percentile q (in percent) of sorted values: rank max(1, ceil(q/100 * n))."""
    n = len(sorted_vals)
    rank = max(1, math.ceil(Fraction(str(q)) * n / 100))
    return int(sorted_vals[rank - 1])


@dataclass
class TruthSeries:
    tgid: int
    dev: int
    op: str
    comm: str
    count: int = 0
    bytes: int = 0
    samples: dict[str, np.ndarray] = field(default_factory=dict)   # phase -> sorted ns

    @property
    def key(self) -> tuple[int, str, str]:
        return (self.tgid, devno(self.dev), self.op)


def aggregate(requests: Iterable[Request]) -> dict[tuple[int, str, str], TruthSeries]:
    """Series (tgid, devno, op) of exact samples."""
    groups: dict[tuple[int, int, str], list[Request]] = defaultdict(list)
    for r in requests:
        groups[(r.tgid, r.dev, r.op)].append(r)
    out = {}
    for (tgid, dev, op), reqs in groups.items():
        reqs.sort(key=lambda r: r.complete_ns)
        s = TruthSeries(tgid, dev, op, reqs[-1].comm, len(reqs), sum(r.bytes for r in reqs))
        for ph in PHASES:
            vals = [v for r in reqs if (v := r.phase_ns(ph)) is not None]
            if vals:
                s.samples[ph] = np.sort(np.asarray(vals, dtype=np.int64))
        out[s.key] = s
    return out


# ---------------------------------------------------------------------------- comparison

@dataclass
class Scope:
    """Which requests iotrace was in a position to see.

    A request counts if it started at or after `surely_from` and completed
    at or before `surely_until` (ns, CLOCK_MONOTONIC), on one of `devs` (all
    if empty) and, if `tgids` is given, by one of those processes.  Requests
    started before `maybe_from` or completed after `maybe_until` are left
    out as explained (iotrace was not attached); ones in between are
    ambiguous and reported.
    """

    surely_from: int
    surely_until: int
    maybe_from: int | None = None
    maybe_until: int | None = None
    tgids: set[int] | None = None
    devs: list[int] = field(default_factory=list)
    label: str = ""


@dataclass
class Check:
    name: str            # "count", "bytes", "total.p50", "device.max", ...
    exact: float | None
    reported: float | None
    ok: bool
    how: str = ""        # "equal", "2%", "bucket", or why it failed


@dataclass
class SeriesResult:
    key: tuple[int, str, str]     # (tgid, devno, op)
    comm: str
    device: str
    status: str                   # "compared", "only-truth", "only-iotrace"
    checks: list[Check] = field(default_factory=list)
    truth: TruthSeries | None = None
    iotrace: object | None = None  # tracer.dump.Series

    @property
    def ok(self) -> bool:
        return self.status == "compared" and all(c.ok for c in self.checks)

    @property
    def failures(self) -> list[Check]:
        return [c for c in self.checks if not c.ok]

    def check(self, name: str) -> Check:
        for c in self.checks:
            if c.name == name:
                return c
        raise KeyError(name)


@dataclass
class Comparison:
    series: list[SeriesResult]
    excluded: Counter             # reason -> requests left out of scope, explained
    ambiguous: list[Request]      # requests at the edge of iotrace's window
    iotrace_dropped: dict[str, int]
    iotrace_events: dict[str, int]
    truth_notes: Counter
    scope: Scope

    @property
    def ok(self) -> bool:
        return (all(s.ok for s in self.series) and not any(self.iotrace_dropped.values())
                and not self.ambiguous)

    def problems(self) -> list[str]:
        out = []
        for s in self.series:
            if s.status != "compared":
                out.append(f"{_fmt_key(s)}: {s.status}")
            for c in s.failures:
                out.append(f"{_fmt_key(s)}: {c.name} exact={_fmt_val(c)[0]} iotrace={_fmt_val(c)[1]} ({c.how})")
        for k, v in self.iotrace_dropped.items():
            if v:
                out.append(f"iotrace dropped {v} event(s): {k}")
        if self.ambiguous:
            out.append(f"{len(self.ambiguous)} request(s) at the edge of iotrace's window (device not quiet)")
        return out

    def accounting_problems(self) -> list[str]:
        """The problems that are not about latency values: missing series, counts, bytes, phases, drops."""
        timing = re.compile(r": (queue|device|total)\.(p50|p90|p99|p99\.9|max|offset) ")
        return [p for p in self.problems() if not timing.search(p)]

    def find(self, comm: str | None = None, device: str | None = None, op: str | None = None,
             tgid: int | None = None) -> list[SeriesResult]:
        return [s for s in self.series if (comm is None or s.comm == comm) and
                (device is None or s.device == device or s.key[1] == device) and
                (op is None or s.key[2] == op) and (tgid is None or s.key[0] == tgid)]


def _within(exact: float, reported: float, skew_ns: int = 0) -> tuple[bool, str]:
    from .histogram import bucket_index

    if abs(reported - exact) <= REL_TOL * exact:
        return True, "2%"
    if bucket_index(int(round(exact))) == bucket_index(int(round(reported))):
        return True, "bucket"
    if abs(reported - exact) <= skew_ns:
        return True, f"within the {skew_ns} ns skew allowance"
    return False, f"off by {reported - exact:+.0f} ns ({(reported - exact) / exact:+.1%}), other bucket"


def _same_bucket(exact: float, reported: float, skew_ns: int = 0) -> tuple[bool, str]:
    from .histogram import bucket_index

    if bucket_index(int(round(exact))) == bucket_index(int(round(reported))):
        return True, "bucket"
    if abs(reported - exact) <= skew_ns:
        return True, f"within the {skew_ns} ns skew allowance"
    return False, f"off by {reported - exact:+.0f} ns, other bucket"


def load_iotrace(dumps) -> tuple[dict, dict[str, int], dict[str, int]]:
    """iotrace's series by (tgid, devno, op), merged over dumps (tracer.dump.Dump or JSON dicts)."""
    from . import dump as dumpmod

    ds = [d if isinstance(d, dumpmod.Dump) else dumpmod.from_json(d) for d in dumps]
    if not ds:
        raise TruthError("iotrace wrote no dumps")
    merged = dumpmod.merge_dumps(ds)
    return {s.key: s for s in merged.series}, merged.dropped, merged.events


def compare_series(t: TruthSeries, s, skew_ns: int | None = None) -> list[Check]:
    """Checks of one iotrace series (tracer.dump.Series) against the exact one."""
    skew = SKEW_NS if skew_ns is None else skew_ns
    checks = [Check("count", t.count, s.count, t.count == s.count, "equal" if t.count == s.count else "differs"),
              Check("bytes", t.bytes, s.bytes, t.bytes == s.bytes, "equal" if t.bytes == s.bytes else "differs")]
    for ph in PHASES:
        exact = t.samples.get(ph)
        st = s.phases.get(ph)
        n_exact = 0 if exact is None else len(exact)
        n_rep = 0 if st is None else st.count
        checks.append(Check(f"{ph}.count", n_exact, n_rep, n_exact == n_rep,
                            "equal" if n_exact == n_rep else "differs"))
        if not n_exact or not n_rep:
            continue
        summary = st.summary_us()
        offset = st.sum_ns / n_rep - float(np.mean(exact))
        checks.append(Check(f"{ph}.offset", 0.0, offset, abs(offset) <= OFFSET_MAX_NS,
                            f"observers' offset within {OFFSET_MAX_NS} ns" if abs(offset) <= OFFSET_MAX_NS
                            else f"means differ by {offset:+.0f} ns, beyond {OFFSET_MAX_NS} ns"))
        for q, k in zip(PCTS, PCT_KEYS, strict=True):
            ex = nearest_rank(exact, q) + offset
            rep = summary[k] * 1e3
            ok, how = _within(ex, rep, skew)
            checks.append(Check(f"{ph}.{k}", ex, rep, ok, how))
        ex_max = exact[-1] + offset
        ok, how = _same_bucket(ex_max, st.max_ns, skew)
        checks.append(Check(f"{ph}.max", ex_max, st.max_ns, ok, how))
    return checks


def compare(requests: Iterable[Request], dumps, scope: Scope, notes: Counter | None = None,
            skew_ns: int | None = None) -> Comparison:
    """iotrace's dumps against the exact requests in `scope`; `notes` are the truth's, for the report.

    `skew_ns` (default SKEW_NS, 0) lets latencies pass that are that close to the exact value.
    """
    iot, dropped, events = load_iotrace(dumps)
    maybe_from = scope.surely_from if scope.maybe_from is None else scope.maybe_from
    maybe_until = scope.surely_until if scope.maybe_until is None else scope.maybe_until
    excluded: Counter = Counter()
    ambiguous = []
    kept = []
    for r in requests:
        if scope.devs and r.dev not in scope.devs:
            continue
        if scope.tgids is not None and r.tgid not in scope.tgids:
            excluded[f"{r.comm or r.tgid} (tgid {r.tgid}) is not traced"] += 1
        elif r.start_ns < maybe_from:
            excluded["started before iotrace attached"] += 1
        elif r.complete_ns > maybe_until:
            excluded["completed after iotrace stopped"] += 1
        elif r.start_ns < scope.surely_from or r.complete_ns > scope.surely_until:
            ambiguous.append(r)
        else:
            kept.append(r)
    truth = aggregate(kept)
    results = []
    for key in sorted(set(truth) | set(iot), key=lambda k: (k[0], k[1], k[2])):
        t, s = truth.get(key), iot.get(key)
        name = device_name(t.dev) if t else s.device
        if t and s:
            results.append(SeriesResult(key, t.comm, name, "compared", compare_series(t, s, skew_ns), t, s))
        elif t:
            results.append(SeriesResult(key, t.comm, name, "only-truth", [], t, None))
        else:
            results.append(SeriesResult(key, s.comm, name, "only-iotrace", [], None, s))
    return Comparison(results, excluded, ambiguous, dict(dropped), dict(events), Counter(notes or {}), scope)


# ---------------------------------------------------------------------------- rendering

def _fmt_ns(v: float | None) -> str:
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "-"
    if v < 1e3:
        return f"{v:.0f}ns"
    if v < 1e6:
        return f"{v / 1e3:.2f}us" if v < 1e4 else f"{v / 1e3:.1f}us"
    if v < 1e9:
        return f"{v / 1e6:.3f}ms"
    return f"{v / 1e9:.3f}s"


def _fmt_val(c: Check) -> tuple[str, str]:
    if c.name in ("count", "bytes") or c.name.endswith(".count"):
        return (str(c.exact), str(c.reported))
    return (_fmt_ns(c.exact), _fmt_ns(c.reported))


def _fmt_key(s: SeriesResult) -> str:
    return f"{s.key[0]} {s.comm} {s.device} {s.key[2]}"


def render(cmp: Comparison, all_checks: bool = False) -> str:
    """A text table, iotrace (iot) against the exact values (ex), one line per series and phase."""
    cols = ("PID", "COMM", "DEV", "OP", "PHASE", "COUNT ex/iot", "BYTES ex/iot",
            "p50 ex/iot", "p99 ex/iot", "p99.9 ex/iot", "max ex/iot", "VERDICT")
    rows = []
    for s in cmp.series:
        t, i = s.truth, s.iotrace
        if s.status != "compared":
            rows.append((str(s.key[0]), s.comm[:15], s.device, s.key[2], "-",
                         f"{t.count if t else '-'}/{i.count if i else '-'}",
                         f"{t.bytes if t else '-'}/{i.bytes if i else '-'}", "", "", "", "",
                         "FAIL " + s.status))
            continue
        first = True
        for ph in PHASES:
            if ph not in t.samples and ph not in i.phases:
                continue
            cells = []
            for k in ("p50", "p99", "p99.9", "max"):
                try:
                    c = s.check(f"{ph}.{k}")
                    cells.append(f"{_fmt_ns(c.exact)}/{_fmt_ns(c.reported)}{'' if c.ok else '!'}")
                except KeyError:
                    cells.append("-")
            bad = [c for c in s.failures if c.name.startswith(ph + ".") or (first and "." not in c.name)]
            verdict = "ok" if not bad else "FAIL " + ",".join(c.name.split(".")[-1] if "." in c.name
                                                               else c.name for c in bad)
            rows.append((str(s.key[0]) if first else "", s.comm[:15] if first else "",
                         s.device if first else "", s.key[2] if first else "", ph,
                         f"{t.count}/{i.count}" if first else "",
                         f"{t.bytes}/{i.bytes}" if first else "", *cells, verdict))
            first = False
    widths = [max(len(c), *(len(r[n]) for r in rows)) if rows else len(c) for n, c in enumerate(cols)]
    lines = ["  ".join(c.ljust(w) for c, w in zip(cols, widths, strict=True)).rstrip()]
    lines += ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in rows]
    if not rows:
        lines.append("(no series on either side)")
    for reason, n in sorted(cmp.excluded.items()):
        lines.append(f"explained, not compared: {n} request(s): {reason}")
    if cmp.truth_notes:
        lines.append("truth notes: " + ", ".join(f"{k}={v}" for k, v in sorted(cmp.truth_notes.items())))
    ev = {k: v for k, v in cmp.iotrace_events.items() if v}
    if ev:
        lines.append("iotrace notes: " + ", ".join(f"{k}={v}" for k, v in sorted(ev.items())))
    probs = cmp.problems()
    if all_checks:
        for s in cmp.series:
            for c in s.checks:
                ex, rep = _fmt_val(c)
                lines.append(f"  {_fmt_key(s)} {c.name}: exact {ex} iotrace {rep} -> {'ok' if c.ok else 'FAIL'} "
                             f"({c.how})")
    lines.append("RESULT: " + ("PASS" if cmp.ok else f"FAIL ({len(probs)} problem(s))"))
    lines += ["  " + p for p in probs]
    return "\n".join(lines)


# ---------------------------------------------------------------------------- running iotrace against the truth

def wall_to_mono_ns(dt) -> int:
    """A datetime from a dump (iotrace's wall clock) as CLOCK_MONOTONIC ns of this boot."""
    return int(dt.timestamp() * 1e9) - (time.time_ns() - time.monotonic_ns())


def dumps_end_mono_ns(dumps) -> int:
    from . import dump as dumpmod

    ds = [d if isinstance(d, dumpmod.Dump) else dumpmod.from_json(d) for d in dumps]
    return max(wall_to_mono_ns(d.end) for d in ds)


_CHILD_PID = re.compile(r"tracing block I/O of command .*\(pid (\d+)\)")

#: Margin around the instants iotrace's window is known from (the wall-clock
#: round trip of a dump's end, a signal's delivery): requests that start or
#: complete this close to an edge are ambiguous rather than silently kept.
EDGE_NS = 2_000_000


def command_pid(stderr: str) -> int:
    """The pid of the command iotrace ran, from its start-up line on stderr."""
    m = _CHILD_PID.search(stderr)
    if not m:
        raise TruthError(f"iotrace did not say which pid it ran the command as; its stderr:\n{stderr}")
    return int(m.group(1))


def command_scope(truth: Truth, stderr: str, launched_ns: int, dumps, devs: Sequence[int]) -> Scope:
    """What `iotrace -- COMMAND` could see: the command's process tree, from launch to its final drain.

    The command is held before exec until iotrace is attached, so everything
    its processes started was traced; whatever completed after the final
    drain was not.
    """
    end = dumps_end_mono_ns(dumps)
    return Scope(surely_from=launched_ns, surely_until=end - EDGE_NS, maybe_from=launched_ns,
                 maybe_until=end + EDGE_NS, tgids=truth.descendants(command_pid(stderr)), devs=list(devs),
                 label="command")


def system_scope(launched_ns: int, ready_ns: int, stop_ns: int, dumps, devs: Sequence[int]) -> Scope:
    """What `iotrace --dev ...` (every process) could see: from attach to its final drain."""
    end = dumps_end_mono_ns(dumps)
    return Scope(surely_from=ready_ns, surely_until=stop_ns, maybe_from=launched_ns,
                 maybe_until=max(end, stop_ns) + EDGE_NS, tgids=None, devs=list(devs), label="system")


def wait_quiet(devs: Sequence[int], quiet_s: float = 0.15, timeout_s: float = 20.0) -> None:
    """Wait until `devs` have nothing in flight and no new I/O for `quiet_s` seconds."""
    paths = [Path(f"/sys/dev/block/{devno(d)}") for d in devs]

    def snapshot():
        return tuple((p / "stat").read_text() for p in paths)

    deadline = time.monotonic() + timeout_s
    last, since = snapshot(), time.monotonic()
    while time.monotonic() < deadline:
        time.sleep(0.02)
        now = snapshot()
        busy = any((p / "inflight").read_text().split() != ["0", "0"] for p in paths)
        if now != last or busy:
            last, since = now, time.monotonic()
        elif time.monotonic() - since >= quiet_s:
            return
    raise TruthError(f"devices {', '.join(map(devno, devs))} never went quiet for {quiet_s}s")


class SystemIotrace:
    """`iotrace --dev ... -o FILE` tracing every process, started and stopped around a workload.

    start() returns once iotrace says it is tracing; stop() sends SIGINT
    (the Ctrl-C path), waits, and returns its exit status.  The instants of
    launch, readiness and stop are kept for system_scope().
    """

    READY = "iotrace: tracing block I/O"

    def __init__(self, args: Sequence[str], python: str, cwd: str | Path, timeout_s: float = 120):
        self.argv = [python, "-m", "tracer.cli", *args]
        self.cwd = str(cwd)
        self.timeout_s = timeout_s
        self.proc = None
        self.stderr = ""
        self.stdout = ""
        self.launched_ns = self.ready_ns = self.stop_ns = 0

    def start(self) -> None:
        import subprocess
        import threading

        self.launched_ns = time.monotonic_ns()
        self.proc = subprocess.Popen(self.argv, cwd=self.cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                     text=True)
        lines: list[str] = []
        ready = threading.Event()

        def pump_err():
            for line in self.proc.stderr:
                lines.append(line)
                if self.READY in line:
                    ready.set()
            ready.set()

        out: list[str] = []
        self._threads = [threading.Thread(target=pump_err, daemon=True),
                         threading.Thread(target=lambda: out.extend(self.proc.stdout), daemon=True)]
        for t in self._threads:
            t.start()
        self._err_lines, self._out_lines = lines, out
        if not ready.wait(self.timeout_s) or self.proc.poll() is not None and not any(self.READY in x for x in lines):
            self.kill()
            raise TruthError("iotrace did not start tracing:\n" + "".join(lines))
        self.ready_ns = time.monotonic_ns()

    def stop(self) -> int:
        import signal

        self.stop_ns = time.monotonic_ns()
        self.proc.send_signal(signal.SIGINT)
        try:
            rc = self.proc.wait(self.timeout_s)
        except Exception:
            self.kill()
            raise
        for t in self._threads:
            t.join(5)
        self.stderr, self.stdout = "".join(self._err_lines), "".join(self._out_lines)
        return rc

    def kill(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


def load_jsonl(path: str | Path) -> list[dict]:
    import json

    return [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()]
