"""The diskstats mode's records: /proc/diskstats lines, iostat's column arithmetic, a window's rows.

DiskCounters is one /proc/diskstats line; IostatRow one device's deltas between
two of them and the `iostat -x` columns made from them (per second of the
window; awaits the mean milliseconds per completed request; aqu-sz the mean
queue length; %util the share of the window the device had a request in
flight).  A dump of the diskstats mode keeps, per window, a Diskstats: a
DiskRow per device and a ProcBytes per process (/proc/PID/io).  The
samplers that fill them are in tracer.sources.diskstats.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields

from tracer import contract

SECTOR = contract.load().sector_size     # bytes per /proc/diskstats sector


# iostat -x's columns, by iostat's names, and the DiskRow fields holding them
IOSTAT_COLUMNS = {"r/s": "r_s", "w/s": "w_s", "rkB/s": "rkb_s", "wkB/s": "wkb_s", "r_await": "r_await",
                  "w_await": "w_await", "aqu-sz": "aqu_sz", "%util": "util"}


@dataclass(frozen=True)
class DiskRow:
    """One device over a window as /proc/diskstats shows it: counts, and iostat -x's columns.

    Rates are per second of the window; awaits the mean ms per completed read or
    write; aqu_sz the mean queue length; util the share (%) of the window the
    device was busy.
    """

    device: str
    reads: int = 0
    writes: int = 0
    read_kb: float = 0.0
    write_kb: float = 0.0
    discards: int = 0
    flushes: int = 0
    r_s: float = 0.0
    w_s: float = 0.0
    rkb_s: float = 0.0
    wkb_s: float = 0.0
    r_await: float = 0.0
    w_await: float = 0.0
    aqu_sz: float = 0.0
    util: float = 0.0

    def columns(self) -> dict[str, float]:
        """iostat -x's columns, by iostat's names."""
        return {name: getattr(self, attr) for name, attr in IOSTAT_COLUMNS.items()}

    @property
    def active(self) -> bool:
        return bool(self.reads or self.writes or self.discards or self.flushes or self.util)


@dataclass(frozen=True)
class ProcBytes:
    """Bytes a process made the block layer read and write in a window (/proc/PID/io)."""

    pid: int
    comm: str
    read_bytes: int = 0
    write_bytes: int = 0


@dataclass
class Diskstats:
    """What `iotrace --diskstats` saw in a window, from /proc alone: no BPF, so no latency percentiles."""

    devices: list[DiskRow]
    processes: list[ProcBytes] = field(default_factory=list)
    unreadable: int = 0         # processes of other users whose /proc/PID/io could not be read


@dataclass(frozen=True)
class DiskCounters:
    """One /proc/diskstats line's counters (the fields iotrace uses), cumulative since boot."""

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
        return {name: getattr(self, attr) for name, attr in IOSTAT_COLUMNS.items()}

    def row(self) -> DiskRow:
        """The window's record, as a dump keeps it."""
        return DiskRow(self.device, self.reads, self.writes, self.read_sectors * SECTOR / 1024,
                       self.write_sectors * SECTOR / 1024, self.discards, self.flushes,
                       **{attr: getattr(self, attr) for attr in IOSTAT_COLUMNS.values()})


_COUNTERS = [f.name for f in fields(IostatRow) if f.name not in ("device", "seconds")]


_ZERO = DiskCounters(*(0 for _ in fields(DiskCounters)))


def window(device: str, before: DiskCounters | None, after: DiskCounters, seconds: float) -> IostatRow:
    """The row of `device` between two snapshots; None before = the device appeared meanwhile (counts from 0)."""
    before = before or _ZERO
    delta = {name: getattr(after, name) - getattr(before, name) for name in _COUNTERS}
    if any(v < 0 for v in delta.values()):
        # the counters went back: the device was detached and attached anew; all it did is since then
        delta = {name: getattr(after, name) for name in _COUNTERS}
    return IostatRow(device, seconds, **delta)
