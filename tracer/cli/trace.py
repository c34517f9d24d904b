"""Trace mode, `sudo iotrace [options] [interval [count]] [-- COMMAND]`, and `iotrace --diskstats`.

Arguments become objects here: the sources (the BPF probe, the per-process
tracer, or the /proc samplers), the pipeline that turns them into windows,
the sinks the options ask for, and the live loop (tracer.runtime.loop) that
runs them.  Every problem the user can fix is one line on stderr and a
non-zero exit (tracer.errors.UserError); whatever was collected is still
printed and written on Ctrl-C or SIGTERM.
"""

from __future__ import annotations

import argparse
import os
import sys
from dataclasses import dataclass, field, fields
from typing import TextIO

from tracer import contract
from tracer.cli.common import (
    PID_HELP,
    add_attach_option,
    add_device_option,
    alert_check,
    duration,
    interval_count,
    offer_diskstats,
    output_options,
    take_interval,
)
from tracer.errors import UserError
from tracer.options import Parser, at_least, interval_seconds, pid, wait_seconds
from tracer.runtime.loop import Schedule
from tracer.runtime.session import LiveRun
from tracer.text import safe

EPILOG = """\
examples:
  sudo iotrace                                  every process, every device, until Ctrl-C
  sudo iotrace --pid "$(pgrep -f train.py)" -i 10
                                                a running trainer, its workers and what it forks
                                                later, a report every 10 s
  sudo iotrace -o run.jsonl -- python train.py  run a command traced from its first I/O
                                                and, once it exits, the write-back of what it left
                                                dirty (up to 30 s: --wb-wait SECONDS, 0 for none)
  sudo iotrace --dev nvme0n1 -d 30 --hist       one device for 30 s, with latency bars
  iotrace report run.jsonl                      render saved dumps again (no root needed)
  iotrace mark 'epoch 3'                        close the running tracer's dump, labelled (no root needed)
  iotrace report run.jsonl --by label           epochs (marker labels) side by side
  iotrace diff a.jsonl b.jsonl                  two runs (or two labels) compared row by row
  sudo iotrace bench -o new.json                a versioned fio suite, repeated, to a result file
  iotrace compare base.json new.json            regression gate: exit 1 beyond threshold and spread
  sudo iotrace serve --listen :9464             a Prometheus exporter: latency histograms per device,
                                                op, process name and container
  sudo iotrace -i 10 --csv io.csv --alert 'p99>50ms' --fail-on-alert -- python train.py
                                                iostat's columns beside p50/p99 per interval; exit 3 on an alert
  iotrace plot run.jsonl -o io.png              latency over time, a heatmap, per-epoch bars (needs matplotlib)
  sudo iotrace top                              a live view, like biotop with percentiles (q quits)
  iotrace --diskstats -i 5                      no root, no BPF: iostat's numbers per device, bytes per process
  sudo iotrace 1 10                             a report every second, ten reports (the last one the final), as iostat
  sudo iotrace -p "$(pgrep -f train.py)" -j -d 60 | jq .
                                                one process, each report as a JSON line on stdout, no table

coming from bcc and sysstat (what their flags are here):
  biolatency 1 10, iostat -x 1 10   iotrace 1 10       [interval [count]]; or -i SECONDS and -d SECONDS
  biolatency -d sda                 iotrace --dev sda  (here -d is the duration, in seconds)
  biolatency -D                     per disk already: every row is a process, a device and an op
  biolatency -Q                     queue time is in already: total = queue + device (QUEUE, DEVICE)
  biolatency -F                     per op already: the OP column (read, write, flush, discard, other)
  biolatency -m                     units adapt per value (us, ms, s); --hist for log2 bars
  biotop -p PID, pidstat -d -p PID  iotrace -p PID (--pid; with the children it has and forks)
  biotop                            iotrace top
  biolatpcts -j, iostat -o JSON     iotrace -j         one JSON line per report on stdout (the -o dump format)
  iostat -x (no root)               iotrace --diskstats

latency phases (blktrace's names in brackets):
  queue   request start to issue to the driver    (~Q2D)
  device  issue to completion                      (D2C)
  total   start to completion                      (~Q2C)
The table shows total latency percentiles, and p50/p99 of its queue and device parts
(QUEUE p50 .. DEVICE p99; with --hist, blktrace's way: Q:p50 .. D:p99).
"""


@dataclass
class TraceArgs:
    """Trace mode's options, typed: each field is the parsed option of its name (parse_trace_args fills
    them from the namespace by name, so an option of the mode's own is one field here).  `options` is
    the whole namespace: the sinks read their own options there, whatever module added them."""

    pids: list[int] = field(default_factory=list)
    no_children: bool = False
    threads: bool = False
    devs: list[str] = field(default_factory=list)
    interval: float | None = None
    duration: float | None = None
    output: str | None = None
    hist: bool = False
    inflight_slots: int | None = None
    hist_cells: int | None = None
    cgroup: str | None = None
    command: list[str] = field(default_factory=list)
    csv: str | None = None                                  # tracer.sinks: --csv, --alert; --diskstats
    alerts: list[str] = field(default_factory=list)
    fail_on_alert: bool = False
    diskstats: bool = False
    attach: str = "auto"                                    # how the BPF programs attach (--attach)
    tasks: bool = False                                     # --tasks: per-process rows' reads, fsyncs at the syscalls
    no_tasks: bool = False                                  # --no-tasks: no per-process rows (tracer.sources.tasks)
    files: int = 50                                         # --files: file rows kept per dump (the rest summed)
    count: int | None = None                                # reports to make, the final one included
    json: bool = False                                      # -j: dumps as JSON lines on stdout, no table
    wb_wait: float = 30.0                                   # --wb-wait: seconds for the targets' write-back at exit
    bio: bool = False                                       # --bio: each I/O also timed as submitted (a bio)
    options: argparse.Namespace = field(default_factory=argparse.Namespace)   # every option, sinks' included


def trace_parser() -> argparse.ArgumentParser:
    con = contract.load()   # defaults shown in --help come from the BPF contract
    p = Parser(prog="iotrace", formatter_class=argparse.RawDescriptionHelpFormatter, epilog=EPILOG,
                usage="sudo iotrace [options] [interval [count]] [-- COMMAND [ARGS...]]\n"
                      "       iotrace report FILE.jsonl...\n"
                      "       iotrace --diskstats [-i SECONDS] [--dev DEV] [--pid PID]   (no root)",
                description="Block I/O latency per process and device, from in-kernel BPF histograms: "
                            "p50/p90/p99/p99.9 of each process's reads, writes, flushes and discards.")
    interval_count(p)
    p.add_argument("-p", "--pid", type=pid, action="append", default=[], metavar="PID", dest="pids",
                   help=PID_HELP + ". The run ends when every PID has exited; a trainer already running finds "
                        "the tracer with its next marker")
    p.add_argument("--no-children", action="store_true",
                   help="with --pid: that process (and its threads) alone, no descendant; with COMMAND: "
                        "do not follow its forks")
    p.add_argument("--wb-wait", type=wait_seconds, default=30.0, metavar="SECONDS",
                   help="when the COMMAND or the --pid processes have exited leaving written data in the page "
                        "cache (buffered writes, no fsync), keep tracing until the kernel has written it to disk, "
                        "charged to them, for at most SECONDS (default 30; Ctrl-C ends the wait with everything "
                        "written out). 0: do not wait. If some is still unwritten at the end, one line and the "
                        "final dump's unwritten_at_exit say how much")
    p.add_argument("--bio", action="store_true",
                   help="also time each I/O as the process submitted it, from block_bio_queue to its completion: "
                        "a table of its own beside the requests', where an I/O the kernel split into several "
                        "requests is one row entry and the wait for a request (a tag, a plug) is counted; "
                        "what fio's clat sees minus the system call. Raw tracepoints only; one more program "
                        "run per bio")
    p.add_argument("--threads", action="store_true", help="one row per thread instead of per process")
    add_device_option(p)
    p.add_argument("--cgroup", metavar="PATH",
                   help="trace only I/O submitted from this cgroup v2 or below it (a container, a systemd "
                        "unit): a path under the cgroup2 mount, or relative to it, e.g. /system.slice/x.scope")
    p.add_argument("-i", "--interval", type=interval_seconds, metavar="SECONDS",
                   help="print (and dump) a report every SECONDS, histograms reset each time")
    p.add_argument("-d", "--duration", type=duration, metavar="SECONDS",
                   help="stop after SECONDS (the disk is --dev, not -d as in biolatency)")
    p.add_argument("--inflight-slots", type=int, metavar="N",
                   help="size of the in-kernel in-flight request table (power of two, default "
                        f"{con.const('INFLIGHT_SLOTS')}; raise it if the report shows inflight_full)")
    p.add_argument("--hist-cells", type=int, metavar="N",
                   help=f"per-CPU fast histogram cells (power of two, default {con.const('HIST_CELLS')}); "
                        "buckets that find no cell still count, in a slower hash map")
    add_attach_option(p)
    output_options(p, "trace")     # -o, -j, --hist, --csv, --alert, --fail-on-alert
    rows = p.add_mutually_exclusive_group()
    rows.add_argument("--tasks", action="store_true",
                      help="per-process rows (\"tasks\", on by default) with reads and fsyncs timed at the system "
                           "calls instead of the page cache's and ext4's events: what a kernel without those events "
                           "needs (before 6.11: no mm_filemap_get_pages; the dump's tasks_sources says), and the "
                           "baseline they are checked against. Costs while on (scripts/bench_tasks.py): ~0.06-0.2 us "
                           "on every system call of the machine, ~0.3-0.9 us per traced file read; without it no "
                           "system call pays anything")
    rows.add_argument("--no-tasks", action="store_true",
                      help="no per-process rows: by default every dump has them (I/O wait, bytes read from files, "
                           "page-cache hits, bytes from disk, fsync and dirty-page throttling time, for the "
                           "per-epoch verdict), from scheduler, page-cache and ext4 events: ~0.05-0.2 us per context "
                           "switch, ~0.2-0.3 us per buffered read batch, ~0.1 us per folio a miss adds, nothing "
                           "per system call")
    p.add_argument("--files", type=at_least(0), default=50, metavar="N",
                   help="file rows kept in each dump (\"files\"): the top N files by bytes moved (read from "
                        "disk + written), the rest summed into one \"(other files)\" row (default 50; the table "
                        "at the end shows the top 10)")
    p.add_argument("--diskstats", action="store_true",
                   help="no BPF, no root: iostat's numbers per device from /proc/diskstats and bytes per "
                        "process from /proc/PID/io (your own processes only, unless root); no percentiles. "
                        "Takes [interval [count]], -i, -d, -o, -j, --csv, --dev, --pid, --alert")
    return p


def parse_trace_args(argv: list[str]) -> TraceArgs:
    command: list[str] = []
    if "--" in argv:
        cut = argv.index("--")
        argv, command = argv[:cut], argv[cut + 1:]
        if not command:
            raise UserError("nothing after '--': give the command to trace, e.g. 'iotrace -- fio job.fio'")
    ns = trace_parser().parse_args(argv)
    interval = take_interval(ns)
    if command and ns.pids:
        raise UserError("give either --pid or a COMMAND after '--', not both")
    ns.interval, ns.command = interval, command
    return TraceArgs(**{f.name: getattr(ns, f.name) for f in fields(TraceArgs) if hasattr(ns, f.name)}, options=ns)


def run(argv: list[str], out: TextIO = sys.stdout) -> int:
    return run_trace(parse_trace_args(argv), out)


def run_trace(args: TraceArgs, out: TextIO = sys.stdout) -> int:
    """Trace until the command or the --pid targets exit, -d or count is reached, or Ctrl-C."""
    from tracer.marker import ENV_CONTROL
    from tracer.runtime import child as childmod
    from tracer.runtime.cmdtree import CommandTree
    from tracer.sources import cgroups, devices

    if args.diskstats:
        return run_diskstats(args, out)
    cgroups.env_root()      # refused under sudo: before anything starts, not at the first dump
    devs = devices.device_filter(args.devs)     # the probe's map, the sinks and the alerts all take this one
    cgroup_id, cgroup_level = cgroups.resolve_cgroup(args.cgroup) if args.cgroup else (0, 0)
    pidfds = childmod.check_pids(args.pids)
    alerts = alert_check(args, devices=devs)
    run = LiveRun("trace", args.options, out, devs, alerts)
    with run:
        run.open_sinks()
        # a traced COMMAND is told the socket's path before it runs (it is held until the probe is ready);
        # otherwise the socket is bound once the probe is attached: a marker sent while the programs still
        # compile would be taken only when the loop starts, seconds late, and close the wrong stretch
        control, control_error = open_control(args.pids) if args.command else (None, None)
        run.control = control
        child = tree = None
        held: list[int] = []        # the held child's release fd, until it is let go
        if args.command:
            env = {ENV_CONTROL: control.path} if control else None
            child, release = childmod.spawn_held(args.command, env, args.json)
            held.append(release)

            def end_command() -> None:
                if held:
                    os.close(held.pop())    # unblocks the held child: it exits 125
                try:
                    if tree is not None:    # all it started: SIGTERM, SIGKILL after a grace; its cgroup removed
                        tree.end(childmod.KILL_GRACE_S)
                finally:
                    childmod.end(child)     # a no-op once the loop reaped it; else SIGTERM, then SIGKILL

            run.end_command = end_command
            # held, it has forked nothing yet: all it will start is in its tree (a cgroup of its own)
            tree = CommandTree.open(child)
        # from here on, Ctrl-C and SIGTERM end the trace in order instead of raising
        run.catch_signals()
        from tracer.sources.probe import ProbeOptions

        opts = ProbeOptions(pids=list(args.pids) + ([child] if child else []), follow_children=not args.no_children,
                            per_thread=args.threads, devs=devs, inflight_slots=args.inflight_slots,
                            hist_cells=args.hist_cells, cgroup_id=cgroup_id, cgroup_level=cgroup_level,
                            attach=args.attach, files=True, files_top=max(args.files, 0), submitted=args.bio)
        probe = run.open_probe(opts, on_error=offer_diskstats)
        tasks, tasks_note = ((None, "") if args.no_tasks else
                             run.open_tasks(opts.pids, opts.follow_children, syscall_hooks=args.tasks))
        # after both filters are armed: what the --pid targets forked before the attach joins them
        attached = run.attach_existing(args.pids, not args.no_children) if args.pids else None
        if not args.command:
            control, control_error = open_control(args.pids)
            run.control = control
        if control:     # whose markers it takes: with --pid or a COMMAND, its traced tree's (runtime.control)
            from tracer.runtime.control import SenderGate

            control.gate = SenderGate(probe.traced_pids if opts.pids else None)
        if child:
            pidfds.append(os.pidfd_open(child))
            childmod.release(held.pop())
        _announce(args, child, probe, control, control_error, attached)
        if tree is not None and tree.note:
            print(f"iotrace: warning: {safe(tree.note)}", file=sys.stderr)
        _announce_tasks(args, tasks, tasks_note)
        from tracer.pipeline.windows import unavailable

        print_unavailable(unavailable(probe.unavailable, tasks.sources if tasks is not None else None))
        # attached: the traced processes ran before the trace (--pid, or every process), unlike a COMMAND
        windows = run.dump_windows(traced=bool(args.pids or args.command), iostat=bool(args.csv),
                                   attached=not args.command,
                                   cgroup=cgroups.cgroup_path(args.cgroup) if args.cgroup else None)
        after_exit = _writeback_wait(args, probe) if args.pids or args.command else None
        run.loop(windows, Schedule(args.interval, args.duration, args.count), child=child, tree=tree,
                 pidfds=pidfds, control=control, after_exit=after_exit)
        if after_exit is not None and after_exit.line:
            print(after_exit.line, file=sys.stderr)
    # leaving `with` closed everything in order (tracer.runtime.session): the outputs, the command, the
    # programs, the per-process tracer, the control socket, and last the signal handlers
    return run.status


def _writeback_wait(args: TraceArgs, probe):
    """The wait for the traced processes' write-back once they have exited (tracer.runtime.wbwait)."""
    from tracer.runtime.wbwait import WritebackWait
    from tracer.sources.meminfo import machine_unwritten_bytes

    return WritebackWait(probe.owed_bytes, args.wb_wait, machine_unwritten_bytes,
                         say=lambda line: print(line, file=sys.stderr))


def _announce(args: TraceArgs, child: int | None, probe, control, control_error: str | None,
              attached=None) -> None:
    from tracer.sources.proctree import describe

    what = (f"command {' '.join(args.command)!r} (pid {child})" if child else
            describe(attached) if attached else "all processes" if not args.cgroup else "")
    # --cgroup filters whoever runs: the processes of that cgroup (and below it), or those of the targets there
    if args.cgroup:
        what += f"{' in ' if what else 'the processes of '}cgroup {args.cgroup} (and below it)"
    # the command, devices and paths as given: shown through safe(), as every name
    print(safe(f"iotrace: tracing block I/O of {what}"
               f"{' on ' + ', '.join(args.devs) if args.devs else ''}; Ctrl-C to end"), file=sys.stderr)
    if probe.attach_note:
        print(f"iotrace: attached to perf-event tracepoints, not raw ones: {safe(probe.attach_note)}",
              file=sys.stderr)
    if probe.start_note:
        print(f"iotrace: {probe.start_note}", file=sys.stderr)
    print(safe(f"iotrace: markers: 'iotrace mark LABEL' or tracer.marker.mark(LABEL) close a labelled dump "
               f"(control socket {control.path})" if control else
               f"iotrace: warning: no control socket, markers are off ({control_error})"), file=sys.stderr)


def unavailable_line(missing: dict[str, str]) -> str:
    """The one start line of what the kernel or attach path lacks (the dumps' "unavailable"), or ""."""
    if not missing:
        return ""
    from tracer.sources.tasks import PAGECACHE_SOURCES

    hint = ("; --tasks counts reads and fsyncs at the syscalls instead"
            if {f"tasks.{k}" for k in PAGECACHE_SOURCES} & missing.keys() else "")
    return safe("iotrace: not on this kernel or path, so not counted (the dumps' \"unavailable\" names them): "
                + "; ".join(f"{k}: {v}" for k, v in missing.items()) + hint)


def print_unavailable(missing: dict[str, str]) -> None:
    line = unavailable_line(missing)
    if line:
        print(line, file=sys.stderr)


def _announce_tasks(args: TraceArgs, tasks, note: str) -> None:
    """What the per-process rows are made of, when it is not what was asked for (a warning each; the sources
    the kernel lacks are in the start line of what is unavailable)."""
    if args.no_tasks:
        return
    if tasks is None:
        print(f"iotrace: warning: no per-process rows (\"tasks\") in the dumps: {safe(note)}", file=sys.stderr)
        return
    if tasks.syscalls_note:
        print(f"iotrace: per-process rows time reads and fsyncs on the syscalls' perf-event tracepoints, "
              f"not raw ones (costlier for every syscall): {safe(tasks.syscalls_note)}", file=sys.stderr)


def open_control(pids: list[int] | None = None):
    """The control socket for markers, or (None, why not): tracing goes on without it.

    It is writable by the user behind sudo; with --pid, by the user the
    first target runs as, if not root: the trainer attached to must reach
    the tracer with its next marker (root, sudo iotrace mark, always can).
    """
    import pwd

    from tracer.osutil import invoking_user
    from tracer.runtime.control import ControlSocket

    owner = invoking_user()
    if pids:
        try:
            uid = os.stat(f"/proc/{pids[0]}").st_uid
            owner = pwd.getpwuid(uid) if uid else owner
        except (OSError, KeyError):
            pass
    try:
        return ControlSocket.open(owner=owner), None
    except OSError as exc:
        return None, exc.strerror or str(exc)


# ---- iotrace --diskstats ---------------------------------------------------------

def _check_diskstats_args(args: TraceArgs) -> None:
    if args.command:
        raise UserError("--diskstats watches, it does not run a COMMAND: start the command yourself and give "
                        "--pid PID (its bytes come from /proc/PID/io)")
    for flag, given in (("--threads", args.threads), ("--hist", args.hist), ("--inflight-slots", args.inflight_slots),
                        ("--hist-cells", args.hist_cells), ("--cgroup", args.cgroup), ("--tasks", args.tasks)):
        if given:
            raise UserError(f"{flag} needs BPF; --diskstats has per-device and per-process numbers only")


def run_diskstats(args: TraceArgs, out: TextIO = sys.stdout) -> int:
    """`iotrace --diskstats`: iostat's numbers per device and bytes per process, every -i, until -d or Ctrl-C."""
    from tracer.pipeline.windows import DiskWindows
    from tracer.runtime.child import check_pids
    from tracer.sources.devices import device_filter
    from tracer.sources.diskstats import DiskSampler, ProcSampler
    from tracer.views.diskstats import NO_PERCENTILES

    _check_diskstats_args(args)
    devs = device_filter(args.devs)
    names = devs.name_list
    alerts = alert_check(args, bpf=False, devices=devs)
    pidfds = check_pids(args.pids)
    windows = DiskWindows(DiskSampler(names), ProcSampler(args.pids, children=not args.no_children),
                          every_device=names is not None, alerts=alerts)
    from tracer.sources import proctree

    run = LiveRun("diskstats", args.options, out, devs, alerts)
    with run:
        run.open_sinks(whole=windows.whole)
        who = f", {proctree.describe(proctree.snapshot(args.pids, not args.no_children))}" if args.pids else ""
        print(safe(f"iotrace: --diskstats: {'devices ' + ', '.join(names) if names else 'every disk'}"
                   f"{who}; {NO_PERCENTILES}; Ctrl-C to end"), file=sys.stderr)
        if os.geteuid() != 0:
            print("iotrace: not root: /proc/PID/io shows only your own processes", file=sys.stderr)
        run.catch_signals()
        run.loop(windows, Schedule(args.interval, args.duration, args.count), pidfds=pidfds)
        run.status = 0      # the status is the outputs' (no command here)
    return run.status
