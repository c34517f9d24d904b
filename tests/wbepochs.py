"""A trainer whose checkpoint is written back an epoch later, for tests/privileged/test_writeback.py:

    wbepochs.py FILE MIB PIDFILE

Window "epoch 1" (tracer.marker.phase): MIB MiB written to FILE without fsync (a torch.save with no
fsync).  Window "epoch 2": the file's pages handed to the kernel's flusher (`sync -f FILE`: syncfs,
which has the flusher write the file system's dirty inodes and waits), so that the write-back runs in
epoch 2, by the flusher, for data epoch 1 dirtied.  Writes its pid to PIDFILE first (keep it off FILE's
file system).  Standard library and tracer.marker only.
"""

import os
import subprocess
import sys

from tracer import marker

path, mib, pidfile = sys.argv[1], int(sys.argv[2]), sys.argv[3]
with open(pidfile, "w") as f:
    f.write(f"{os.getpid()}\n")
block = b"\x5a" * (1 << 20)
with marker.phase("epoch 1"), open(path, "wb") as f:
    for _ in range(mib):
        f.write(block)
with marker.phase("epoch 2"):
    subprocess.run(["sync", "-f", path], check=True, timeout=60)
