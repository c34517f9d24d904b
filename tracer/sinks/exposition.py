"""What a scrape of `iotrace serve` shows: the metric names, their help, and the exposition of a snapshot.

tracer.sinks.prometheus folds dumps into the exporter's cumulative state and
takes a `Snapshot` of it after each fold; the /metrics server process
(tracer.sinks.promserver) receives the snapshot and renders it, with the
functions here: `render_text` (the text format 0.0.4, written directly) and
`families` (prometheus_client's metric families, for OpenMetrics and name[]
filters).  It imports neither numpy nor any other module of the tracer, and
prometheus_client only when rendering.

The metric names are listed once, here (the list deploy/ and its tests check
the Grafana dashboard against, through prometheus.metric_labels):

    iotrace_io_latency_seconds{device,op,phase,comm,container}   histogram
    iotrace_ios_total{device,op,comm,container}                   counter: requests completed
    iotrace_bytes_total{device,op,comm,container}                 counter
    iotrace_dropped_events_total{reason}                          counter (README, "Dropped events")
    iotrace_drains_total                                          counter: intervals folded in
    iotrace_labelled_owners                                       gauge: (comm, container) pairs with own labels
    iotrace_folded_owners_total                                   counter: owners folded into comm="other"
    iotrace_attached                                              gauge: 0 while the BPF programs load, then 1
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

LATENCY = "iotrace_io_latency_seconds"
IOS = "iotrace_ios_total"
BYTES = "iotrace_bytes_total"
DROPPED = "iotrace_dropped_events_total"
DRAINS = "iotrace_drains_total"
LABELLED = "iotrace_labelled_owners"
FOLDED = "iotrace_folded_owners_total"
ATTACHED = "iotrace_attached"
READY_PATH = "/ready"

LATENCY_LABELS = ("device", "op", "phase", "comm", "container")
IO_LABELS = ("device", "op", "comm", "container")

OTHER = "other"    # the comm of everything without labels of its own

# Storage latency from 10 us (a fast NVMe read) to 10 s (a stuck device), 1-2.5-5 per decade.
BOUNDS_S = (1e-5, 2.5e-5, 5e-5, 1e-4, 2.5e-4, 5e-4, 1e-3, 2.5e-3, 5e-3, 1e-2, 2.5e-2, 5e-2,
            0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)

HELP = {
    LATENCY: "Block I/O latency from request start (queue, total) or issue (device) to completion",
    IOS: "Block I/O requests completed",
    BYTES: "Bytes of block I/O requests completed",
    DROPPED: "Events iotrace could not record, by reason",
    DRAINS: "Intervals drained from the kernel and folded in",
    LABELLED: "(comm, container) pairs exported with labels of their own (at most --top)",
    FOLDED: "Owners folded into comm=\"other\" (idle or displaced)",
    ATTACHED: "1 once iotrace's BPF programs are attached and tracing; 0 while they load (the counters are 0 for "
              "want of tracing then, not of I/O)",
}


@dataclass
class Snapshot:
    """Everything a scrape shows, as plain values (what marshal can carry to the server process)."""

    latency: list       # ((device, op, phase, comm, container), cumulative buckets (len(BOUNDS_S) + 1), sum in s)
    io: list            # ((device, op, comm, container), ios, bytes)
    dropped: list       # (reason, n), every reason
    drains: int
    labelled: int
    folded: int
    attached: int
    tasks: list | None = None   # with --tasks: (comm, container, [value per taskmetrics.FIELDS])
    bounds: tuple | None = None  # the buckets' `le` in seconds, if not BOUNDS_S (scripts/bench_scrape.py's
                                 # comparison with another layout)

    def wire(self) -> tuple:
        return (self.latency, self.io, self.dropped, self.drains, self.labelled, self.folded, self.attached,
                self.tasks, self.bounds)

    @classmethod
    def from_wire(cls, t: tuple) -> Snapshot:
        return cls(*t)


def _les(snap: Snapshot) -> list[str]:
    from prometheus_client.utils import floatToGoString

    return [floatToGoString(b) for b in snap.bounds or BOUNDS_S] + ["+Inf"]


def families(snap: Snapshot):
    """The exporter's metric families (prometheus_client's), for its encoders other than the text format."""
    from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily

    les = _les(snap)
    lat = HistogramMetricFamily(LATENCY, HELP[LATENCY], labels=LATENCY_LABELS)
    ios = CounterMetricFamily(IOS, HELP[IOS], labels=IO_LABELS)
    nbytes = CounterMetricFamily(BYTES, HELP[BYTES], labels=IO_LABELS)
    dropped = CounterMetricFamily(DROPPED, HELP[DROPPED], labels=("reason",))
    for labels, cum, sum_s in snap.latency:
        lat.add_metric(labels, list(zip(les, cum, strict=True)), sum_s)
    for labels, n, b in snap.io:
        ios.add_metric(labels, n)
        nbytes.add_metric(labels, b)
    for reason, n in snap.dropped:
        dropped.add_metric((reason,), n)
    yield lat
    yield ios
    yield nbytes
    yield dropped
    yield CounterMetricFamily(DRAINS, HELP[DRAINS], value=snap.drains)
    yield GaugeMetricFamily(LABELLED, HELP[LABELLED], value=snap.labelled)
    yield CounterMetricFamily(FOLDED, HELP[FOLDED], value=snap.folded)
    yield GaugeMetricFamily(ATTACHED, HELP[ATTACHED], value=snap.attached)


def render_text(snap: Snapshot) -> str:
    """What prometheus_client's generate_latest writes for `families(snap)` (text format 0.0.4), byte for
    byte, but formatted here: the labels of a series once, not once per bucket, so that a scrape of a
    busy node's thousands of buckets costs milliseconds.  The task counters are not in it."""
    return _render(snap, openmetrics=False)


def render_openmetrics(snap: Snapshot) -> str:
    """What prometheus_client's OpenMetrics 1.0.0 generate_latest writes for `families(snap)`, byte for byte,
    without its closing "# EOF" line (the task counters' part, if any, comes before it).  It differs from
    the text format in the counters' family names (no _total), a double quote escaped in HELP, and the EOF."""
    return _render(snap, openmetrics=True)


def _render(snap: Snapshot, openmetrics: bool) -> str:
    from prometheus_client.utils import floatToGoString

    def num(v) -> str:
        # floatToGoString's own result for the common case (an int below 10**6), without its call
        return f"{v}.0" if type(v) is int and 0 <= v < 1_000_000 else floatToGoString(v)

    def head(name: str, kind: str) -> str:
        return _head_om(name, kind) if openmetrics else _head(name, kind)

    les = _les(snap)
    out = [head(LATENCY, "histogram")]
    for (device, op, phase, comm, ctr), cum, sum_s in snap.latency:
        first = f'comm="{_esc(comm)}",container="{_esc(ctr)}",device="{_esc(device)}"'
        last = f'op="{_esc(op)}",phase="{_esc(phase)}"'
        pre, post = f'{LATENCY}_bucket{{{first},le="', f'",{last}}} '
        out.extend([f"{pre}{le}{post}{num(c)}\n" for le, c in zip(les, cum, strict=True)])
        out.append(f"{LATENCY}_count{{{first},{last}}} {num(cum[-1])}\n")
        out.append(f"{LATENCY}_sum{{{first},{last}}} {num(sum_s)}\n")
    for name, col in ((IOS, 1), (BYTES, 2)):
        out.append(head(name, "counter"))
        for (device, op, comm, ctr), *values in snap.io:
            out.append(f'{name}{{comm="{_esc(comm)}",container="{_esc(ctr)}",device="{_esc(device)}",'
                       f'op="{_esc(op)}"}} {num(values[col - 1])}\n')
    out.append(head(DROPPED, "counter"))
    out.extend(f'{DROPPED}{{reason="{_esc(reason)}"}} {num(n)}\n' for reason, n in snap.dropped)
    for name, kind, v in ((DRAINS, "counter", snap.drains), (LABELLED, "gauge", snap.labelled),
                          (FOLDED, "counter", snap.folded), (ATTACHED, "gauge", snap.attached)):
        out.append(f"{head(name, kind)}{name} {num(v)}\n")
    return "".join(out)


@functools.lru_cache(maxsize=4096)
def _esc(value: str) -> str:
    """A label value as the text format writes it (as prometheus_client escapes it)."""
    return value.replace("\\", r"\\").replace("\n", r"\n").replace('"', r'\"')


def _head(name: str, kind: str) -> str:
    return f"# HELP {name} {HELP[name].replace(chr(92), chr(92) * 2)}\n# TYPE {name} {kind}\n"


def _head_om(name: str, kind: str) -> str:
    """OpenMetrics' HELP and TYPE lines: a counter's family is named without its samples' _total."""
    family = name.removesuffix("_total") if kind == "counter" else name
    text = HELP[name].replace("\\", r"\\").replace("\n", r"\n").replace('"', r'\"')
    return f"# HELP {family} {text}\n# TYPE {family} {kind}\n"
