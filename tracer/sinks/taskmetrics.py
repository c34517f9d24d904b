"""iotrace serve --tasks: the per-process counters (I/O wait, file and disk read bytes, fsync and
dirty-page throttling time) as Prometheus counters, with serve's bounded labels.

This module owns these metric names and how a dump's "tasks" rows (tracer.sources.tasks, see tracer.codec.jsonl)
fold into them; tracer.sinks.prometheus owns the exporter, its labels and their ranking, and registers
this collector beside its own:

    iotrace_task_io_wait_seconds_total{comm,container}     time blocked in I/O wait, threads summed
    iotrace_task_read_bytes_total{comm,container}          bytes reads of regular files returned
    iotrace_task_disk_read_bytes_total{comm,container}     bytes read from block devices for them
    iotrace_task_fsync_seconds_total{comm,container}       time in fsync, fdatasync, sync_file_range
    iotrace_task_throttled_seconds_total{comm,container}   time throttled for dirty pages

Labels: never pid.  A row counts under its (process name, container) when serve's Exporter gives
that owner labels of its own (at most --top, ranked by block I/O: see tracer.sinks.prometheus), and under
comm="other", container="" otherwise; kernel workers are kworker/*.  A row's container is its
process's block-I/O series' (a process that did no block I/O in the interval is counted under
container ""), so a process that reads only from the page cache counts under "other" unless its
name and container do block I/O too.  When an owner loses its labels its totals move into "other"
and its series end, so every counter stays monotonic and the sum over all series is everything
counted since start; an owner that gets labels again starts new series from zero.
"""

from __future__ import annotations

import threading

FIELDS = (  # TaskRow attribute (tracer.model.sections) -> (metric name, help)
    ("io_wait_s", "iotrace_task_io_wait_seconds_total",
     "Seconds the process's threads spent blocked in I/O wait (delay accounting's block-I/O delay), summed"),
    ("read_bytes", "iotrace_task_read_bytes_total", "Bytes the process's reads of regular files returned, "
     "page-cache hits included"),
    ("disk_read_bytes", "iotrace_task_disk_read_bytes_total", "Bytes read from block devices for the process"),
    ("fsync_s", "iotrace_task_fsync_seconds_total", "Seconds the process spent in fsync, fdatasync and "
     "sync_file_range"),
    ("throttled_s", "iotrace_task_throttled_seconds_total", "Seconds the process was throttled for dirty pages "
     "(balance_dirty_pages)"),
)
LABELS = ("comm", "container")
OTHER = "other"


def metric_labels() -> dict[str, tuple[str, ...]]:
    """Every sample name this collector exposes -> its label names."""
    return {name: LABELS for _, name, _ in FIELDS}


class TaskCounters:
    """Folds dumps' "tasks" rows into cumulative counters; a prometheus_client collector (``collect``).

    Fold each dump after the Exporter folded it (so its labelled owners are this dump's)."""

    def __init__(self, exporter):
        self.exporter = exporter
        self.owned: dict[tuple[str, str], list[float]] = {}
        self.other = [0.0] * len(FIELDS)
        self.rows = 0
        self.generation = 0     # bumped at every fold that changed something: the scrape cache's key
        self._lock = threading.Lock()

    def fold(self, dump) -> None:
        from tracer.views.report import row_comm

        if dump.tasks is None:
            return
        containers = {}
        for s in dump.series:
            containers.setdefault(s.tgid or s.pid, s.container)
        labelled = self.exporter.labelled()
        with self._lock:
            for key in [k for k in self.owned if k not in labelled]:
                for i, v in enumerate(self.owned.pop(key)):
                    self.other[i] += v
            for r in dump.tasks.rows:
                key = (row_comm(r.comm), containers.get(r.pid, ""))
                acc = self.owned.setdefault(key, [0.0] * len(FIELDS)) if key in labelled else self.other
                for i, (field, _, _) in enumerate(FIELDS):
                    acc[i] += float(getattr(r, field))
                self.rows += 1
            self.generation += 1

    def snapshot(self) -> list:
        """What a scrape shows: (comm, container, [value per FIELDS]) per series, copied under the lock."""
        with self._lock:
            return [(*key, list(acc)) for key, acc in self.owned.items()] + [(OTHER, "", list(self.other))]

    def collect(self):
        yield from families(self.snapshot())


def families(rows: list):
    """prometheus_client's metric families of a TaskCounters.snapshot()."""
    from prometheus_client.core import CounterMetricFamily

    out = [CounterMetricFamily(name, text, labels=LABELS) for _, name, text in FIELDS]
    for comm, container, acc in rows:
        for fam, v in zip(out, acc, strict=True):
            fam.add_metric((comm, container), v)
    return out
