"""A reader for tests/privileged/test_tasks.py's default-vs---tasks comparison: one process, three marker
windows.  "cold" and "warm" read every file in DIR whole with os.read (1 MiB, page-aligned: the sizes are
whole pages), "fsync" writes FSYNCS MiB to a new file in DIR's parent with an fsync (or, every other one, an
fdatasync) after each MiB, timing each.  What it did goes to RESULTS as one JSON object.

    python pcload.py DIR RESULTS.json [FSYNCS]

Standard library only (tracer.marker is too); everything it needs is imported before the first window, so
that no file but DIR's is read inside one.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from tasksload import read_all  # noqa: E402 - the same reader as the --tasks tests

from tracer import marker  # noqa: E402

CHUNK = 1 << 20


def syncs(path: Path, n: int) -> list[float]:
    took = []
    block = os.urandom(CHUNK)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        for i in range(n):
            os.write(fd, block)
            t0 = time.monotonic()
            (os.fsync if i % 2 == 0 else os.fdatasync)(fd)
            took.append(time.monotonic() - t0)
    finally:
        os.close(fd)
    return took


def main() -> int:
    data, results = Path(sys.argv[1]), Path(sys.argv[2])
    n = int(sys.argv[3]) if len(sys.argv) > 3 else 8
    files = sorted(data.iterdir())
    out: dict = {"pid": os.getpid()}
    with marker.phase("cold"):
        out["cold"] = read_all(files)
    with marker.phase("warm"):
        out["warm"] = read_all(files)
    with marker.phase("fsync"):
        out["fsync_s"] = syncs(data.parent / "synced", n)
    results.write_text(json.dumps(out) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
