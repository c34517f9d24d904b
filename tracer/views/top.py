"""What `iotrace top` shows: the rows of one interval, sorted, and the screen's lines.

Like biotop, a row per process, device and op, sorted by p99 latency,
bytes or IOPS, but with percentiles.  Pure functions of a dump, so the
screen can be checked without a terminal; tracer.sinks.screen draws it.
Names (comm, device, what is traced) go through tracer.text.safe.
"""

from __future__ import annotations

from dataclasses import dataclass

from tracer.text import safe
from tracer.units import MIB

SORTS = ("p99", "bytes", "iops")
COLUMNS = (("PID", ">7"), ("COMM", "<15"), ("DEVICE", "<9"), ("OP", "<10"), ("IOPS", ">8"), ("MiB/s", ">8"),
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
    wb: bool = False    # write-back charged to its dirtier (Series.wb): OP says "write-back" (tracer.views.words)

    def cells(self) -> list[str]:
        from tracer.units import fmt_latency, fmt_size

        lat = [fmt_latency(self.pct_us.get(k)) for k in ("p50", "p90", "p99", "p99.9", "max")]
        from tracer.views.words import PLAIN

        comm, op = PLAIN.comm_op(self.comm, self.op, self.wb)
        return [str(self.pid), comm, safe(self.device)[:9], op, f"{self.iops:.0f}",
                f"{self.mbps:.2f}", fmt_size(self.avg_size) if self.avg_size else "-", *lat]


def top_rows(dump, sort: str = "p99") -> list[TopRow]:
    """The rows of one dump, sorted: highest p99, most bytes or most requests first."""
    from tracer.model.dump import duration_of, summarize

    seconds = duration_of(dump) or 1e-9
    summarize(dump.series)
    rows = []
    for s in dump.series:
        st = s.phases.get("total")
        pct = st.summary_us() if st and st.count else {}
        rows.append(TopRow(s.pid, s.comm, s.device, s.op, s.count / seconds, s.bytes / seconds / MIB, s.bytes,
                           s.bytes / s.count if s.count else 0.0, pct, s.wb))
    key = {"p99": lambda r: (-r.pct_us.get("p99", -1.0), -r.bytes),
           "bytes": lambda r: (-r.bytes, -r.pct_us.get("p99", -1.0)),
           "iops": lambda r: (-r.iops, -r.pct_us.get("p99", -1.0))}[sort]
    return sorted(rows, key=lambda r: (*key(r), r.pid, r.device, r.op))


def _line(cells: list[str]) -> str:
    return " ".join(f"{c:{spec}}" for c, (_, spec) in zip(cells, COLUMNS, strict=True)).rstrip()


def screen_lines(dump, sort: str, interval: float, where: str, height: int) -> list[str]:
    """What the screen shows: a header, the column names, as many rows as fit in `height` lines."""
    head = f"iotrace top  every {interval:g}s  {safe(where)}  sort: {sort}  [{HELP}]"
    if dump is None:
        return [head, "", "  waiting for the first interval..."]
    rows = top_rows(dump, sort)
    iops = sum(r.iops for r in rows)
    mbps = sum(r.mbps for r in rows)
    lost = sum(dump.dropped.values())
    lines = [head,
             f"{dump.start:%H:%M:%S} - {dump.end:%H:%M:%S}: {len(rows)} rows, {iops:.0f} IOPS, {mbps:.2f} MiB/s; "
             f"total latency (request start to completion)" + (f"; {lost} events not recorded" if lost else ""),
             "", _line([name for name, _ in COLUMNS])]
    room = max(height - len(lines), 0)
    lines += [_line(r.cells()) for r in rows[:room]]
    if not rows:
        lines.append("  no block I/O completed in this interval")
    elif len(rows) > room:
        lines[-1] = f"  ... {len(rows) - room + 1} more rows (a taller terminal shows them)"
    return lines
