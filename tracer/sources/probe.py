"""The collector: chooses the attach path and start event, loads and attaches
the BPF programs (through tracer.sources.bpfobject, the loader it shares with
the per-process tracer), and assembles the pieces that read them: the drain
of their maps (tracer.sources.drain) and the loss ledger
(tracer.sources.ledger).

It knows nothing about percentiles, tables or files: `Probe.drain()` hands
over the raw series and bucket counts of one interval (`RawInterval`), and
the aggregator (tracer.pipeline.aggregate) takes it from there.
"""

from __future__ import annotations

import ctypes as ct
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np

from tracer import contract
from tracer.errors import UserError
from tracer.sources import bpfobject, devices, kernel, ticks
from tracer.sources.bpfobject import BpfObject, ProgStats, Variant
from tracer.sources.drain import MapDrain
from tracer.sources.drain import read_array as read_array  # noqa: F401 - scripts/reference reads through it
from tracer.sources.files import FileDrain
from tracer.sources.ledger import LOST_MIN_AGE_NS as LOST_MIN_AGE_NS  # noqa: F401 - the tests plant by it
from tracer.sources.ledger import PROGRAMS as PROGRAMS
from tracer.sources.ledger import USER_DROPS as USER_DROPS
from tracer.sources.ledger import Ledger

# The events, their attach paths and the fields they read: contract.toml's events, and
# what is derived from it.  The start is the first "start" event the kernel has (block_io_start
# fires in the submitter's context, Linux 6.5+; block_rq_insert is the closest older equivalent).
EVENTS = contract.load().events
START_EVENTS = kernel.START_EVENTS
# the perf-event programs' tracepoint fields, checked at start: every request's events, the bio ones
REQUIRED_FIELDS = {e.name: e.fields for e in EVENTS if e.when == "always" and "tracepoint" in e.paths and e.fields}
CATEGORIES = {e.name: e.category for e in EVENTS}
BIO_FIELDS = {e.name: e.fields for e in EVENTS if e.when == "bio" and "tracepoint" in e.paths}
TRACEFS_DIRS = (Path("/sys/kernel/tracing"), Path("/sys/kernel/debug/tracing"))
# How the programs attach, one source file each over the shared bpf/core.bpf.h (SOURCES): raw tracepoints
# keyed by the request, reading kernel structs at BTF offsets, or perf-event tracepoints keyed by
# (dev, sector) where no BTF is
ATTACH_MODES = ("raw_tp", "tracepoint")
SOURCES = {"raw_tp": "raw_tp.bpf.c", "tracepoint": "tracepoint.bpf.c"}
# Each program by the short name its skipped events are reported under (PROGRAMS), and the drop reasons
# user space finds (USER_DROPS): the loss ledger's, tracer.sources.ledger
# Raw tracepoints of the raw_tp path, beside the start event (bio ones only for bio-based disks)
RAW_EVENTS = tuple(e.name for e in EVENTS if e.when == "always" and "raw_tp" in e.paths)
RAW_BIO_EVENTS = tuple(e.name for e in EVENTS if e.when == "bio" and "raw_tp" in e.paths)
# Raw tracepoints attached only where the kernel has them (mm_filemap_get_pages: Linux 6.12+)
RAW_PRESENT_EVENTS = tuple(e.name for e in EVENTS if e.when == "present" and "raw_tp" in e.paths)
# A page dirtied, newest name first: each path takes the first the kernel has (IOTRACE_DIRTY_PAGE for the older)
DIRTY_EVENTS = tuple(e.name for e in EVENTS if e.when == "dirty")
RAW_DIRTY_EVENTS = tuple(e.name for e in EVENTS if e.when == "dirty" and "raw_tp" in e.paths)


@dataclass
class ProbeOptions:
    pids: list[int] = field(default_factory=list)   # empty: every process
    follow_children: bool = True
    per_thread: bool = False
    devs: devices.DeviceFilter = field(default_factory=devices.DeviceFilter)   # --dev; empty: every device
    inflight_slots: int | None = None
    hist_entries: int | None = None
    hist_cells: int | None = None
    cgroup_id: int = 0          # cgroup v2 id (inode number); 0: every cgroup
    cgroup_level: int = 0       # its depth below the cgroup v2 root
    series_entries: int | None = None
    attach: str = "auto"        # "raw_tp", "tracepoint", or "auto": raw_tp where the kernel's BTF allows
    files: bool = False         # per-file rows (bpf/files.bpf.h; raw path): trace mode's, not top's or serve's
    files_top: int = 50         # --files: file rows kept per window (top by bytes moved), the rest summed
    writeback: bool = True      # write-back under its writer (IOTRACE_NO_WRITEBACK when off: the cost bench's)
    submitted: bool = False     # --bio: request-based disks' bios timed as submitted too (IOTRACE_BIO_SUBMITTED)
    stamps: str = "own"         # --stamps: "own" (the programs read the clock) or "kernel" (choose_stamps)


@dataclass
class RawInterval:
    """One drained generation: what the kernel recorded between two drains."""

    start_ns: int            # CLOCK_MONOTONIC, the clock of bpf_ktime_get_ns
    end_ns: int
    series_keys: np.ndarray  # structured: pid, dev, op
    series_vals: np.ndarray  # structured, per-CPU values already folded
    hist_keys: np.ndarray    # structured: pid, dev, bucket, op, phase
    hist_counts: np.ndarray  # uint64, per-CPU summed
    reasons: dict[str, int]  # events per reason during the interval, plus USER_DROPS as drop_*
    # /proc/diskstats at the interval's start and end, for coverage; None where unreadable
    diskstats_start: dict | None = None
    diskstats_end: dict | None = None
    traced_devs: list[int] | None = None   # the --dev filter; None: every device
    filtered: bool = False                 # a pid or cgroup filter leaves some I/O out by design
    bio_devs: list[int] = field(default_factory=list)   # disks traced per bio, not per request
    attach: str = "tracepoint"             # ATTACH_MODES: how the programs were attached
    start_event: str = ""                  # the request start's event (START_EVENTS)
    start_blind: list[str] = field(default_factory=list)   # disks whose requests it mostly misses (blind_disks)
    files: list | None = None              # tracer.sources.files.FileRaw rows; None: no file rows on this path
    files_top: int = 0                     # rows kept of them (the rest summed)
    files_cache: bool = False              # page-cache read bytes measured (mm_filemap_get_pages present)
    window: int = 0                        # this window's sequence number (MapDrain.window; 0: unknown)
    stamps: str = "own"                    # STAMPS: whose clock readings the latencies are (choose_stamps)


def tracefs() -> Path:
    for d in TRACEFS_DIRS:
        if (d / "events").is_dir():
            return d
    raise UserError("tracefs is not mounted: run 'mount -t tracefs nodev /sys/kernel/tracing' as root")


def tracepoint_fields(event: str, category: str = "block") -> set[str] | None:
    """The field names of a tracepoint in the running kernel, or None if absent."""
    fmt = tracefs() / "events" / category / event / "format"
    try:
        text = fmt.read_text()
    except OSError:
        return None
    names = set()
    for line in text.splitlines():
        line = line.strip()
        if line.startswith("field:"):
            decl = line.split(";", 1)[0][len("field:"):]
            names.add(decl.split()[-1].split("[")[0])
    return names


START_EVENT_ENV = "IOTRACE_START_EVENT"


def start_events() -> tuple[str, ...]:
    """The start events to look for, newest first; $IOTRACE_START_EVENT names one to use even where a newer
    one exists (to see on this kernel what an older one does: the tests of the self-check below)."""
    forced = os.environ.get(START_EVENT_ENV)
    if not forced:
        return START_EVENTS
    if forced not in START_EVENTS:
        raise UserError(f"${START_EVENT_ENV} takes {' or '.join(START_EVENTS)}, not {forced!r}")
    return (forced,)


def starts_at_bio(start_event: str) -> bool:
    """Whether `start_event` gives a bio, not a request (block_getrq): then the programs carry the start
    from the bio to its request (IOTRACE_START_BIO), and block_getrq names a partition's dev."""
    # the bio is the last argument each prototype lists: (bio), or 5.10's (q, bio, rw) read up to it
    return all(want[-1:] == ["struct bio *"] for want in contract.load().kernel.raw_tps[start_event])


# The one start event that sees only the requests passing an I/O scheduler (blind_disks).
SCHEDULED_START = "block_rq_insert"


def traced_request_disks(devs: list[int]) -> list[str]:
    """The request-based whole disks a run traces: those among `devs` (--dev), or every one in use without."""
    disks = devices.whole_disks()
    names = {dev: name for name, dev in disks.items()}
    chosen = [names[d] for d in devs if d in names] if devs else sorted(disks)
    # an unused loop device is no disk of anyone's
    return [n for n in chosen if not devices.bio_based(n) and (devs or devices.size_sectors(n) > 0)]


def blind_disks(start_event: str, devs: list[int]) -> list[str]:
    """The traced disks (every whole disk, without --dev) on which `start_event` misses most requests.

    block_rq_insert, the start before block_io_start (Linux 6.5), fires only
    for requests that go through an I/O scheduler or are requeued: on a disk
    whose scheduler is "none" (NVMe, virtio, loop: the default for fast
    disks) the block layer issues most requests directly, and their
    completions find no start.  Measured on 6.18 with the programs forced
    onto block_rq_insert: fio 4 KiB O_DIRECT on a none loop device, 11% of
    requests seen.  Not a guess from the version: the scheduler is read now.
    """
    if start_event != SCHEDULED_START:
        return []
    return [n for n in traced_request_disks(devs) if devices.scheduler(n) == "none"]


# What each optional source gives, for the "unavailable" line and dump field (unavailable()): the raw path's
# "present" events, each a part of the per-file rows
PRESENT_GIVES = {
    "mm_filemap_get_pages": "per-file rows count no page-cache reads (cache_read_bytes absent; Linux 6.12+)",
    "iomap_dio_rw_begin": "per-file rows count no O_DIRECT bytes as asked (direct_bytes 0)",
}


def unavailable(start_event: str, files: bool, present: tuple[str, ...] | None,
                group_dead: bool, blind: tuple[str, ...] = ()) -> dict[str, str]:
    """What the block-layer programs would use that this kernel or attach path has not, each with what
    follows: {source: why and what is not counted}; {} when nothing is missing.

    `present`: the raw path's optional events this kernel has (None on the perf-event path, where the
    per-file rows are missing whole); `blind`: the traced disks without an I/O scheduler, whose requests
    block_rq_insert mostly misses (blind_disks).  Said at start in one line and in every dump
    ("unavailable"), so that a missing source is never read as a zero.
    """
    out: dict[str, str] = {}
    # block_rq_insert misses requests only on a disk without a scheduler: where every traced disk has
    # one, nothing is lost and nothing is said
    if start_event == SCHEDULED_START and blind:
        out["start"] = (f"no block:{START_EVENTS[0]} (Linux 6.5+): requests start at block:{start_event}, "
                        f"which fires only for requests that pass an I/O scheduler: most of "
                        f"{', '.join(blind)}'s are not counted (scheduler none)")
    elif start_event not in (START_EVENTS[0], SCHEDULED_START):
        out["start"] = (f"no block:{START_EVENTS[0]} (Linux 6.5+): requests start at block:{start_event}, "
                        f"when their request is allocated")
    if files and present is None:
        out["files"] = "no per-file rows: they need the raw tracepoints (--attach raw_tp)"
    elif files:
        for event, gives in PRESENT_GIVES.items():
            if event not in present:
                out[event] = f"no raw tracepoint {event}: {gives}"
    if not group_dead:
        out["group_dead"] = ("sched_process_exit passes no group_dead: under --pid an exited process stays in the "
                             "pid filter until the run ends")
    return out


def choose_start_event() -> str:
    wanted = [e for name in start_events() for e in EVENTS if e.name == name]
    for ev in wanted:
        fields = tracepoint_fields(ev.name)
        if fields is not None and all(f in fields for f in ev.fields):
            return ev.name
    raise UserError("this kernel has none of the tracepoints "
                    + "; ".join(f"block:{e.name} with fields {', '.join(e.fields)}" for e in wanted)
                    + "; iotrace needs Linux 5.0 or later")


def check_tracepoints(required: dict[str, tuple[str, ...]] = REQUIRED_FIELDS) -> None:
    for ev, needed in required.items():
        cat = CATEGORIES.get(ev, "block")
        fields = tracepoint_fields(ev, cat)
        if fields is None:
            raise UserError(f"tracepoint {cat}:{ev} is missing from this kernel "
                            f"(see {tracefs()}/events/{cat}); iotrace needs it")
        missing = [f for f in needed if f not in fields]
        if missing:
            raise UserError(f"tracepoint {cat}:{ev} lacks field(s) {', '.join(missing)} on this kernel")


def choose_attach(mode: str, bio: bool) -> tuple[str, kernel.Layout | None, str]:
    """How to attach: (one of ATTACH_MODES, the kernel layout for raw_tp, why raw_tp was not taken).

    `mode` "auto" takes raw_tp wherever the running kernel's BTF has everything
    the programs read, else falls back to perf-event tracepoints and says why.
    """
    if mode == "tracepoint":
        return "tracepoint", None, ""
    if mode not in ("auto", "raw_tp"):
        raise UserError(f"--attach takes auto, {' or '.join(ATTACH_MODES)}, not {mode!r}")
    try:
        return "raw_tp", kernel.load(RAW_EVENTS + (RAW_BIO_EVENTS if bio else ()), start_events=start_events(),
                                     optional=RAW_PRESENT_EVENTS, firsts=(RAW_DIRTY_EVENTS,)), ""
    except kernel.LayoutError as exc:
        if mode == "raw_tp":
            raise UserError(f"--attach raw_tp: this kernel's BTF lacks what iotrace reads: {exc}") from None
        return "tracepoint", None, str(exc)


def bio_level_devices(devs: list[int]) -> list[int]:
    """The bio-based disks to trace per bio: those among `devs`, or every one in use when none is given.

    Decided at start: the bio programs cost every bio on every disk an
    extra program run, so they are attached only when such a disk is traced.
    """
    from tracer.sources import devices

    disks = devices.whole_disks()
    names = {dev: name for name, dev in disks.items()}
    if devs:
        return [d for d in devs if d in names and devices.bio_based(names[d])]
    return [dev for name, dev in disks.items() if devices.bio_based(name) and devices.size_sectors(name) > 0]


# --bio: bios a request's completion walks, longest first: 6.18's verifier takes 32, 6.1's gives up on them
BIO_WALKS = (32, 8, 2)


def submitted_devices(devs: list[int]) -> dict[int, int]:
    """--bio: the request-based disks whose bios are timed as submitted, with their partitions (a bio names
    the partition it was sent to): dev_t -> the whole disk's.  Those among `devs`, or every one in use when
    none is given; decided at start, as for bio_level_devices."""
    from tracer.sources import devices

    chosen = {dev for name, dev in devices.whole_disks().items() if not devices.bio_based(name)
              and (dev in devs if devs else devices.size_sectors(name) > 0)}
    out = {d: d for d in chosen}
    out.update({part: disk for part, disk in devices.partitions().items() if disk in chosen})
    return out


def check_perf_events(bio: bool) -> str:
    """The perf-event path: every tracepoint field its programs read is in this kernel (a UserError names
    what is not), bio ones too with `bio`, the page-dirtied event's too; the start event it has."""
    check_tracepoints()
    if bio:
        check_tracepoints(BIO_FIELDS)
    dirty = dirty_event()
    check_tracepoints({dirty: next(e.fields for e in EVENTS if e.name == dirty)})
    return choose_start_event()


def chosen_dirty_event(layout: kernel.Layout | None) -> str:
    """The page-dirtied event a run attaches: the raw path's from its layout, the perf-event path's from tracefs."""
    return layout.firsts[0] if layout is not None and layout.firsts else dirty_event()


def dirty_event() -> str:
    """The perf-event path's page-dirtied event: the first of DIRTY_EVENTS this kernel has (the newest when
    none is: check_tracepoints then names it as missing)."""
    return next((ev for ev in DIRTY_EVENTS if tracepoint_fields(ev, CATEGORIES[ev]) is not None), DIRTY_EVENTS[0])


# Whose clock readings a request's times are: iotrace's programs' at the start, issue and completion
# events ("own"), or the kernel's own stamps in struct request with the completion's clock ("kernel")
STAMPS = ("own", "kernel")
# The start event kernel stamps need: the request exists there (block_getrq's starts travel with a bio)
KERNEL_STAMPS_START = "block_io_start"


def choose_stamps(asked: str, layout: kernel.Layout | None, devs: list[int],
                  stamped: Callable[[kernel.Layout], kernel.Layout] | None = None,
                  keeps: Callable[[str], bool] = devices.keeps_start_stamp) -> tuple[kernel.Layout | None, str]:
    """(the layout to compile with, what of the kernel stamps asked for is not had: "" when all is, or not asked).

    --stamps kernel takes each request's start from rq->start_time_ns, which
    the kernel sets on every disk that keeps I/O statistics (iostat's await
    is computed from it), and its issue from rq->io_start_time_ns where
    RQF_STATS is set: no program on the issue, one clock read fewer.
    Where the raw path, block_io_start, the members in BTF (`stamped`: the
    layout with scope ["block", "stamps"]) or a traced request-based disk's
    stamps (`keeps`; every disk in use without --dev) are missing, iotrace
    keeps its own stamps and says why.  (A request that finds no stamp all
    the same, its disk's iostats turned off since, is timed from the start
    program's clock reading and counted: note own_start.)
    """
    if asked not in STAMPS:
        raise UserError(f"--stamps takes {' or '.join(STAMPS)}, not {asked!r}")
    if asked == "own":
        return layout, ""
    if layout is None:
        return None, "kernel stamps need the raw tracepoints (--attach raw_tp): iotrace's own stamps are used"
    if layout.start_event != KERNEL_STAMPS_START:
        return layout, (f"kernel stamps need block:{KERNEL_STAMPS_START} (the request is made by then; Linux 6.5+): "
                        f"iotrace's own stamps are used")
    unstamped = [n for n in traced_request_disks(devs) if not keeps(n)]
    if unstamped:
        return layout, (f"the kernel keeps no start stamp for {', '.join(unstamped)} (queue/iostats 0): "
                        f"iotrace's own stamps are used")
    try:
        return (stamped or _stamped_layout)(layout), ""
    except kernel.LayoutError as exc:
        return layout, f"this kernel's BTF lacks what kernel stamps read ({exc}): iotrace's own stamps are used"


def _stamped_layout(layout: kernel.Layout) -> kernel.Layout:
    """`layout` with the kernel stamps' reads (scope ["block", "stamps"]) resolved in too."""
    return replace(layout, values={**layout.values, **kernel.load_stamps()})


def compile_flags(opts: ProbeOptions, layout: kernel.Layout | None, bio: bool, start_event: str,
                  possible: list[int], tick: ticks.Ticks | None = None) -> tuple[str, ...]:
    """The programs' compiler flags: the shared headers, bio-level programs, the raw path's kernel layout,
    the start event's kind, the start's clock (`tick`: the tick count, with kernel stamps), the CPUs and
    the map sizes asked for."""
    cflags = [f"-I{contract.bpf_dir()}"]
    if bio:
        cflags.append("-DIOTRACE_BIO_LEVEL")
    if opts.submitted:
        cflags.append("-DIOTRACE_BIO_SUBMITTED")
    if layout is not None:
        cflags += layout.cflags()
        if layout.group_dead:
            cflags.append("-DIOTRACE_HAVE_GROUP_DEAD")
        if opts.files:
            cflags += [f"-DIOTRACE_HAVE_{event.upper()}" for event in getattr(layout, "present", ())]
        else:
            cflags.append("-DIOTRACE_NO_FILES")
    elif "group_dead" in (tracepoint_fields("sched_process_exit", "sched") or ()):
        cflags.append("-DIOTRACE_HAVE_GROUP_DEAD")
    # files and write-back's owed bytes (bpf/writeback.bpf.h, both paths) count pages
    cflags.append(f"-DIOTRACE_PAGE_SHIFT={(os.sysconf('SC_PAGE_SIZE') - 1).bit_length()}")
    if not opts.writeback:
        cflags.append("-DIOTRACE_NO_WRITEBACK")
    if layout is not None and layout.stamped:
        cflags.append("-DIOTRACE_KERNEL_STAMPS")
        if tick is not None:
            cflags.append(f"-DIOTRACE_START_TICK_NS={tick.tick_ns}")
    if starts_at_bio(start_event):
        cflags.append("-DIOTRACE_START_BIO")
    if not bpfobject.has_cmpxchg():
        cflags.append("-DIOTRACE_NO_CMPXCHG")
    if not bpfobject.has_ancestor_cgroup():
        cflags.append("-DIOTRACE_NO_ANCESTOR_CGROUP")
    if chosen_dirty_event(layout) != DIRTY_EVENTS[0]:
        cflags.append("-DIOTRACE_DIRTY_PAGE")
    cpus = max(possible) + 1
    cflags.append(f"-DIOTRACE_CPUS={cpus}")
    for name, value in (("INFLIGHT_SLOTS", opts.inflight_slots), ("HIST_ENTRIES", opts.hist_entries),
                        ("SERIES_ENTRIES", opts.series_entries),
                        ("HIST_CELLS", opts.hist_cells or hist_cells_for(cpus, contract.load()))):
        if value:
            cflags.append(f"-DIOTRACE_{name}={int(value)}")
    return tuple(cflags)


def hist_cells_for(cpus: int, c: contract.Contract) -> int:
    """The histogram cells a CPU when --hist-cells is not given: the power of two that HIST_CELLS_BUDGET cells
    hold over both generations of `cpus` CPUs' parts, no fewer than HIST_CELLS and no more than HIST_CELLS_MOST.
    A machine of few CPUs so gets the room 16 disks' fine histograms need (their samples otherwise overflow
    into the slower hash: docs/costs.md), and a large one no more memory than before."""
    share = c.const("HIST_CELLS_BUDGET") // (2 * max(cpus, 1))
    most = 1 << (share.bit_length() - 1) if share else 0
    return max(c.const("HIST_CELLS"), min(c.const("HIST_CELLS_MOST"), most))


def check_sizes(opts: ProbeOptions, c: contract.Contract) -> None:
    """The map sizes asked for that must be powers of two of at least the programs' probe windows."""
    for flag, value, least in (("--inflight-slots", opts.inflight_slots, c.const("INFLIGHT_PROBES")),
                               ("--hist-cells", opts.hist_cells, c.const("HIST_CELL_PROBES"))):
        if value is not None and (value < least or value & (value - 1)):
            raise UserError(f"{flag} must be a power of two of at least {least}, not {value}")


def program_text(attach: str, start_event: str) -> str:
    """The source bcc compiles for `attach`, the start event's category and name substituted in."""
    text = bpfobject.source(contract.bpf_dir(), SOURCES[attach])
    start = next(e for e in EVENTS if e.name == start_event)
    return text.replace("IOTRACE_START_CATEGORY", start.category).replace("IOTRACE_START_EVENT", start_event)


class Probe:
    """The BPF side of iotrace, loaded and attached; `close()` detaches."""

    def __init__(self, opts: ProbeOptions):
        bpfobject.preflight()
        self.contract = contract.load()
        self.bio_devs = bio_level_devices(list(opts.devs.devs))
        self.submitted = submitted_devices(list(opts.devs.devs)) if opts.submitted else {}
        bio = bool(self.bio_devs or self.submitted)
        # attach_note: why raw tracepoints were not used, when "auto" fell back
        self.attach, layout, self.attach_note = choose_attach(opts.attach, bio)
        if opts.submitted and layout is None:
            # the perf-event path knows a bio by its (dev, sector): a split bio completes under another sector
            raise UserError("--bio needs the raw-tracepoint path (--attach raw_tp): "
                            + (f"here it is not available: {self.attach_note}" if self.attach_note
                               else "--attach tracepoint cannot tell a split bio's completion"))
        self.start_event = layout.start_event if layout is not None else check_perf_events(bio)
        # where a traced process dirtying a page is seen (writeback_dirty_page before 5.17)
        self.dirty_event = chosen_dirty_event(layout)
        layout, stamps_note = choose_stamps(opts.stamps, layout, list(opts.devs.devs))
        self.stamps = "kernel" if layout is not None and layout.stamped else "own"
        # the event table's "present" events this kernel has, attached beside the others (raw path)
        self.present: tuple[str, ...] = tuple(getattr(layout, "present", ())) if opts.files else ()
        # the disks whose requests this start event mostly misses (said at start and in every dump)
        self.start_blind = blind_disks(self.start_event, list(opts.devs.devs))
        group_dead = (layout.group_dead if layout is not None
                      else "group_dead" in (tracepoint_fields("sched_process_exit", "sched") or ()))
        # what this kernel or path lacks, said at start and in every dump
        self.unavailable = unavailable(self.start_event, opts.files,
                                       self.present if layout is not None else None, group_dead,
                                       tuple(self.start_blind))
        if stamps_note:
            self.unavailable["stamps"] = stamps_note
        if opts.cgroup_id and not bpfobject.has_ancestor_cgroup():
            self.unavailable["cgroup"] = ("no bpf_get_current_ancestor_cgroup_id for tracing programs: --cgroup "
                                          "traces the threads directly in the cgroup, not those in cgroups below it")
        possible = bpfobject.possible_cpus()
        self.ncpu = len(possible)       # values per key of a per-CPU map
        # with the kernel's stamps a start only dates its slot: the tick count does, for less than the clock
        self.tick = ticks.calibrate() if self.stamps == "kernel" else None
        cflags = compile_flags(opts, layout, bio, self.start_event, possible, self.tick)
        text = program_text(self.attach, self.start_event)
        check_sizes(opts, self.contract)
        # --bio: the longest walk of a request's bios this kernel's verifier takes (BIO_WALKS, contract.toml)
        variants = ([Variant(self.attach, cflags + (f"-DIOTRACE_BIO_WALK={n}",)) for n in BIO_WALKS]
                    if opts.submitted else [Variant(self.attach, cflags)])
        self.bpf: BpfObject | None = BpfObject(text, variants, "the BPF programs")
        if not self.bpf.counts_misses():
            self.unavailable["skipped"] = ("the kernel does not count the events it skipped for a program "
                                           "(recursion_misses, Linux 5.12+): skipped_* read 0 without meaning none")
        self.bio_walk = int(self.bpf.variant.cflags[-1].rsplit("=", 1)[1]) if opts.submitted else 0
        self.maps = MapDrain(self.bpf, self.ncpu)
        self.ledger = Ledger(self.bpf, self.attach, self.contract.reasons, self.contract.const("STALE_NS"))
        # per-file rows: the raw path's (files.bpf.h reads kernel structs)
        self.files = (FileDrain(self.bpf, cache="mm_filemap_get_pages" in self.present)
                      if layout is not None and opts.files else None)
        self._write_filters(opts)
        # last: the programs record nothing until the config says enabled
        self._write_config(opts)
        self._interval_start = time.monotonic_ns()
        self.ledger.open_window()

    @property
    def bio_note(self) -> str:
        """One line when --bio's walk is shorter than the longest (an older verifier refused it), or ""."""
        if not self.bio_walk or self.bio_walk == BIO_WALKS[0]:
            return ""
        return (f"--bio: this kernel's verifier takes a walk of {self.bio_walk} bios a request, not "
                f"{BIO_WALKS[0]}: a request of more merged bios loses the rest's as-submitted rows (counted "
                f"as dropped bio_walk)")

    @property
    def stamps_note(self) -> str:
        """One line when the times are the kernel's stamps (--stamps kernel), or ""."""
        if self.stamps != "kernel":
            return ""
        return ("times from the kernel's own request stamps (--stamps kernel): a request's start is its "
                "start_time_ns, as in iostat's await; queue and device apart only where the kernel stamped "
                "its issue later than its start")

    @property
    def start_note(self) -> str:
        """One line on a start event that misses requests, or ""."""
        if not self.start_blind:
            return ""
        return (f"warning: requests are started on block:{self.start_event} here (block:{START_EVENTS[0]} is "
                f"Linux 6.5+), which fires only for requests that pass an I/O scheduler: on "
                f"{', '.join(self.start_blind)} (scheduler none) most requests will not be recorded; "
                f"'echo mq-deadline > /sys/block/DISK/queue/scheduler' lets iotrace see them")

    def _write_filters(self, opts: ProbeOptions) -> None:
        """The pids, devices, bio-based disks and (block_getrq on the perf-event path) partitions maps."""
        for pid in opts.pids:
            self.add_pid(pid)
        devs = self.bpf["devs"]
        for d in opts.devs.devs:
            devs[devs.Key(d)] = ct.c_uint8(1)
        if self.bio_devs or self.submitted:
            bio = self.bpf["bio_devs"]
            timed = {d: (d, 0) for d in self.bio_devs}
            timed.update({d: (disk, self.contract.const("OP_BIO")) for d, disk in self.submitted.items()})
            if len(timed) > bio.max_entries:
                raise UserError(f"--bio: {len(timed)} disks and partitions, more than the {bio.max_entries} "
                                f"iotrace can time per bio; name the disks with --dev")
            for d, (disk, mark) in timed.items():
                bio[bio.Key(d)] = bio.Leaf(disk, mark)
        if starts_at_bio(self.start_event) and self.attach == "tracepoint":
            parts = self.bpf["parts"]
            for part, disk in list(devices.partitions().items())[:parts.max_entries]:
                parts[parts.Key(part)] = parts.Leaf(disk)

    def _write_config(self, opts: ProbeOptions) -> None:
        self.bpf.write_config("config", gen=self.maps.gen, filter_pids=1 if opts.pids else 0,
                              follow_children=1 if opts.follow_children else 0,
                              per_thread=1 if opts.per_thread else 0, filter_devs=1 if opts.devs else 0,
                              filter_cgroup=opts.cgroup_id, cgroup_level=opts.cgroup_level,
                              tick_base=self.tick.base if self.tick is not None else 0, enabled=1)
        self._opts = opts
        self._partitions: dict[int, int] | None = None     # partition -> its disk, read once (owed_bytes)

    def add_pid(self, pid: int) -> None:
        pids = self.bpf["pids"]
        pids[pids.Key(pid)] = ct.c_uint8(1)
        # then: the start programs' per-thread cache of the filter's verdict is read again (struct iotrace_who);
        # user space is this count's only writer
        epochs, user = self.bpf["who_epochs"], self.contract.const("WHO_EPOCH_USER")
        epochs[epochs.Key(user)] = ct.c_uint32((epochs[epochs.Key(user)].value + 1) & 0xFFFFFFFF)

    def traced_pids(self) -> set[int]:
        return {k.value for k in self.bpf["pids"].keys()}

    def owed_bytes(self) -> int:
        """Bytes traced processes dirtied that no write-back has written yet (wb_owed, bpf/writeback.bpf.h:
        an entry per inode until its write-back has written all it owed or left it clean); with --dev,
        of files on those disks (a partition's are its disk's) and of files whose device is not known (the
        perf-event path does not read it); 0 when the programs leave write-back out."""
        if not self._opts.writeback:
            return 0
        owed = self.bpf["wb_owed"].values()
        if not self._opts.devs:
            return sum(v.bytes for v in owed)
        if self._partitions is None:
            self._partitions = devices.partitions()
        traced = set(self._opts.devs.devs)
        return sum(v.bytes for v in owed if not v.dev or self._partitions.get(v.dev, v.dev) in traced)

    def reason_totals(self) -> np.ndarray:
        """Events per reason since load (per-CPU counters summed)."""
        return self.ledger.reason_totals()

    def drain(self, final: bool = False) -> RawInterval:
        """Close the current interval and return everything recorded in it.

        `final`: the last one; it waits (up to LOST_MIN_AGE_NS) until requests
        left in flight on idle devices are old enough to be told lost.
        """
        # /proc/diskstats at the flip itself, not after the grace period: a request is counted there
        # a microsecond after its completion event, so a read at the flip has the old generation's
        # requests (but those completing in that microsecond) and none of the new one's, while a read
        # GENERATION_GRACE_S later also had the next window's first 5 ms (the first window after an
        # attach then fell short by them: 99.9%)
        window = self.maps.window
        edge = {}
        old, end = self.maps.flip(lambda: edge.update(ds=self.ledger.diskstats_window()))
        diskstats_start, diskstats_end = edge["ds"]
        maps = self.maps.drain(old)
        files = self.files.drain(old) if self.files is not None else None
        reasons = self.ledger.dropped(final)
        raw = RawInterval(
            start_ns=self._interval_start, end_ns=end,
            series_keys=maps.series_keys, series_vals=maps.series_vals,
            hist_keys=maps.hist_keys, hist_counts=maps.hist_counts,
            reasons=reasons, diskstats_start=diskstats_start, diskstats_end=diskstats_end,
            traced_devs=list(self._opts.devs.devs) or None, filtered=bool(self._opts.pids or self._opts.cgroup_id),
            bio_devs=list(self.bio_devs), attach=self.attach,
            start_event=self.start_event, start_blind=list(self.start_blind),
            files=files, files_top=self._opts.files_top, files_cache=bool(self.files and self.files.cache),
            window=window, stamps=self.stamps,
        )
        self._interval_start = end
        return raw

    def prog_stats(self) -> dict[str, ProgStats]:
        """Per-program kernel statistics, by tracepoint name."""
        return self.bpf.stats()

    def program_costs(self) -> dict[str, dict[str, int]]:
        """Each program's events, time spent (both 0 unless kernel.bpf_stats_enabled) and events skipped."""
        return self.bpf.costs()

    def close(self) -> None:
        if self.bpf is not None:
            self.bpf.close()
            self.bpf = None
