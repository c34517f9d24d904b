"""Series churn for the memory tests: many short-lived processes, each one block read.

    churnload.py DEVICE PROCESSES SAMPLES_FILE [--live N] [--at N,N...] [--settle S]

Forks PROCESSES children, at most N alive at once (default 8); each one
reads one 4 KiB block with O_DIRECT from DEVICE (the descriptor is the
parent's, inherited: the request is the child's own, a new pid and so a new
series in the tracer) and exits.  Run as iotrace's COMMAND: the tracer is
this process's parent, and SAMPLES_FILE gets its resident memory (VmRSS,
MB) as "children_so_far rss" lines: before the first child, after each --at
number of children (default 1000) and --settle seconds (default 2.5: a few of the
tracer's dumps) after the last has been reaped; then "reads N" (children
whose read was whole).  A fork from one small Python parent is ~1 ms: the
churn is as fast as the tracer lets the parent run.
"""

from __future__ import annotations

import argparse
import mmap
import os
import random
import sys
import time

BLOCK = 4096


def rss_mb(pid: int) -> float:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    raise SystemExit(f"no VmRSS for {pid}")


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("device")
    p.add_argument("processes", type=int)
    p.add_argument("samples")
    p.add_argument("--live", type=int, default=8)
    p.add_argument("--at", default="1000", help="children after which to sample, comma-separated")
    p.add_argument("--settle", type=float, default=2.5)
    a = p.parse_args()
    at = {int(n) for n in a.at.split(",")}
    tracer = os.getppid()
    fd = os.open(a.device, os.O_RDONLY | os.O_DIRECT)
    blocks = os.lseek(fd, 0, os.SEEK_END) // BLOCK
    buf = mmap.mmap(-1, BLOCK)      # page-aligned, as O_DIRECT wants; the child's copy-on-write page
    rng = random.Random(32)
    alive = whole = 0
    with open(a.samples, "w") as out:
        print(0, rss_mb(tracer), file=out, flush=True)
        for i in range(a.processes):
            if alive >= a.live:
                _, status = os.wait()
                alive -= 1
                whole += os.waitstatus_to_exitcode(status) == 0
            block = rng.randrange(blocks)
            if os.fork() == 0:
                os._exit(0 if os.preadv(fd, [buf], block * BLOCK) == BLOCK else 1)
            alive += 1
            if i + 1 in at:
                print(i + 1, rss_mb(tracer), file=out, flush=True)
        while alive:
            _, status = os.wait()
            alive -= 1
            whole += os.waitstatus_to_exitcode(status) == 0
        time.sleep(a.settle)        # the tracer drains the last children's windows
        print(a.processes, rss_mb(tracer), file=out, flush=True)
        print("reads", whole, file=out, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
