"""Recording the reference: a private tracefs instance, and BPF stamps at iotrace's instant.

Recording.  A tracefs instance ``instances/iotrace-truth-<pid>`` with
``trace_clock`` mono (the clock of bpf_ktime_get_ns), ``record-tgid`` on, a
large per-CPU buffer and the events block_rq_issue, block_rq_complete,
block_rq_merge, block_bio_frontmerge, block_rq_requeue and the start event
iotrace uses (iotrace_start_event(): block_io_start on Linux 6.5+, block_getrq
before it, or what $IOTRACE_START_EVENT forces), filtered to the devices given,
sched_process_fork (to know a command's process tree) and
the page-dirtied event iotrace uses (writeback_dirty_folio; writeback_dirty_page
before Linux 5.17), writeback_single_inode_start, writeback_single_inode
(filtered to the devices' bdi names: whose write-back a flusher's request is).
The devices are whole disks: block_getrq's dev is the bio's, a partition's
where the bio was sent to one, so on a partition the filter would drop its
starts (the tests trace whole loop devices, where it is the disk's, as at
issue and completion).
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
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

from tracer import contract
from tracer.errors import UserError
from tracer.sources import bpfobject, kernel, probe
from tracer.sources.devices import kdev

from .events import DEFAULT_START, DISTURBED_NS, Event, Stamp, TruthError, stamped
from .matcher import Truth

#: The block events recorded besides the start
OTHER_BLOCK_EVENTS = ("block_rq_issue", "block_rq_complete", "block_rq_merge", "block_bio_frontmerge",
                      "block_rq_requeue")
FORK_EVENT = ("sched", "sched_process_fork")
#: After the page-dirtied event (probe.dirty_event(): writeback_dirty_folio, or writeback_dirty_page before 5.17)
WRITEBACK_EVENTS = ("writeback_single_inode_start", "writeback_single_inode")
DEFAULT_BUFFER_KB = 64 * 1024          # per CPU


def block_events(start_event: str) -> tuple[str, ...]:
    """The block events the recorder enables, for a start event."""
    return (start_event, *OTHER_BLOCK_EVENTS)


def iotrace_start_event(attach: str = "auto") -> str:
    """The start event iotrace uses when attached as `attach`, chosen as its Probe chooses it.

    On raw tracepoints the first start of the kernel's BTF whose arguments
    fit (probe.choose_attach's layout), on the perf-event path the first
    whose tracepoint has the fields read (probe.choose_start_event); both
    honour $IOTRACE_START_EVENT.  block_io_start on Linux 6.5+, block_getrq
    before it: the reference then takes the start from block_getrq, as
    iotrace does.
    """
    _, layout, _ = probe.choose_attach(attach, bio=False)
    return layout.start_event if layout is not None else probe.choose_start_event()


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


def parse_text(text: str) -> dict[int, list[tuple[int, int, int | None, str, str]]]:
    """Per CPU, the events of a text `trace` file: (time in us, pid, tgid or None, event name, comm)."""
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
        out[int(m["cpu"])].append((us, int(m["pid"]), tgid, m["event"], m["comm"]))
    return out


#: A BPF stamp is matched to the ftrace event of the same tracepoint call:
#: same event, device, sector and CPU, and in the same order, since one
#: call's callbacks all finish before the next call's begin.  ftrace's
#: callback runs first; this much leeway is left should it not.
STAMP_LEAD_NS = 1_000
STAMP_PER_CPU = 1 << 18



#: The older form of iotrace's BIO_BDEV a block_getrq start's stamp reads where the kernel lacks bi_bdev
#: (before Linux 5.12): bi_disk, the whole disk (block_getrq's dev there; the partition is remapped by then),
#: read as its major and first minor (IOTRACE_K_BIO_BDEV_ERA 1)
BIO_DISK = ("bio", "bi_disk", 8)


def bio_cflags() -> list[str]:
    """The bio's device as block_getrq's dev field gives it: iotrace's BIO_BDEV and BDEV_DEV (its --bio
    programs' reads), or BIO_DISK, resolved in the running kernel's BTF as -DIOTRACE_K_<NAME>=<value> flags."""
    own = contract.load().kernel_events["block_bio_queue"]
    reads = contract.KernelReads({n: own.members[n] for n in ("BIO_BDEV", "BDEV_DEV")}, {}, {}, {},
                                 older={"BIO_BDEV": [BIO_DISK]})
    try:
        return kernel.resolve(kernel.open_btf(), reads, (), start_events=()).cflags()
    except kernel.LayoutError as exc:
        raise TruthError(f"the stamper cannot read a bio on this kernel: {exc}") from None


class Stamper:
    """stamps.bpf.c twice: attach_before() ahead of iotrace, attach_after() once iotrace is attached.

    The kernel runs a tracepoint's BPF programs in the order they were
    attached, so the two copies bracket iotrace's own stamp of every event.
    """

    def __init__(self, devs: Sequence[int], per_cpu: int = STAMP_PER_CPU, attach: str = "auto"):
        bpfobject.preflight()
        self._bcc = bpfobject.import_bcc()
        # the way iotrace attaches without --bio (probe.ATTACH_MODES): programs run in attach order only
        # among their kind
        self.attach, layout, _ = probe.choose_attach(attach, bio=False)
        # the start iotrace will use (iotrace_start_event): the stamps' first program
        self.start_event = layout.start_event if layout is not None else probe.choose_start_event()
        self.stamped = stamped(self.start_event)
        self._cflags = ["-DSTAMP_RAW_TP", *layout.cflags()] if layout else []
        if layout and probe.starts_at_bio(self.start_event):
            # its argument is the bio, not the request: what the stamp reads of it, resolved here
            self._cflags += ["-DSTAMP_START_BIO", *bio_cflags()]
        self.devs = list(devs)
        self.per_cpu = per_cpu
        self.ncpu = max(self._bcc.utils.get_possible_cpus()) + 1
        self.src = Path(__file__).with_name("stamps.bpf.c")
        self.sides: dict[str, object] = {}

    def _attach(self, side: str) -> None:
        try:
            devs = " || ".join(f"dev == {d}" for d in self.devs) or "1"
            text = self.src.read_text().replace("STAMP_START_EVENT", self.start_event)
            b = self._bcc.BPF(text=text.encode(),
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
            for tp in self.stamped:
                if self.attach == "raw_tp":
                    b.detach_raw_tracepoint(tp.encode())
                else:
                    b.detach_tracepoint(f"block:{tp}".encode())

    def close(self) -> None:
        for b in self.sides.values():
            b.cleanup()
        self.sides.clear()


def attach_stamps(events: Sequence[Event], before: np.ndarray, after: np.ndarray | None,
                  start_event: str = DEFAULT_START) -> tuple[list[Event], Counter]:
    """The ftrace events with their BPF stamps (Stamp) joined on; notes on the join.

    Both observers record the same tracepoint call on the same CPU, so a
    stamp belongs to the ftrace event with its event, device, sector and
    CPU that it follows (or leads by at most STAMP_LEAD_NS).  An ftrace
    event with no before-stamp is one the kernel skipped the before-copy
    for: its Stamp has no `ts`, and a `window` where the after-copy ran.
    `start_event` is the event the stamper's start program ran on.
    """
    notes: Counter = Counter()
    names = stamped(start_event)     # the stamper's programs, by enum stamp_event

    def index(recs: np.ndarray | None) -> dict[tuple, list[tuple[int, ...]]]:
        """(event, dev, sector, cpu) -> (ts, end, rq, bio, bio_next) in time order"""
        out: dict[tuple, list[tuple[int, ...]]] = defaultdict(list)
        ids = [n for n in ("rq", "bio", "bio_next") if recs is not None and n in recs.dtype.names]
        for r in ([] if recs is None else np.sort(recs, order="ts")):
            key = (names[r["event"]], int(r["dev"]), int(r["sector"]), int(r["cpu"]))
            out[key].append((int(r["ts"]), int(r["end"]),
                             *(int(r[n]) if n in ids else 0 for n in ("rq", "bio", "bio_next"))))
        return out

    groups: dict[tuple, list[int]] = defaultdict(list)
    for i, ev in enumerate(events):
        if ev.name in names:
            groups[(ev.name, ev.f["dev"], ev.f["sector"], ev.cpu)].append(i)
    found: list[dict[int, tuple[int, ...]]] = [{}, {}]
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
    for name in names:
        w = [v for i, v in width.items() if events[i].name == name]
        usual[name] = int(np.median(w)) if w else 0
    out = list(events)
    for i, ev in enumerate(events):
        if ev.name not in names:
            continue
        if i not in found[0]:
            notes[f"bpf_unseen_{ev.name}"] += 1
            a = found[1].get(i)
            out[i] = replace(ev, stamp=Stamp(None) if a is None else
                             Stamp(None, 0, a[2], a[3], a[4], window=(ev.ts, a[0])))
            continue
        slack = 0
        if i in width and width[i] > usual[ev.name] + DISTURBED_NS:
            slack = width[i]
            notes["stamp_disturbed"] += 1
        _, end, rq, bio, bio_next = found[0][i]
        out[i] = replace(ev, stamp=Stamp(end, slack, rq, bio, bio_next))
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
        # the start iotrace will use: recorded and matched as the request's start
        self.start_event = self.stamper.start_event if self.stamper else iotrace_start_event(attach)
        self.block_events = block_events(self.start_event)
        self.writeback_events = (probe.dirty_event(), *WRITEBACK_EVENTS)
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
        for ev in self.block_events:
            if flt:
                self._write(f"events/block/{ev}/filter", flt)
            self._write(f"events/block/{ev}/enable", "1")
        self._write(f"events/{FORK_EVENT[0]}/{FORK_EVENT[1]}/enable", "1")
        # a disk's bdi is named "major:minor"
        bdi = " || ".join(f'name == "{d >> 20}:{d & 0xFFFFF}"' for d in self.devs)
        for ev in self.writeback_events:
            if bdi:
                self._write(f"events/writeback/{ev}/filter", bdi)
            self._write(f"events/writeback/{ev}/enable", "1")
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
            events, notes = attach_stamps(events, self.stamper.read("before"), self.stamper.read("after"),
                                          self.start_event)
            self.stamper.close()
        self.result = Truth.from_events(events, self.devs, self.started_ns, self.stopped_ns, self.start_event)
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
            for ev in self.block_events:
                (self.dir / f"events/block/{ev}/enable").write_text("0")
            (self.dir / f"events/{FORK_EVENT[0]}/{FORK_EVENT[1]}/enable").write_text("0")
            for ev in self.writeback_events:
                (self.dir / f"events/writeback/{ev}/enable").write_text("0")
        except OSError:
            pass
        try:
            self.dir.rmdir()
        except OSError as e:
            raise TruthError(f"cannot remove tracefs instance {self.dir}: {e.strerror}") from None

    # -- reading

    def _formats(self) -> dict[int, EventFormat]:
        out = {}
        for system, name in [("block", e) for e in self.block_events] + [FORK_EVENT] + \
                [("writeback", e) for e in self.writeback_events]:
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
            for seq, ((ts, name, f), (us, pid, tgid, tname, comm)) in enumerate(zip(raw, txt, strict=True)):
                # the text prints ns2usecs(ts) = (ts + 500) / 1000
                if name != tname or f["common_pid"] != pid or (ts + 500) // 1000 != us:
                    raise TruthError(f"cpu{cpu} event {seq}: binary {name} pid {f['common_pid']} at {ts} ns "
                                     f"disagrees with text {tname} pid {pid} at {us} us")
                if name.startswith("writeback_"):
                    f = {**f, "comm": comm}     # the writer's name, where the trace has it (else "<...>")
                evs.append(Event(ts, cpu, seq, name, pid, tgid, f))
            streams.append(evs)
        self._check_stats()
        return list(heapq.merge(*streams, key=lambda e: (e.ts, e.cpu, e.seq)))
