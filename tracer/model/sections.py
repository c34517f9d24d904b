"""The optional sections of a dump, each a type: how it reads from JSON, writes to JSON, and merges.

A dump (tracer.model.dump.Dump) has its core (times, host, series, drops)
and optional sections that features add: the attach path, the start event,
coverage, per-process rows, the training loop's timing, ... .  Each is one
class here, registered once in SECTIONS; the class's ``key`` is both its
JSON key in a dump's line (tracer.codec.jsonl) and the Dump attribute that
holds it (None when the dump has none).  The codec, DumpMerger and the views
walk SECTIONS or use the attributes; nothing spells a section's keys
elsewhere.

A class provides:
  from_json(value) -> section   the JSON value of its key, checked (ValueError
                                names the bad value; see tracer.model.jsoncheck)
  to_json() -> value            what is written under its key
  merger() -> Merger | None     how the sections of disjoint windows merge
                                (None: a merged dump has none, e.g. alerts)

Most classes are Fieldwise (tracer.model.fieldwise): their dataclass fields'
annotations and options say how they read, write and merge.  The others
(Loop; Files, in tracer.model.files) and the mergers no policy expresses
(TaskMerger, LoopMerger) are written by hand, each saying why.

A Merger sees every merged dump in order (``add(dump)``, whether or not it
has the section: the loop's merge needs every label) and gives the merged
section or None (``result()``).

A line's keys that no class claims (written by a newer iotrace) are kept as
they are on that dump (Dump.unknown) and written back with it; a merge, which
cannot know how to add them up, leaves them out.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, fields, replace
from typing import Any, ClassVar

from tracer.marker import LOOP_KEYS, check_loop
from tracer.model.fieldwise import (
    AGREED,
    BY_FIELD,
    Fieldwise,
    Record,
    at_most,
    either,
    joined,
    largest,
    one_of,
    opt,
    summed_per_key,
    union,
)
from tracer.model.files import Files
from tracer.model.sectionbase import Merger, Section

# ---- the attach path and the start event ---------------------------------------

@dataclass(frozen=True)
class Attach(Fieldwise):
    """The attach path the BPF programs used ("raw_tp", "tracepoint"; "raw_tp+tracepoint" for merged runs)."""

    key: ClassVar[str] = "attach"
    json_bare: ClassVar[bool] = True
    json_merge: ClassVar[str] = BY_FIELD
    path: str = opt(merge=joined())     # one, unless runs of both kinds


@dataclass(frozen=True)
class StartEvent(Fieldwise):
    """The block event requests start on, the disks it is blind to (scheduler none, before block_io_start), and
    whose stamps the times are: "kernel" (--stamps kernel: the request's own start_time_ns and io_start_time_ns),
    absent for iotrace's own."""

    key: ClassVar[str] = "start_event"
    json_merge: ClassVar[str] = BY_FIELD
    event: str = opt("", merge=joined())
    blind: tuple[str, ...] = opt((), omit_empty=True, merge=union())
    stamps: str = opt("", omit_empty=True, merge=joined())


# ---- coverage ------------------------------------------------------------------

@dataclass(frozen=True)
class DeviceCoverage(Record):
    recorded: int = 0       # requests iotrace recorded
    diskstats: int = 0      # requests /proc/diskstats completed, same window


@dataclass
class Coverage(Fieldwise):
    """Per device: requests recorded vs completed per /proc/diskstats; `filtered`: a pid or cgroup filter
    was on (iotrace's share is partial by design).  Merged: added up, device by device."""

    key: ClassVar[str] = "coverage"
    json_merge: ClassVar[str] = BY_FIELD
    filtered: bool = opt(merge=either())
    devices: dict[str, DeviceCoverage] = opt(factory=dict, merge=summed_per_key())

    def unrecorded(self, device: str | None = None) -> dict[str, int]:
        """Requests /proc/diskstats completed that iotrace did not record, per device that is short of them
        (`device`: that one only)."""
        return {name: c.diskstats - c.recorded for name, c in self.devices.items()
                if (device is None or name == device) and c.diskstats > c.recorded}


@dataclass(frozen=True)
class BioDevices(Fieldwise):
    """Bio-based devices among the traced ones: their rows time bios (queue to completion), total phase only."""

    key: ClassVar[str] = "bio_devices"
    json_bare: ClassVar[bool] = True
    json_merge: ClassVar[str] = BY_FIELD
    names: tuple[str, ...] = opt(merge=union(none_if_empty=True))


# ---- per-process rows ("tasks"; their sources) -------------------------------------

@dataclass
class TaskRow(Record):
    """One traced process in a window (tracer.sources.tasks; docs/training.md, per process)."""

    json_sep: ClassVar[str] = " "      # its errors say "tasks pid", as they always have

    pid: int
    ppid: int = 0
    comm: str = ""
    io_wait_s: float = 0.0      # its threads' time blocked in I/O wait (delay accounting's block-I/O delay)
    io_waits: int = 0
    read_bytes: int = 0         # read from files, page cache included (tasks_sources says from which events)
    reads: int = 0
    # the page counts are written only where there are some (rows of --tasks, and of files older than them,
    # have none)
    read_pages: int = opt(0, omit_empty=True)       # pages of those reads (the page cache's events only)
    missed_pages: int = opt(0, omit_empty=True)     # pages they added to the cache (hit ratio: 1 - missed/read)
    disk_read_bytes: int = 0    # its read series' bytes
    fsync_s: float = 0.0        # in fsync, fdatasync (ext4_sync_file; with --tasks the syscalls, sync_file_range too)
    fsyncs: int = 0
    throttled_s: float = 0.0    # blocked by dirty-page throttling
    throttles: int = 0
    started: bool = False
    exited: bool = False

    def add(self, r: TaskRow) -> None:
        """`r`, the same process's row of a later window, added in (name and parent from the latest)."""
        for k in TASK_SUMS:
            v = getattr(self, k) + getattr(r, k)
            setattr(self, k, round(v, 6) if k.endswith("_s") else v)
        self.comm = r.comm or self.comm
        self.ppid = r.ppid or self.ppid
        self.started = self.started or r.started
        self.exited = self.exited or r.exited


# the counters a row adds up over windows
TASK_SUMS = ("io_wait_s", "io_waits", "read_bytes", "reads", "read_pages", "missed_pages", "disk_read_bytes",
             "fsync_s", "fsyncs", "throttled_s", "throttles")


@dataclass
class Tasks(Fieldwise):
    """A row per traced process of the window, exited ones included (an empty list: none ran)."""

    key: ClassVar[str] = "tasks"
    json_bare: ClassVar[bool] = True
    rows: list[TaskRow] = opt(factory=list, item="a {name} row")

    @classmethod
    def merger(cls) -> Merger:
        return TaskMerger()     # by pid, each row's counters added (TaskRow.add): no field-wise policy says that

    def folded(self) -> Tasks:
        """Exited processes' rows summed per comm (pid 0: "these processes"), live ones kept: a long run's
        total holds a row per name, not per pid, of what came and went (tracer.sinks.table)."""
        acc = TaskMerger()
        acc.add_rows([r if not r.exited else replace(r, pid=0, ppid=0, started=False) for r in self.rows])
        return acc.result() or Tasks([])


@dataclass(frozen=True)
class _TextMap(Fieldwise):
    """A {name: text} section that every window of a run has alike: merged when the dumps agree."""

    json_bare: ClassVar[bool] = True
    json_sep: ClassVar[str] = " "      # "unavailable start is 3, ..."
    json_merge: ClassVar[str] = AGREED
    items: tuple[tuple[str, str], ...]     # pairs, not a dict: the agreed merge keeps them in a set

    @classmethod
    def of(cls, texts: dict[str, str]):
        return cls(tuple(texts.items()))


@dataclass(frozen=True)
class Unavailable(_TextMap):
    """What this kernel or attach path lacks that iotrace would use, each with what is not counted for it
    ({source: why}; tracer.pipeline.windows.unavailable): a figure it names is missing, not zero."""

    key: ClassVar[str] = "unavailable"


@dataclass(frozen=True)
class TasksSources(_TextMap):
    """Where each counter of the rows came from (tracer.sources.tasks: an event, the syscalls, "unavailable: why")."""

    key: ClassVar[str] = "tasks_sources"

    @property
    def available(self) -> dict[str, bool]:
        return {k: not x.startswith("unavailable") for k, x in self.items}


class TaskMerger:
    """Rows of disjoint windows added up by pid (one row per pid kept), sorted by pid."""

    def __init__(self) -> None:
        self.out: dict[int, TaskRow] | None = None

    def add(self, d) -> None:
        if d.tasks is not None:
            self.add_rows(d.tasks.rows)

    def add_rows(self, rows: list[TaskRow]) -> None:
        out = self.out = {} if self.out is None else self.out
        for r in rows:
            key = (r.pid, r.comm if r.pid == 0 else "")    # pid 0: folded rows (Tasks.folded), one per comm
            acc = out.get(key)
            if acc is None:
                out[key] = TaskRow(**{f.name: getattr(r, f.name) for f in fields(r)})
            else:
                acc.add(r)

    def result(self) -> Tasks | None:
        """None if no window had rows (not even an empty list)."""
        return None if self.out is None else Tasks([self.out[k] for k in sorted(self.out)])


# ---- markers: the enclosing window, the training loop's timing, the sender ------------

@dataclass(frozen=True)
class Enclosing(Fieldwise):
    """A marker dump's enclosing window: its label, or None at the top level (or from `iotrace mark`)."""

    key: ClassVar[str] = "enclosing"
    json_bare: ClassVar[bool] = True
    json_merge: ClassVar[str] = AGREED
    label: str | None


@dataclass(frozen=True)
class Loop(Section):
    """The training loop's timing over a marker's window: seconds it waited for batches, batches, wall time.

    Hand-written: it is checked by the marker wire's check_loop (its own messages, "loop.steps is not a whole
    number", and a steps of 10.0 read as 10), and merged by LoopMerger (nested windows are not added twice)."""

    key: ClassVar[str] = "loop"
    null_is_absent: ClassVar[bool] = True
    data_wait_s: float
    steps: int
    wall_s: float

    @classmethod
    def from_json(cls, v) -> Loop:
        why = check_loop(v)
        if why:
            raise ValueError(why)
        return cls(float(v["data_wait_s"]), int(v["steps"]), float(v["wall_s"]))

    def to_json(self) -> dict:
        return {"data_wait_s": self.data_wait_s, "steps": self.steps, "wall_s": self.wall_s}

    @property
    def wait_share(self) -> float | None:
        """The share of its wall time the loop waited for batches, or None without steps or wall time."""
        if not self.steps or not self.wall_s:
            return None
        return min(1.0, self.data_wait_s / self.wall_s)

    @classmethod
    def merger(cls) -> Merger:
        return LoopMerger()


class LoopMerger:
    """The loops of merged dumps added up, in order.

    A window's loop counts the steps of the windows nested in it, so a loop
    whose enclosing window is among the merged dumps' labels is not added
    again; whether it is depends on labels still to come, so such loops wait
    (in order, keeping the float sums bit for bit merge_loops') until their
    enclosing label shows up, or the merge ends.
    """

    def __init__(self) -> None:
        self.sums: list[float] | None = None
        self.labels: set[str | None] = set()
        self.waiting: deque[tuple[str | None, Loop]] = deque()

    def add(self, d) -> None:
        self.labels.add(d.label)
        if d.loop is None:
            return
        enclosing = d.enclosing.label if d.enclosing is not None else None
        if enclosing is not None and enclosing in self.labels:
            return
        self.waiting.append((enclosing, d.loop))
        while self.waiting:
            enc = self.waiting[0][0]
            if enc is not None and enc in self.labels:
                self.waiting.popleft()
            elif enc is None:
                self.sums = _add_loop(self.sums, self.waiting.popleft()[1])
            else:
                break

    def result(self) -> Loop | None:
        sums = self.sums
        for enc, loop in self.waiting:
            if enc is None or enc not in self.labels:
                sums = _add_loop(sums, loop)
        return None if sums is None else Loop(sums[0], int(sums[1]), sums[2])


def _add_loop(sums: list[float] | None, loop: Loop) -> list[float]:
    sums = [0, 0, 0] if sums is None else sums
    return [sums[i] + float(getattr(loop, k)) for i, k in enumerate(LOOP_KEYS)]


def merge_loops(parts: list[Loop]) -> Loop | None:
    """The training loop's timing over several windows: each of data_wait_s, steps and wall_s added up."""
    sums = None
    for p in parts:
        sums = _add_loop(sums, p)
    return None if sums is None else Loop(sums[0], int(sums[1]), sums[2])


@dataclass(frozen=True)
class SenderPid(Fieldwise):
    """The process that sent a marker dump's marker (the trainer; tracer.views.verdict tells its rows by it)."""

    key: ClassVar[str] = "sender_pid"
    json_bare: ClassVar[bool] = True
    json_merge: ClassVar[str] = AGREED
    pid: int


@dataclass(frozen=True)
class Owner(Fieldwise):
    """Whose window a marker dump is, when a run's windows are per sender (tracer.pipeline.senders): the training
    loop that sent its marker (`pid`) and the rank it said it is (`rank`, None: it did not say).  Its series,
    rows and files are that sender's processes' only (itself and its descendants)."""

    key: ClassVar[str] = "owner"
    json_merge: ClassVar[str] = AGREED
    MAX_RANK: ClassVar[int] = 2**20
    pid: int
    rank: int | None = opt(None, check=at_most(MAX_RANK))

    @property
    def name(self) -> str:
        """How its windows are named: "rank 1", or "pid 4242" for a sender that gave no rank."""
        return f"rank {self.rank}" if self.rank is not None else f"pid {self.pid}"



@dataclass(frozen=True)
class BeforeAttach(Fieldwise):
    """A window that began before the tracer attached (`iotrace --pid` mid-epoch, a tracer started after the
    trainer): `by_s` seconds before (None: how long is not known: an older sender's marker does not say); the dump
    holds only what came after.  Merged: the longest of them."""

    key: ClassVar[str] = "before_attach"
    json_merge: ClassVar[str] = BY_FIELD
    by_s: float | None = opt(None, merge=largest())


# ---- what the final dump says about the tracer, and per-window findings (not merged) -------------

@dataclass
class BpfPrograms(Fieldwise):
    """The final dump's BPF program costs, per program name ("tasks:NAME" for the per-process tracer's)."""

    key: ClassVar[str] = "bpf_programs"
    json_bare: ClassVar[bool] = True
    costs: dict[str, Any]


@dataclass(frozen=True)
class TracedPids(Fieldwise):
    """The final dump's pid filter size (a pid filter was on): flat over a long run."""

    key: ClassVar[str] = "traced_pids"
    json_bare: ClassVar[bool] = True
    count: int


# why the wait for the traced processes' write-back ended (UnwrittenAtExit.ended)
WRITEBACK_ENDS = ("written", "bound", "deadline", "signal", "not waited")


@dataclass
class UnwrittenAtExit(Fieldwise):
    """The final dump of a run that ended when its traced processes did (a COMMAND, the --pid tree): the bytes
    they dirtied that the kernel had not written back when the trace stopped (0: all of it is in the run's
    figures), the seconds waited for that write-back, and why the wait ended (WRITEBACK_ENDS: "bound" is
    --wb-wait's time, "deadline" -d's, "not waited" --wb-wait 0).  tracer.runtime.wbwait."""

    key: ClassVar[str] = "unwritten_at_exit"
    bytes: int
    waited_s: float = opt(digits=3)
    ended: str = opt(check=one_of(WRITEBACK_ENDS))


@dataclass(frozen=True)
class WindowSeq(Fieldwise):
    """The window's sequence number in its run (1 the first; the BPF side's wb_window): what a later window's
    write-back names it by (tracer.model.dump.Dirtied).  A merge of windows has none."""

    key: ClassVar[str] = "window_seq"
    json_bare: ClassVar[bool] = True
    seq: int


@dataclass(frozen=True)
class Credit(Record):
    """Write-back of data a window dirtied, by one process (`comm`) and the window it was written back in
    (`written_in`, its label; None: unlabelled), from `start` to `end` (ISO 8601: the first and last such
    windows' edges)."""

    comm: str
    written_in: str | None
    count: int
    bytes: int
    start: str
    end: str


@dataclass(frozen=True)
class WrittenBack(Fieldwise):
    """A labelled window's write-back credit (`iotrace report --by label`'s merged windows): the bytes its
    processes dirtied, by the window that wrote them back (the same one, or a later one), from the write-back
    rows' Dirtied entries of every dump read.  Bytes only: the requests' latencies are those of the window
    they ran in.  A merge has none (it is made from all the dumps, not merged)."""

    key: ClassVar[str] = "written_back"
    json_bare: ClassVar[bool] = True
    credits: tuple[Credit, ...] = opt((), item="{name}[{i}]")


@dataclass
class Alerts(Fieldwise):
    """The --alert rules a window crossed (tracer.pipeline.alerts.Alert.to_json each)."""

    key: ClassVar[str] = "alerts"
    json_bare: ClassVar[bool] = True
    items: list[dict] = opt(item="an alert")


@dataclass
class VerdictSection(Fieldwise):
    """A merged window's verdict as `report --json` writes it (tracer.views.verdict.Verdict.to_json)."""

    key: ClassVar[str] = "verdict"
    json_bare: ClassVar[bool] = True
    value: dict


# Every section, in the order a line holds them.
SECTIONS: tuple[type[Section], ...] = (Attach, StartEvent, Coverage, BioDevices, Tasks, TasksSources, Unavailable,
                                       Files,
                                       Enclosing, Loop, SenderPid, Owner, BeforeAttach, BpfPrograms, TracedPids,
                                       UnwrittenAtExit, Alerts,
                                       VerdictSection, WindowSeq, WrittenBack)
BY_KEY: dict[str, type[Section]] = {cls.key: cls for cls in SECTIONS}


def read_sections(obj_: dict, known: set[str]) -> tuple[dict[str, Section], dict[str, Any]]:
    """A line's sections ({key: section}, for Dump(**...)) and the keys nothing claims (`known`: the core's)."""
    sections, unknown = {}, {}
    for k, v in obj_.items():
        cls = BY_KEY.get(k)
        if cls is not None:
            if v is not None or not cls.null_is_absent:
                sections[k] = cls.from_json(v)
        elif k not in known:
            unknown[k] = v
    return sections, unknown


def write_sections(d, out: dict) -> None:
    """`d`'s sections into its line's object `out`, in SECTIONS order, then its unknown keys."""
    for cls in SECTIONS:
        s = getattr(d, cls.key)
        if s is not None:
            out[cls.key] = s.to_json()
    out.update(d.unknown)
