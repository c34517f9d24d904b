"""The diskstats mode's report on a terminal: iostat -x's columns per device, bytes per process."""

from __future__ import annotations

from typing import TextIO

from tracer.model.diskstats import IOSTAT_COLUMNS, DiskWindow
from tracer.units import fmt_size

NO_PERCENTILES = ("from /proc/diskstats and /proc/PID/io, no BPF: no percentiles and no per-process latency; "
                  "await is the mean per request")


_DEV_HEAD = f"{'DEVICE':<12}" + "".join(f"{c:>10}" for c in IOSTAT_COLUMNS)


_PROC_HEAD = f"{'PID':>7} {'COMM':<16}{'READ':>9}{'WRITE':>9}{'rkB/s':>10}{'wkB/s':>10}"


def render_window(w: DiskWindow, out: TextIO, root: bool) -> None:
    out.write(f"\ndiskstats {w.kind}: {w.start:%H:%M:%S} - {w.end:%H:%M:%S} ({w.seconds:.1f}s); iostat -x's "
              f"columns from /proc/diskstats, bytes from /proc/PID/io; no BPF, so no percentiles\n")
    if w.devices:
        out.write(_DEV_HEAD + "\n")
        for r in w.devices:
            out.write(f"{r.device:<12}" + "".join(f"{v:>10.2f}" for v in r.columns().values()) + "\n")
    else:
        out.write("  no block I/O on any disk\n")
    if w.processes:
        out.write(_PROC_HEAD + "\n")
        per_s = 1 / 1024 / w.seconds if w.seconds > 0 else 0.0
        for p in w.processes:
            out.write(f"{p.pid:>7} {p.comm[:15]:<16}{fmt_size(p.read_bytes):>9}{fmt_size(p.write_bytes):>9}"
                      f"{p.read_bytes * per_s:>10.1f}{p.write_bytes * per_s:>10.1f}\n")
    else:
        out.write("  no process did block I/O that /proc/PID/io shows\n")
    if w.unreadable and not root:
        out.write(f"  (not shown: {w.unreadable} processes of other users; /proc/PID/io is readable only "
                  f"for your own processes without root)\n")
    out.flush()
