"""The one stable surface of the package for iotrace's own tools and tests.

The scripts under scripts/ (the benches, the soak, the kernel-matrix guest's
measurements) drive iotrace through its command line, `python -m tracer.cli`,
or through the names below; what else lives under tracer/ may change shape
between commits without a script noticing only at bench time.  A name belongs
here when a tool needs it and the command line cannot give it; keep it small.

  scratch_loop(directory, size_mb)   a loop device over a freshly written file
                                     in `directory`, detached and removed on
                                     exit (the device `iotrace bench` uses)
  BPFStats()                         the kernel's BPF run-time statistics on
                                     while inside the `with` block (the sysctl
                                     that shows it: STATS_SYSCTL)
  prog_stats(fd) -> ProgStats        a loaded program's run count, run time
                                     and recursion misses
  import_bcc()                       bcc, or a UserError saying how to get it
  USER_DROPS                         the drop reasons user space counts, keys of
                                     a dump's "dropped" beside the programs'

Components benchmarked for their own sake (the histogram codec, the exposition
renderer, the pipeline) are imported from their modules by the bench that
measures them: those benches measure the internals, not use them.
"""

from __future__ import annotations

import ctypes
import os
from pathlib import Path

from tracer.runtime.bench import scratch_loop
from tracer.sources.bpfobject import SYS_BPF, ProgStats, import_bcc, prog_stats
from tracer.sources.ledger import USER_DROPS

__all__ = ["STATS_SYSCTL", "BPFStats", "ProgStats", "USER_DROPS", "import_bcc", "prog_stats", "scratch_loop"]

STATS_SYSCTL = Path("/proc/sys/kernel/bpf_stats_enabled")
_BPF_ENABLE_STATS, _BPF_STATS_RUN_TIME = 32, 0


class BPFStats:
    """kernel.bpf_stats_enabled in effect while inside, by holding a BPF_ENABLE_STATS fd.

    The kernel counts such fds apart from the sysctl, so a test on the same machine that
    turns the sysctl off cannot stop these statistics midway, and leaving never turns them
    off under someone else.  Where the syscall fails, the sysctl itself, put back as it was.
    """

    def __init__(self) -> None:
        self.fd = -1
        self.old: str | None = None

    def __enter__(self) -> BPFStats:
        libc = ctypes.CDLL(None, use_errno=True)
        attr = (ctypes.c_uint32 * 32)()     # union bpf_attr, zeroed; enable_stats.type is its first field
        attr[0] = _BPF_STATS_RUN_TIME
        libc.syscall.restype = ctypes.c_long
        self.fd = libc.syscall(ctypes.c_long(SYS_BPF), ctypes.c_int(_BPF_ENABLE_STATS), ctypes.byref(attr),
                               ctypes.c_uint(ctypes.sizeof(attr)))
        if self.fd < 0:
            self.old = STATS_SYSCTL.read_text().strip()
            STATS_SYSCTL.write_text("1")
        return self

    def __exit__(self, *exc) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1
        elif self.old is not None:
            STATS_SYSCTL.write_text(self.old)
            self.old = None
