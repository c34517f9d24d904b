"""The iotrace command line: arguments, command mode, signals, exit codes.

    sudo iotrace [options] [-- COMMAND [ARGS...]]     trace, report, dump
    iotrace report FILE.jsonl...                      render saved dumps
    iotrace diff A B                                  compare two runs or labels

Every problem the user can fix is one line on stderr and a non-zero exit
(tracer.errors.UserError); whatever was collected is still printed and
written on Ctrl-C or SIGTERM.
"""

from __future__ import annotations

import argparse
import os
import pwd
import select
import shutil
import signal
import sys
import time
from dataclasses import dataclass, field
from typing import TextIO

from .errors import UserError

EPILOG = """\
examples:
  sudo iotrace                                  every process, every device, until Ctrl-C
  sudo iotrace --pid "$(pgrep -f train.py)" -i 10
                                                one process and its children, a report every 10 s
  sudo iotrace -o run.jsonl -- python train.py  run a command traced from its first I/O
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
  biolatency -Q                     queue time is in already: total = queue (Q:) + device (D:)
  biolatency -F                     per op already: the OP column (read, write, flush, discard, other)
  biolatency -m                     units adapt per value (us, ms, s); --hist for log2 bars
  biotop -p PID, pidstat -d -p PID  iotrace -p PID (--pid; follows the children it forks)
  biotop                            iotrace top
  biolatpcts -j, iostat -o JSON     iotrace -j         one JSON line per report on stdout (the -o dump format)
  iostat -x (no root)               iotrace --diskstats

latency phases (blktrace's names in brackets):
  queue   request start to issue to the driver    (~Q2D)
  device  issue to completion                      (D2C)
  total   start to completion                      (~Q2C)
The table shows total latency percentiles, and p50/p99 of queue (Q:) and device (D:).
"""

# subcommand -> "module:function"; each takes (argv, out) and returns the exit code.
# Imported only when used, so `iotrace mark` never pays for numpy or bcc.
SUBCOMMANDS = {
    "report": "tracer.cli:run_report",
    "diff": "tracer.diff:main",
    "mark": "tracer.control:run_mark",
    "bench": "tracer.bench:main",
    "compare": "tracer.compare:main",
    "serve": "tracer.serve:main",
    "plot": "tracer.plot:main",
    "top": "tracer.top:main",
}


@dataclass
class TraceArgs:
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
    csv: str | None = None                                  # tracer.iostat: --csv, --alert, --diskstats
    alerts: list[str] = field(default_factory=list)
    fail_on_alert: bool = False
    diskstats: bool = False
    attach: str = "auto"                                    # how the BPF programs attach (--attach)
    tasks: bool = False                                     # --tasks: per-process rows (tracer.tasks)
    count: int | None = None                                # reports to make, the final one included
    json: bool = False                                      # -j: dumps as JSON lines on stdout, no table


def _positive(text: str) -> float:
    try:
        v = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds") from None
    if v <= 0:
        raise argparse.ArgumentTypeError(f"{text!r} must be more than 0 seconds")
    return v


def _at_least(least: int):
    """An argparse type: a whole number no smaller than `least`."""
    def parse(text: str) -> int:
        try:
            n = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
        if n < least:
            raise argparse.ArgumentTypeError(f"{text!r} must be {least} or more")
        return n
    return parse


def _duration(text: str) -> float:
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
    return _positive(text)


def _interval_word(text: str) -> float:
    """The first positional: an interval, or a mistyped subcommand."""
    try:
        return _positive(text)
    except argparse.ArgumentTypeError:
        raise argparse.ArgumentTypeError(f"{text!r} is neither an interval in seconds nor a command "
                                         f"({', '.join(SUBCOMMANDS)})") from None


def interval_count(p: argparse.ArgumentParser) -> None:
    """The [interval [count]] positionals of iostat, biolatency and biotop, beside -i."""
    p.add_argument("interval_pos", nargs="?", type=_interval_word, metavar="interval",
                   help="as -i: a report every this many seconds")
    p.add_argument("count", nargs="?", type=_at_least(1),
                   help="stop after this many reports, the final one included (as iostat)")


def take_interval(ns: argparse.Namespace) -> float | None:
    """-i or the interval positional (not both)."""
    if ns.interval is not None and ns.interval_pos is not None:
        raise UserError(f"give the interval once: -i {ns.interval:g} or {ns.interval_pos:g}, not both")
    return ns.interval if ns.interval is not None else ns.interval_pos


def deadline(args, start: float) -> float | None:
    """When a run ends (time.monotonic): after -d, or when `count` reports are due, whichever comes first."""
    ends = [start + args.duration] if args.duration else []
    if args.count:
        ends.append(start + args.interval * args.count)
    return min(ends, default=None)


def interval_due(now: float, next_tick: float | None, end: float | None) -> bool:
    """An interval report is due: its tick has come, and it is not (within a ms) the end, which the final covers."""
    return next_tick is not None and now >= next_tick and (end is None or next_tick < end - 1e-3)


class _Parser(argparse.ArgumentParser):
    """argparse that raises UserError (one line, exit 2) instead of printing usage."""

    def error(self, message: str):
        raise UserError(f"{message} (see '{self.prog} --help')")


def add_attach_option(p: argparse.ArgumentParser) -> None:
    """--attach, shared by every command that loads the BPF programs."""
    default = os.environ.get("IOTRACE_ATTACH", "auto")
    p.add_argument("--attach", choices=("auto", "raw_tp", "tracepoint"), default=default,
                   help="how the BPF programs attach: raw_tp (raw tracepoints: a request is known by its "
                        "struct request, kernel structs are read at offsets from the kernel's BTF, and other BPF "
                        "tools running make the kernel skip nothing), tracepoint (perf-event tracepoints, for "
                        "kernels without BTF), or auto: raw_tp where /sys/kernel/btf/vmlinux has all it needs. "
                        "Default: $IOTRACE_ATTACH, else auto. Every dump says which ran (\"attach\")")


def trace_parser() -> argparse.ArgumentParser:
    from . import contract

    con = contract.load()   # defaults shown in --help come from the BPF contract
    p = _Parser(prog="iotrace", formatter_class=argparse.RawDescriptionHelpFormatter, epilog=EPILOG,
                usage="sudo iotrace [options] [interval [count]] [-- COMMAND [ARGS...]]\n"
                      "       iotrace report FILE.jsonl...\n"
                      "       iotrace --diskstats [-i SECONDS] [--dev DEV] [--pid PID]   (no root)",
                description="Block I/O latency per process and device, from in-kernel BPF histograms: "
                            "p50/p90/p99/p99.9 of each process's reads, writes, flushes and discards.")
    interval_count(p)
    p.add_argument("-p", "--pid", type=int, action="append", default=[], metavar="PID", dest="pids",
                   help="trace this process (and the children it forks from now on); repeatable. "
                        "Default: every process")
    p.add_argument("--no-children", action="store_true", help="with --pid or COMMAND: do not follow forks")
    p.add_argument("--threads", action="store_true", help="one row per thread instead of per process")
    p.add_argument("--dev", action="append", default=[], metavar="DEV", dest="devs",
                   help="trace only this disk (loop0, /dev/nvme0n1, 7:0); repeatable. Default: every device")
    p.add_argument("--cgroup", metavar="PATH",
                   help="trace only I/O submitted from this cgroup v2 or below it (a container, a systemd "
                        "unit): a path under the cgroup2 mount, or relative to it, e.g. /system.slice/x.scope")
    p.add_argument("-i", "--interval", type=_positive, metavar="SECONDS",
                   help="print (and dump) a report every SECONDS, histograms reset each time")
    p.add_argument("-d", "--duration", type=_duration, metavar="SECONDS",
                   help="stop after SECONDS (the disk is --dev, not -d as in biolatency)")
    p.add_argument("-o", "--output", metavar="FILE.jsonl", help="append one JSON line per report to FILE")
    p.add_argument("-j", "--json", action="store_true",
                   help="each report as one JSON line on stdout (as -o writes it), for jq or a notebook; no "
                        "table. A COMMAND's own stdout goes to stderr")
    p.add_argument("--hist", action="store_true", help="add a log2 latency bar chart per row")
    p.add_argument("--inflight-slots", type=int, metavar="N",
                   help="size of the in-kernel in-flight request table (power of two, default "
                        f"{con.const('INFLIGHT_SLOTS')}; raise it if the report shows inflight_full)")
    p.add_argument("--hist-cells", type=int, metavar="N",
                   help=f"per-CPU fast histogram cells (power of two, default {con.const('HIST_CELLS')}); "
                        "buckets that find no cell still count, in a slower hash map")
    add_attach_option(p)
    p.add_argument("--csv", metavar="FILE.csv", help="append a row per report, device and op: iostat -x's columns "
                   "(r/s, w/s, rkB/s, wkB/s, r_await, w_await, aqu-sz, %%util) from /proc/diskstats beside "
                   "iotrace's count, MB/s, p50 and p99")
    p.add_argument("--alert", action="append", default=[], metavar="RULE", dest="alerts",
                   help="warn on each report where RULE holds (repeatable): [DEV:][OP:][PHASE.]STAT>VALUE, e.g. "
                        "'p99>50ms', 'device.p99.9>=5ms', 'loop0:read:mean>2ms', or util>90%% (also r_await, "
                        "w_await, aqu-sz, from /proc/diskstats); recorded in the dump as \"alerts\"")
    p.add_argument("--fail-on-alert", action="store_true",
                   help="exit 3 if any alert fired (a COMMAND's own non-zero exit code wins)")
    p.add_argument("--tasks", action="store_true",
                   help="add per-process rows to every dump (\"tasks\"): I/O wait, bytes read from files (page "
                        "cache hits included) beside bytes read from disk, fsync and dirty-page throttling time. "
                        "Costs while on: ~100 ns on every system call on the machine (syscall tracepoints), "
                        "~0.5 us per traced file read, ~0.1 us per context switch")
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
    return TraceArgs(pids=ns.pids, no_children=ns.no_children, threads=ns.threads, devs=ns.devs,
                     interval=interval, duration=ns.duration, output=ns.output, hist=ns.hist,
                     inflight_slots=ns.inflight_slots, hist_cells=ns.hist_cells, cgroup=ns.cgroup, command=command,
                     csv=ns.csv, alerts=ns.alerts, fail_on_alert=ns.fail_on_alert, diskstats=ns.diskstats,
                     attach=ns.attach, count=ns.count, json=ns.json, tasks=ns.tasks)


# ---- command mode ------------------------------------------------------------

def _invoking_user() -> pwd.struct_passwd | None:
    """The user behind sudo, when we are root because of sudo."""
    uid = os.environ.get("SUDO_UID")
    if os.geteuid() != 0 or not uid:
        return None
    try:
        return pwd.getpwuid(int(uid))
    except (KeyError, ValueError):
        return None


def _spawn_held(command: list[str], env: dict[str, str] | None = None, stdout_to_stderr: bool = False
                ) -> tuple[int, int]:
    """Fork the command (with `env` added), held before exec until release() writes to the returned fd.

    `stdout_to_stderr`: the command writes its stdout to our stderr (-j keeps stdout JSON only).

    Holding it lets the tracer put the child's pid in the in-kernel filter
    before the command runs, so its very first I/O is traced.
    """
    if shutil.which(command[0]) is None:
        raise UserError(f"command not found: {command[0]}")
    user = _invoking_user()
    r, w = os.pipe()
    pid = os.fork()
    if pid:
        os.close(r)
        return pid, w
    # the child: no Python-level cleanup may run here, only exec or _exit
    try:
        os.close(w)
        for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGUSR1):
            signal.signal(sig, signal.SIG_DFL)
        if os.read(r, 1) != b"g":
            os._exit(125)   # the tracer gave up before releasing us
        os.close(r)
        if user:
            os.setgroups(os.getgrouplist(user.pw_name, user.pw_gid))
            os.setgid(user.pw_gid)
            os.setuid(user.pw_uid)
            os.environ.update(HOME=user.pw_dir, USER=user.pw_name, LOGNAME=user.pw_name)
        os.environ.update(env or {})
        if stdout_to_stderr:
            os.dup2(2, 1)
        os.execvp(command[0], command)
    except BaseException as exc:  # noqa: BLE001 - must never return into the tracer's code
        try:
            os.write(2, f"iotrace: cannot run {command[0]}: {exc}\n".encode())
        finally:
            os._exit(127)


def _exit_status(status: int) -> int:
    code = os.waitstatus_to_exitcode(status)
    return 128 - code if code < 0 else code


# ---- the trace loop ----------------------------------------------------------

class _Signals:
    """Signals turned into a readable fd, so one select() waits for everything."""

    HANDLED = (signal.SIGINT, signal.SIGTERM, signal.SIGUSR1)

    def __init__(self) -> None:
        self.r, self.w = os.pipe()
        os.set_blocking(self.r, False)
        os.set_blocking(self.w, False)
        self.pending: list[int] = []
        self._old_fd = signal.set_wakeup_fd(self.w, warn_on_full_buffer=False)
        self._old = {s: signal.signal(s, self._on_signal) for s in self.HANDLED}

    def _on_signal(self, signum, frame) -> None:
        self.pending.append(signum)

    def take(self) -> list[int]:
        try:
            while os.read(self.r, 512):
                pass
        except BlockingIOError:
            pass
        out, self.pending = self.pending, []
        return out

    def restore(self) -> None:
        for s, h in self._old.items():
            signal.signal(s, h)
        signal.set_wakeup_fd(self._old_fd)


def _open_output(path: str) -> TextIO:
    try:
        f = open(path, "a")  # noqa: SIM115 - lives as long as the trace
    except OSError as exc:
        raise UserError(f"cannot write {path}: {exc.strerror}") from None
    user = _invoking_user()
    if user:
        try:
            os.chown(path, user.pw_uid, user.pw_gid)
        except OSError:
            pass
    return f


def _check_pids(pids: list[int]) -> list[int]:
    fds = []
    for pid in pids:
        try:
            fds.append(os.pidfd_open(pid))
        except ProcessLookupError:
            raise UserError(f"--pid {pid}: no such process") from None
    return fds


# Rows kept in the whole-run summary before rows of the same command are folded together.
MAX_RUN_ROWS = 2000


class Session:
    """One tracing run: owns the probe, the output file and the report stream."""

    def __init__(self, args: TraceArgs, out: TextIO):
        self.args = args
        self.out = out
        self.file: TextIO | None = None
        self.dumps = 0
        # the whole run so far, merged as it goes: a long run keeps one dump, not all of them
        self.total = None
        self.extras = None      # tracer.iostat.TraceExtras: --csv rows and --alert checks per dump
        self.tasks = None       # tracer.tasks.TaskTracer: the per-process rows of every dump, when it loaded
        from .report import LabelWindows
        self.labels = LabelWindows()    # marker dumps per label, for the waits and verdicts at the end

    def drain(self, probe, final: bool = False):
        """Close the window on both BPF objects at once: (raw interval, task rows or None, their drops)."""
        raw = probe.drain(final=final)
        if self.tasks is None:
            return raw, None, None
        return raw, self.tasks.drain(final), self.tasks.dropped()

    def build(self, drained, clock, kind: str, label: str | None = None):
        from .aggregate import build_dump

        raw, tasks, dropped = drained
        return build_dump(raw, clock, kind, label=label, tasks=tasks, tasks_dropped=dropped)

    def emit(self, dump) -> None:
        from . import dump as dumpmod
        from .cgroups import resolve_containers
        from .report import render_table

        resolve_containers(dump)
        if self.extras:     # before the write: the dump's alerts go in its JSON line
            self.extras.on_dump(dump)
        if self.file:
            dumpmod.write(self.file, dump)
        if self.args.json:
            dumpmod.write(self.out, dump)
        else:
            render_table(dump, self.out, hist=self.args.hist)
            self.out.flush()
        self.dumps += 1
        self.labels.add(dump)
        self.total = dump if self.total is None else dumpmod.merge_dumps([self.total, dump])
        if len(self.total.series) > MAX_RUN_ROWS:
            # processes come and go on a long run: keep their sums, not a row per pid
            self.total.series = dumpmod.fold_by_comm(self.total.series)


def run_trace(args: TraceArgs, out: TextIO = sys.stdout) -> int:
    from . import cgroups, devices
    from .iostat import TraceExtras, offer_diskstats, run_diskstats
    from .marker import ENV_CONTROL

    if args.diskstats:
        return run_diskstats(args, out)
    devs = [devices.resolve(d) for d in args.devs]
    cgroup_id, cgroup_level = cgroups.resolve_cgroup(args.cgroup) if args.cgroup else (0, 0)
    pidfds = _check_pids(args.pids)
    extras = TraceExtras.from_args(args)
    file = _open_output(args.output) if args.output else None
    control, control_error = _open_control()
    try:
        env = {ENV_CONTROL: control.path} if control else None
        child, release = _spawn_held(args.command, env, args.json) if args.command else (None, None)
    except BaseException:
        if control:
            control.close()
        raise
    probe = None
    session = None
    # from here on, Ctrl-C and SIGTERM end the trace in order instead of raising
    sig = _Signals()
    try:
        from .aggregate import Clock
        from .probe import Probe, ProbeOptions
        from .report import render_table
        from .tasks import open_tracer

        opts = ProbeOptions(pids=list(args.pids) + ([child] if child else []), follow_children=not args.no_children,
                            per_thread=args.threads, devs=devs, inflight_slots=args.inflight_slots,
                            hist_cells=args.hist_cells, cgroup_id=cgroup_id, cgroup_level=cgroup_level,
                            attach=args.attach)
        try:
            probe = Probe(opts)
        except UserError as exc:
            raise offer_diskstats(exc) from None
        clock = Clock()
        session = Session(args, out)
        session.file = file
        session.tasks, tasks_note = open_tracer(opts.pids, opts.follow_children) if args.tasks else (None, "")
        session.extras = extras.start() if extras else None
        if child:
            pidfds.append(os.pidfd_open(child))
            try:
                os.write(release, b"g")
            except BrokenPipeError:
                pass    # the command died while held (Ctrl-C during start-up): the loop reaps it
            os.close(release)
            release = None
        what = (f"command {' '.join(args.command)!r} (pid {child})" if child else
                f"pid {', '.join(map(str, args.pids))}" if args.pids else "all processes")
        print(f"iotrace: tracing block I/O of {what}"
              f"{' on ' + ', '.join(args.devs) if args.devs else ''}; Ctrl-C to end", file=sys.stderr)
        if probe.attach_note:
            print(f"iotrace: attached to perf-event tracepoints, not raw ones: {probe.attach_note}", file=sys.stderr)
        if args.tasks and session.tasks is None:
            print(f"iotrace: warning: no per-process rows (\"tasks\") in the dumps: {tasks_note}", file=sys.stderr)
        print(f"iotrace: markers: 'iotrace mark LABEL' or tracer.marker.mark(LABEL) close a labelled dump "
              f"(control socket {control.path})" if control else
              f"iotrace: warning: no control socket, markers are off ({control_error})", file=sys.stderr)
        status = _loop(args, probe, clock, session, pidfds, child, sig, control)
        if control:     # markers sent just before the command exited are still queued
            _take_markers(control, probe, clock, session)
        final = session.build(session.drain(probe, final=True), clock, "final")
        final.extra["bpf_programs"] = probe.program_costs()
        if session.tasks:
            final.extra["bpf_programs"].update({f"tasks:{name}": cost
                                                for name, cost in session.tasks.program_costs().items()})
        if args.pids or args.command:    # the pid filter's size at the end: flat over a long run
            final.extra["traced_pids"] = len(probe.traced_pids())
        session.emit(final)
        if session.dumps > 1 and not args.json:
            render_table(session.total, out, title="whole run")
            session.labels.render(out)
        return extras.finish(status) if extras else status
    finally:
        sig.restore()
        if extras:
            extras.close()
        if release is not None and child:
            os.close(release)       # unblocks the held child: it exits 125
            os.waitpid(child, 0)
        if probe:
            probe.close()
        if session is not None and session.tasks:
            session.tasks.close()
        if file:
            file.close()
        if control:
            control.close()


def _open_control():
    """The control socket for markers, or (None, why not): tracing goes on without it."""
    from .control import ControlSocket

    try:
        return ControlSocket.open(owner=_invoking_user()), None
    except OSError as exc:
        return None, exc.strerror or str(exc)


def _take_markers(control, probe, clock, session: Session) -> None:
    """Each queued marker closes a dump carrying its label, printed and written at once."""
    for m in control.receive():
        drained = session.drain(probe)
        control.ack(m)      # the window is closed: the sender's next I/O falls in the next dump
        d = session.build(drained, clock, "marker", label=m.label)
        d.extra.update(m.dump_fields())
        session.emit(d)


def _loop(args: TraceArgs, probe, clock, session: Session, pidfds: list[int], child: int | None,
          sig: _Signals, control=None) -> int:
    start = time.monotonic()
    end = deadline(args, start)
    next_tick = start + args.interval if args.interval else None
    alive = set(pidfds)
    status = 0
    stopping = False
    while True:
        now = time.monotonic()
        wake = [t for t in (next_tick, end) if t is not None]
        timeout = max(0.0, min(wake) - now) if wake else None
        listen = [sig.r, *alive] + ([control.fileno()] if control else [])
        ready, _, _ = select.select(listen, [], [], 0 if sig.pending else timeout)
        for fd in ready:
            if fd in alive:
                alive.discard(fd)
        if control and control.fileno() in ready:   # before the exit checks: no marker may be left behind
            _take_markers(control, probe, clock, session)
        if child is not None:
            done, st = os.waitpid(child, os.WNOHANG)
            if done:
                status = _exit_status(st)
                return status
        for s in sig.take():
            if s == signal.SIGUSR1:   # dump now, as an interval
                session.emit(session.build(session.drain(probe), clock, "interval"))
                continue
            if child is None or stopping:
                return status
            # the command decides when we end: let it finish, a second signal ends us
            stopping = True
            if s == signal.SIGTERM:
                os.kill(child, signal.SIGTERM)
        if pidfds and child is None and not alive:
            return status       # every --pid target has exited
        now = time.monotonic()
        if interval_due(now, next_tick, end):
            session.emit(session.build(session.drain(probe), clock, "interval"))
            next_tick += args.interval
            while next_tick <= now:  # fell behind (suspended?): skip, do not burst
                next_tick += args.interval
        if end is not None and now >= end:
            if child is not None:
                os.kill(child, signal.SIGTERM)
                status = _exit_status(os.waitpid(child, 0)[1])
            return status


# ---- iotrace report ----------------------------------------------------------

REPORT_EPILOG = """\
examples:
  iotrace report run.jsonl                  the whole run: every dump merged
  iotrace report run.jsonl --by label       epochs side by side: count, MB, p50, p99 per label
  iotrace report --follow run.jsonl         each dump as the tracer appends it (tail -f), until Ctrl-C
  iotrace report run.jsonl --json | jq .    the merged dump as one JSON line (--by label: one per window)

With --by label, dumps that share a label are merged into one window, shown
in the order the labels first appear; rows are process name + device + op
(kworker/* gathers the kernel's writeback workers), so a row lines up across
windows even when the process behind it was restarted.  Dumps without a label
(the final stretch after the last marker, interval dumps) are one window,
"(unlabelled)", shown last, or left out with a note when they saw no I/O.

A file whose last line is cut short (the tracer is still writing it, or was
killed mid-write) is read up to it, with a warning; a bad line anywhere else
is an error naming it.
"""


def run_report(argv: list[str], out: TextIO = sys.stdout) -> int:
    from . import dump as dumpmod
    from .report import render_by_label, render_table, windows_by_label

    p = _Parser(prog="iotrace report", formatter_class=argparse.RawDescriptionHelpFormatter,
                description="Render saved iotrace dumps as one table, merging every "
                "dump of every file through their HdrHistograms.", epilog=REPORT_EPILOG)
    p.add_argument("files", nargs="+", metavar="FILE.jsonl")
    p.add_argument("--hist", action="store_true", help="add a log2 latency bar chart per row")
    p.add_argument("--by", choices=("none", "label"), default="none",
                   help="label: one window per dump label (epoch 1, epoch 2, ...), side by side")
    p.add_argument("--layout", choices=("auto", "wide", "long"), default="auto",
                   help="with --by label: wide = a column group per label, long = a line per label; "
                        "auto = wide while it fits in 120 columns")
    p.add_argument("--per-pid", action="store_true",
                   help="with --by label: a row per pid instead of per process name")
    p.add_argument("-f", "--follow", action="store_true",
                   help="render each dump as it is appended to FILE (tail -f), until Ctrl-C")
    p.add_argument("-j", "--json", action="store_true",
                   help="JSON lines instead of tables, in the dump format: the merged dump, one per window "
                        "with --by label, each dump with --follow")
    ns = p.parse_args(argv)
    if ns.by == "label" and ns.hist:
        raise UserError("--hist goes with the merged table, not with --by label")
    if ns.follow:
        if len(ns.files) > 1 or ns.by == "label":
            raise UserError("--follow takes one file, and renders each dump (no --by label)")
        return _follow(ns.files[0], out, ns.hist, ns.json)
    dumps = [d for path in ns.files for d in dumpmod.read(path)]
    if not dumps:
        raise UserError(f"no dumps in {', '.join(ns.files)}")
    if ns.by == "label":
        if ns.json:
            for w in windows_by_label(dumps):
                dumpmod.write(out, w.merged)
            return 0
        render_by_label(dumps, out, layout=ns.layout, per_pid=ns.per_pid,
                        title=f"by label, from {', '.join(ns.files)}")
        return 0
    merged = dumpmod.merge_dumps(dumps)
    if ns.json:
        dumpmod.write(out, merged)
        return 0
    render_table(merged, out, hist=ns.hist, title=f"{len(dumps)} dump(s) from {', '.join(ns.files)}")
    return 0


def _follow(path: str, out: TextIO, hist: bool, as_json: bool) -> int:
    """Each dump of `path` as it is appended, until SIGINT or SIGTERM (exit 0)."""
    from . import dump as dumpmod
    from .report import render_table

    sig = _Signals()

    def stop(wait: float) -> bool:
        select.select([sig.r], [], [], 0 if sig.pending else wait)
        return any(s != signal.SIGUSR1 for s in sig.take())

    try:
        for d in dumpmod.read(path, follow=stop):
            if as_json:
                dumpmod.write(out, d)
            else:
                render_table(d, out, hist=hist)
                out.flush()
    finally:
        sig.restore()
    return 0


def _subcommand(name: str):
    import importlib

    module, func = SUBCOMMANDS[name].split(":")
    return getattr(importlib.import_module(module), func)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    try:
        if argv and argv[0] in SUBCOMMANDS:
            return _subcommand(argv[0])(argv[1:], sys.stdout)
        return run_trace(parse_trace_args(argv))
    except UserError as exc:
        print(f"iotrace: {exc}", file=sys.stderr)
        return exc.exit_code
    except BrokenPipeError:
        # reader went away (iotrace ... | head): not an error worth a traceback
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 1
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
