"""What every iotrace command shares: the command registry, argument types, option groups.

cli/ turns argv into objects and nothing else: each subcommand is one module
with `run(argv, out) -> exit code`, registered with one line in COMMANDS
and imported only when used (so `iotrace mark` never pays for numpy or bcc).
The live modes (trace, serve, top, diskstats) take their output options from
the sink registry (tracer.sinks), so every mode gets every sink that makes
sense for it.
"""

from __future__ import annotations

import argparse
import os

from tracer import sinks as sinkreg
from tracer.errors import UserError
from tracer.options import MAX_COUNT, Parser, at_least, interval_seconds, positive

# subcommand -> the module that runs it (trace mode, `iotrace [options]`, is tracer.cli.trace)
COMMANDS = {
    "report": "tracer.cli.report",
    "diff": "tracer.cli.diff",
    "mark": "tracer.cli.mark",
    "bench": "tracer.cli.bench",
    "compare": "tracer.cli.compare",
    "serve": "tracer.cli.serve",
    "plot": "tracer.cli.plot",
    "top": "tracer.cli.top",
}

__all__ = ["COMMANDS", "Parser", "at_least", "interval_seconds", "positive", "add_attach_option", "interval_count",
           "take_interval", "duration", "output_options", "add_device_option"]


def duration(text: str) -> float:
    """-d's type: seconds; a disk's name (biolatency's -d) gets pointed to --dev."""
    try:
        float(text)
    except ValueError:
        name = text.removeprefix("/dev/")
        if name and "/" not in name and os.path.exists(f"/sys/class/block/{name}"):
            raise argparse.ArgumentTypeError(f"{text!r} is a disk, but -d is the duration in seconds here: "
                                             f"for only that disk (biolatency's -d), give --dev {name}") from None
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds: -d is the duration here "
                                         f"(a disk is --dev)") from None
    return positive(text)


def interval_word(text: str) -> float:
    """The first positional: an interval, or a mistyped subcommand."""
    try:
        float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is neither an interval in seconds nor a command "
                                         f"({', '.join(COMMANDS)})") from None
    return interval_seconds(text)


def interval_count(p: argparse.ArgumentParser) -> None:
    """The [interval [count]] positionals of iostat, biolatency and biotop, beside -i."""
    p.add_argument("interval_pos", nargs="?", type=interval_word, metavar="interval",
                   help="as -i: a report every this many seconds")
    p.add_argument("count", nargs="?", type=at_least(1, MAX_COUNT),
                   help="stop after this many reports, the final one included (as iostat)")


def take_interval(ns: argparse.Namespace) -> float | None:
    """-i or the interval positional (not both)."""
    if ns.interval is not None and ns.interval_pos is not None:
        raise UserError(f"give the interval once: -i {ns.interval:g} or {ns.interval_pos:g}, not both")
    return ns.interval if ns.interval is not None else ns.interval_pos


def add_attach_option(p: argparse.ArgumentParser) -> None:
    """--attach and --stamps, shared by every command that loads the BPF programs."""
    default = os.environ.get("IOTRACE_ATTACH", "auto")
    p.add_argument("--attach", choices=("auto", "raw_tp", "tracepoint"), default=default,
                   help="how the BPF programs attach: raw_tp (raw tracepoints: a request is known by its "
                        "struct request, kernel structs are read at offsets from the kernel's BTF, and other BPF "
                        "tools running make the kernel skip nothing), tracepoint (perf-event tracepoints, for "
                        "kernels without BTF), or auto: raw_tp where /sys/kernel/btf/vmlinux has all it needs. "
                        "Default: $IOTRACE_ATTACH, else auto. Every dump says which ran (\"attach\")")
    p.add_argument("--stamps", choices=("own", "kernel"), default=os.environ.get("IOTRACE_STAMPS", "own"),
                   help="whose clock the latencies are read on: own (iotrace reads the clock at each request's "
                        "start, issue and completion: queue and device times for every request) or kernel (the "
                        "request's own start and issue stamps, the ones iostat's await is computed from, and one "
                        "clock read fewer: about a fifth less BPF time a request; queue and device are "
                        "told apart only where the kernel stamped the issue apart, on 6.9+ not for a request "
                        "issued within its submitter's plug). kernel needs raw tracepoints, block_io_start and "
                        "iostats on the traced disks, else own is used and the start says why. Default: "
                        "$IOTRACE_STAMPS, else own. Dumps say kernel in start_event.stamps")


def output_options(p: argparse.ArgumentParser, mode: str) -> None:
    """Every sink's options for this live mode (-o, -j, --hist, --csv, --alert, ...), from the sink registry."""
    sinkreg.add_arguments(p.add_argument_group("outputs"), mode)


DEV_HELP = "trace only this disk (loop0, /dev/nvme0n1, 7:0); repeatable. Default: every device"


def add_device_option(p: argparse.ArgumentParser) -> None:
    """--dev, shared by every mode that traces live (trace, --diskstats, serve, top): the strings as given
    in ns.devs; the run resolves them once (tracer.sources.devices.device_filter)."""
    p.add_argument("--dev", action="append", default=[], metavar="DEV", dest="devs", help=DEV_HELP)


PID_HELP = ("trace this process, all its threads, every descendant it has now, and (unless --no-children) "
            "every process forked from then on; repeatable. Default: every process")
