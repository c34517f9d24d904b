"""The whole machine's dirty page cache, from /proc/meminfo: a bound on any process's unwritten pages.

What the traced processes dirtied and the kernel has not written back yet
is counted per inode by the BPF programs (Probe.owed_bytes); an inode that
left the kernel's books without a write-back (a deleted file's dirty pages
are dropped, no event says so) would stay counted there.  No process can
have more unwritten than the machine's Dirty + Writeback, so the run's end
takes the smaller of the two (tracer.runtime.wbwait).
"""

from __future__ import annotations

MEMINFO = "/proc/meminfo"
UNWRITTEN_KEYS = ("Dirty", "Writeback")     # pages dirty, and pages being written


def unwritten_bytes(text: str) -> int | None:
    """Dirty + Writeback of a /proc/meminfo text, in bytes; None if either is missing or unreadable."""
    found: dict[str, int] = {}
    for line in text.splitlines():
        name, _, rest = line.partition(":")
        if name in UNWRITTEN_KEYS:
            parts = rest.split()
            if len(parts) != 2 or parts[1] != "kB" or not parts[0].isdigit():
                return None
            found[name] = int(parts[0]) * 1024
    return sum(found.values()) if len(found) == len(UNWRITTEN_KEYS) else None


def machine_unwritten_bytes(path: str = MEMINFO) -> int | None:
    try:
        with open(path) as f:
            return unwritten_bytes(f.read(1 << 16))
    except OSError:
        return None
