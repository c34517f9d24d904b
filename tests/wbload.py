"""A buffered writer for the write-back tests (tests/privileged/test_writeback.py).

    wbload.py FILE MIB WRITTEN GO [START]

Waits for the file START (if given), writes MIB MiB to FILE without fsync, writes its pid to the
file WRITTEN (keep it off FILE's file system: it would be written back too), then waits (up to
120 s) for the file GO and exits: alive while the test has the kernel's flusher write its pages
back.  Standard library only.
"""

import os
import sys
import time


def wait_for(path: str) -> None:
    deadline = time.monotonic() + 120
    while not os.path.exists(path) and time.monotonic() < deadline:
        time.sleep(0.02)


path, mib, written, go = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4]
if len(sys.argv) > 5:
    wait_for(sys.argv[5])
block = b"\xa5" * (1 << 20)
with open(path, "wb") as f:
    for _ in range(mib):
        f.write(block)
# written, not synced: the kernel's flusher writes it back
with open(written + ".tmp", "w") as f:
    f.write(f"{os.getpid()}\n")
os.rename(written + ".tmp", written)
wait_for(go)
