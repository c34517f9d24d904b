"""`sudo iotrace serve`: a long-running Prometheus exporter (tracer.sinks.prometheus) fed by the live loop.

Also takes -o, --csv and --alert, through the same sinks as trace mode.
"""

from __future__ import annotations

import argparse
import sys
from typing import TextIO

from tracer import sinks as sinkreg
from tracer.cli.common import add_attach_option, alert_check, device_names, make_sinks, output_options
from tracer.errors import UserError
from tracer.options import Parser, interval_seconds
from tracer.runtime.loop import Live, Schedule, Sinks
from tracer.runtime.teardown import run_steps
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
    OTHER,
    READY_PATH,
    PrometheusSink,
)

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
    p.add_argument("--dev", action="append", default=[], metavar="DEV", dest="devs",
                   help="only this disk (loop0, /dev/nvme0n1, 7:0); repeatable. Default: every device")
    p.add_argument("--cgroup", metavar="PATH",
                   help="only I/O submitted from this cgroup v2 or below it, e.g. /kubepods.slice for pods only")
    p.add_argument("--tasks", action="store_true", help="also export per-process I/O wait, file and disk read bytes, "
                   "fsync and throttled time (iotrace_task_*; tracer.sinks.taskmetrics), with the same labels")
    output_options(p, "serve")      # --listen, --top, --idle, -o, --csv, --alert, --fail-on-alert
    return p


def run(argv: list[str], out: TextIO = sys.stdout) -> int:
    from tracer.pipeline.windows import DumpWindows
    from tracer.runtime.signals import Signals
    from tracer.sources import devices
    from tracer.sources.cgroups import resolve_cgroup

    ns = parser().parse_args(argv)
    devs = [devices.resolve(d) for d in ns.devs]
    cgroup_id, cgroup_level = resolve_cgroup(ns.cgroup) if ns.cgroup else (0, 0)
    names = device_names(ns.devs)
    alerts = alert_check(ns, devices=names)
    # the HTTP server listens here, before loading BPF (seconds of compiling): a port in use fails at once
    outputs = Sinks(make_sinks(ns, sinkreg.Context("serve", out, names, alerts)))
    prom = next(s for s in outputs.sinks if isinstance(s, PrometheusSink))
    probe = tasks = sig = None
    status = 0
    try:
        sig = Signals()
        from tracer.sources.probe import Probe, ProbeOptions
        from tracer.sources.tasks import open_tracer

        probe = Probe(ProbeOptions(devs=devs, cgroup_id=cgroup_id, cgroup_level=cgroup_level, attach=ns.attach))
        if probe.start_note:
            print(f"iotrace serve: {probe.start_note}", file=sys.stderr)
        if ns.tasks:
            tasks, why = open_tracer([], True)      # every process: serve has no pid filter
            if tasks is None:
                raise UserError(f"--tasks: {why}")
            if tasks.syscalls_note:
                print(f"iotrace: --tasks times reads and fsyncs on the syscalls' perf-event tracepoints, not raw "
                      f"ones (costlier for every syscall): {tasks.syscalls_note}", file=sys.stderr)
        prom.attached()
        print(f"iotrace: serving block I/O metrics on http://{prom.where}/metrics, every {ns.interval:g}s"
              f"{' on ' + ', '.join(ns.devs) if ns.devs else ''}{' in ' + ns.cgroup if ns.cgroup else ''}; "
              f"SIGTERM or Ctrl-C to end", file=sys.stderr)
        Live(DumpWindows(probe, tasks, alerts=alerts, iostat=bool(ns.csv), devices=names), outputs,
             Schedule(ns.interval), sig).run()
        e = prom.exporter
        out.write(f"iotrace serve: {e.drains} intervals folded, {len(e.owners)} labelled owners, "
                  f"{e.folded} folded into \"{OTHER}\"\n")
    finally:
        status = outputs.close(status)      # never raises
        run_steps(("detaching the BPF programs", probe.close if probe else None),
                  ("detaching the per-process tracer", tasks.close if tasks else None),
                  ("restoring the signal handlers", sig.restore if sig else None))
    return status
