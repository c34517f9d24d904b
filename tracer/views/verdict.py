"""The verdict: was storage what a training window waited for?  One pure rule over one window.

This module owns the rule, its thresholds and the one line that states it;
tracer.views.report and tracer.views.plot show it, nothing here reads files or the
kernel.  Its input is one window (a dump, or the dumps of one label merged):
its wall time, the training loop's timing ("loop": data_wait_s, steps,
wall_s, sent with the window's marker) and its per-process rows ("tasks":
io_wait_s, read_bytes, read_pages, missed_pages, disk_read_bytes, fsync_s,
throttled_s per pid, with ppid; on by default, from the scheduler's,
page cache's and ext4's events).

Who is who.  The *trainer* is the process that sent the window's markers
("sender_pid" of marker dumps), else the one process of the rows whose
parent is not among them (the root of the traced tree: the command iotrace
ran, or the --pid).  Its *loaders* are its descendants among the rows
(DataLoader workers, multiprocessing pools).  With neither known (a
system-wide run, no markers), every row is a *process* and the busiest
one speaks for them.

Shares, of the window's wall time (the dumps' own time, which the rows
cover):

- data wait: loop.data_wait_s / loop.wall_s, the loop's own clock;
- trainer I/O wait: its io_wait_s / wall, summed over its threads, so a
  trainer whose reader threads wait at once (tf.data) can pass 100%;
- loaders I/O wait: their io_wait_s summed / (loaders x wall): the mean
  loader's share (again summed over each one's threads);
- from disk: disk_read_bytes / read_bytes over trainer and loaders (capped
  at 100%: readahead may read more than was asked for; all of it when bytes
  came from disk but none through read(), as with mmap); unknown where the
  rows could not count reads (tasks_sources: a kernel before 6.12 has no
  page-cache read event, and the rows were not timed at the syscalls), so
  that no share is made up of disk bytes alone;
- page-cache hits: 1 - missed_pages / read_pages over trainer and loaders
  (the pages their reads asked for, and those of them their readahead had
  to add to the cache: the page cache's own events), else (rows timed at the
  syscalls, --tasks, which count no pages) 1 - from disk.

The rule (thresholds below, module constants):

1. no wall time, or neither loop timing nor rows: "no verdict";
2. with loop timing: the loop waited less than DATA_WAIT_MIN of the window
   for data: "not I/O-bound" (whatever the disk did, the loop did not wait);
3. it waited more, and the readers (the trainer or its loaders, whichever
   waited more) were in I/O wait IO_WAIT_MIN of the window or more, or
   IO_WAIT_DISK_MIN or more with DISK_SHARE_MIN of their bytes from disk:
   "I/O-bound";
4. it waited more, but the readers hardly waited for I/O: "not I/O-bound",
   and the line asks "loader CPU?" (decoding, too few workers, the GIL);
5. it waited more and there are no rows: "no verdict" (traced with
   --no-tasks, or the per-process programs did not load);
6. no loop timing (a checkpoint window, a plain mark): "I/O-bound" when the
   readers were in I/O wait IO_WAIT_ALONE of the window or more, else
   "not I/O-bound".

A window that began before the tracer attached (its dump's before_attach:
`iotrace --pid` mid-epoch) is judged on what was traced, and says so
("attached N s after it began; the cold start may be missed"): the loop's
timing covers the whole window (the trainer's clock), the rows only the
traced part.  So rule 2 (from the loop alone) and an "I/O-bound" stand, but a
"not I/O-bound" that rests on the rows (rules 4 and 6) becomes "no verdict":
the I/O wait it did not see may have been the reason.

fsync and dirty-page throttling time are added to the line when together
they reach STALL_MIN of the window and STALL_MIN_S seconds ("checkpoint
stalls"); they are I/O wait
too, so a checkpoint window that stalls on its fsync is called I/O-bound by
rule 6.
"""

from __future__ import annotations

import math
import re
from dataclasses import asdict, dataclass

from tracer.model.sections import BeforeAttach, Loop, TaskRow

DATA_WAIT_MIN = 0.10        # the loop waited at least this share of the window for its batches
IO_WAIT_MIN = 0.20          # readers' I/O wait share that makes the disk the reason for the wait
IO_WAIT_DISK_MIN = 0.05     # ... or this much, when most bytes came from disk
DISK_SHARE_MIN = 0.50       # "most bytes from disk"
IO_WAIT_ALONE = 0.50        # without loop timing: readers in I/O wait at least half the window
STALL_MIN = 0.10            # fsync + throttled share of the window worth naming ...
STALL_MIN_S = 0.05          # ... and at least this many seconds

IO_BOUND = "I/O-bound"
NOT_IO_BOUND = "not I/O-bound"
UNKNOWN = "no verdict"


@dataclass(frozen=True)
class Verdict:
    """One window judged: the state, the numbers it rests on, and the line that says it."""

    state: str                          # IO_BOUND, NOT_IO_BOUND or UNKNOWN
    line: str                           # "I/O-bound: waited 31% of the epoch for data; ..."
    wall_s: float
    data_wait: float | None = None      # share of the loop's wall time spent waiting for batches
    steps: int | None = None
    trainer_pid: int | None = None
    trainer_io_wait: float | None = None    # share of the window, the trainer's threads summed
    loaders: int = 0
    loader_io_wait: float | None = None     # the mean loader's share of the window
    busiest_io_wait: float | None = None    # no trainer known: the busiest process's share
    processes: int = 0                      # rows judged (trainer + loaders, or all when no trainer is known)
    read_bytes: int = 0
    disk_read_bytes: int = 0
    from_disk: float | None = None          # share of the bytes read that came from disk
    read_pages: int = 0                     # pages read (the page cache's events; 0 when timed at the syscalls)
    missed_pages: int = 0                   # of them, added to the cache by the readers' readahead
    fsync_s: float = 0.0
    throttled_s: float = 0.0
    reads_counted: bool = True              # False: the rows had no source for reads (from_disk unknown)
    before_attach: bool = False             # the window began before the tracer attached (partly traced)
    before_attach_s: float | None = None    # ... this long before (None: not known)

    @property
    def cache_hit(self) -> float | None:
        """Share of the reads the page cache served: of the pages read when they were counted (1 - missed /
        read pages), else of the bytes (1 - from_disk)."""
        if self.read_pages:
            return 1.0 - min(1.0, self.missed_pages / self.read_pages)
        return None if self.from_disk is None else 1.0 - self.from_disk

    @property
    def readers_io_wait(self) -> float | None:
        """The I/O wait share of whichever waited more, the trainer or its (mean) loader."""
        shares = [s for s in (self.trainer_io_wait, self.loader_io_wait, self.busiest_io_wait) if s is not None]
        return max(shares) if shares else None

    def to_json(self) -> dict:
        out = asdict(self)
        if not self.read_pages:     # as windows of rows timed at the syscalls (and older files) have it
            del out["read_pages"], out["missed_pages"]
        if self.reads_counted:      # said only where the rows could not count reads
            del out["reads_counted"]
        if not self.before_attach:  # said only of a window that began before the tracer attached
            del out["before_attach"], out["before_attach_s"]
        out["cache_hit"] = None if self.cache_hit is None else round(self.cache_hit, 4)
        for k in ("data_wait", "trainer_io_wait", "loader_io_wait", "busiest_io_wait", "from_disk"):
            if out[k] is not None:
                out[k] = round(out[k], 4)
        return out


def _num(v: float) -> float:
    """A finite number, 0 if not (the wall time of a window: a hand-made dump may hold NaN)."""
    return float(v) if math.isfinite(v) and v >= 0 else 0.0


def family(rows: list[TaskRow], trainer_pid: int | None = None) -> tuple[TaskRow | None, list[TaskRow]]:
    """(the trainer's row or None, its loaders' rows): see the module docstring for who is who."""
    by_pid = {r.pid: r for r in rows}
    trainer = by_pid.get(trainer_pid) if trainer_pid is not None else None
    if trainer is None:
        roots = [r for r in rows if r.ppid not in by_pid or r.ppid == r.pid]
        trainer = roots[0] if len(roots) == 1 else None
    if trainer is None:
        return None, []
    children: dict[int, list[TaskRow]] = {}
    for r in rows:
        if r is not trainer:
            children.setdefault(r.ppid, []).append(r)
    loaders, todo, seen = [], [trainer.pid], {trainer.pid}
    while todo:
        for r in children.get(todo.pop(), []):
            if r.pid not in seen:
                seen.add(r.pid)
                loaders.append(r)
                todo.append(r.pid)
    return trainer, loaders


def _pct(share: float) -> str:
    return f"{share:.0%}" if share >= 0.01 or share == 0 else "<1%"


def _waits(v: Verdict) -> str:
    """'trainer 3%, 2 loaders 85% on average', or the busiest process's share when no trainer is known."""
    if v.trainer_pid is None:
        return "" if v.busiest_io_wait is None else f"busiest of {v.processes} processes {_pct(v.busiest_io_wait)}"
    text = f"trainer {_pct(v.trainer_io_wait or 0.0)}"
    if v.loaders == 1:
        text += f", its loader {_pct(v.loader_io_wait or 0.0)}"
    elif v.loaders:
        text += f", {v.loaders} loaders {_pct(v.loader_io_wait or 0.0)} on average"
    return text


def _bytes(v: Verdict) -> str:
    if not v.reads_counted:
        return "file reads not counted on this kernel (--tasks counts them)"
    if v.from_disk is None:
        return "no file reads"
    hits = f" (page-cache hits {_pct(v.cache_hit or 0.0)} of pages read)" if v.read_pages else ""
    if v.from_disk >= 0.5:
        return f"{_pct(v.from_disk)} of bytes from disk{hits}"
    return f"{_pct(1.0 - v.from_disk)} of bytes from page cache{hits}"


def _stalls(v: Verdict) -> str:
    stalled = v.fsync_s + v.throttled_s
    if v.wall_s <= 0 or stalled / v.wall_s < STALL_MIN or stalled < STALL_MIN_S:
        return ""
    parts = [f"fsync {v.fsync_s:.2f} s"] + ([f"throttled {v.throttled_s:.2f} s"] if v.throttled_s else [])
    return f"; checkpoint stalls: {', '.join(parts)}"


def judge(wall_s: float, loop: Loop | None = None, tasks: list[TaskRow] | None = None,
          trainer_pid: int | None = None, noun: str = "window", reads_counted: bool = True,
          before_attach: BeforeAttach | None = None) -> Verdict:
    """The verdict on one window: `wall_s` seconds, the loop's timing (or None), its rows (or None), the
    trainer's pid if known (the marker sender).  `noun` names the window in the line ("epoch");
    `reads_counted`: whether the rows count file reads (their tasks_sources' "reads" is available);
    `before_attach`: the window began before the tracer attached (the dump's section)."""
    wall = _num(wall_s)
    rows = tasks or []
    has_rows = bool(rows)
    dw = steps = None
    if loop is not None and loop.wall_s > 0 and loop.steps > 0:
        dw = min(1.0, loop.data_wait_s / loop.wall_s)
        steps = loop.steps
    trainer, loaders = family(rows, trainer_pid)
    judged = ([trainer] + loaders) if trainer is not None else rows
    fields: dict = {"wall_s": wall, "data_wait": dw, "steps": steps, "processes": len(judged)}
    if before_attach is not None:
        fields["before_attach"] = True
        fields["before_attach_s"] = before_attach.by_s
    if has_rows and wall > 0:
        fields["read_bytes"] = sum(r.read_bytes for r in judged)
        fields["disk_read_bytes"] = sum(r.disk_read_bytes for r in judged)
        fields["read_pages"] = sum(r.read_pages for r in judged)
        fields["missed_pages"] = sum(r.missed_pages for r in judged)
        fields["fsync_s"] = round(sum(r.fsync_s for r in judged), 6)
        fields["throttled_s"] = round(sum(r.throttled_s for r in judged), 6)
        if not reads_counted:
            fields["reads_counted"] = False
        elif fields["read_bytes"]:
            fields["from_disk"] = min(1.0, fields["disk_read_bytes"] / fields["read_bytes"])
        elif fields["disk_read_bytes"]:
            fields["from_disk"] = 1.0
        if trainer is not None:
            fields["trainer_pid"] = trainer.pid
            fields["trainer_io_wait"] = trainer.io_wait_s / wall
            fields["loaders"] = len(loaders)
            if loaders:
                fields["loader_io_wait"] = sum(r.io_wait_s for r in loaders) / len(loaders) / wall
        elif rows:
            # no trainer known: the busiest process speaks for them
            fields["busiest_io_wait"] = max(r.io_wait_s for r in rows) / wall
    v = Verdict(UNKNOWN, "", **fields)
    state, line = _rule(v, has_rows and wall > 0, noun)
    if v.before_attach:
        state, line = _partly_traced(v, state, line, noun)
    return Verdict(state, f"{state}: {line}", **fields)


def _partly_traced(v: Verdict, state: str, line: str, noun: str) -> tuple[str, str]:
    """A window that began before the attach: what the rule said, and that; a "not I/O-bound" that rests on
    the rows (not on the loop alone, rule 2) is no verdict (see the module docstring)."""
    by = f"{v.before_attach_s:.1f} s " if v.before_attach_s is not None else ""
    late = f"attached {by}after the {noun} began; the cold start may be missed"
    from_loop = v.data_wait is not None and v.data_wait < DATA_WAIT_MIN
    if state == NOT_IO_BOUND and not from_loop:
        return UNKNOWN, f"{late} (what was traced: {line})"
    return state, f"{line}; {late}"


def _rule(v: Verdict, rows: bool, noun: str) -> tuple[str, str]:
    if v.wall_s <= 0:
        return UNKNOWN, f"empty {noun} (no wall time)"
    if v.data_wait is None and not rows:
        return UNKNOWN, ("no loop timing and no per-process rows (traced with --no-tasks, or they did not load; "
                         "mark epochs with tracer.marker)")
    io = v.readers_io_wait or 0.0
    waits, read = _waits(v), _bytes(v)
    if v.data_wait is not None:
        waited = f"waited {_pct(v.data_wait)} of the {noun} for data"
        if v.data_wait < DATA_WAIT_MIN:
            facts = f"; in I/O wait: {waits}; {read}" if rows and waits else (f"; {read}" if rows else "")
            return NOT_IO_BOUND, f"{waited}{facts}{_stalls(v)}"
        if not rows:
            return UNKNOWN, (f"{waited}; no per-process rows to tell whether for the disk (traced with --no-tasks, "
                             f"or they did not load)")
        disk = v.from_disk if v.from_disk is not None else 0.0
        if io >= IO_WAIT_MIN or (io >= IO_WAIT_DISK_MIN and disk >= DISK_SHARE_MIN):
            return IO_BOUND, f"{waited}; in I/O wait: {waits}; {read}{_stalls(v)}"
        return NOT_IO_BOUND, f"{waited}, but hardly in I/O wait ({waits}); {read}: loader CPU?{_stalls(v)}"
    state = IO_BOUND if io >= IO_WAIT_ALONE else NOT_IO_BOUND
    return state, f"no loop timing; in I/O wait: {waits}; {read}{_stalls(v)}"


_OWNED = re.compile(r"^(rank|pid) \d+: ")      # a rank's window's name (tracer.views.report.window_label)


def noun_of(label: str | None) -> str:
    """What to call a window in its line: "epoch" for "epoch 3" (also nested: "run 2 / epoch 3", and a
    rank's: "rank 1: epoch 3")."""
    last = _OWNED.sub("", label or "", count=1).rsplit(" / ", 1)[-1]
    return "epoch" if last.startswith("epoch") else "window"


def judge_dump(d) -> Verdict:
    """The verdict on a dump (tracer.model.dump.Dump: one window, or one label's dumps merged)."""
    from tracer.model.dump import duration_of

    reads = d.tasks_sources.available.get("reads", True) if d.tasks_sources is not None else True
    return judge(duration_of(d), d.loop, d.tasks.rows if d.tasks is not None else None,
                 d.sender_pid.pid if d.sender_pid is not None else None, noun_of(d.label), reads, d.before_attach)
