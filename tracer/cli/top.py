"""`sudo iotrace top`: a live view like biotop, with percentiles: the live loop feeding the screen sink.

The probe is loaded, and any problem said in one line, before curses takes
the terminal; q, Ctrl-C or SIGTERM end it and curses restores the terminal.
With a count (`iotrace top 5 3`), the last screen stays printed, as biotop's.
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import TextIO

from tracer.cli.common import (
    PID_HELP,
    add_attach_option,
    add_device_option,
    interval_count,
    output_options,
    take_interval,
)
from tracer.errors import UserError
from tracer.options import Parser, interval_seconds, pid
from tracer.runtime.loop import Schedule
from tracer.runtime.session import LiveRun, offer_diskstats

EPILOG = """\
examples:
  sudo iotrace top                       every device, a new screen every second, highest p99 first
  sudo iotrace top -i 5 --sort bytes     5 s windows, busiest first
  sudo iotrace top --dev nvme0n1
  sudo iotrace top 5 3                   as biotop 5 3: three 5 s screens, then the last one stays printed

Each screen is one interval (histograms reset each time); rows are process,
device and op, with total latency percentiles.  Keys: q quits, s changes the
sort.  Ctrl-C quits too.  For a log instead of a screen: sudo iotrace -i 1.
"""


def parser() -> argparse.ArgumentParser:
    p = Parser(prog="iotrace top", formatter_class=argparse.RawDescriptionHelpFormatter, epilog=EPILOG,
               description="A live view of block I/O per process, device and op, with latency percentiles, "
                           "refreshed every interval (like biotop).  Needs root, as tracing does.")
    interval_count(p)
    p.add_argument("-i", "--interval", type=interval_seconds, metavar="SECONDS",
                   help="refresh every SECONDS (default 1)")
    add_device_option(p)
    p.add_argument("-p", "--pid", type=pid, action="append", default=[], metavar="PID", dest="pids", help=PID_HELP)
    p.add_argument("--no-children", action="store_true", help="with --pid: that process alone, no descendant")
    add_attach_option(p)
    output_options(p, "top")        # --sort
    return p


def run(argv: list[str], out: TextIO) -> int:
    from tracer.sources import devices

    ns = parser().parse_args(argv)
    interval = take_interval(ns) or 1.0
    if not (sys.stdin.isatty() and out.isatty()):
        raise UserError("top needs a terminal; for a log, run 'sudo iotrace -i 1' instead")
    devs = devices.device_filter(ns.devs)
    from tracer.runtime.child import check_pids

    for fd in check_pids(ns.pids):      # a gone pid: one line now, before the programs load
        os.close(fd)

    from tracer.sources.probe import ProbeOptions

    run = LiveRun("top", ns, out, devs)
    with run:
        print("iotrace top: loading the BPF programs ...", file=sys.stderr, flush=True)
        probe = run.open_probe(ProbeOptions(devs=devs, attach=ns.attach, stamps=ns.stamps, pids=ns.pids,
                                            follow_children=not ns.no_children), on_error=offer_diskstats)
        if probe.start_note:    # said before curses takes the screen; and in the header, which stays
            print(f"iotrace top: {probe.start_note}", file=sys.stderr)
        if probe.unavailable.get("stamps"):     # --stamps kernel asked, own stamps used: why
            print(f"iotrace top: {probe.unavailable['stamps']}", file=sys.stderr)
        where = ", ".join(ns.devs) or "every device"
        if probe.start_blind:
            where += f"; most requests unseen on {', '.join(probe.start_blind)} (see the line above)"
        if ns.pids:
            from tracer.sources.proctree import describe

            where += "; " + describe(run.attach_existing(ns.pids, not ns.no_children), shown=2)
        # our own handlers, not Python's: a process started with SIGINT ignored gets no KeyboardInterrupt
        run.catch_signals()
        import curses

        last: list[str] = []        # the screen sink keeps its last screen here when the count is reached

        def view(scr) -> None:
            run.open_sinks(extra={"scr": scr, "interval": interval, "where": where, "keep": last})
            try:       # the screen sink watches the keys (its inputs) and draws every window
                run.loop(run.dump_windows(containers=False), Schedule(interval, count=ns.count),
                         final=ns.count is not None)
            finally:
                run.close_outputs()     # never raises; inside curses, which ends with the view

        curses.wrapper(view)
        if last:    # the terminal is back as it was: leave the last screen in it, as biotop does
            out.write("\n".join(last) + "\n")
    return 0
