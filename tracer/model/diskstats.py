"""Disk and process windows of the diskstats mode: plain data and iostat's column arithmetic.

IostatRow holds one device's /proc/diskstats deltas over a window and the
`iostat -x` columns made from them (per second of the window; awaits the
mean milliseconds per completed request; aqu-sz the mean queue length; %util
the share of the window the device had a request in flight).  ProcIO is one
process's block bytes in a window (/proc/PID/io), DiskWindow one report of
`iotrace --diskstats`.  The samplers that fill them are in
tracer.sources.diskstats.
"""

from __future__ import annotations

import platform
import socket
from dataclasses import dataclass, fields
from datetime import datetime

SECTOR = 512     # bytes per /proc/diskstats sector


@dataclass(frozen=True)
class DiskStats:
    """One /proc/diskstats line (the fields iotrace uses)."""

    reads: int
    read_sectors: int
    read_ms: int
    writes: int
    write_sectors: int
    write_ms: int
    in_flight: int
    io_ms: int
    weighted_ms: int
    discards: int
    discard_sectors: int
    flushes: int

    @property
    def completions(self) -> int:
        """Data requests completed (reads, writes, discards): what iotrace counts too."""
        return self.reads + self.writes + self.discards


@dataclass(frozen=True)
class IostatRow:
    """One device over one window: /proc/diskstats deltas and the iostat -x columns made from them."""

    device: str
    seconds: float
    reads: int = 0
    writes: int = 0
    read_sectors: int = 0
    write_sectors: int = 0
    read_ms: int = 0
    write_ms: int = 0
    io_ms: int = 0
    weighted_ms: int = 0
    discards: int = 0
    flushes: int = 0

    def _rate(self, n: float) -> float:
        return n / self.seconds if self.seconds > 0 else 0.0

    @property
    def r_s(self) -> float:
        return self._rate(self.reads)

    @property
    def w_s(self) -> float:
        return self._rate(self.writes)

    @property
    def rkb_s(self) -> float:
        return self._rate(self.read_sectors * SECTOR / 1024)

    @property
    def wkb_s(self) -> float:
        return self._rate(self.write_sectors * SECTOR / 1024)

    @property
    def r_await(self) -> float:
        return self.read_ms / self.reads if self.reads else 0.0

    @property
    def w_await(self) -> float:
        return self.write_ms / self.writes if self.writes else 0.0

    @property
    def aqu_sz(self) -> float:
        return self._rate(self.weighted_ms / 1e3)

    @property
    def util(self) -> float:
        # io_ms and the window come from different clocks: cap as iostat does
        return min(100.0, self._rate(self.io_ms / 1e3) * 100)

    @property
    def active(self) -> bool:
        return bool(self.reads or self.writes or self.discards or self.flushes or self.io_ms)

    def columns(self) -> dict[str, float]:
        """iostat -x's columns, by iostat's names."""
        return {"r/s": self.r_s, "w/s": self.w_s, "rkB/s": self.rkb_s, "wkB/s": self.wkb_s,
                "r_await": self.r_await, "w_await": self.w_await, "aqu-sz": self.aqu_sz, "%util": self.util}


IOSTAT_COLUMNS = ("r/s", "w/s", "rkB/s", "wkB/s", "r_await", "w_await", "aqu-sz", "%util")


_COUNTERS = [f.name for f in fields(IostatRow) if f.name not in ("device", "seconds")]


_ZERO = DiskStats(*(0 for _ in fields(DiskStats)))


def window(device: str, before: DiskStats | None, after: DiskStats, seconds: float) -> IostatRow:
    """The row of `device` between two snapshots; None before = the device appeared meanwhile (counts from 0)."""
    before = before or _ZERO
    delta = {name: getattr(after, name) - getattr(before, name) for name in _COUNTERS}
    if any(v < 0 for v in delta.values()):
        # the counters went back: the device was detached and attached anew; all it did is since then
        delta = {name: getattr(after, name) for name in _COUNTERS}
    return IostatRow(device, seconds, **delta)


@dataclass(frozen=True)
class ProcIO:
    """Bytes a process made the block layer read and write in a window (/proc/PID/io read_bytes, write_bytes).

    write_bytes counts pages when they are dirtied, not when writeback writes them.
    """

    pid: int
    comm: str
    read_bytes: int
    write_bytes: int


@dataclass
class DiskWindow:
    """One report of the diskstats mode."""

    kind: str                   # interval, final, or run (the whole run)
    start: datetime
    end: datetime
    seconds: float
    devices: list[IostatRow]
    processes: list[ProcIO]
    unreadable: int
    alerts: list[dict] | None = None

    def to_json(self) -> dict:
        devs = []
        for r in self.devices:
            devs.append({"device": r.device, "reads": r.reads, "writes": r.writes,
                         "read_kB": r.read_sectors * SECTOR / 1024, "write_kB": r.write_sectors * SECTOR / 1024,
                         "discards": r.discards, "flushes": r.flushes,
                         **{k: round(v, 3) for k, v in r.columns().items()}})
        obj = {"schema": 1, "kind": "diskstats", "window": self.kind, "label": None,
               "start": self.start.isoformat(), "end": self.end.isoformat(), "duration_s": round(self.seconds, 6),
               "host": socket.gethostname(), "kernel": platform.release(), "percentiles": None,
               "source": "/proc/diskstats, /proc/PID/io", "devices": devs,
               "processes": [{"pid": p.pid, "comm": p.comm, "read_bytes": p.read_bytes, "write_bytes": p.write_bytes}
                             for p in self.processes],
               "unreadable_processes": self.unreadable}
        if self.alerts is not None:
            obj["alerts"] = self.alerts
        return obj
