"""--csv FILE: a row per window, device and op: iostat -x's columns beside iotrace's count, MiB/s, p50, p99."""

from __future__ import annotations

import csv
from datetime import datetime

from tracer.model.diskstats import IOSTAT_COLUMNS, DiskRow, IostatRow
from tracer.osutil import open_output, quiet_close
from tracer.text import safe
from tracer.units import mib

CSV_COLUMNS = ("time", "kind", "label", "seconds", "device", "op", *IOSTAT_COLUMNS,
               "count", "MiB/s", "p50_us", "p99_us")


class CsvLog:
    """The --csv file: a row per window, device and op: iostat's columns beside iotrace's count, MiB/s, p50, p99.

    iostat's columns are the device's (every op and every process); the
    iotrace columns are the op's, all traced processes merged, total phase.
    A device with no traced request in the window gets one row, op "-".
    """

    def __init__(self, path: str):
        self.file = open_output(path)   # the same rules as -o: append, opened as the sudo user
        self.writer = csv.writer(self.file, lineterminator="\n")
        if self.file.tell() == 0:
            self.writer.writerow(CSV_COLUMNS)

    def _row(self, end: datetime, kind: str, label: str | None, disk: IostatRow | DiskRow | None, seconds: float,
             device: str, op: str, traced=None) -> list:
        cols = disk.columns() if disk else {}
        # `seconds` is the dump's own duration, the window both sides' rates are over (the pipeline reads
        # iostat's rows at the dump's edges); names made safe (tracer.text), as on the terminal
        row = [end.isoformat(), safe(kind), safe(label or ""), f"{seconds:.6f}",
               safe(device), safe(op)]
        row += [f"{cols[c]:.2f}" if c in cols else "" for c in IOSTAT_COLUMNS]
        if traced is None:
            return row + ["", "", "", ""]
        total = traced.phases.get("total")
        summary = total.summary_us() if total and total.count else {}
        mbps = mib(traced.bytes) / seconds if seconds > 0 else 0.0
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

    def write_disk(self, end: datetime, kind: str, disk: list[DiskRow], seconds: float) -> None:
        """Rows of one --diskstats window."""
        for r in disk:
            self.writer.writerow(self._row(end, kind, None, r, seconds, r.device, "-"))
        self.file.flush()

    def close(self) -> None:
        self.file.close()

    def abandon(self) -> None:
        quiet_close(self.file)


def add_arguments(p, mode: str) -> None:
    if mode == "top":
        return
    p.add_argument("--csv", metavar="FILE.csv",
                   help="append a row per report, device and op: iostat -x's columns (r/s, w/s, rkB/s, wkB/s, "
                        "r_await, w_await, aqu-sz, %%util) from /proc/diskstats"
                        + (" beside iotrace's count, MiB/s, p50 and p99" if mode != "diskstats" else ""))


class CsvSink:
    """CsvLog fed by every window; a BPF dump's iostat columns are its `iostat` rows (sampled by the pipeline)."""

    def __init__(self, path: str, devices: list[str] | None):
        self.log = CsvLog(path)
        self.devices = devices
        self.what = f"--csv {path}"     # names the output in a write error's line (tracer.runtime.loop.Sinks)

    def on_dump(self, window) -> None:
        if window.disks is not None:        # a --diskstats window: its own rows
            from tracer.model.dump import duration_of

            self.log.write_disk(window.end, window.kind, window.disks.devices, duration_of(window))
            return
        self.log.write_dump(window, window.iostat or [], every_device=self.devices is not None)

    def close(self, status: int) -> int:
        self.log.close()
        return status

    def abandon(self) -> None:
        """A write failed: let go of the file without writing more."""
        self.log.abandon()


def from_args(ns, ctx) -> CsvSink | None:
    path = getattr(ns, "csv", None)
    return CsvSink(path, ctx.devices) if path else None
