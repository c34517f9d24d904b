"""Block devices as users know them: names from sysfs, kernel dev_t numbers,
and /proc/diskstats counters; and a run's --dev, resolved once into the
DeviceFilter every part of the run is given.  No root needed.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from tracer.errors import UserError
from tracer.model.diskstats import DiskCounters

SYS_BLOCK = Path("/sys/block")
SYS_DEV_BLOCK = Path("/sys/dev/block")
# The kernel's internal dev_t, as block tracepoints report it: 12 bits of
# major above 20 bits of minor (MINORBITS), unlike the userspace encoding.
MINOR_BITS = 20


def kdev(major: int, minor: int) -> int:
    return (major << MINOR_BITS) | minor


def split_kdev(dev: int) -> tuple[int, int]:
    return dev >> MINOR_BITS, dev & ((1 << MINOR_BITS) - 1)


def devno(dev: int) -> str:
    """'7:0' for a kernel dev_t."""
    major, minor = split_kdev(dev)
    return f"{major}:{minor}"


def name_of(dev: int) -> str:
    """The device's name ('loop0', 'nvme0n1'), or its number if sysfs does not know it."""
    try:
        for line in (SYS_DEV_BLOCK / devno(dev) / "uevent").read_text().splitlines():
            if line.startswith("DEVNAME="):
                return line.split("=", 1)[1]
    except OSError:
        pass
    return devno(dev)


def in_flight(dev: int) -> int | None:
    """Requests the kernel has in flight on a device (sysfs), None if it cannot be read."""
    try:
        return sum(int(x) for x in (SYS_DEV_BLOCK / devno(dev) / "inflight").read_text().split())
    except (OSError, ValueError):
        return None


def whole_disks() -> dict[str, int]:
    """Name -> kernel dev_t of every whole block device (partitions excluded)."""
    out = {}
    for entry in sorted(SYS_BLOCK.iterdir()) if SYS_BLOCK.is_dir() else []:
        try:
            major, minor = (entry / "dev").read_text().strip().split(":")
        except (OSError, ValueError):
            continue
        out[entry.name] = kdev(int(major), int(minor))
    return out


def _dev_file(path: Path) -> int | None:
    try:
        major, minor = path.read_text().strip().split(":")
        return kdev(int(major), int(minor))
    except (OSError, ValueError):
        return None


def partitions(sys_block: Path = SYS_BLOCK) -> dict[int, int]:
    """Kernel dev_t of every partition -> its whole disk's (sysfs: /sys/block/DISK/PART/partition)."""
    out = {}
    for disk in sorted(sys_block.iterdir()) if sys_block.is_dir() else []:
        whole = _dev_file(disk / "dev")
        try:
            children = sorted(disk.iterdir())
        except OSError:
            continue
        for part in children:
            if whole is not None and (part / "partition").is_file() and (dev := _dev_file(part / "dev")) is not None:
                out[dev] = whole
    return out


def bio_based(name: str) -> bool:
    """A disk whose driver takes bios directly (zram, device-mapper, md): no request events.

    Request-based (blk-mq) disks have an mq directory in sysfs.
    """
    return (SYS_BLOCK / name).is_dir() and not (SYS_BLOCK / name / "mq").exists()


def scheduler(name: str, sys_block: str = "/sys/block") -> str | None:
    """The I/O scheduler a disk uses now ("none", "mq-deadline", ...: the bracketed one), or None."""
    try:
        text = open(f"{sys_block}/{name}/queue/scheduler").read()
    except OSError:
        return None
    start, end = text.find("["), text.find("]")
    return text[start + 1:end] if 0 <= start < end else (text.strip() or None)


def keeps_start_stamp(name: str, sys_block: str = "/sys/block") -> bool:
    """Whether the kernel stamps each request of a disk with its start (rq->start_time_ns, as it accounts
    the request's time in /proc/diskstats): while the disk keeps I/O statistics (queue/iostats 1, the default)."""
    try:
        return open(f"{sys_block}/{name}/queue/iostats").read().strip() == "1"
    except OSError:
        return False


def size_sectors(name: str) -> int:
    try:
        return int((SYS_BLOCK / name / "size").read_text())
    except (OSError, ValueError):
        return 0


def resolve(spec: str) -> int:
    """A --dev argument ('loop0', '/dev/loop0', '7:0') -> kernel dev_t."""
    disks = whole_disks()
    name = spec.removeprefix("/dev/")
    if name in disks:
        return disks[name]
    if ":" in spec:
        try:
            dev = kdev(*(int(x) for x in spec.split(":", 1)))
        except ValueError:
            dev = -1
        if dev in disks.values():
            return dev
    if spec.startswith("/dev/") and os.path.exists(spec):
        st = os.stat(spec)
        dev = kdev(os.major(st.st_rdev), os.minor(st.st_rdev))
        if dev in disks.values():
            return dev
        raise UserError(f"--dev {spec}: a partition or not a whole disk; block requests are "
                        f"reported per disk, give the disk instead ({', '.join(disks)})")
    raise UserError(f"--dev {spec}: no such block device; known devices: {', '.join(disks) or 'none'}")


@dataclass(frozen=True)
class DeviceFilter:
    """The disks a run traces (--dev), resolved once: what the BPF map, the sinks and the alerts are given.

    Empty: every disk.  `given` keeps the arguments as typed (the start line
    says them back); `names` are the disks' sysfs names, in the same order;
    `devs` their kernel dev_t's.
    """

    given: tuple[str, ...] = ()
    names: tuple[str, ...] = ()
    devs: tuple[int, ...] = ()

    def __bool__(self) -> bool:
        return bool(self.devs)

    @property
    def name_list(self) -> list[str] | None:
        """The names as the sinks and alerts take them: None for every disk."""
        return list(self.names) or None


def device_filter(specs: list[str] | tuple[str, ...]) -> DeviceFilter:
    """--dev arguments -> the run's DeviceFilter; a bad one is resolve()'s one-line UserError."""
    devs = tuple(resolve(s) for s in specs)
    return DeviceFilter(tuple(specs), tuple(name_of(d) for d in devs), devs)


def read_diskstats(path: str = "/proc/diskstats") -> dict[str, DiskCounters]:
    out = {}
    with open(path) as f:
        for line in f:
            p = line.split()
            v = [int(x) for x in p[3:]] + [0] * 17
            out[p[2]] = DiskCounters(reads=v[0], read_sectors=v[2], read_ms=v[3], writes=v[4], write_sectors=v[6],
                                  write_ms=v[7], in_flight=v[8], io_ms=v[9], weighted_ms=v[10],
                                  discards=v[11], discard_sectors=v[13], flushes=v[15])
    return out
