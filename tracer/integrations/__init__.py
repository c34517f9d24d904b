"""Hooks that put iotrace markers into training frameworks' loops, and what they share.

Each lives in its own module and imports its framework only there, so the
core never needs one: tracer.integrations.keras (pip install 'iotrace[keras]'),
tracer.integrations.torch (a batch timer that needs no torch; torch.save and
Lightning only where used).  A plain loop needs no hook: tracer.marker.epochs(n).
"""

from __future__ import annotations

import os


def fsync_saved(path: str) -> None:
    """Flush a saved file (or a directory of them, as a SavedModel) and the directory entry naming it,
    so that a checkpoint reaches the disk inside its marker window, in the trainer's context."""
    files = [path]
    if os.path.isdir(path):
        files = [os.path.join(d, n) for d, _, names in os.walk(path) for n in names] + [path]
    for f in files + [os.path.dirname(os.path.abspath(path))]:
        fd = os.open(f, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
