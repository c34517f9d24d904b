"""Trace mode's command line, `sudo iotrace [options] [interval [count]] [-- COMMAND]`, and `iotrace --diskstats`'s.

Argv becomes one object here: the parser (its --help and the man page),
the checks of options that go together or not (--pid or a COMMAND, what
--diskstats cannot take), and the typed options (TraceArgs) that the run
takes.  The run itself, the probe, the held command, the control socket and
the loop, is tracer.runtime.trace's.  Every problem the user can fix is one
line on stderr and a non-zero exit (tracer.errors.UserError); whatever was
collected is still printed and written on Ctrl-C or SIGTERM.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import fields
from typing import TextIO

from tracer import contract
from tracer.cli.common import (
    PID_HELP,
    add_attach_option,
    add_device_option,
    duration,
    interval_count,
    output_options,
    take_interval,
)
from tracer.errors import UserError
from tracer.options import Parser, at_least, interval_seconds, pid, wait_seconds
from tracer.runtime import trace as runtime_trace
from tracer.runtime.trace import TraceOptions, unavailable_line
from tracer.runtime.trace import announce as _announce

# the start lines went to tracer.runtime.trace with the run: still importable from here, where they were
__all__ = ["EPILOG", "TraceArgs", "trace_parser", "parse_trace_args", "run", "run_trace", "unavailable_line",
           "_announce"]

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


# the typed options parse_trace_args fills from the namespace by name: an option of the mode's own is one
# field of it (tracer.runtime.trace.TraceOptions), and `options` is the whole namespace, for the sinks
TraceArgs = TraceOptions


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
                   help="per-CPU fast histogram cells (power of two; default: as many as 16 MB of 16-byte "
                        f"cells hold over all CPUs, {con.const('HIST_CELLS_MOST')} on up to "
                        f"{con.const('HIST_CELLS_BUDGET') // (2 * con.const('HIST_CELLS_MOST'))} CPUs and no "
                        f"fewer than {con.const('HIST_CELLS')}); buckets that find no cell still count, in a "
                        "slower hash map (the notes then say hist_overflow: raise it)")
    add_attach_option(p)
    output_options(p, "trace")     # -o, -j, --hist, --csv, --alert, --fail-on-alert
    rows = p.add_mutually_exclusive_group()
    rows.add_argument("--tasks", action="store_true",
                      help="per-process rows (\"tasks\", on by default) with reads and fsyncs timed at the system "
                           "calls instead of the page cache's and ext4's events: what a kernel without those events "
                           "needs (before 6.12: no mm_filemap_get_pages; the dump's tasks_sources says), and the "
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
    """Trace (tracer.runtime.trace) until the command or the --pid targets exit, -d or count is reached, or
    Ctrl-C; with --diskstats, once its options are checked, sample /proc instead."""
    if args.diskstats:
        _check_diskstats_args(args)
    return runtime_trace.run(args, out)


def _check_diskstats_args(args: TraceArgs) -> None:
    if args.command:
        raise UserError("--diskstats watches, it does not run a COMMAND: start the command yourself and give "
                        "--pid PID (its bytes come from /proc/PID/io)")
    for flag, given in (("--threads", args.threads), ("--hist", args.hist), ("--inflight-slots", args.inflight_slots),
                        ("--hist-cells", args.hist_cells), ("--cgroup", args.cgroup), ("--tasks", args.tasks)):
        if given:
            raise UserError(f"{flag} needs BPF; --diskstats has per-device and per-process numbers only")
