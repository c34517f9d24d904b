"""An exact, independent reference for iotrace: every block request from ftrace.

iotrace keeps histograms in the kernel and never sees single requests; this
module records every block tracepoint event into a private tracefs instance,
matches the events offline into one record per request, and computes exact
counts, bytes and nearest-rank percentiles, so iotrace's numbers can be
checked against them.  run_command() and run_system() do it all for one
workload; by hand:

    with TruthRecorder(devs=[kdev]) as rec:        # start before iotrace
        ... start iotrace; once it is attached: rec.bracket()
        ... run the workload ...
        truth = rec.stop()
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

Timing.  ftrace says what happened, but not when iotrace saw it: its
callback stamps an event ~0.5 us (measured: 15 ns to 1.5 us, p1-p99) before
a BPF program at the same tracepoint does, and now and then 30-170 us before
(the hypervisor, an interrupt), which moves microsecond queue times by far
more than 2%.  So each event is also stamped by stamps.bpf.c (Stamper),
attached once before iotrace and once after it: the kernel runs the BPF
programs of a tracepoint back to back in attach order, so the first copy's
return stamp is ~100 ns before iotrace's own and the second copy's entry
stamp bounds it from above.  Latencies are taken between the first copy's
stamps; where a bracket is unusually wide (DISTURBED_NS) iotrace's stamp is
known only to lie within it, and the comparison accepts the whole range
for that request.  An event ftrace saw but no BPF program did (the kernel
skipped it) takes its request out of the comparison, explained.

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

import ctypes as ct
import heapq
import math
import os
import re
import struct
import time
from collections import Counter, defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace
from fractions import Fraction
from pathlib import Path

import numpy as np

from tracer import contract
from tracer.errors import UserError
from tracer.sources import probe
from tracer.sources.devices import devno, kdev, name_of

BLOCK_EVENTS = ("block_io_start", "block_rq_issue", "block_rq_complete", "block_rq_merge",
                "block_bio_frontmerge", "block_rq_requeue")
FORK_EVENT = ("sched", "sched_process_fork")
DEFAULT_BUFFER_KB = 64 * 1024          # per CPU
SECTOR = contract.load().const("SECTOR_SIZE")   # bytes per sector in the tracepoints' nr_sector
PHASES = tuple(contract.load().phases)          # queue, device, total: iotrace's phases
PCTS = (50.0, 90.0, 99.0, 99.9)
PCT_KEYS = ("p50", "p90", "p99", "p99.9")
REL_TOL = 0.02                         # percentiles: within 2% of the exact value, or the same bucket
class TruthError(RuntimeError):
    """The reference could not be recorded exactly (lost events, bad decode, no tracefs)."""


def kdev_of_path(path: str) -> int:
    """Kernel dev_t of a block device node such as /dev/loop3."""
    rdev = os.stat(path).st_rdev
    return kdev(os.major(rdev), os.minor(rdev))


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
    stamp: Stamp | None = None   # when BPF programs saw it (see Stamper); None: not stamped


@dataclass(frozen=True)
class Stamp:
    """An event's time at iotrace's instant: BPF stamps taken just before and just after iotrace's.

    `ts` is the return stamp of the copy attached before iotrace, None if no
    BPF program ran for the event (the kernel skipped it).  `slack` is how
    much later iotrace's own stamp may be: 0 normally (the programs run back
    to back), the whole bracket (the after-copy's entry stamp - ts) when it
    was unusually wide because something ran in between (an interrupt, the
    hypervisor).  `rq` is the struct request's address where the stamper ran
    on raw tracepoints (0 otherwise): it tells apart requests in flight at
    the same sector, which ftrace's fields cannot.
    """

    ts: int | None
    slack: int = 0
    rq: int = 0


#: Stamper programs, in the order of stamps.bpf.c's enum stamp_event.
STAMPED = ("block_io_start", "block_rq_issue", "block_rq_complete")
#: A bracket wider than the usual one for its event by more than this means
#: something ran in it (an interrupt, the hypervisor): iotrace's stamp is
#: then known only to lie within it.  The bracket also holds iotrace's whole
#: program, whose run time varies by a few hundred ns (cache misses), which
#: moves nothing; the gap between the first copy's return and iotrace's own
#: stamp was measured at 60-120 ns (p50), under 1.4 us (p99.9), with three
#: copies of the stamper in a row.
DISTURBED_NS = 1000
#: What one undisturbed sample may still be off by: the gap between the
#: stamper's return and iotrace's stamp varies from event to event.  Measured
#: with a third stamper copy in iotrace's place (fio 4 KiB reads on a loop
#: device): per-request phase errors of -10..+10 ns median, within +-170 ns
#: for 95% of requests, +-400 ns for 99%, +-880 ns for 99.9%.  So a
#: percentile, which sits on one sample, passes within SAMPLE_JITTER_NS of
#: the exact one, the max (the most exposed sample) within DISTURBED_NS, and
#: the mean, where the errors average out, within MEAN_JITTER_NS.
SAMPLE_JITTER_NS = 250
MEAN_JITTER_NS = 50
#: A BPF stamp is matched to the ftrace event of the same tracepoint call:
#: same event, device, sector and CPU, and in the same order, since one
#: call's callbacks all finish before the next call's begin.  ftrace's
#: callback runs first; this much leeway is left should it not.
STAMP_LEAD_NS = 1_000
STAMP_PER_CPU = 1 << 18


class Stamper:
    """stamps.bpf.c twice: attach_before() ahead of iotrace, attach_after() once iotrace is attached.

    The kernel runs a tracepoint's BPF programs in the order they were
    attached, so the two copies bracket iotrace's own stamp of every event.
    """

    def __init__(self, devs: Sequence[int], per_cpu: int = STAMP_PER_CPU, attach: str = "auto"):
        probe.check_privileges()
        self._bcc = probe.import_bcc()
        probe.kernel_headers()
        # the way iotrace attaches (probe.ATTACH_MODES): programs run in attach order only among their kind
        self.attach, layout, _ = probe.choose_attach(attach, bio=False)
        self._cflags = ["-DSTAMP_RAW_TP", *layout.cflags()] if layout else []
        self.devs = list(devs)
        self.per_cpu = per_cpu
        self.ncpu = max(self._bcc.utils.get_possible_cpus()) + 1
        self.src = Path(__file__).with_name("stamps.bpf.c")
        self.sides: dict[str, object] = {}

    def _attach(self, side: str) -> None:
        try:
            devs = " || ".join(f"dev == {d}" for d in self.devs) or "1"
            b = self._bcc.BPF(src_file=str(self.src).encode(),
                              cflags=[f"-DSTAMP_SIDE={int(side == 'after')}", f"-DSTAMP_PER_CPU={self.per_cpu}",
                                      f"-DSTAMP_CPUS={self.ncpu}", f"-DSTAMP_DEVS=({devs})", *self._cflags])
        except Exception as exc:  # bcc raises bare Exception for compile/load errors
            raise TruthError(f"cannot load {self.src.name}: {str(exc).strip().splitlines()[-1]}") from None
        self.sides[side] = b

    def attach_before(self) -> None:
        self._attach("before")

    def attach_after(self) -> None:
        self._attach("after")

    def read(self, side: str) -> np.ndarray:
        """The side's records (structured: ts, end, sector, dev, cpu, event, side); None if never attached."""
        b = self.sides.get(side)
        if b is None:
            return None
        claimed = [int(v) for v in b[b"claimed"][ct.c_int(0)]]
        if max(claimed) > self.per_cpu:
            raise TruthError(f"the {side} stamper overflowed: {max(claimed)} events on one CPU for "
                             f"{self.per_cpu} records")
        table = b[b"stamps"]
        size = self.ncpu * self.per_cpu
        try:
            recs = probe.read_array(table, np.zeros(size, np.uint32), np.zeros(size, np.dtype(table.Leaf)),
                              self._bcc.libbcc.lib)
        except OSError as e:
            raise TruthError(f"cannot read the {side} stamps: {e.strerror}") from None
        if len(recs) != size:
            raise TruthError(f"read {len(recs)} of the {side} stamper's {size} records")
        return np.concatenate([recs[c * self.per_cpu:c * self.per_cpu + n] for c, n in enumerate(claimed)])

    def detach(self) -> None:
        """Stop stamping; the records stay readable until close()."""
        for b in self.sides.values():
            for tp in STAMPED:
                if self.attach == "raw_tp":
                    b.detach_raw_tracepoint(tp.encode())
                else:
                    b.detach_tracepoint(f"block:{tp}".encode())

    def close(self) -> None:
        for b in self.sides.values():
            b.cleanup()
        self.sides.clear()


def attach_stamps(events: Sequence[Event], before: np.ndarray,
                  after: np.ndarray | None) -> tuple[list[Event], Counter]:
    """The ftrace events with their BPF stamps (Stamp) joined on; notes on the join.

    Both observers record the same tracepoint call on the same CPU, so a
    stamp belongs to the ftrace event with its event, device, sector and
    CPU that it follows (or leads by at most STAMP_LEAD_NS).  An ftrace
    event with no before-stamp is one the kernel ran no BPF program for.
    """
    notes: Counter = Counter()

    def index(recs: np.ndarray | None) -> dict[tuple, list[tuple[int, int, int]]]:
        out: dict[tuple, list[tuple[int, int, int]]] = defaultdict(list)
        has_rq = recs is not None and "rq" in recs.dtype.names
        for r in ([] if recs is None else np.sort(recs, order="ts")):
            key = (STAMPED[r["event"]], int(r["dev"]), int(r["sector"]), int(r["cpu"]))
            out[key].append((int(r["ts"]), int(r["end"]), int(r["rq"]) if has_rq else 0))
        return out

    groups: dict[tuple, list[int]] = defaultdict(list)
    for i, ev in enumerate(events):
        if ev.name in STAMPED:
            groups[(ev.name, ev.f["dev"], ev.f["sector"], ev.cpu)].append(i)
    found: list[dict[int, tuple[int, int, int]]] = [{}, {}]
    for side, stamps in enumerate((index(before), index(after))):
        unmatched = f"stamp_unmatched_{('before', 'after')[side]}"
        notes[unmatched] += sum(len(pool) for key, pool in stamps.items() if key not in groups)
        for key, idxs in groups.items():
            pool = stamps.get(key, [])
            j = 0
            for n, i in enumerate(idxs):
                lo = events[i].ts - STAMP_LEAD_NS
                hi = events[idxs[n + 1]].ts if n + 1 < len(idxs) else math.inf
                while j < len(pool) and pool[j][0] < lo:
                    j += 1
                    notes[unmatched] += 1
                if j < len(pool) and pool[j][0] < hi:
                    found[side][i] = pool[j]
                    j += 1
            notes[unmatched] += len(pool) - j
    # iotrace's stamp lies between the before-copy's return and the after-copy's entry
    width = {i: found[1][i][0] - b[1] for i, b in found[0].items() if i in found[1]}
    usual = {}
    for name in STAMPED:
        w = [v for i, v in width.items() if events[i].name == name]
        usual[name] = int(np.median(w)) if w else 0
    out = list(events)
    for i, ev in enumerate(events):
        if ev.name not in STAMPED:
            continue
        if i not in found[0]:
            notes[f"bpf_unseen_{ev.name}"] += 1
            out[i] = replace(ev, stamp=Stamp(None))
            continue
        slack = 0
        if i in width and width[i] > usual[ev.name] + DISTURBED_NS:
            slack = width[i]
            notes["stamp_disturbed"] += 1
        out[i] = replace(ev, stamp=Stamp(found[0][i][1], slack, found[0][i][2]))
    return out, notes


class TruthRecorder:
    """A private tracefs instance recording every block event on `devs` (kernel dev_t; all if empty).

    Use as a context manager (the instance is always removed) or call
    start() / stop() / close().  stop() returns and keeps the Truth.
    """

    def __init__(self, devs: Iterable[int] = (), buffer_kb: int = DEFAULT_BUFFER_KB,
                 tracefs: Path | None = None, name: str | None = None, stamps: bool = True, attach: str = "auto"):
        self.devs = sorted(set(devs))
        # BPF stamps at iotrace's instant (Stamper, attached as iotrace is); needs devs, and bcc
        self.stamper: Stamper | None = Stamper(self.devs, attach=attach) if stamps and self.devs else None
        self.buffer_kb = buffer_kb
        try:
            self.tracefs = Path(tracefs) if tracefs is not None else probe.tracefs()   # the one iotrace uses
        except UserError as e:
            raise TruthError(str(e)) from None
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
        # after ftrace is on and detached before it is off: every stamp has its event
        if self.stamper:
            self.stamper.attach_before()

    def bracket(self) -> None:
        """Call once iotrace is attached: the after-stamps then bracket its own (see Stamper)."""
        if self.stamper:
            self.stamper.attach_after()

    def stop(self) -> Truth:
        """Stop recording, read and check everything, match it; the instance stays until close()."""
        if self.stamper:
            self.stamper.detach()
        self._write("tracing_on", "0")
        self.stopped_ns = time.monotonic_ns()
        events = self._read_all()
        notes: Counter = Counter()
        if self.stamper:
            events, notes = attach_stamps(events, self.stamper.read("before"), self.stamper.read("after"))
            self.stamper.close()
        self.result = Truth.from_events(events, self.devs, self.started_ns, self.stopped_ns)
        self.result.notes.update(notes)
        return self.result

    def close(self) -> None:
        if self.stamper:
            self.stamper.close()
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
    # the BPF stamps of its start, last issue and completion (None: no stamp, or
    # never issued); the tuple is None when the events were not stamped
    stamps: tuple[Stamp | None, Stamp | None, Stamp | None] | None = None

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

    def phase_bounds(self, phase: str) -> tuple[int, int, int] | None:
        """(value, low, high) of a phase as iotrace could have measured it; None if it has no such phase.

        With stamps, the value is taken between the before-stamps, and where
        a bracket was disturbed iotrace's stamp may lie anywhere in it.
        """
        if self.stamps is None:
            v = self.phase_ns(phase)
            return None if v is None else (v, v, v)
        start, issue, complete = self.stamps
        a, b = {"queue": (start, issue), "device": (issue, complete), "total": (start, complete)}[phase]
        if a is None or b is None or a.ts is None or b.ts is None:
            return None
        v = b.ts - a.ts
        return v, v - a.slack, v + b.slack


class _Live:
    __slots__ = ("comm", "dev", "done", "issue_ns", "issue_stamp", "issued", "op", "remaining", "rq", "rwbs",
                 "sector", "start_ns", "start_sector", "start_stamp", "tgid", "tid")

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
        self.start_stamp = ev.stamp
        self.rq = ev.stamp.rq if ev.stamp else 0
        self.issue_ns: int | None = None
        self.issue_stamp: Stamp | None = None   # of the last issue a BPF program saw
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

        def find(key, zero: bool, prefer_unissued: bool = False, stamp: Stamp | None = None) -> _Live | None:
            if stamp is not None and stamp.rq:
                # the request's own address, where the stamps carry it: exact
                same = [r for r in pending.get(key, ()) if r.rq == stamp.rq]
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
                r = find(key, f["bytes"] == 0, prefer_unissued=True, stamp=ev.stamp)
                if r is None:
                    notes["issue_no_start"] += 1
                    continue
                if r.issued:
                    notes["issue_of_issued"] += 1
                r.issue_ns = ev.ts
                if ev.stamp is not None and ev.stamp.ts is not None:
                    r.issue_stamp = ev.stamp
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
                                    r.start_ns, r.issue_ns, ev.ts, stamps))
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
    # phase -> sorted lower / upper bounds of the samples (equal to them but where a stamp was disturbed)
    low: dict[str, np.ndarray] = field(default_factory=dict)
    high: dict[str, np.ndarray] = field(default_factory=dict)
    disturbed: dict[str, int] = field(default_factory=dict)    # phase -> samples known only within bounds

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
            b = np.asarray([v for r in reqs if (v := r.phase_bounds(ph)) is not None], dtype=np.int64)
            if len(b):
                s.samples[ph], s.low[ph], s.high[ph] = (np.sort(b[:, i]) for i in range(3))
                s.disturbed[ph] = int(np.count_nonzero((b[:, 1] != b[:, 0]) | (b[:, 2] != b[:, 0])))
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
    iotrace: object | None = None  # tracer.model.dump.Series

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
        timing = re.compile(r": (queue|device|total)\.(p50|p90|p99|p99\.9|max|mean) ")
        return [p for p in self.problems() if not timing.search(p)]

    def find(self, comm: str | None = None, device: str | None = None, op: str | None = None,
             tgid: int | None = None) -> list[SeriesResult]:
        return [s for s in self.series if (comm is None or s.comm == comm) and
                (device is None or s.device == device or s.key[1] == device) and
                (op is None or s.key[2] == op) and (tgid is None or s.key[0] == tgid)]


def _within(exact: float, low: float, high: float, reported: float, rel: float = REL_TOL,
            noise: float = 0) -> tuple[bool, str]:
    """Whether a reported value matches the exact one: within `rel` or in its bucket.

    Where disturbed stamps leave the exact value known only within [low,
    high], anything within `rel` of that range or in a bucket it touches
    passes too; so does anything within `noise` ns of it.
    """
    from tracer.model.histogram import bucket_index

    def bucket(v: float) -> int:
        return bucket_index(max(0, int(round(v))))

    if abs(reported - exact) <= rel * exact:
        return True, f"{rel:.0%}" if rel else "equal"
    if bucket(exact) == bucket(reported):
        return True, "bucket"
    if abs(reported - exact) <= noise:
        return True, f"within {noise:.0f} ns, the stamps' jitter"
    if (low, high) != (exact, exact):
        if (low * (1 - rel) - noise <= reported <= high * (1 + rel) + noise
                or bucket(low) <= bucket(reported) <= bucket(high)):
            return True, "within the disturbed stamps' bounds"
        return False, (f"off by {reported - exact:+.0f} ns ({(reported - exact) / max(exact, 1):+.1%}), "
                       f"outside [{low:.0f}, {high:.0f}] ns")
    return False, f"off by {reported - exact:+.0f} ns ({(reported - exact) / max(exact, 1):+.1%}), other bucket"


def load_iotrace(dumps) -> tuple[dict, dict[str, int], dict[str, int]]:
    """iotrace's series by (tgid, devno, op), merged over dumps (tracer.model.dump.Dump or JSON dicts)."""
    from tracer.model import dump as dumpmod

    ds = [d if isinstance(d, dumpmod.Dump) else dumpmod.from_json(d) for d in dumps]
    if not ds:
        raise TruthError("iotrace wrote no dumps")
    merged = dumpmod.merge_dumps(ds)
    return {s.key: s for s in merged.series}, merged.dropped, merged.events


def compare_series(t: TruthSeries, s) -> list[Check]:
    """Checks of one iotrace series (tracer.model.dump.Series) against the exact one."""
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
        low, high = t.low[ph], t.high[ph]
        summary = st.summary_us()
        # iotrace keeps the exact sum: its mean may differ only by the stamps' own jitter
        mean = st.sum_ns / n_rep
        ok, how = _within(float(np.mean(exact)), float(np.mean(low)), float(np.mean(high)), mean,
                          noise=MEAN_JITTER_NS)
        checks.append(Check(f"{ph}.mean", float(np.mean(exact)), mean, ok, how))
        for q, k in zip(PCTS, PCT_KEYS, strict=True):
            ok, how = _within(nearest_rank(exact, q), nearest_rank(low, q), nearest_rank(high, q),
                              summary[k] * 1e3, noise=SAMPLE_JITTER_NS)
            checks.append(Check(f"{ph}.{k}", nearest_rank(exact, q), summary[k] * 1e3, ok, how))
        # a single sample: the stamps' own jitter is not averaged out
        ok, how = _within(exact[-1], low[-1], high[-1], st.max_ns, rel=0, noise=DISTURBED_NS)
        checks.append(Check(f"{ph}.max", exact[-1], st.max_ns, ok, how))
    return checks


UNSEEN = "the kernel ran no BPF program for its start or completion"


def _unexplained_drops(dropped: dict[str, int], unseen: int) -> dict[str, int]:
    """iotrace's drops less those the reference saw happen: events the kernel ran no BPF program for.

    A request whose start no program saw costs iotrace a "skipped_start"
    (when the kernel counted the skip) and its completion a "no_start"; one
    whose completion no program saw is a "skipped_complete" (raw
    tracepoints) or a "lost_completion" (perf-event tracepoints).
    """
    out = dict(dropped)
    for reason in ("skipped_start", "skipped_complete", "no_start", "lost_completion"):
        if reason in out:
            out[reason] = max(0, out[reason] - unseen)
    return out


def compare(requests: Iterable[Request], dumps, scope: Scope, notes: Counter | None = None) -> Comparison:
    """iotrace's dumps against the exact requests in `scope`; `notes` are the truth's, for the report."""
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
        elif not r.bpf_seen:
            # no BPF program ran for its start or completion: iotrace cannot have it
            excluded[UNSEEN] += 1
        elif r.start_ns < maybe_from:
            excluded["started before iotrace attached"] += 1
        elif r.complete_ns > maybe_until:
            excluded["completed after iotrace stopped"] += 1
        elif r.start_ns < scope.surely_from or r.complete_ns > scope.surely_until:
            ambiguous.append(r)
        else:
            kept.append(r)
    truth = aggregate(kept)
    dropped = _unexplained_drops(dropped, excluded[UNSEEN])
    results = []
    for key in sorted(set(truth) | set(iot), key=lambda k: (k[0], k[1], k[2])):
        t, s = truth.get(key), iot.get(key)
        name = name_of(t.dev) if t else s.device
        if t and s:
            results.append(SeriesResult(key, t.comm, name, "compared", compare_series(t, s), t, s))
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
    from tracer.model import dump as dumpmod

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


#: Holds a command until the file named by $0 exists, then becomes it (same pid).
_GATE = 'while [ ! -e "$0" ]; do sleep 0.005; done; exec "$@"'


@dataclass
class Run:
    """One workload traced by iotrace while the reference recorded it, compared."""

    comparison: Comparison
    truth: Truth
    dumps: list[dict]
    trace_text: str            # the reference's raw events, as tracefs prints them
    iotrace_stderr: str


def _attach_of(iotrace_args: Sequence[str]) -> str:
    """The --attach iotrace is given, else what it would default to."""
    args = list(iotrace_args)
    if "--attach" in args[:-1]:
        return args[args.index("--attach") + 1]
    return os.environ.get("IOTRACE_ATTACH", "auto")


def _attach_args(rec: TruthRecorder) -> list[str]:
    """iotrace attaches as the stamper did, so that the stamps bracket its programs."""
    return ["--attach", rec.stamper.attach] if rec.stamper else []


def run_command(iotrace_args: Sequence[str], command: Sequence[str], devs: Sequence[int], python: str,
                cwd: str | Path, workdir: str | Path, timeout_s: float = 300) -> Run:
    """`iotrace ARGS -o FILE -- COMMAND` (its process tree) against the reference.

    The command waits, under iotrace, until the after-stamps are attached
    behind iotrace's programs (TruthRecorder.bracket).
    """
    import subprocess

    out, gate = Path(workdir) / "iotrace.jsonl", Path(workdir) / "gate"
    with TruthRecorder(devs, attach=_attach_of(iotrace_args)) as rec:
        argv = [python, "-m", "tracer.cli", "-o", str(out), *iotrace_args, *_attach_args(rec), "--",
                "sh", "-c", _GATE, str(gate), *command]
        launched = time.monotonic_ns()
        proc = subprocess.Popen(argv, cwd=str(cwd), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            head = []
            for line in proc.stderr:         # iotrace runs the command once attached, and says so
                head.append(line)
                if _CHILD_PID.search(line):
                    break
            rec.bracket()
            gate.touch()
            _, rest = proc.communicate(timeout=timeout_s)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        stderr = "".join(head) + rest
        if proc.returncode != 0:
            raise TruthError(f"iotrace exited {proc.returncode}:\n{stderr}")
        truth = rec.stop()
    dumps = load_jsonl(out)
    scope = command_scope(truth, stderr, launched, dumps, devs)
    return Run(compare(truth.requests, dumps, scope, truth.notes), truth, dumps, rec.text, stderr)


def run_system(iotrace_args: Sequence[str], command: Sequence[str], devs: Sequence[int], python: str,
               cwd: str | Path, workdir: str | Path, timeout_s: float = 300) -> Run:
    """`iotrace ARGS -o FILE` tracing every process, from before COMMAND until its writes are on disk.

    Waits for the devices to be quiet around it, so that the window's edges
    cut no request in two.
    """
    import subprocess

    out = Path(workdir) / "iotrace.jsonl"
    subprocess.run(["sync"], check=True)
    wait_quiet(devs)
    with TruthRecorder(devs, attach=_attach_of(iotrace_args)) as rec:
        it = SystemIotrace(["-o", str(out), *iotrace_args, *_attach_args(rec)], python, cwd, timeout_s)
        it.start()
        try:
            rec.bracket()
            wait_quiet(devs)
            w = subprocess.run(list(command), capture_output=True, text=True, timeout=timeout_s)
            if w.returncode != 0:
                raise TruthError(f"the workload exited {w.returncode}:\n{w.stderr}")
            subprocess.run(["sync"], check=True)
            wait_quiet(devs)
        finally:
            rc = it.stop()
        if rc != 0:
            raise TruthError(f"iotrace exited {rc}:\n{it.stderr}")
        truth = rec.stop()
    dumps = load_jsonl(out)
    scope = system_scope(it.launched_ns, it.ready_ns, it.stop_ns, dumps, devs)
    return Run(compare(truth.requests, dumps, scope, truth.notes), truth, dumps, rec.text, it.stderr)


def load_jsonl(path: str | Path) -> list[dict]:
    import json

    return [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()]
