"""--alert's end of run: how many alerts fired, and --fail-on-alert's exit 3.

The alerts themselves are found by the pipeline (tracer.pipeline.alerts.
AlertCheck), before any sink sees the window, so each JSON line carries
its own; this sink only reports and sets the exit status.
"""

from __future__ import annotations

import sys

# --fail-on-alert's exit code: apart from 1 (a failed command, usually) and 2 (bad input)
ALERT_EXIT = 3


def add_arguments(p, mode: str) -> None:
    if mode == "top":
        return
    p.add_argument("--alert", action="append", default=[], metavar="RULE", dest="alerts",
                   help="warn on each report where RULE holds (repeatable): [DEV:][OP:][PHASE.]STAT>VALUE, e.g. "
                        "'p99>50ms', 'device.p99.9>=5ms', 'loop0:read:mean>2ms', or util>90%% (also r_await, "
                        "w_await, aqu-sz, from /proc/diskstats); recorded in the dump as \"alerts\"")
    p.add_argument("--fail-on-alert", action="store_true",
                   help="exit 3 if any alert fired" + (" (a COMMAND's own non-zero exit code wins)"
                                                       if mode == "trace" else ""))


class AlertStatus:
    """Says how many alerts `check` (an AlertCheck) fired; exit ALERT_EXIT with `fail`, unless status is set."""

    def __init__(self, check, fail: bool, err=None):
        self.check = check
        self.fail = fail
        self.err = err or sys.stderr

    def on_dump(self, window) -> None:
        pass

    def close(self, status: int) -> int:
        c = self.check
        if not c.windows:
            return status       # no report was made (an error while starting): nothing to say
        failing = bool(c.fired and self.fail and not status)
        print(f"iotrace: alerts: {c.fired} in {c.alerted_windows} of {c.windows} report(s)"
              + (f"; exit {ALERT_EXIT} (--fail-on-alert)" if failing else ""), file=self.err)
        return ALERT_EXIT if failing else status


def from_args(ns, ctx) -> AlertStatus | None:
    if ctx.alerts is None:
        return None
    return AlertStatus(ctx.alerts, getattr(ns, "fail_on_alert", False))
