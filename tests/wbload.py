"""A buffered writer for the write-back tests: writes FILE (MiB of it, no fsync), then waits until the
file GO exists (the test runs `sync` meanwhile) and exits.  Standard library only."""

import os
import sys
import time

path, mib, go = sys.argv[1], int(sys.argv[2]), sys.argv[3]
block = b"\xa5" * (1 << 20)
with open(path, "wb") as f:
    for _ in range(mib):
        f.write(block)
# written, not synced: the kernel's flusher writes it back
with open(path + ".written", "w"):
    pass
deadline = time.monotonic() + 120
while not os.path.exists(go) and time.monotonic() < deadline:
    time.sleep(0.05)
