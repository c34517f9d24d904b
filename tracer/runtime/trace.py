"""Trace mode's session, `sudo iotrace [options] [-- COMMAND]`, and `iotrace --diskstats`'s, run.

Owns what a trace run does between its typed options (TraceOptions, filled
from argv by tracer.cli.trace) and its exit status: the options resolved in
one order (a refused environment, --dev, --cgroup, --pid, --alert: each a
one-line UserError before anything starts), the COMMAND held before exec
and its process tree, the control socket for markers, the pidfds the loop
waits on, the start lines on stderr, and the wait for the targets'
write-back at exit.  What every live mode opens and closes (the sinks, the
probe, the per-process tracer, the signal handlers) is the LiveRun's
(tracer.runtime.session), which this drives.
"""

from __future__ import annotations

import os
import sys
import types
from dataclasses import dataclass, field
from typing import Any, TextIO

from tracer.runtime.loop import Schedule
from tracer.runtime.session import LiveRun, alert_check, offer_diskstats
from tracer.text import safe


@dataclass
class TraceOptions:
    """Trace mode's options, typed: each field is the option of its name (tracer.cli.trace fills them from
    its parser by name, so an option of the mode's own is one field here).  `options` is every option, the
    sinks' included: each sink reads its own there (tracer.sinks), whatever module declared it."""

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
    stamps: str = "own"                                     # whose clock readings the times are (--stamps)
    tasks: bool = False                                     # --tasks: per-process rows' reads, fsyncs at the syscalls
    no_tasks: bool = False                                  # --no-tasks: no per-process rows (tracer.sources.tasks)
    files: int = 50                                         # --files: file rows kept per dump (the rest summed)
    count: int | None = None                                # reports to make, the final one included
    json: bool = False                                      # -j: dumps as JSON lines on stdout, no table
    wb_wait: float = 30.0                                   # --wb-wait: seconds for the targets' write-back at exit
    bio: bool = False                                       # --bio: each I/O also timed as submitted (a bio)
    options: Any = field(default_factory=types.SimpleNamespace)    # every option, the sinks' included


def run(opts: TraceOptions, out: TextIO = sys.stdout) -> int:
    """Trace (or, with --diskstats, sample /proc) until the run ends; its exit status."""
    if opts.diskstats:
        return run_diskstats(opts, out)
    return TraceSession(opts, out).run()


class TraceSession:
    """One trace run: the options resolved when it is made (a bad one fails before anything opens), then
    run() traces until the command or the --pid targets exit, -d or count is reached, or Ctrl-C."""

    def __init__(self, opts: TraceOptions, out: TextIO = sys.stdout):
        from tracer.runtime import child as childmod
        from tracer.sources import cgroups, devices

        self.opts, self.out = opts, out
        cgroups.env_root()      # refused under sudo: before anything starts, not at the first dump
        self.devs = devices.device_filter(opts.devs)    # the probe's map, the sinks and the alerts all take this one
        self.cgroup_id, self.cgroup_level = cgroups.resolve_cgroup(opts.cgroup) if opts.cgroup else (0, 0)
        self.pidfds = childmod.check_pids(opts.pids)
        self.alerts = alert_check(opts, devices=self.devs)
        self.control = None
        self.control_error: str | None = None
        self.child: int | None = None
        self.tree = None            # the command's process tree (tracer.runtime.cmdtree.CommandTree)
        self.held: list[int] = []   # the held child's release fd, until it is let go

    def run(self) -> int:
        from tracer.runtime import child as childmod
        from tracer.sources import cgroups

        o = self.opts
        live = LiveRun("trace", o.options, self.out, self.devs, self.alerts)
        with live:
            live.open_sinks()
            # a traced COMMAND is told the socket's path before it runs (it is held until the probe is ready);
            # otherwise the socket is bound once the probe is attached: a marker sent while the programs still
            # compile would be taken only when the loop starts, seconds late, and close the wrong stretch
            if o.command:
                self._open_control(live)
                self._hold_command(live)
            # from here on, Ctrl-C and SIGTERM end the trace in order instead of raising
            live.catch_signals()
            probe_opts = self._probe_options()
            probe = live.open_probe(probe_opts, on_error=offer_diskstats)
            tasks, tasks_note = ((None, "") if o.no_tasks else
                                 live.open_tasks(probe_opts.pids, probe_opts.follow_children, syscall_hooks=o.tasks))
            # after both filters are armed: what the --pid targets forked before the attach joins them
            attached = live.attach_existing(o.pids, not o.no_children) if o.pids else None
            if not o.command:
                self._open_control(live)
            if self.control:    # whose markers it takes: with --pid or a COMMAND, its traced tree's (runtime.control)
                from tracer.runtime.control import SenderGate

                self.control.gate = SenderGate(probe.traced_pids if probe_opts.pids else None)
            if self.child:
                self.pidfds.append(os.pidfd_open(self.child))
                childmod.release(self.held.pop())
            announce(o, self.child, probe, self.control, self.control_error, attached)
            if self.tree is not None and self.tree.note:
                print(f"iotrace: warning: {safe(self.tree.note)}", file=sys.stderr)
            _announce_tasks(o, tasks, tasks_note)
            from tracer.pipeline.windows import unavailable

            print_unavailable(unavailable(probe.unavailable, tasks.sources if tasks is not None else None))
            # attached: the traced processes ran before the trace (--pid, or every process), unlike a COMMAND
            windows = live.dump_windows(traced=bool(o.pids or o.command), iostat=bool(o.csv),
                                        attached=not o.command,
                                        cgroup=cgroups.cgroup_path(o.cgroup) if o.cgroup else None)
            after_exit = _writeback_wait(o, probe) if o.pids or o.command else None
            live.loop(windows, Schedule(o.interval, o.duration, o.count), child=self.child, tree=self.tree,
                      pidfds=self.pidfds, control=self.control, after_exit=after_exit)
            if after_exit is not None and after_exit.line:
                print(after_exit.line, file=sys.stderr)
        # leaving `with` closed everything in order (tracer.runtime.session): the outputs, the command, the
        # programs, the per-process tracer, the control socket, and last the signal handlers
        return live.status

    def _open_control(self, live: LiveRun) -> None:
        self.control, self.control_error = open_control(self.opts.pids)
        live.control = self.control

    def _hold_command(self, live: LiveRun) -> None:
        """The COMMAND forked and held before exec, told the control socket's path; ended with the run."""
        from tracer.marker import ENV_CONTROL
        from tracer.runtime import child as childmod
        from tracer.runtime.cmdtree import CommandTree

        env = {ENV_CONTROL: self.control.path} if self.control else None
        self.child, release = childmod.spawn_held(self.opts.command, env, self.opts.json)
        self.held.append(release)
        live.end_command = self._end_command    # before the tree: a failure to open it still ends the child
        # held, it has forked nothing yet: all it will start is in its tree (a cgroup of its own)
        self.tree = CommandTree.open(self.child)

    def _end_command(self) -> None:
        from tracer.runtime import child as childmod

        if self.held:
            os.close(self.held.pop())   # unblocks the held child: it exits 125
        try:
            if self.tree is not None:   # all it started: SIGTERM, SIGKILL after a grace; its cgroup removed
                self.tree.end(childmod.KILL_GRACE_S)
        finally:
            childmod.end(self.child)    # a no-op once the loop reaped it; else SIGTERM, then SIGKILL

    def _probe_options(self):
        from tracer.sources.probe import ProbeOptions

        o = self.opts
        return ProbeOptions(pids=list(o.pids) + ([self.child] if self.child else []),
                            follow_children=not o.no_children, per_thread=o.threads, devs=self.devs,
                            inflight_slots=o.inflight_slots, hist_cells=o.hist_cells, cgroup_id=self.cgroup_id,
                            cgroup_level=self.cgroup_level, attach=o.attach, files=True,
                            files_top=max(o.files, 0), submitted=o.bio, stamps=o.stamps)


def _writeback_wait(opts: TraceOptions, probe):
    """The wait for the traced processes' write-back once they have exited (tracer.runtime.wbwait)."""
    from tracer.runtime.wbwait import WritebackWait
    from tracer.sources.meminfo import machine_unwritten_bytes

    return WritebackWait(probe.owed_bytes, opts.wb_wait, machine_unwritten_bytes,
                         say=lambda line: print(line, file=sys.stderr))


def announce(opts: TraceOptions, child: int | None, probe, control, control_error: str | None,
             attached=None) -> None:
    """The start lines on stderr: what is traced, how the programs attached, where markers go."""
    from tracer.sources.proctree import describe

    what = (f"command {' '.join(opts.command)!r} (pid {child})" if child else
            describe(attached) if attached else "all processes" if not opts.cgroup else "")
    # --cgroup filters whoever runs: the processes of that cgroup (and below it), or those of the targets there
    if opts.cgroup:
        what += f"{' in ' if what else 'the processes of '}cgroup {opts.cgroup} (and below it)"
    # the command, devices and paths as given: shown through safe(), as every name
    print(safe(f"iotrace: tracing block I/O of {what}"
               f"{' on ' + ', '.join(opts.devs) if opts.devs else ''}; Ctrl-C to end"), file=sys.stderr)
    if probe.attach_note:
        print(f"iotrace: attached to perf-event tracepoints, not raw ones: {safe(probe.attach_note)}",
              file=sys.stderr)
    if probe.start_note:
        print(f"iotrace: {probe.start_note}", file=sys.stderr)
    if probe.stamps_note:
        print(f"iotrace: {probe.stamps_note}", file=sys.stderr)
    if probe.bio_note:
        print(f"iotrace: {probe.bio_note}", file=sys.stderr)
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


def _announce_tasks(opts: TraceOptions, tasks, note: str) -> None:
    """What the per-process rows are made of, when it is not what was asked for (a warning each; the sources
    the kernel lacks are in the start line of what is unavailable)."""
    if opts.no_tasks:
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

def run_diskstats(opts: TraceOptions, out: TextIO = sys.stdout) -> int:
    """`iotrace --diskstats`: iostat's numbers per device and bytes per process, every -i, until -d or Ctrl-C.
    Its options were checked against what needs BPF already (tracer.cli.trace)."""
    from tracer.pipeline.windows import DiskWindows
    from tracer.runtime.child import check_pids
    from tracer.sources.devices import device_filter
    from tracer.sources.diskstats import DiskSampler, ProcSampler
    from tracer.views.diskstats import NO_PERCENTILES

    devs = device_filter(opts.devs)
    names = devs.name_list
    alerts = alert_check(opts, bpf=False, devices=devs)
    pidfds = check_pids(opts.pids)
    windows = DiskWindows(DiskSampler(names), ProcSampler(opts.pids, children=not opts.no_children),
                          every_device=names is not None, alerts=alerts)
    from tracer.sources import proctree

    live = LiveRun("diskstats", opts.options, out, devs, alerts)
    with live:
        live.open_sinks(whole=windows.whole)
        who = f", {proctree.describe(proctree.snapshot(opts.pids, not opts.no_children))}" if opts.pids else ""
        print(safe(f"iotrace: --diskstats: {'devices ' + ', '.join(names) if names else 'every disk'}"
                   f"{who}; {NO_PERCENTILES}; Ctrl-C to end"), file=sys.stderr)
        if os.geteuid() != 0:
            print("iotrace: not root: /proc/PID/io shows only your own processes", file=sys.stderr)
        live.catch_signals()
        live.loop(windows, Schedule(opts.interval, opts.duration, opts.count), pidfds=pidfds)
        live.status = 0     # the status is the outputs' (no command here)
    return live.status
