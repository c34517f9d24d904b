"""iostat's numbers, from /proc, beside or instead of BPF.

This module owns
* IostatRow: the `iostat -x` columns of one device over one window (r/s, w/s,
  rkB/s, wkB/s, r_await, w_await, aqu-sz, %util), from two /proc/diskstats
  snapshots taken by a DiskSampler;
* ProcSampler: block-layer bytes read and written per process, from
  /proc/PID/io (a non-root user can read it only for its own processes);
* the trace mode's per-dump work: `--csv` rows (CsvLog) and `--alert`
  checks, both on the dump's window (TraceExtras, called from Session.emit);
* `iotrace --diskstats` (run_diskstats), the mode that needs neither root
  nor BPF, and the notice offering it when BPF cannot be used.

Rates follow iostat: per second of the window; awaits are the mean
milliseconds per completed request; aqu-sz the mean queue length; %util the
share of the window the device had a request in flight.
"""

from __future__ import annotations

import csv
import json
import os
import platform
import select
import signal
import socket
import sys
import time
from dataclasses import dataclass, fields
from datetime import datetime
from typing import TextIO

from tracer import contract
from tracer.errors import UserError
from tracer.pipeline import alerts as alertmod
from tracer.sources.devices import DiskStats, read_diskstats, whole_disks

DISKSTATS = "/proc/diskstats"
PROC = "/proc"
SECTOR = contract.load().sector_size
# --fail-on-alert's exit code: apart from 1 (a failed command, usually) and 2 (bad input)
ALERT_EXIT = 3
NO_PERCENTILES = ("from /proc/diskstats and /proc/PID/io, no BPF: no percentiles and no per-process latency; "
                  "await is the mean per request")


@dataclass(frozen=True)
class IostatRow:
    """One device over one window: /proc/diskstats deltas and the iostat -x columns made from them."""

    device: str
    seconds: float
    reads: int = 0
    writes: int = 0
    read_sectors: int = 0
    write_sectors: int = 0
    read_ms: int = 0
    write_ms: int = 0
    io_ms: int = 0
    weighted_ms: int = 0
    discards: int = 0
    flushes: int = 0

    def _rate(self, n: float) -> float:
        return n / self.seconds if self.seconds > 0 else 0.0

    @property
    def r_s(self) -> float:
        return self._rate(self.reads)

    @property
    def w_s(self) -> float:
        return self._rate(self.writes)

    @property
    def rkb_s(self) -> float:
        return self._rate(self.read_sectors * SECTOR / 1024)

    @property
    def wkb_s(self) -> float:
        return self._rate(self.write_sectors * SECTOR / 1024)

    @property
    def r_await(self) -> float:
        return self.read_ms / self.reads if self.reads else 0.0

    @property
    def w_await(self) -> float:
        return self.write_ms / self.writes if self.writes else 0.0

    @property
    def aqu_sz(self) -> float:
        return self._rate(self.weighted_ms / 1e3)

    @property
    def util(self) -> float:
        # io_ms and the window come from different clocks: cap as iostat does
        return min(100.0, self._rate(self.io_ms / 1e3) * 100)

    @property
    def active(self) -> bool:
        return bool(self.reads or self.writes or self.discards or self.flushes or self.io_ms)

    def columns(self) -> dict[str, float]:
        """iostat -x's columns, by iostat's names."""
        return {"r/s": self.r_s, "w/s": self.w_s, "rkB/s": self.rkb_s, "wkB/s": self.wkb_s,
                "r_await": self.r_await, "w_await": self.w_await, "aqu-sz": self.aqu_sz, "%util": self.util}


IOSTAT_COLUMNS = ("r/s", "w/s", "rkB/s", "wkB/s", "r_await", "w_await", "aqu-sz", "%util")
_COUNTERS = [f.name for f in fields(IostatRow) if f.name not in ("device", "seconds")]
_ZERO = DiskStats(*(0 for _ in fields(DiskStats)))


def window(device: str, before: DiskStats | None, after: DiskStats, seconds: float) -> IostatRow:
    """The row of `device` between two snapshots; None before = the device appeared meanwhile (counts from 0)."""
    before = before or _ZERO
    delta = {name: getattr(after, name) - getattr(before, name) for name in _COUNTERS}
    if any(v < 0 for v in delta.values()):
        # the counters went back: the device was detached and attached anew; all it did is since then
        delta = {name: getattr(after, name) for name in _COUNTERS}
    return IostatRow(device, seconds, **delta)


class DiskSampler:
    """Windows of /proc/diskstats: each sample() gives every device's row since the previous one."""

    def __init__(self, devices: list[str] | None = None, path: str = DISKSTATS):
        self.devices = devices      # None: every whole disk
        self.path = path
        self.first = self.last = self._snapshot()

    def _snapshot(self) -> tuple[float, dict[str, DiskStats]]:
        t = time.monotonic()
        stats = read_diskstats(self.path)
        names = self.devices if self.devices is not None else [n for n in whole_disks() if n in stats]
        return t, {n: stats[n] for n in names if n in stats}

    @staticmethod
    def _rows(a, b) -> list[IostatRow]:
        seconds = b[0] - a[0]
        return [window(name, a[1].get(name), st, seconds) for name, st in b[1].items()]

    def sample(self) -> list[IostatRow]:
        now = self._snapshot()
        rows = self._rows(self.last, now)
        self.last = now
        return rows

    def whole(self) -> list[IostatRow]:
        """Every device's row from the first snapshot to the last sample."""
        return self._rows(self.first, self.last)


# ---- per process: /proc/PID/io -----------------------------------------------

@dataclass(frozen=True)
class ProcIO:
    """Bytes a process made the block layer read and write in a window (/proc/PID/io read_bytes, write_bytes).

    write_bytes counts pages when they are dirtied, not when writeback writes them.
    """

    pid: int
    comm: str
    read_bytes: int
    write_bytes: int


def _proc_stat(proc: str, pid: str) -> tuple[str, int, int]:
    """(comm, ppid, start time in ticks) of a process."""
    with open(f"{proc}/{pid}/stat") as f:
        text = f.read()
    close = text.rfind(")")
    rest = text[close + 2:].split()
    return text[text.index("(") + 1:close], int(rest[1]), int(rest[19])


def _proc_io(proc: str, pid: str) -> tuple[int, int]:
    vals = {}
    with open(f"{proc}/{pid}/io") as f:
        for line in f:
            k, _, v = line.partition(":")
            vals[k] = int(v)
    return vals["read_bytes"], vals["write_bytes"]


class ProcSampler:
    """Per-process block bytes between samples; with `pids`, only those and (with `children`) their descendants.

    Processes are told apart by pid and start time, so a reused pid is a new
    process.  One that exits between two samples loses what it did since the
    earlier one: /proc forgets it.
    """

    def __init__(self, pids: list[int] | None = None, children: bool = True, proc: str = PROC):
        self.pids = set(pids or ())
        self.children = children
        self.proc = proc
        self.unreadable = 0         # processes of the last sample whose io we may not read
        self.totals: dict[tuple[int, int], ProcIO] = {}
        self._last, _ = self._snapshot()

    def _snapshot(self) -> tuple[dict[tuple[int, int], tuple[str, int, int]], dict[int, int]]:
        procs, parents, unreadable = {}, {}, 0
        for name in os.listdir(self.proc):
            if not name.isdigit():
                continue
            try:
                comm, ppid, start = _proc_stat(self.proc, name)
                parents[int(name)] = ppid
                rb, wb = _proc_io(self.proc, name)
            except PermissionError:
                unreadable += 1     # another user's process (only root may read its io)
                continue
            except (OSError, ValueError, KeyError, IndexError):
                continue            # exited while we looked
            procs[(int(name), start)] = (comm, rb, wb)
        self.unreadable = unreadable
        return procs, parents

    def _wanted(self, pid: int, parents: dict[int, int]) -> bool:
        if not self.pids:
            return True
        seen = set()
        while pid not in seen:
            if pid in self.pids:
                return True
            if not self.children:
                return False
            seen.add(pid)
            pid = parents.get(pid, 0)
        return False

    def sample(self) -> list[ProcIO]:
        """Processes that did block I/O since the previous sample, most bytes first."""
        now, parents = self._snapshot()
        out = []
        for key, (comm, rb, wb) in now.items():
            # not seen before: started since the last sample, so its counters began at 0
            _, rb0, wb0 = self._last.get(key, ("", 0, 0))
            if (rb - rb0 or wb - wb0) and self._wanted(key[0], parents):
                io = ProcIO(key[0], comm, max(rb - rb0, 0), max(wb - wb0, 0))
                out.append(io)
                t = self.totals.get(key)
                self.totals[key] = io if t is None else ProcIO(io.pid, comm, t.read_bytes + io.read_bytes,
                                                               t.write_bytes + io.write_bytes)
        self._last = now
        return sorted(out, key=lambda p: (-(p.read_bytes + p.write_bytes), p.pid))

    def whole(self) -> list[ProcIO]:
        return sorted(self.totals.values(), key=lambda p: (-(p.read_bytes + p.write_bytes), p.pid))


# ---- --csv ---------------------------------------------------------------------

CSV_COLUMNS = ("time", "kind", "label", "seconds", "device", "op", *IOSTAT_COLUMNS,
               "count", "MB/s", "p50_us", "p99_us")


class CsvLog:
    """The --csv file: a row per window, device and op: iostat's columns beside iotrace's count, MB/s, p50, p99.

    iostat's columns are the device's (every op and every process); the
    iotrace columns are the op's, all traced processes merged, total phase.
    A device with no traced request in the window gets one row, op "-".
    """

    def __init__(self, path: str):
        from tracer.cli import _open_output  # the same rules as -o: append, owned by the sudo user

        self.file = _open_output(path)
        self.writer = csv.writer(self.file, lineterminator="\n")
        if self.file.tell() == 0:
            self.writer.writerow(CSV_COLUMNS)

    def _row(self, end: datetime, kind: str, label: str | None, disk: IostatRow | None, seconds: float,
             device: str, op: str, traced=None) -> list:
        cols = disk.columns() if disk else {}
        row = [end.isoformat(), kind, label or "", f"{disk.seconds if disk else seconds:.6f}", device, op]
        row += [f"{cols[c]:.2f}" if c in cols else "" for c in IOSTAT_COLUMNS]
        if traced is None:
            return row + ["", "", "", ""]
        total = traced.phases.get("total")
        summary = total.summary_us() if total and total.count else {}
        mbps = traced.bytes / seconds / 1e6 if seconds > 0 else 0.0
        return row + [traced.count, f"{mbps:.3f}", summary.get("p50", ""), summary.get("p99", "")]

    def write_dump(self, dump, disk: list[IostatRow], every_device: bool) -> None:
        """Rows of one dump; `every_device`: a row for each of `disk` even when it was idle (--dev given)."""
        from tracer.model.dump import duration_of, merge_by_device_op

        by_name = {r.device: r for r in disk}
        seconds = duration_of(dump)
        seen = set()
        for s in sorted(merge_by_device_op(dump.series), key=lambda s: (s.device, s.op)):
            seen.add(s.device)
            self.writer.writerow(self._row(dump.end, dump.kind, dump.label, by_name.get(s.device), seconds,
                                           s.device, s.op, s))
        for r in disk:
            if r.device not in seen and (every_device or r.active):
                self.writer.writerow(self._row(dump.end, dump.kind, dump.label, r, seconds, r.device, "-"))
        self.file.flush()

    def write_disk(self, end: datetime, kind: str, disk: list[IostatRow]) -> None:
        for r in disk:
            self.writer.writerow(self._row(end, kind, None, r, r.seconds, r.device, "-"))
        self.file.flush()

    def close(self) -> None:
        self.file.close()


# ---- the trace loop's per-dump work ----------------------------------------------

def _device_names(specs: list[str]) -> list[str] | None:
    from tracer.sources.devices import name_of, resolve

    return [name_of(resolve(d)) for d in specs] or None


class TraceExtras:
    """--csv and --alert for the trace mode: on_dump() is called with each dump before it is written."""

    def __init__(self, rules: list[alertmod.Rule], csv_path: str | None = None, devices: list[str] | None = None,
                 fail_on_alert: bool = False, err: TextIO | None = None):
        self.rules = rules
        self.devices = devices
        self.fail_on_alert = fail_on_alert
        self.err = err or sys.stderr
        self.csv = CsvLog(csv_path) if csv_path else None
        self.sampler: DiskSampler | None = None
        self.fired = 0
        self.alerted_windows = 0
        self.windows = 0

    @classmethod
    def from_args(cls, args) -> TraceExtras | None:
        """From cli.TraceArgs; None when neither --csv nor --alert was given.  Bad rules fail here, early."""
        if args.fail_on_alert and not args.alerts:
            raise UserError("--fail-on-alert needs at least one --alert RULE, e.g. --alert 'p99>50ms'")
        if not (args.csv or args.alerts):
            return None
        rules = alertmod.parse_rules(args.alerts)
        return cls(rules, args.csv, _device_names(args.devs), args.fail_on_alert)

    def start(self) -> TraceExtras:
        """Take the diskstats baseline: call it when the first window begins."""
        self.sampler = DiskSampler(self.devices)
        return self

    def _alert(self, what: str, dump=None, disk: list[IostatRow] = ()) -> list[dict]:
        fired = alertmod.check(self.rules, dump, disk)
        for a in fired:
            print(f"iotrace: alert: {what}: {a.describe()}", file=self.err)
        self.windows += 1
        self.fired += len(fired)
        self.alerted_windows += bool(fired)
        self.err.flush()
        return [a.to_json() for a in fired]

    def on_dump(self, dump) -> None:
        if self.sampler is None:
            self.start()
        disk = self.sampler.sample()
        if self.rules:
            what = f"{dump.kind}{' ' + repr(dump.label) if dump.label else ''} ending {dump.end:%H:%M:%S}"
            dump.extra["alerts"] = self._alert(what, dump, disk)
        if self.csv:
            self.csv.write_dump(dump, disk, every_device=self.devices is not None)

    def finish(self, status: int) -> int:
        """The exit status, after --fail-on-alert; says how many alerts fired."""
        if self.rules:
            print(f"iotrace: alerts: {self.fired} in {self.alerted_windows} of {self.windows} report(s)"
                  + (f"; exit {ALERT_EXIT} (--fail-on-alert)" if self.fired and self.fail_on_alert and not status
                     else ""), file=self.err)
        if self.fired and self.fail_on_alert and not status:
            return ALERT_EXIT
        return status

    def close(self) -> None:
        if self.csv:
            self.csv.close()


def offer_diskstats(exc: UserError) -> UserError:
    """A Probe error, with the unprivileged mode offered when it says BPF cannot be used here."""
    message = str(exc)
    if message.startswith("--"):        # an option's value: the user fixes that, BPF may be fine
        return exc
    return UserError(f"{message}; without BPF, 'iotrace --diskstats' shows iostat's numbers per device and "
                     f"bytes per process from /proc (no percentiles, no root needed)", exc.exit_code)


# ---- iotrace --diskstats -------------------------------------------------------

_DEV_HEAD = f"{'DEVICE':<12}" + "".join(f"{c:>10}" for c in IOSTAT_COLUMNS)
_PROC_HEAD = f"{'PID':>7} {'COMM':<16}{'READ':>9}{'WRITE':>9}{'rkB/s':>10}{'wkB/s':>10}"


@dataclass
class DiskWindow:
    """One report of the diskstats mode."""

    kind: str                   # interval, final, or run (the whole run)
    start: datetime
    end: datetime
    seconds: float
    devices: list[IostatRow]
    processes: list[ProcIO]
    unreadable: int
    alerts: list[dict] | None = None

    def to_json(self) -> dict:
        devs = []
        for r in self.devices:
            devs.append({"device": r.device, "reads": r.reads, "writes": r.writes,
                         "read_kB": r.read_sectors * SECTOR / 1024, "write_kB": r.write_sectors * SECTOR / 1024,
                         "discards": r.discards, "flushes": r.flushes,
                         **{k: round(v, 3) for k, v in r.columns().items()}})
        obj = {"schema": 1, "kind": "diskstats", "window": self.kind, "label": None,
               "start": self.start.isoformat(), "end": self.end.isoformat(), "duration_s": round(self.seconds, 6),
               "host": socket.gethostname(), "kernel": platform.release(), "percentiles": None,
               "source": "/proc/diskstats, /proc/PID/io", "devices": devs,
               "processes": [{"pid": p.pid, "comm": p.comm, "read_bytes": p.read_bytes, "write_bytes": p.write_bytes}
                             for p in self.processes],
               "unreadable_processes": self.unreadable}
        if self.alerts is not None:
            obj["alerts"] = self.alerts
        return obj


def render_window(w: DiskWindow, out: TextIO, root: bool) -> None:
    from tracer.views.report import fmt_size

    out.write(f"\ndiskstats {w.kind}: {w.start:%H:%M:%S} - {w.end:%H:%M:%S} ({w.seconds:.1f}s); iostat -x's "
              f"columns from /proc/diskstats, bytes from /proc/PID/io; no BPF, so no percentiles\n")
    if w.devices:
        out.write(_DEV_HEAD + "\n")
        for r in w.devices:
            out.write(f"{r.device:<12}" + "".join(f"{v:>10.2f}" for v in r.columns().values()) + "\n")
    else:
        out.write("  no block I/O on any disk\n")
    if w.processes:
        out.write(_PROC_HEAD + "\n")
        per_s = 1 / 1024 / w.seconds if w.seconds > 0 else 0.0
        for p in w.processes:
            out.write(f"{p.pid:>7} {p.comm[:15]:<16}{fmt_size(p.read_bytes):>9}{fmt_size(p.write_bytes):>9}"
                      f"{p.read_bytes * per_s:>10.1f}{p.write_bytes * per_s:>10.1f}\n")
    else:
        out.write("  no process did block I/O that /proc/PID/io shows\n")
    if w.unreadable and not root:
        out.write(f"  (not shown: {w.unreadable} processes of other users; /proc/PID/io is readable only "
                  f"for your own processes without root)\n")
    out.flush()


def _check_diskstats_args(args) -> list[alertmod.Rule]:
    if args.command:
        raise UserError("--diskstats watches, it does not run a COMMAND: start the command yourself and give "
                        "--pid PID (its bytes come from /proc/PID/io)")
    for flag, given in (("--threads", args.threads), ("--hist", args.hist), ("--inflight-slots", args.inflight_slots),
                        ("--hist-cells", args.hist_cells), ("--cgroup", getattr(args, "cgroup", None))):
        if given:
            raise UserError(f"{flag} needs BPF; --diskstats has per-device and per-process numbers only")
    if args.fail_on_alert and not args.alerts:
        raise UserError("--fail-on-alert needs at least one --alert RULE, e.g. --alert 'util>90%'")
    rules = alertmod.parse_rules(args.alerts)
    for r in rules:
        if r.needs_bpf:
            raise UserError(f"--alert {r.text!r}: latency percentiles need BPF; with --diskstats alerts can use "
                            f"{', '.join(alertmod.DISK_METRICS)}")
    return rules


def run_diskstats(args, out: TextIO = sys.stdout) -> int:
    """`iotrace --diskstats`: iostat's numbers per device and bytes per process, every -i, until -d or Ctrl-C."""
    from tracer.cli import _check_pids, _open_output, _Signals, deadline, interval_due

    rules = _check_diskstats_args(args)
    names = _device_names(args.devs)
    pidfds = _check_pids(args.pids)
    extras = TraceExtras(rules, args.csv, names, args.fail_on_alert) if (rules or args.csv) else None
    file = _open_output(args.output) if args.output else None
    root = os.geteuid() == 0
    disks = DiskSampler(names)
    procs = ProcSampler(args.pids, children=not args.no_children)
    started = last = datetime.now().astimezone()
    windows = 0

    def report(kind: str, rows: list[IostatRow], ps: list[ProcIO], start: datetime, end: datetime,
               seconds: float) -> None:
        shown = rows if names is not None else [r for r in rows if r.active]
        w = DiskWindow(kind, start, end, seconds, shown, ps, procs.unreadable)
        if extras and extras.rules and kind != "run":
            w.alerts = extras._alert(f"{kind} ending {end:%H:%M:%S}", None, rows)
        if extras and extras.csv and kind != "run":
            extras.csv.write_disk(end, kind, shown)
        if not args.json:
            render_window(w, out, root)
        for stream in (file, out if args.json else None):
            if stream and kind != "run":
                stream.write(json.dumps(w.to_json(), separators=(",", ":")) + "\n")
                stream.flush()

    def close_window(kind: str) -> None:
        nonlocal last, windows
        rows = disks.sample()
        end = datetime.now().astimezone()
        report(kind, rows, procs.sample(), last, end, rows[0].seconds if rows else (end - last).total_seconds())
        last = end
        windows += 1

    print(f"iotrace: --diskstats: {'devices ' + ', '.join(names) if names else 'every disk'}"
          f"{', pid ' + ', '.join(map(str, args.pids)) if args.pids else ''}; {NO_PERCENTILES}; Ctrl-C to end",
          file=sys.stderr)
    if not root:
        print("iotrace: not root: /proc/PID/io shows only your own processes", file=sys.stderr)
    sig = _Signals()
    try:
        start = time.monotonic()
        end = deadline(args, start)
        next_tick = start + args.interval if args.interval else None
        alive = set(pidfds)
        while True:
            wake = [t for t in (next_tick, end) if t is not None]
            timeout = max(0.0, min(wake) - time.monotonic()) if wake else None
            ready, _, _ = select.select([sig.r, *alive], [], [], 0 if sig.pending else timeout)
            alive -= set(ready)
            signals = sig.take()
            if signal.SIGUSR1 in signals:
                close_window("interval")
            if any(s != signal.SIGUSR1 for s in signals) or (pidfds and not alive):
                break
            now = time.monotonic()
            if interval_due(now, next_tick, end):
                close_window("interval")
                while next_tick <= now:
                    next_tick += args.interval
            if end is not None and now >= end:
                break
        close_window("final")
        if windows > 1:
            report("run", disks.whole(), procs.whole(), started, last, disks.last[0] - disks.first[0])
    finally:
        sig.restore()
        if file:
            file.close()
        if extras:
            extras.close()
    return extras.finish(0) if extras else 0
