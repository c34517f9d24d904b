"""A training loop that marks its epochs, started before any tracer, for tests/privileged/test_attach.py:

    markload.py DEVICE CTRL NAME FIRST_BLOCK EPOCH_S

Epochs are tracer.marker.epochs' windows, labelled "NAME epoch N"; each
step is one 4 KiB O_DIRECT read from its own range (from FIRST_BLOCK on),
timed as the loop's data wait (marker.loop_step).  An epoch lasts EPOCH_S
seconds; the loop ends after the epoch in which CTRL/stop appears.  It writes
CTRL/ready (its pid) once its first epoch has begun, and CTRL/result at the
end: {"pid", "epochs": [[label, time.time() at its start, requests], ...]}.
Markers it sends while no tracer listens warn once and are dropped.
"""

from __future__ import annotations

import json
import os
import sys
import time
import warnings
from pathlib import Path

from ioload import read_blocks

from tracer import marker


def main() -> int:
    device, ctrl, name, first, epoch_s = sys.argv[1], Path(sys.argv[2]), sys.argv[3], int(sys.argv[4]), \
        float(sys.argv[5])
    warnings.simplefilter("ignore", marker.MarkerWarning)
    epochs = []
    for n in marker.epochs(10_000, label=f"{name} epoch {{n}}"):
        start = time.time()
        epochs.append([f"{name} epoch {n + 1}", start, 0])
        if n == 0:
            (ctrl / "ready").write_text(str(os.getpid()))
        while time.time() - start < epoch_s:
            t = time.perf_counter()
            read_blocks(device, 1, first + epochs[-1][2] % 4096)
            marker.loop_step(time.perf_counter() - t)
            epochs[-1][2] += 1
        if (ctrl / "stop").exists():
            break
    (ctrl / "result").write_text(json.dumps({"pid": os.getpid(), "epochs": epochs}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
