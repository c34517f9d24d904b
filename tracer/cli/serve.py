"""`sudo iotrace serve`: a long-running Prometheus exporter (tracer.sinks.prometheus) fed by the live loop.

Also takes -o, --csv and --alert, through the same sinks as trace mode.
"""

from __future__ import annotations

import argparse
import sys
from typing import TextIO

from tracer.cli.common import add_attach_option, add_device_option, output_options
from tracer.options import Parser, interval_seconds
from tracer.runtime.loop import Schedule
from tracer.runtime.session import LiveRun, alert_check
from tracer.sinks.prometheus import (
    ATTACHED,
    BOUNDS_S,
    BYTES,
    DEFAULT_LISTEN,
    DRAINS,
    DROPPED,
    FOLDED,
    IOS,
    LABELLED,
    LATENCY,
    READY_PATH,
)
from tracer.text import safe

EPILOG = f"""\
examples:
  sudo iotrace serve                               metrics on http://{DEFAULT_LISTEN}/metrics
  sudo iotrace serve --listen :9464 --interval 15  every interface (as in deploy/kubernetes)
  sudo iotrace serve --dev nvme0n1 -o fold.jsonl   one disk; also append each folded dump to a file
  sudo iotrace serve --csv io.csv --alert 'p99>50ms'
                                                   also iostat's columns per interval, and alerts
                                                   on stderr (as trace mode's -o, --csv, --alert)

metrics:
  {LATENCY}{{device,op,phase,comm,container}}  histogram, {len(BOUNDS_S)} buckets 10us..10s
  {IOS}, {BYTES}{{device,op,comm,container}}
  {DROPPED}{{reason}}, {DRAINS}, {LABELLED}, {FOLDED}
  {ATTACHED}   0 while the BPF programs load (seconds), 1 once attached

readiness: {READY_PATH} answers 200 once the programs are attached, 503 before
(deploy/kubernetes probes it); /metrics answers from the start.

At most --top (comm, container) pairs keep labels of their own, ranked by
recent I/O; the rest is counted under comm="other".  A pair with no I/O for
--idle seconds (its processes exited) is folded into "other" too, so a node
where processes come and go keeps a bounded number of series.  SIGTERM or
Ctrl-C end it (exit 0).
"""


def parser() -> argparse.ArgumentParser:
    p = Parser(prog="iotrace serve", formatter_class=argparse.RawDescriptionHelpFormatter, epilog=EPILOG,
               description="Export block I/O latency to Prometheus: histograms per device, op and latency "
                           "phase, labelled with process name and container, plus I/O, byte and "
                           "dropped-event counters.")
    p.add_argument("-i", "--interval", type=interval_seconds, default=5.0, metavar="SECONDS",
                   help="drain the kernel's histograms into the metrics this often (default 5)")
    add_attach_option(p)
    add_device_option(p)
    p.add_argument("--cgroup", metavar="PATH",
                   help="only I/O submitted from this cgroup v2 or below it, e.g. /kubepods.slice for pods only")
    p.add_argument("--tasks", action="store_true", help="also export per-process I/O wait, file and disk read bytes, "
                   "fsync and throttled time (iotrace_task_*; tracer.sinks.taskmetrics), with the same labels; "
                   "from scheduler, page-cache and ext4 events, as trace's default rows (no system call pays)")
    output_options(p, "serve")      # --listen, --top, --idle, -o, --csv, --alert, --fail-on-alert
    return p


def run(argv: list[str], out: TextIO = sys.stdout) -> int:
    from tracer.sources import devices
    from tracer.sources.cgroups import env_root, resolve_cgroup
    from tracer.sources.probe import ProbeOptions

    ns = parser().parse_args(argv)
    env_root()      # refused under sudo: before anything starts, not at the first dump
    devs = devices.device_filter(ns.devs)       # the probe's map, the sinks and the alerts all take this one
    cgroup_id, cgroup_level = resolve_cgroup(ns.cgroup) if ns.cgroup else (0, 0)
    run = LiveRun("serve", ns, out, devs, alert_check(ns, devices=devs))
    with run:
        # the HTTP server listens here, before loading BPF (seconds of compiling): a port in use fails at once
        run.open_sinks()
        run.catch_signals()
        probe = run.open_probe(ProbeOptions(devs=devs, cgroup_id=cgroup_id, cgroup_level=cgroup_level,
                                            attach=ns.attach, stamps=ns.stamps))
        for note in (probe.start_note, probe.stamps_note, probe.unavailable.get("stamps", "")):
            if note:
                print(f"iotrace serve: {safe(note)}", file=sys.stderr)
        if ns.tasks:
            tasks, _ = run.open_tasks([], True, required=True)      # every process: serve has no pid filter
            if tasks.syscalls_note:
                print(f"iotrace: --tasks times reads and fsyncs on the syscalls' perf-event tracepoints, not raw "
                      f"ones (costlier for every syscall): {tasks.syscalls_note}", file=sys.stderr)
        run.attached()      # the Prometheus sink: ready, iotrace_attached 1, and where it serves
        run.loop(run.dump_windows(iostat=bool(ns.csv)), Schedule(ns.interval))     # its summary at the end
    return run.status
