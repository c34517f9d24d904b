"""One way to open a live run, for every live mode (trace, serve, top, --diskstats).

A mode builds a LiveRun from its parsed options and opens what it needs
through it, in its own order (serve binds its port before the programs
compile, top loads them before curses takes the terminal):

    run = LiveRun("serve", ns, out, devices, alerts)
    with run:
        run.open_sinks()                    # every sink of the registry (tracer.sinks) for these options
        run.catch_signals()
        run.open_probe(ProbeOptions(...))   # the BPF programs; run.open_tasks(...) the per-process tracer
        run.attached()                      # sinks that wait for the sources are told
        run.loop(run.dump_windows(), Schedule(...))
    return run.status

The loop is tracer.runtime.loop.Live, its inputs gathered from the sinks;
at the end every sink hears why the loop ended, and leaving the `with`
closes everything opened in one order, each step run whatever the others
do (tracer.runtime.teardown): the outputs (whose close may change the exit
status), the traced command, the BPF programs, the per-process tracer, the
control socket, the signal handlers.

Sinks may have, beside on_dump and close (tracer.sinks), these optional hooks:
    attached()         the sources are attached (serve: ready, iotrace_attached 1)
    inputs() -> {fd: callback}   file descriptors the loop watches for them (top: the keys);
                       a callback returning True ends the run
    on_end(reason)     the loop ended normally ("deadline", "signal", "command", "key", ...)

Also the checks the live modes share before they open anything: their --alert
rules against the disks they watch (alert_check), and a probe error reworded
to offer --diskstats where BPF cannot run (offer_diskstats).
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TextIO

from tracer import sinks as sinkreg
from tracer.errors import UserError
from tracer.runtime.loop import Live, Schedule, Sinks
from tracer.runtime.teardown import run_steps

if TYPE_CHECKING:
    from tracer.sources.devices import DeviceFilter


class LiveRun:
    """What one live run opened (see the module docstring); `status` is its exit status once closed."""

    def __init__(self, mode: str, ns: Any, out: TextIO = sys.stdout, devices: DeviceFilter | None = None,
                 alerts: Any = None):
        if mode not in sinkreg.MODES:
            raise ValueError(f"no live mode {mode!r} (modes: {', '.join(sinkreg.MODES)})")
        self.mode, self.ns, self.out = mode, ns, out
        # --dev, resolved once by the mode (the probe got its dev_t's): the sinks and windows get its names
        self.devices = devices.name_list if devices is not None else None
        self.alerts = alerts        # the pipeline's AlertCheck, or None
        self.outputs: Sinks | None = None
        self.probe = None
        self.tasks = None
        self.control = None
        self.sig = None
        self.end_command: Callable[[], None] | None = None     # the traced command's ending (trace mode)
        self.live: Live | None = None
        self.status = 0
        self._outputs_closed = False

    # ---- opening, in the mode's order --------------------------------------------------

    def open_sinks(self, whole: Callable[[], Any] | None = None, extra: dict | None = None) -> Sinks:
        """Every sink these options ask for (files opened, ports bound here: a bad one fails first)."""
        ctx = sinkreg.Context(self.mode, self.out, self.devices, self.alerts, whole=whole, extra=extra)
        self.outputs = Sinks(sinkreg.from_args(self.ns, ctx))
        return self.outputs

    def catch_signals(self):
        """Ctrl-C and SIGTERM end the run in order from here on, instead of raising."""
        from tracer.runtime.signals import Signals

        self.sig = Signals()
        return self.sig

    def open_probe(self, opts, on_error: Callable[[UserError], UserError] | None = None):
        """The BPF programs (tracer.sources.probe.Probe) for `opts`; `on_error` may reword a failure."""
        from tracer.sources.probe import Probe

        try:
            self.probe = Probe(opts)
        except UserError as exc:
            if on_error is None:
                raise
            raise on_error(exc) from None
        return self.probe

    def open_tasks(self, pids: list[int], follow: bool, required: bool = False, syscall_hooks: bool = False):
        """The per-process tracer, or (None, why not) when it cannot load and is not `required`;
        `syscall_hooks` (--tasks): reads and fsyncs timed at the syscalls (tracer.sources.tasks)."""
        from tracer.sources.tasks import open_tracer

        self.tasks, why = open_tracer(pids, follow, syscall_hooks)
        if self.tasks is None and required:
            raise UserError(f"--tasks: {why}")
        return self.tasks, why

    def attach_existing(self, pids: list[int], follow: bool):
        """The --pid targets' existing descendants added to each BPF filter armed so far (proctree)."""
        from tracer.sources import proctree

        found = proctree.attach_tree(pids, self.probe.add_pid, self.probe.traced_pids, follow=follow)
        if self.tasks is not None:      # its own filter, armed later than the probe's: its own walk
            proctree.attach_tree(pids, self.tasks.add_pid, self.tasks.traced_pids, follow=follow)
        if not found.settled:
            print(f"iotrace: warning: the process tree under pid {', '.join(map(str, pids))} kept changing "
                  f"through {found.rounds} reads of /proc: processes it forked while we read may be missed",
                  file=sys.stderr)
        self.begin_window()
        return found

    def begin_window(self) -> None:
        """The first window begins now: what the sources recorded so far is let go, and the next drain's
        start (its time, its /proc/diskstats baseline) is now.  Called once the filters hold the whole tree:
        until then the workers' requests were counted by the disk but not yet recorded, and the first
        window's coverage fell short by them (the requests of the ~0.1-1 s the walk and the per-process
        tracer's load took)."""
        if self.tasks is not None:      # in the pipeline's order (tracer.pipeline.windows.DumpWindows.cut)
            self.tasks.drain(False)
            self.tasks.dropped()
        if self.probe is not None:
            self.probe.drain()

    def dump_windows(self, **kw):
        """The BPF pipeline (tracer.pipeline.windows.DumpWindows) over what was opened."""
        from tracer.pipeline.windows import DumpWindows

        return DumpWindows(self.probe, self.tasks, self.alerts, devices=self.devices, **kw)

    def attached(self) -> None:
        """Tell the sinks that wait for it that the sources are attached."""
        for s in self._sinks():
            hook = getattr(s, "attached", None)
            if hook is not None:
                hook()

    # ---- the loop ------------------------------------------------------------------------

    def loop(self, windows, schedule: Schedule, **live_kw) -> int:
        """Run the live loop until it ends; the sinks' inputs join `live_kw`'s.  The run's status."""
        if self.outputs is None:
            raise RuntimeError("open_sinks() first")
        inputs = dict(live_kw.pop("inputs", {}))
        for s in self._sinks():
            hook = getattr(s, "inputs", None)
            if hook is not None:
                inputs.update(hook())
        self.live = Live(windows, self.outputs, schedule, self.sig, inputs=inputs, **live_kw)
        self.status = self.live.run()
        for s in self._sinks():
            hook = getattr(s, "on_end", None)
            if hook is not None:
                hook(self.reason)
        return self.status

    @property
    def reason(self) -> str | None:
        """Why the loop ended, None if it did not run to its end."""
        return getattr(self.live, "reason", None) or None

    # ---- closing -------------------------------------------------------------------------

    def close_outputs(self) -> int:
        """Every sink closed (once), which may change the exit status; never raises."""
        if self.outputs is not None and not self._outputs_closed:
            self._outputs_closed = True
            self.status = self.outputs.close(self.status)
        return self.status

    def close(self) -> int:
        """Everything opened, closed in order; each step runs whatever the others do."""
        probe, tasks = self.probe, self.tasks
        run_steps(("writing the outputs", self.close_outputs),
                  ("ending the traced command", self.end_command),
                  ("detaching the BPF programs", probe.close if probe else None),
                  ("detaching the per-process tracer", tasks.close if tasks else None),
                  ("removing the control socket", self.control.close if self.control else None),
                  ("restoring the signal handlers", self.sig.restore if self.sig else None))
        return self.status

    def __enter__(self) -> LiveRun:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _sinks(self) -> list:
        return list(self.outputs.sinks) if self.outputs is not None else []


# ---- what the live modes check and say before they trace --------------------------------

def alert_check(ns, bpf: bool = True, devices: DeviceFilter | None = None):
    """The pipeline's --alert stage for these options, or None; bad rules fail here, before tracing.

    `devices`: the disks the run watches (--dev), None or empty for every disk.  A rule scoped to a disk
    that is not one of them (or not a disk at all) could never fire, so it is refused.
    """
    from tracer.pipeline import alerts as alertmod
    from tracer.sources.devices import whole_disks

    traced = devices.name_list if devices is not None else None
    alerts = getattr(ns, "alerts", [])
    if getattr(ns, "fail_on_alert", False) and not alerts:
        example = "'p99>50ms'" if bpf else "'util>90%'"
        raise UserError(f"--fail-on-alert needs at least one --alert RULE, e.g. --alert {example}")
    rules = alertmod.parse_rules(alerts)
    if not bpf:
        for r in rules:
            if r.needs_bpf:
                raise UserError(f"--alert {r.text!r}: latency percentiles need BPF; with --diskstats alerts can "
                                f"use {', '.join(alertmod.DISK_METRICS)}")
    scoped = [r for r in rules if r.device is not None]
    disks = sorted(whole_disks()) if scoped else []
    for r in scoped:
        if r.device not in disks:
            raise UserError(f"--alert {r.text!r}: no disk {r.device!r}, so it could never fire; "
                            f"disks: {', '.join(disks) or 'none'}")
        if traced is not None and r.device not in traced:
            raise UserError(f"--alert {r.text!r}: {r.device} is not traced (--dev {' --dev '.join(traced)}), "
                            f"so it could never fire: add --dev {r.device}")
    return alertmod.AlertCheck(rules) if rules else None


def offer_diskstats(exc: UserError) -> UserError:
    """A Probe error, with the unprivileged mode offered when it says BPF cannot be used here."""
    message = str(exc)
    if message.startswith("--"):        # an option's value: the user fixes that, BPF may be fine
        return exc
    return UserError(f"{message}; without BPF, 'iotrace --diskstats' shows iostat's numbers per device and "
                     f"bytes per process from /proc (no percentiles, no root needed)", exc.exit_code)
