"""A `iotrace --diskstats` window (a Dump with disks) on a terminal: iostat -x per device, bytes per process.

The same table live (tracer.sinks.table) and from a saved file (`iotrace
report` reads what --diskstats -o wrote); render_dump picks it or report's
table by the dump.
"""

from __future__ import annotations

from typing import TextIO

from tracer.model.diskstats import IOSTAT_COLUMNS
from tracer.model.dump import Dump, duration_of
from tracer.text import safe
from tracer.units import fmt_size
from tracer.views.report import render_table

NO_PERCENTILES = ("from /proc/diskstats and /proc/PID/io, no BPF: no percentiles and no per-process latency; "
                  "await is the mean per request")

DEV_HEAD = f"{'DEVICE':<12}" + "".join(f"{c:>10}" for c in IOSTAT_COLUMNS)
PROC_HEAD = f"{'PID':>7} {'COMM':<16}{'READ':>9}{'WRITE':>9}{'rkB/s':>10}{'wkB/s':>10}"


def render_dump(d: Dump, out: TextIO, hist: bool = False, title: str | None = None) -> None:
    """A dump as `iotrace report` shows it: a --diskstats window's iostat numbers, else the table of series."""
    if d.disks is not None:
        render(d, out, title)
    else:
        render_table(d, out, hist=hist, title=title)


def render(d: Dump, out: TextIO, title: str | None = None) -> None:
    disks = d.disks
    if disks is None:
        raise ValueError("not a --diskstats window")
    seconds = duration_of(d)
    out.write(f"\n{safe(title or 'diskstats ' + d.kind)}: {d.start:%H:%M:%S} - {d.end:%H:%M:%S} ({seconds:.1f}s); "
              f"iostat -x's columns from /proc/diskstats, bytes from /proc/PID/io; no BPF, so no percentiles\n")
    if disks.devices:
        out.write(DEV_HEAD + "\n")
        for r in disks.devices:
            out.write(f"{safe(r.device):<12}" + "".join(f"{v:>10.2f}" for v in r.columns().values()) + "\n")
    else:
        out.write("  no block I/O on any disk\n")
    if disks.processes:
        out.write(PROC_HEAD + "\n")
        per_s = 1 / 1024 / seconds if seconds > 0 else 0.0
        for p in disks.processes:
            out.write(f"{p.pid:>7} {safe(p.comm)[:15]:<16}{fmt_size(p.read_bytes):>9}{fmt_size(p.write_bytes):>9}"
                      f"{p.read_bytes * per_s:>10.1f}{p.write_bytes * per_s:>10.1f}\n")
    else:
        out.write("  no process did block I/O that /proc/PID/io shows\n")
    if disks.unreadable:
        out.write(f"  (not shown: {disks.unreadable} processes of other users; /proc/PID/io is readable only "
                  f"for your own processes without root)\n")
