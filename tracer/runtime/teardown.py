"""Ending a live mode in order, whatever fails on the way: every step runs, none raises.

A step that fails (an OSError closing a file, a probe that will not
detach) is one line on stderr; the steps after it still run, so the
control socket is removed, the BPF programs detached and the traced
command ended even when an output could not be written.
"""

from __future__ import annotations

import sys
from collections.abc import Callable


def run_steps(*steps: tuple[str, Callable[[], object] | None]) -> None:
    """Each (what, step) in order; a None step is skipped; a failing one is said, never raised."""
    interrupt: BaseException | None = None
    for what, step in steps:
        if step is None:
            continue
        try:
            step()
        except Exception as exc:  # noqa: BLE001 - the next steps must run
            print(f"iotrace: while ending, {what} failed: {exc}", file=sys.stderr, flush=True)
        except BaseException as exc:  # noqa: BLE001 - Ctrl-C again while ending: end the rest first
            interrupt = interrupt or exc
    if interrupt:
        raise interrupt
