"""BPF program bookkeeping of the overhead bench: statistics on while measuring, the programs a tracer loaded.

kernel.bpf_stats_enabled is turned on by holding a BPF_ENABLE_STATS fd
(BPFStats); the machine's programs and their counters come from
`bpftool prog show -j`; a process's own programs from /proc/PID/fdinfo.
"""

from __future__ import annotations

import ctypes
import json
import os
import subprocess
from pathlib import Path

from tracer.sources.bpfobject import SYS_BPF

STATS_SYSCTL = Path("/proc/sys/kernel/bpf_stats_enabled")
BPF_ENABLE_STATS, BPF_STATS_RUN_TIME = 32, 0


class BPFStats:
    """kernel.bpf_stats_enabled=1 while inside: by holding a BPF_ENABLE_STATS fd where the kernel has it.

    The fd is counted apart from the sysctl, so neither writes the other's value: a test on this
    shared machine that turns the sysctl off cannot stop our statistics midway, and we never turn
    it off under someone else.  Without the syscall, the sysctl itself, put back as it was after.
    """

    def __init__(self) -> None:
        self.fd = -1
        self.old: str | None = None

    def __enter__(self) -> BPFStats:
        if SYS_BPF:
            libc = ctypes.CDLL(None, use_errno=True)
            attr = (ctypes.c_uint32 * 32)()         # union bpf_attr, zeroed: enable_stats.type first
            attr[0] = BPF_STATS_RUN_TIME
            libc.syscall.restype = ctypes.c_long
            self.fd = libc.syscall(ctypes.c_long(SYS_BPF), ctypes.c_int(BPF_ENABLE_STATS), ctypes.byref(attr),
                                   ctypes.c_uint(ctypes.sizeof(attr)))
        if self.fd < 0:
            self.old = STATS_SYSCTL.read_text().strip()
            STATS_SYSCTL.write_text("1")
        return self

    def __exit__(self, *exc) -> None:
        if self.fd >= 0:
            os.close(self.fd)
        elif self.old is not None:
            STATS_SYSCTL.write_text(self.old)


def bpf_programs() -> dict[int, dict]:
    """Every BPF program loaded on the machine, by id, as `bpftool prog show -j` lists it."""
    r = subprocess.run(["bpftool", "prog", "show", "-j"], capture_output=True, text=True, check=True)
    return {p["id"]: p for p in json.loads(r.stdout or "[]")}


def held_program_ids(pid: int | str = "self") -> set[int]:
    """Ids of the BPF programs a process holds a file descriptor of (from /proc/PID/fdinfo)."""
    ids = set()
    fdinfo = Path(f"/proc/{pid}/fdinfo")
    try:
        entries = list(fdinfo.iterdir())
    except OSError:
        return ids
    for f in entries:
        try:
            for line in f.read_text().splitlines():
                if line.startswith("prog_id:"):
                    ids.add(int(line.split()[1]))
        except (OSError, ValueError):
            pass    # closed meanwhile
    return ids


def foreign_program_ids(ours: set[int]) -> set[int]:
    """Programs held by processes other than these: others' tools that loaded while ours started."""
    ids = set()
    for d in Path("/proc").iterdir():
        if d.name.isdigit() and int(d.name) not in ours:
            ids |= held_program_ids(d.name)
    return ids
