"""What a scrape of `iotrace serve` shows: the metric names, their help, and the exposition of a snapshot.

tracer.sinks.prometheus folds dumps into the exporter's cumulative state and
takes a `Snapshot` of it after each fold; the /metrics server process
(tracer.sinks.promserver) receives the snapshot, and prometheus_client's
encoders write its bodies from `families(snap)`, once per snapshot and
format (tracer.sinks.promhttp.ScrapeCache).  It imports neither numpy nor
any other module of the tracer, and prometheus_client only in `families`.

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
    """The exporter's metric families (prometheus_client's), what its encoders write a scrape's body from."""
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
