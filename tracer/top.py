"""iotrace top: a live terminal view of block I/O latency, refreshed every interval (curses).

Like biotop, a row per process, device and op, sorted by p99 latency,
bytes or IOPS, but with percentiles.  It traces like `iotrace` (root, BPF):
the probe is loaded, and any problem said in one line, before the screen is
taken over; q, Ctrl-C or SIGTERM end it and curses restores the terminal.
The screen text is made by pure functions (screen_lines), so it can be
checked without a terminal.
"""

from __future__ import annotations

import argparse
import signal
import sys
import time
from dataclasses import dataclass
from typing import TextIO

from tracer.errors import UserError

SORTS = ("p99", "bytes", "iops")
COLUMNS = (("PID", ">7"), ("COMM", "<15"), ("DEVICE", "<9"), ("OP", "<7"), ("IOPS", ">8"), ("MB/s", ">8"),
           ("AVGSZ", ">6"), ("p50", ">7"), ("p90", ">7"), ("p99", ">7"), ("p99.9", ">7"), ("max", ">7"))
HELP = "q quit  s sort"


@dataclass(frozen=True)
class TopRow:
    pid: int
    comm: str
    device: str
    op: str
    iops: float
    mbps: float
    bytes: int
    avg_size: float
    pct_us: dict        # p50, p90, p99, p99.9, max of the total phase; empty when it has none

    def cells(self) -> list[str]:
        from tracer.views.report import fmt_latency, fmt_size

        lat = [fmt_latency(self.pct_us.get(k)) for k in ("p50", "p90", "p99", "p99.9", "max")]
        return [str(self.pid), self.comm[:15], self.device[:9], self.op, f"{self.iops:.0f}", f"{self.mbps:.2f}",
                fmt_size(self.avg_size) if self.avg_size else "-", *lat]


def top_rows(dump, sort: str = "p99") -> list[TopRow]:
    """The rows of one dump, sorted: highest p99, most bytes or most requests first."""
    from tracer.model.dump import duration_of, summarize

    seconds = duration_of(dump) or 1e-9
    summarize(dump.series)
    rows = []
    for s in dump.series:
        st = s.phases.get("total")
        pct = st.summary_us() if st and st.count else {}
        rows.append(TopRow(s.pid, s.comm, s.device, s.op, s.count / seconds, s.bytes / seconds / 1e6, s.bytes,
                           s.bytes / s.count if s.count else 0.0, pct))
    key = {"p99": lambda r: (-r.pct_us.get("p99", -1.0), -r.bytes),
           "bytes": lambda r: (-r.bytes, -r.pct_us.get("p99", -1.0)),
           "iops": lambda r: (-r.iops, -r.pct_us.get("p99", -1.0))}[sort]
    return sorted(rows, key=lambda r: (*key(r), r.pid, r.device, r.op))


def _line(cells: list[str]) -> str:
    return " ".join(f"{c:{spec}}" for c, (_, spec) in zip(cells, COLUMNS, strict=True)).rstrip()


def screen_lines(dump, sort: str, interval: float, where: str, height: int) -> list[str]:
    """What the screen shows: a header, the column names, as many rows as fit in `height` lines."""
    head = f"iotrace top  every {interval:g}s  {where}  sort: {sort}  [{HELP}]"
    if dump is None:
        return [head, "", "  waiting for the first interval..."]
    rows = top_rows(dump, sort)
    iops = sum(r.iops for r in rows)
    mbps = sum(r.mbps for r in rows)
    lost = sum(dump.dropped.values())
    lines = [head,
             f"{dump.start:%H:%M:%S} - {dump.end:%H:%M:%S}: {len(rows)} rows, {iops:.0f} IOPS, {mbps:.2f} MB/s; "
             f"total latency (request start to completion)" + (f"; {lost} events not recorded" if lost else ""),
             "", _line([name for name, _ in COLUMNS])]
    room = max(height - len(lines), 0)
    lines += [_line(r.cells()) for r in rows[:room]]
    if not rows:
        lines.append("  no block I/O completed in this interval")
    elif len(rows) > room:
        lines[-1] = f"  ... {len(rows) - room + 1} more rows (a taller terminal shows them)"
    return lines


def _draw(scr, lines: list[str]) -> None:
    import curses

    height, width = scr.getmaxyx()
    scr.erase()
    for y, text in enumerate(lines[:height]):
        attr = curses.A_REVERSE if y == 3 else (curses.A_BOLD if y == 0 else curses.A_NORMAL)
        try:
            scr.addnstr(y, 0, text, max(width - 1, 0), attr)
        except curses.error:
            pass        # the last cell of a tiny screen: nothing to do about it
    scr.refresh()


def _view(scr, probe, interval: float, sort: str, where: str, count: int | None = None) -> list[str] | None:
    """Redraw every interval until q; after `count` screens, return the last one's lines."""
    import curses

    from tracer.pipeline.aggregate import Clock, build_dump

    try:
        curses.curs_set(0)
    except curses.error:
        pass
    clock = Clock()
    dump = None
    next_tick = time.monotonic() + interval
    _draw(scr, screen_lines(dump, sort, interval, where, scr.getmaxyx()[0]))
    while True:
        left = next_tick - time.monotonic()
        if left <= 0:
            dump = build_dump(probe.drain(), clock, "interval")
            now = time.monotonic()
            while next_tick <= now:     # fell behind: skip, do not burst
                next_tick += interval
            lines = screen_lines(dump, sort, interval, where, scr.getmaxyx()[0])
            _draw(scr, lines)
            if count is not None:
                count -= 1
                if not count:
                    return lines
            continue
        scr.timeout(max(1, int(left * 1000)))
        key = scr.getch()
        if key in (ord("q"), ord("Q")):
            return None
        if key in (ord("s"), ord("S")):
            sort = SORTS[(SORTS.index(sort) + 1) % len(SORTS)]
        if key != -1:
            _draw(scr, screen_lines(dump, sort, interval, where, scr.getmaxyx()[0]))


def _interrupt(signum, frame):
    raise KeyboardInterrupt


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


def main(argv: list[str], out: TextIO) -> int:
    from tracer.cli import _Parser, _positive, add_attach_option, interval_count, take_interval
    from tracer.sources import devices

    p = _Parser(prog="iotrace top", formatter_class=argparse.RawDescriptionHelpFormatter, epilog=EPILOG,
                description="A live view of block I/O per process, device and op, with latency percentiles, "
                            "refreshed every interval (like biotop).  Needs root, as tracing does.")
    interval_count(p)
    p.add_argument("-i", "--interval", type=_positive, metavar="SECONDS",
                   help="refresh every SECONDS (default 1)")
    p.add_argument("--sort", choices=SORTS, default="p99", help="order of the rows (default p99; s changes it)")
    p.add_argument("--dev", action="append", default=[], metavar="DEV", dest="devs",
                   help="only this disk (loop0, /dev/nvme0n1, 7:0); repeatable")
    add_attach_option(p)
    ns = p.parse_args(argv)
    interval = take_interval(ns) or 1.0
    if not (sys.stdin.isatty() and out.isatty()):
        raise UserError("top needs a terminal; for a log, run 'sudo iotrace -i 1' instead")
    devs = [devices.resolve(d) for d in ns.devs]

    from tracer.iostat import offer_diskstats
    from tracer.sources.probe import Probe, ProbeOptions

    print("iotrace top: loading the BPF programs ...", file=sys.stderr, flush=True)
    try:
        probe = Probe(ProbeOptions(devs=devs, attach=ns.attach))
    except UserError as exc:
        raise offer_diskstats(exc) from None
    # SIGINT too, not left to Python: a process started with SIGINT ignored gets no KeyboardInterrupt
    old = {s: signal.signal(s, _interrupt) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        import curses

        last = curses.wrapper(_view, probe, interval, ns.sort, ", ".join(ns.devs) or "every device", ns.count)
        if last:    # the terminal is back as it was: leave the last screen in it, as biotop does
            out.write("\n".join(last) + "\n")
    except KeyboardInterrupt:
        pass        # curses.wrapper restored the terminal on its way out
    finally:
        for s, handler in old.items():
            signal.signal(s, handler)
        probe.close()
    return 0
