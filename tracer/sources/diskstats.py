"""Samplers of the diskstats mode (and of --csv / --alert's iostat columns): /proc/diskstats and /proc/PID/io.

Raw readers take a path, so tests feed them fake /proc text; they return the
plain records of tracer.model.diskstats.  A non-root user can read
/proc/PID/io only for their own processes: the rest are counted as
unreadable.
"""

from __future__ import annotations

import os
import time

from tracer.model.diskstats import DiskCounters, IostatRow, ProcBytes, window
from tracer.sources.devices import read_diskstats, whole_disks
from tracer.sources.proctree import stat_of

DISKSTATS = "/proc/diskstats"


PROC = "/proc"


class DiskSampler:
    """Windows of /proc/diskstats: each sample() gives every device's row since the previous one."""

    def __init__(self, devices: list[str] | None = None, path: str = DISKSTATS):
        self.devices = devices      # None: every whole disk
        self.path = path
        self.first = self.last = self._snapshot()

    def _snapshot(self) -> tuple[float, dict[str, DiskCounters]]:
        t = time.monotonic()
        stats = read_diskstats(self.path)
        names = self.devices if self.devices is not None else [n for n in whole_disks() if n in stats]
        return t, {n: stats[n] for n in names if n in stats}

    @staticmethod
    def _rows(a, b) -> list[IostatRow]:
        seconds = b[0] - a[0]
        return [window(name, a[1].get(name), st, seconds) for name, st in b[1].items()]

    def sample(self) -> list[IostatRow]:
        now = self._snapshot()
        rows = self._rows(self.last, now)
        self.last = now
        return rows

    def whole(self) -> list[IostatRow]:
        """Every device's row from the first snapshot to the last sample."""
        return self._rows(self.first, self.last)


def proc_io(proc: str, pid: str) -> tuple[int, int]:
    vals = {}
    with open(f"{proc}/{pid}/io") as f:
        for line in f:
            k, _, v = line.partition(":")
            vals[k] = int(v)
    return vals["read_bytes"], vals["write_bytes"]


class ProcSampler:
    """Per-process block bytes between samples; with `pids`, only those and (with `children`) their descendants.

    Processes are told apart by pid and start time, so a reused pid is a new
    process.  One that exits between two samples loses what it did since the
    earlier one: /proc forgets it.
    """

    def __init__(self, pids: list[int] | None = None, children: bool = True, proc: str = PROC):
        self.pids = set(pids or ())
        self.children = children
        self.proc = proc
        self.unreadable = 0         # processes of the last sample whose io we may not read
        self.totals: dict[tuple[int, int], ProcBytes] = {}
        self._last, _ = self._snapshot()

    def _snapshot(self) -> tuple[dict[tuple[int, int], tuple[str, int, int]], dict[int, int]]:
        procs, parents, unreadable = {}, {}, 0
        for name in os.listdir(self.proc):
            if not name.isdigit():
                continue
            try:
                st = stat_of(name, self.proc)
                parents[int(name)] = st.ppid
                rb, wb = proc_io(self.proc, name)
            except PermissionError:
                unreadable += 1     # another user's process (only root may read its io)
                continue
            except (OSError, ValueError, KeyError, IndexError):
                continue            # exited while we looked
            procs[(int(name), st.start_ticks)] = (st.comm, rb, wb)
        self.unreadable = unreadable
        return procs, parents

    def _wanted(self, pid: int, parents: dict[int, int]) -> bool:
        if not self.pids:
            return True
        seen = set()
        while pid not in seen:
            if pid in self.pids:
                return True
            if not self.children:
                return False
            seen.add(pid)
            pid = parents.get(pid, 0)
        return False

    def sample(self) -> list[ProcBytes]:
        """Processes that did block I/O since the previous sample, most bytes first."""
        now, parents = self._snapshot()
        out = []
        for key, (comm, rb, wb) in now.items():
            # not seen before: started since the last sample, so its counters began at 0
            _, rb0, wb0 = self._last.get(key, ("", 0, 0))
            if (rb - rb0 or wb - wb0) and self._wanted(key[0], parents):
                io = ProcBytes(key[0], comm, max(rb - rb0, 0), max(wb - wb0, 0))
                out.append(io)
                t = self.totals.get(key)
                self.totals[key] = io if t is None else ProcBytes(io.pid, comm, t.read_bytes + io.read_bytes,
                                                               t.write_bytes + io.write_bytes)
        self._last = now
        return sorted(out, key=lambda p: (-(p.read_bytes + p.write_bytes), p.pid))

    def whole(self) -> list[ProcBytes]:
        return sorted(self.totals.values(), key=lambda p: (-(p.read_bytes + p.write_bytes), p.pid))
