"""The aggregator: turns a drained interval (raw numpy arrays from
tracer.sources.probe) into a Dump of Series with histograms.  Pure numpy, no root.
"""

from __future__ import annotations

import platform
import socket
import time
from datetime import UTC, datetime

import numpy as np

from tracer import contract
from tracer.model.dump import Dirtied, Dump, PhaseStats, Series, merge_dirtied
from tracer.model.files import FileRow, Files, bounded
from tracer.model.histogram import Histogram
from tracer.model.sections import (
    Attach,
    BioDevices,
    Coverage,
    DeviceCoverage,
    StartEvent,
    TaskRow,
    Tasks,
    WindowSeq,
)
from tracer.sources import devices


class Clock:
    """Maps CLOCK_MONOTONIC nanoseconds (the kernel's timestamps) to wall-clock datetimes."""

    def __init__(self) -> None:
        self.offset_ns = time.time_ns() - time.monotonic_ns()

    def wall(self, mono_ns: int) -> datetime:
        return datetime.fromtimestamp((mono_ns + self.offset_ns) / 1e9, tz=UTC).astimezone()


def _group_hists(keys: np.ndarray, counts: np.ndarray) -> dict[tuple[int, int, int, int], Histogram]:
    """(pid, dev, op, phase) -> Histogram, from the flat bucket entries.

    One key may appear several times (once per CPU, in a cell and in the
    overflow map): repeats are summed.  Done for all histograms at once,
    since a dump may hold thousands.
    """
    if not len(keys):
        return {}
    order = np.lexsort((keys["bucket"], keys["phase"], keys["op"], keys["dev"], keys["pid"]))
    k = keys[order]
    c = counts[order].astype(np.uint64)
    ident = np.stack([k["pid"].astype(np.int64), k["dev"].astype(np.int64),
                      k["op"].astype(np.int64), k["phase"].astype(np.int64)], axis=1)
    bucket = k["bucket"].astype(np.int64)
    new_group = np.r_[True, np.any(ident[1:] != ident[:-1], axis=1)]
    new_entry = new_group | np.r_[True, bucket[1:] != bucket[:-1]]
    first = np.flatnonzero(new_entry)
    sums = np.add.reduceat(c, first)
    keep = sums > 0
    first, sums = first[keep], sums[keep]
    group_of = np.cumsum(new_group)[first]          # which histogram each summed entry belongs to
    starts = np.flatnonzero(np.r_[True, group_of[1:] != group_of[:-1]])
    keys = map(tuple, ident[first[starts]].tolist())
    # sorted, unique and non-zero already: no need for from_pairs' dense pass
    return {k: Histogram(i, c) for k, i, c in zip(keys, np.split(bucket[first], starts[1:]),
                                                   np.split(sums, starts[1:]), strict=True)}


class WindowNames:
    """The windows of a run so far by sequence number (WindowSeq): the label and start of the last MAX, so that
    a later window's write-back names the window that dirtied its data (an older one: by number alone)."""

    MAX = 4096

    def __init__(self) -> None:
        self.known: dict[int, tuple[str | None, datetime]] = {}

    def add(self, seq: int, label: str | None, start: datetime) -> None:
        if not seq:
            return
        self.known[seq] = (label, start)
        if len(self.known) > self.MAX:
            del self.known[next(iter(self.known))]     # insertion order: the oldest

    def get(self, seq: int) -> tuple[str | None, datetime | None]:
        return self.known.get(seq, (None, None))


def full_window(current: int, low: int, bits: int) -> int:
    """The sequence number of the window a write-back request names by its low `bits` (`low`), seen in window
    `current`: the latest one not after it (0, or `current` unknown: `low` as it is)."""
    if not low or not current:
        return low
    return current - ((current - low) & ((1 << bits) - 1))


def _fold_rows(cols: dict, rows: list[int], nphases: int) -> dict:
    """The kernel's series rows of one (pid, dev, op) (one per dirtying window, for write-back) as one:
    counts and sums added, min of the minima seen (0: none), max of the maxima; identity of the largest."""
    if len(rows) == 1:
        i = rows[0]
        return {name: cols[name][i] for name in cols}
    out = {"count": sum(cols["count"][i] for i in rows), "bytes": sum(cols["bytes"][i] for i in rows)}
    for name in ("phase_count", "sum_ns", "max_ns"):
        pick = max if name == "max_ns" else sum
        out[name] = [pick(cols[name][i][p] for i in rows) for p in range(nphases)]
    out["min_ns"] = [min((cols["min_ns"][i][p] for i in rows if cols["min_ns"][i][p]), default=0)
                     for p in range(nphases)]
    main = max(rows, key=lambda i: cols["count"][i])
    out["tgid"], out["cgroup"] = cols["tgid"][main], cols["cgroup"][main]
    out["main"] = main
    return out


def build_dump(raw, clock: Clock, kind: str, label: str | None = None, tasks: list | None = None,
               tasks_dropped: dict[str, int] | None = None, windows: WindowNames | None = None) -> Dump:
    """A Dump from a probe.RawInterval; with `tasks` (tracer.sources.tasks.TaskRaw rows of the same window)
    it carries "tasks", and `tasks_dropped`'s non-zero counts join its dropped events.  A write-back row's
    requests come from the kernel split by the window their data was dirtied in (IOTRACE_OP_WINDOW_SHIFT):
    one row, its latencies this window's, its bytes split in Series.dirtied (named through `windows`)."""
    con = contract.load()
    ops, phases, wb_bit, bio_bit = con.ops, con.phases, con.const("OP_WB"), con.const("OP_BIO")
    shift, bits, code_mask = con.const("OP_WINDOW_SHIFT"), con.const("OP_WINDOW_BITS"), con.const("OP_CODE_MASK")
    hists = _group_hists(raw.hist_keys, raw.hist_counts)
    names: dict[int, str] = {}
    series = []
    submitted = []      # --bio: the bios as submitted (IOTRACE_OP_BIO), rows of their own (Dump.submitted)
    k, v = raw.series_keys, raw.series_vals
    # plain lists, column by column: per-element access to numpy records is slow
    cols = {name: v[name].tolist() for name in ("count", "bytes", "tgid", "cgroup",
                                                 "phase_count", "sum_ns", "min_ns", "max_ns")}
    comms = [bytes(c).split(b"\0", 1)[0].decode(errors="replace") for c in v["comm"]]
    full_ops = k["op"].tolist()
    groups: dict[tuple[int, int, int], list[int]] = {}
    for i, (pid, dev, op) in enumerate(zip(k["pid"].tolist(), k["dev"].tolist(), full_ops, strict=True)):
        groups.setdefault((pid, dev, op & code_mask), []).append(i)
    here = raw.window
    for (pid, dev, op), rows in groups.items():
        if dev not in names:
            names[dev] = devices.name_of(dev)
        row = _fold_rows(cols, rows, len(phases))
        stats = {}
        for p, pname in enumerate(phases):
            if not row["phase_count"][p]:
                continue
            stats[pname] = PhaseStats(hists.get((pid, dev, op, p), Histogram.empty()), float(row["sum_ns"][p]),
                                      row["min_ns"][p], row["max_ns"][p])
        dirtied = []
        if op & wb_bit:
            for i in rows:
                seq = full_window(here, full_ops[i] >> shift, bits)
                name, began = ((label, clock.wall(raw.start_ns)) if seq == here and seq
                               else windows.get(seq) if windows is not None else (None, None))
                dirtied.append(Dirtied(seq, name, began, cols["count"][i], cols["bytes"][i]))
        code = op & (bio_bit - 1)    # the op, without the bio and write-back marks
        (submitted if op & bio_bit else series).append(Series(
            pid=pid, comm=comms[row.get("main", rows[0])], device=names[dev], devno=devices.devno(dev),
            op=ops[code] if code < len(ops) else str(code), count=row["count"], bytes=row["bytes"],
            phases=stats, tgid=row["tgid"], cgroup_id=row["cgroup"], wb=bool(op & wb_bit),
            dirtied=merge_dirtied(sorted(dirtied, key=lambda e: e.window))))
    series.sort(key=lambda s: (s.pid, s.device, s.op, s.wb))
    submitted.sort(key=lambda s: (s.pid, s.device, s.op, s.wb))
    dropped = {r.removeprefix("drop_"): n for r, n in raw.reasons.items() if r.startswith("drop_")}
    events = {r.removeprefix("note_"): n for r, n in raw.reasons.items() if r.startswith("note_")}
    d = Dump(kind=kind, label=label, start=clock.wall(raw.start_ns), end=clock.wall(raw.end_ns),
             host=socket.gethostname(), kernel=platform.release(), series=series,
             dropped=dropped, events=events, submitted=submitted)
    d.attach = Attach(raw.attach)
    if raw.window:
        d.window_seq = WindowSeq(raw.window)
    if raw.start_event:
        d.start_event = StartEvent(raw.start_event, tuple(raw.start_blind or ()),
                                   "kernel" if raw.stamps == "kernel" else "")
    d.coverage = coverage(raw, series)
    if raw.bio_devs:
        # their rows time bios (queue to completion): total phase only
        d.bio_devices = BioDevices(tuple(sorted(devices.name_of(dev) for dev in raw.bio_devs)))
    if tasks is not None:
        d.tasks = Tasks(task_rows(tasks, series))
    if raw.files is not None:
        d.files = Files(file_rows(on_disks(raw.files, raw.traced_devs), raw.files_top, raw.files_cache))
    for reason, n in (tasks_dropped or {}).items():
        if n:
            d.dropped[reason] = d.dropped.get(reason, 0) + n
    return d


def task_rows(tasks: list, series: list[Series]) -> list[TaskRow]:
    """The dump's "tasks": a row per process of the window (tracer.sources.tasks.TaskRaw), with
    disk_read_bytes from the same window's read series of that process (its tgid: with
    --threads a process's threads are added up).  A process with read series but no row
    (untraced by the task programs, e.g. one that only faulted pages in) gets one with
    its disk reads alone."""
    disk: dict[int, int] = {}
    comm: dict[int, str] = {}
    for s in series:
        if s.op == "read":
            pid = s.tgid or s.pid
            disk[pid] = disk.get(pid, 0) + s.bytes
            comm.setdefault(pid, s.comm)
    rows = []
    for t in tasks:
        c = t.counts
        rows.append(TaskRow(pid=t.pid, ppid=t.ppid, comm=t.comm,
                            io_wait_s=round(c["io_wait_ns"] / 1e9, 6), io_waits=c["io_waits"],
                            read_bytes=c["read_bytes"], reads=c["reads"], read_pages=c.get("read_pages", 0),
                            missed_pages=c.get("missed_pages", 0), disk_read_bytes=disk.pop(t.pid, 0),
                            fsync_s=round(c["fsync_ns"] / 1e9, 6), fsyncs=c["fsyncs"],
                            throttled_s=round(c["throttle_ns"] / 1e9, 6), throttles=c["throttles"],
                            started=t.started, exited=t.exited))
    for pid, n in disk.items():
        rows.append(TaskRow(pid=pid, comm=comm[pid], disk_read_bytes=n))
    rows.sort(key=lambda r: r.pid)
    return rows


def on_disks(rows: list, disks: list[int] | None, parts: dict[int, int] | None = None) -> list:
    """File rows (tracer.sources.files.FileRaw) of files on `disks` (kernel dev_t; None: every disk).

    A file's dev is its filesystem's: a partition of a disk counts as the disk
    (`parts`: partition -> disk, sysfs's unless given).  Its reads from the
    page cache and O_DIRECT's bytes are counted before any request (so on any
    disk, --dev or not); a row with requests passed the --dev filter itself
    (a filesystem over several disks, btrfs, has a dev that is no disk's).
    """
    if not disks:
        return rows
    if parts is None:
        parts = devices.partitions()
    wanted = set(disks)
    return [r for r in rows if r.requests or parts.get(r.dev, r.dev) in wanted]


def file_rows(raw_rows: list, top: int, cache: bool) -> list[FileRow]:
    """The dump's "files" (tracer.sources.files.FileRaw rows): the top `top` by bytes moved (read from disk +
    written), the rest summed; page-cache read bytes only where they were measured (`cache`)."""
    rows = [FileRow(devices.devno(r.dev), r.ino, r.path, r.tgid, r.comm, "", r.cgroup,
                    r.cache_bytes if cache else None, r.disk_read_bytes, r.written_bytes, r.requests,
                    r.direct_bytes, dict(r.hist))
            for r in raw_rows]
    return bounded(rows, top)


# Ops whose requests /proc/diskstats counts among its reads, writes and discards.  An
# iotrace flush is an empty write with a preflush (what fsync sends), which the kernel
# counts as a write; the flush machinery's own REQ_OP_FLUSH it counts apart, as iotrace does.
COUNTED_OPS = ("read", "write", "flush", "discard")


def coverage(raw, series: list[Series]) -> Coverage | None:
    """Per device: requests iotrace recorded vs requests /proc/diskstats completed, same window.

    Devices: the traced disks only.  The --dev ones; else, without a pid or
    cgroup filter, every whole disk either side saw activity on (all are
    traced); with one, the disks the traced processes' requests were
    recorded on (another process's busy disk is no disk of theirs: its
    "0/114033" said nothing about them).  Without a filter the two agree
    exactly over a run (an interval's edges may move a request or two
    across); with one, iotrace's share is partial by design and marked so.
    """
    if raw.diskstats_start is None or raw.diskstats_end is None:
        return None
    recorded: dict[str, int] = {}
    for s in series:
        if s.op in COUNTED_OPS:
            recorded[s.device] = recorded.get(s.device, 0) + s.count
    if raw.traced_devs:
        names = [devices.name_of(dev) for dev in raw.traced_devs]
    else:
        disks = set(devices.whole_disks())
        names = sorted(n for n in raw.diskstats_end if n in disks and (
            n in recorded or not raw.filtered and raw.diskstats_end[n].completions != getattr(
                raw.diskstats_start.get(n), "completions", 0)))
    out = {}
    for name in names:
        end, start = raw.diskstats_end.get(name), raw.diskstats_start.get(name)
        if not same_disk(start, end):
            continue
        out[name] = DeviceCoverage(recorded.get(name, 0), end.completions - start.completions)
    return Coverage(raw.filtered, out)


def same_disk(start, end) -> bool:
    """Both /proc/diskstats samples of a window show one disk: it neither appeared nor went away between them
    (a loop device detached and removed, a disk unplugged, one attached anew under the name: its counters
    went back).  A disk that changed is left out of the window's coverage: what it completed in the window
    cannot be told from what it completed before, and comparing would call the difference lost."""
    if start is None or end is None:
        return False
    return all(getattr(end, f) >= getattr(start, f) for f in ("reads", "writes", "discards"))
