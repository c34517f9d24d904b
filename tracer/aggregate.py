"""The aggregator: turns a drained interval (raw numpy arrays from
tracer.probe) into a Dump of Series with histograms.  Pure numpy, no root.
"""

from __future__ import annotations

import platform
import socket
import time
from datetime import UTC, datetime

import numpy as np

from . import contract, devices
from .dump import Dump, PhaseStats, Series
from .histogram import Histogram


class Clock:
    """Maps CLOCK_MONOTONIC nanoseconds (the kernel's timestamps) to wall-clock datetimes."""

    def __init__(self) -> None:
        self.offset_ns = time.time_ns() - time.monotonic_ns()

    def wall(self, mono_ns: int) -> datetime:
        return datetime.fromtimestamp((mono_ns + self.offset_ns) / 1e9, tz=UTC).astimezone()


def _group_hists(keys: np.ndarray, counts: np.ndarray) -> dict[tuple[int, int, int, int], Histogram]:
    """(pid, dev, op, phase) -> Histogram, from the flat bucket entries."""
    if not len(keys):
        return {}
    order = np.lexsort((keys["bucket"], keys["phase"], keys["op"], keys["dev"], keys["pid"]))
    k = keys[order]
    c = counts[order]
    ident = np.stack([k["pid"].astype(np.int64), k["dev"].astype(np.int64),
                      k["op"].astype(np.int64), k["phase"].astype(np.int64)], axis=1)
    starts = np.flatnonzero(np.r_[True, np.any(ident[1:] != ident[:-1], axis=1)])
    ends = np.r_[starts[1:], len(k)]
    out = {}
    for s, e in zip(starts, ends, strict=True):
        out[tuple(int(x) for x in ident[s])] = Histogram.from_pairs(k["bucket"][s:e], c[s:e])
    return out


def build_dump(raw, clock: Clock, kind: str, label: str | None = None) -> Dump:
    """A Dump from a probe.RawInterval."""
    con = contract.load()
    ops, phases = con.ops, con.phases
    hists = _group_hists(raw.hist_keys, raw.hist_counts)
    names: dict[int, str] = {}
    series = []
    for key, val in zip(raw.series_keys, raw.series_vals, strict=True):
        pid, dev, op = int(key["pid"]), int(key["dev"]), int(key["op"])
        if dev not in names:
            names[dev] = devices.name_of(dev)
        stats = {}
        for p, pname in enumerate(phases):
            if not int(val["phase_count"][p]):
                continue
            stats[pname] = PhaseStats(hists.get((pid, dev, op, p), Histogram.empty()),
                                      float(val["sum_ns"][p]), int(val["min_ns"][p]), int(val["max_ns"][p]))
        series.append(Series(
            pid=pid, comm=bytes(val["comm"]).split(b"\0", 1)[0].decode(errors="replace"),
            device=names[dev], devno=devices.devno(dev), op=ops[op] if op < len(ops) else str(op),
            count=int(val["count"]), bytes=int(val["bytes"]), phases=stats,
            tgid=int(val["tgid"]), cgroup_id=int(val["cgroup"])))
    series.sort(key=lambda s: (s.pid, s.device, s.op))
    dropped = {r.removeprefix("drop_"): n for r, n in raw.reasons.items() if r.startswith("drop_")}
    events = {r.removeprefix("note_"): n for r, n in raw.reasons.items() if r.startswith("note_")}
    return Dump(kind=kind, label=label, start=clock.wall(raw.start_ns), end=clock.wall(raw.end_ns),
                host=socket.gethostname(), kernel=platform.release(), series=series,
                dropped=dropped, events=events)
