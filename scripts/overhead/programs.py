"""BPF program bookkeeping of the overhead bench: the programs a tracer loaded.

The machine's programs and their counters come from `bpftool prog show -j`;
a process's own programs from /proc/PID/fdinfo.  Statistics are turned on
while measuring by tracer.testing.BPFStats.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path


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
