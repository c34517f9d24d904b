"""A small direct-I/O reader for tests: known counts, optional forked child.

    ioload.py DEVICE BLOCKS [--child BLOCKS] [--wait PATH] [--offset-blocks N]

Reads BLOCKS 4 KiB blocks with O_DIRECT (each one a single block request),
after PATH exists when --wait is given; with --child, a forked child reads
its own BLOCKS first, then the parent reads.  Prints "pid child_pid".
"""

from __future__ import annotations

import argparse
import mmap
import os
import sys
import time

BLOCK = 4096


def read_blocks(path: str, count: int, first: int) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECT)
    buf = mmap.mmap(-1, BLOCK)   # page-aligned, as O_DIRECT wants
    try:
        for i in range(count):
            if os.preadv(fd, [buf], (first + i) * BLOCK) != BLOCK:
                raise SystemExit(f"short read at block {first + i}")
    finally:
        os.close(fd)


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("device")
    p.add_argument("blocks", type=int)
    p.add_argument("--child", type=int, default=0)
    p.add_argument("--wait")
    p.add_argument("--offset-blocks", type=int, default=0)
    a = p.parse_args()
    if a.wait:
        while not os.path.exists(a.wait):
            time.sleep(0.01)
    child = 0
    if a.child:
        child = os.fork()
        if child == 0:
            read_blocks(a.device, a.child, a.offset_blocks + a.blocks)
            os._exit(0)
        os.waitpid(child, 0)
    read_blocks(a.device, a.blocks, a.offset_blocks)
    print(os.getpid(), child, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
