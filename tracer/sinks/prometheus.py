"""The Prometheus sink of `iotrace serve`: block-I/O latency for a long-running exporter.

This module owns the exporter: the Prometheus bucket bounds' edges and how
iotrace's fine buckets fold into them, the cumulative state with its bounded
label cardinality, and the sink that hands it to the /metrics server process
(tracer.sinks.promserver).  The metric names, their help and their families
are tracer.sinks.exposition's (re-exported here).

Every --interval it drains the kernel's histograms (as `iotrace -i` does)
and adds the dump to cumulative counters, which a Prometheus scrape reads:
the metrics tracer.sinks.exposition lists, and with --tasks the per-process
iotrace_task_*{comm,container} ones (I/O wait, read bytes, fsync...: taskmetrics.py).

/ready answers 200 once the programs are attached and 503 before (a readiness
probe); /metrics answers from the start, so a scrape tells "not attached yet"
(iotrace_attached 0) from "no I/O".  Both are answered by a process of their
own, which gets a snapshot of the state after every fold (promserver.py says
why and how it never outlives the tracer).

Buckets: Prometheus counts a latency in `le` bucket B when it lies below
the iotrace bucket boundary nearest to B.  Every iotrace bucket lies wholly
on one side of such a boundary, so the counts are exact for those
boundaries, which are within 0.4% (half an iotrace bucket) of the nominal
bounds: a latency within 0.4% of a bound may be counted on either side.

Cardinality: labels are process name (comm; kernel workers as kworker/*)
and container, never pid.  At most --top (comm, container) "owners" keep
labels of their own; everything else is counted under comm="other",
container="".  Owners are ranked by recent I/O (an exponentially decayed
count, half-life one minute); a newcomer doing more than twice the I/O of
the weakest labelled owner takes its place, and an owner with no I/O for
--idle seconds (its processes exited) gives its place up.  A displaced
owner's totals move into "other" and its own series end, so every counter
stays monotonic and the sum over all series is every request since start.
An owner that comes back starts new series from zero.
"""

from __future__ import annotations

import errno
import re
import socket
import sys
import threading
import time
from dataclasses import dataclass, field

import numpy as np

from tracer.errors import UserError
from tracer.model.histogram import Histogram, bucket_index, bucket_lower, bucket_upper
from tracer.sinks import taskmetrics
from tracer.sinks.exposition import (  # noqa: F401 - the metric names are also this module's
    ATTACHED,
    BOUNDS_S,
    BYTES,
    DRAINS,
    DROPPED,
    FOLDED,
    HELP,
    IO_LABELS,
    IOS,
    LABELLED,
    LATENCY,
    LATENCY_LABELS,
    OTHER,
    READY_PATH,
    Snapshot,
    families,
)
from tracer.sinks.promhttp import ScrapeCache  # noqa: F401
from tracer.sinks.promserver import LISTEN_BACKLOG, ServerGone, ServerProcess  # noqa: F401


def metric_labels() -> dict[str, tuple[str, ...]]:
    """Every sample name the exporter exposes -> its label names (histogram samples add `le` to _bucket)."""
    return {
        f"{LATENCY}_bucket": (*LATENCY_LABELS, "le"), f"{LATENCY}_sum": LATENCY_LABELS,
        f"{LATENCY}_count": LATENCY_LABELS,
        IOS: IO_LABELS, BYTES: IO_LABELS, DROPPED: ("reason",), DRAINS: (), LABELLED: (), FOLDED: (),
        ATTACHED: (), **taskmetrics.metric_labels(),
    }


def _bucket_cuts(bounds_s) -> np.ndarray:
    """Per bound, the first iotrace bucket above it: buckets below the cut count as `le` the bound."""
    ns = np.round(np.asarray(bounds_s, dtype=np.float64) * 1e9).astype(np.int64)
    i = bucket_index(ns)
    lo, hi = bucket_lower(i), bucket_upper(i)
    return np.where(ns - lo <= hi - ns, i, i + 1)


CUTS = _bucket_cuts(BOUNDS_S)
#: The latency (ns) where each Prometheus bucket really ends: the iotrace boundary nearest its bound.
EDGES_NS = bucket_lower(CUTS)
NBUCKETS = len(BOUNDS_S) + 1    # with +Inf


def prometheus_buckets(hists: list[Histogram]) -> np.ndarray:
    """(len(hists), NBUCKETS) int64: each histogram's counts per Prometheus bucket (not cumulative).

    All histograms in one set of numpy calls: a busy node's dump holds thousands.
    """
    out = np.zeros((len(hists), NBUCKETS), np.int64)
    sizes = np.array([h.idx.size for h in hists], dtype=np.intp)
    if not sizes.sum():
        return out
    idx = np.concatenate([h.idx for h in hists])
    counts = np.concatenate([h.counts for h in hists])
    which = np.repeat(np.arange(len(hists)), sizes) * NBUCKETS + np.searchsorted(CUTS, idx, side="right")
    # float weights are exact: one interval's counts are far below 2**53
    out[:] = np.rint(np.bincount(which, weights=counts.astype(np.float64),
                                 minlength=len(hists) * NBUCKETS)).reshape(len(hists), NBUCKETS)
    return out


# ---- cumulative state ------------------------------------------------------------

HALF_LIFE_S = 60.0
SWAP_FACTOR = 2.0   # a newcomer must do this many times the weakest owner's recent I/O to displace it


@dataclass
class _Latency:
    buckets: np.ndarray = field(default_factory=lambda: np.zeros(NBUCKETS, np.int64))
    sum_ns: float = 0.0


@dataclass
class _Owner:
    """Cumulative counts of one (comm, container), or of everything folded into "other"."""

    latency: dict[tuple[str, str, str], _Latency] = field(default_factory=dict)   # (device, op, phase)
    io: dict[tuple[str, str], list[int]] = field(default_factory=dict)            # (device, op) -> [ios, bytes]
    score: float = 0.0
    last_io: float = 0.0

    def absorb(self, other: _Owner) -> None:
        for k, lat in other.latency.items():
            mine = self.latency.setdefault(k, _Latency())
            mine.buckets += lat.buckets
            mine.sum_ns += lat.sum_ns
        for k, (n, b) in other.io.items():
            mine = self.io.setdefault(k, [0, 0])
            mine[0] += n
            mine[1] += b


OwnerKey = tuple[str, str]   # (comm, container)


class Exporter:
    """Folds dumps into cumulative metrics; a prometheus_client collector (``collect``).

    `fold` runs in the serve loop; `snapshot` (what the server process gets after each fold) and `collect`
    may run in other threads: a lock keeps them from seeing half a dump.
    """

    def __init__(self, top: int = 20, idle_s: float = 600.0, half_life_s: float = HALF_LIFE_S, clock=time.monotonic):
        self.top = top
        self.idle_s = idle_s
        self.half_life_s = half_life_s
        self.clock = clock
        self.owners: dict[OwnerKey, _Owner] = {}
        self.other = _Owner()
        # recent I/O of owners without labels, so one can earn a place; bounded, the weakest forgotten
        self.candidates: dict[OwnerKey, float] = {}
        self.max_candidates = max(4 * top, 64)
        self.dropped: dict[str, int] = {}
        self.drains = 0
        self.folded = 0
        self._last_fold: float | None = None
        self._lock = threading.Lock()
        self.generation = 0     # bumped at every change a scrape can see: the scrape cache's key
        self._attached = False

    @property
    def attached(self) -> bool:
        """The BPF programs are loaded and attached: tracing."""
        return self._attached

    @attached.setter
    def attached(self, value: bool) -> None:
        with self._lock:
            self._attached = value
            self.generation += 1

    # ---- folding

    def labelled(self) -> set[OwnerKey]:
        """The owners with labels of their own, as of the last fold."""
        with self._lock:
            return set(self.owners)

    def fold(self, dump) -> None:
        from tracer.views.report import row_comm

        now = self.clock()
        groups: dict[OwnerKey, list] = {}
        for s in dump.series:
            groups.setdefault((row_comm(s.comm), s.container), []).append(s)
        # the numpy work before taking the lock: scrapes wait only for the additions
        entries = [(key, s, phase, st) for key, ss in groups.items() for s in ss
                   for phase, st in s.phases.items() if st.count]
        counts = prometheus_buckets([st.hist for _, _, _, st in entries])
        ios = {key: sum(s.count for s in ss) for key, ss in groups.items()}
        with self._lock:
            self._age(now, dump.duration_s)
            for key, n in ios.items():
                if key in self.owners:
                    self.owners[key].score += n
                    self.owners[key].last_io = now
                else:
                    self.candidates[key] = self.candidates.get(key, 0.0) + n
            self._evict_idle(now)
            self._promote([k for k in ios if k not in self.owners], now)
            for row, (key, s, phase, st) in enumerate(entries):
                owner = self.owners.get(key, self.other)
                lat = owner.latency.setdefault((s.device, s.op, phase), _Latency())
                lat.buckets += counts[row]
                lat.sum_ns += st.sum_ns
            for key, ss in groups.items():
                owner = self.owners.get(key, self.other)
                for s in ss:
                    io = owner.io.setdefault((s.device, s.op), [0, 0])
                    io[0] += s.count
                    io[1] += s.bytes
            for reason, n in dump.dropped.items():
                self.dropped[reason] = self.dropped.get(reason, 0) + int(n)
            self.drains += 1
            self.generation += 1

    def _age(self, now: float, duration_s: float) -> None:
        elapsed = now - self._last_fold if self._last_fold is not None else duration_s
        self._last_fold = now
        decay = 0.5 ** (max(elapsed, 0.0) / self.half_life_s)
        for o in self.owners.values():
            o.score *= decay
        for k in self.candidates:
            self.candidates[k] *= decay

    def _evict_idle(self, now: float) -> None:
        for key in [k for k, o in self.owners.items() if now - o.last_io >= self.idle_s]:
            self._demote(key)

    def _demote(self, key: OwnerKey) -> None:
        owner = self.owners.pop(key)
        self.other.absorb(owner)
        self.folded += 1

    def _promote(self, active: list[OwnerKey], now: float) -> None:
        """Give the active candidates, busiest first, free places, or those of owners they outdo."""
        ranked = sorted(((k, self.candidates[k]) for k in active), key=lambda kv: -kv[1])
        for key, score in ranked:
            if score <= 0:
                break
            if len(self.owners) >= self.top:
                if not self.owners:
                    break
                weakest = min(self.owners, key=lambda k: self.owners[k].score)
                weak_score = self.owners[weakest].score
                if score <= SWAP_FACTOR * weak_score:
                    break
                self._demote(weakest)
                self.candidates[weakest] = weak_score   # it may win its place back while busy
            del self.candidates[key]
            self.owners[key] = _Owner(score=score, last_io=now)
        if len(self.candidates) > self.max_candidates:
            keep = sorted(self.candidates.items(), key=lambda kv: -kv[1])[:self.max_candidates]
            self.candidates = dict(keep)

    # ---- what a scrape shows

    def snapshot(self) -> Snapshot:
        """Everything a scrape shows, copied under the lock as plain values (cumulative buckets as lists of
        ints): what the server process gets after each fold."""
        with self._lock:
            owners = [(comm, ctr, o) for (comm, ctr), o in self.owners.items()] + [(OTHER, "", self.other)]
            lat = [((device, op, phase, comm, ctr), np.cumsum(h.buckets).tolist(), float(h.sum_ns) / 1e9)
                   for comm, ctr, o in owners for (device, op, phase), h in o.latency.items()]
            io = [((device, op, comm, ctr), int(n), int(b)) for comm, ctr, o in owners
                  for (device, op), (n, b) in o.io.items()]
            dropped = sorted({**dict.fromkeys(drop_reasons(), 0), **self.dropped}.items())
            return Snapshot(lat, io, dropped, self.drains, len(self.owners), self.folded, int(self.attached))

    def collect(self):
        """prometheus_client's Collector protocol."""
        yield from families(self.snapshot())


def drop_reasons() -> list[str]:
    """Every drop reason, so each has a series (at 0) from the first scrape."""
    from tracer import contract
    from tracer.sources.probe import USER_DROPS

    kernel = [r.removeprefix("drop_") for r in contract.load().reasons if r.startswith("drop_")]
    return list(dict.fromkeys(kernel + list(USER_DROPS)))     # lost_completion is counted on both sides


# ---- the command -----------------------------------------------------------------

DEFAULT_LISTEN = "127.0.0.1:9464"


def listen_address(text: str) -> tuple[str, int]:
    """'HOST:PORT', '[V6]:PORT' or ':PORT' (every interface) -> (host, port)."""
    m = re.fullmatch(r"\[([0-9A-Fa-f:.%a-z]+)\]:(\d{1,5})|([^\[\]:]*):(\d{1,5})", text.strip())
    if not m or int(m.group(2) or m.group(4)) > 65535:
        raise UserError(f"--listen {text!r}: want HOST:PORT, e.g. 127.0.0.1:9464, or :9464 for every interface")
    host = m.group(1) if m.group(1) is not None else (m.group(3) or "0.0.0.0")
    return host, int(m.group(2) or m.group(4))


def import_prometheus():
    try:
        import prometheus_client
    except ImportError:
        raise UserError("iotrace serve needs prometheus-client: pip install 'iotrace[prometheus]' "
                        "(or prometheus-client) into iotrace's environment") from None
    return prometheus_client


def _where(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def listen_socket(host: str, port: int) -> socket.socket:
    """A TCP socket bound to (host, port) and listening (backlog LISTEN_BACKLOG), of the family getaddrinfo
    gives first, with SO_REUSEADDR (as prometheus_client's server had); UserError, one line, if it cannot."""
    try:
        family, _, _, _, addr = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)[0]
    except socket.gaierror:
        raise UserError(f"--listen {_where(host, port)}: unknown host {host!r}") from None
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(addr)
        # a deep backlog: a client connecting while every server thread is busy waits, where with
        # socketserver's 5 its SYN was dropped and retried a second later (scrapes of 1 s and 3 s under load)
        sock.listen(LISTEN_BACKLOG)
    except OSError as exc:
        sock.close()
        why = {errno.EADDRINUSE: "the port is in use (another exporter?): choose another --listen port",
               errno.EADDRNOTAVAIL: "not an address of this machine",
               errno.EACCES: "permission denied (ports below 1024 need root)"}.get(exc.errno, exc.strerror)
        raise UserError(f"cannot listen on {_where(host, port)}: {why}") from None
    return sock


def add_arguments(p, mode: str) -> None:
    if mode != "serve":
        return
    from tracer.options import at_least, positive

    p.add_argument("--listen", default=DEFAULT_LISTEN, metavar="HOST:PORT",
                   help=f"where to serve /metrics (default {DEFAULT_LISTEN}; ':9464' for every interface)")
    p.add_argument("--top", type=at_least(0), default=20, metavar="N",
                   help="(comm, container) pairs with labels of their own; the rest is comm=\"other\" (default 20)")
    p.add_argument("--idle", type=positive, default=600.0, metavar="SECONDS",
                   help="fold a pair into \"other\" after this long without I/O (default 600)")


class PrometheusSink:
    """Folds each dump into `exporter` (then, with --tasks, its per-process rows into `tasks`, under the
    owners the exporter just ranked) and hands a snapshot of both to `server` (a promserver.ServerProcess);
    close() ends the server."""

    def __init__(self, exporter: Exporter, server: ServerProcess | None, where: str,
                 tasks: taskmetrics.TaskCounters | None = None, scope: str = "", out=None):
        self.exporter = exporter
        self.server = server
        self.where = where
        self.tasks = tasks
        self.scope = scope      # ", every 5s on nvme0n1 in /kubepods.slice": said once attached
        self.out = out          # where the run's summary goes at its end
        self.what = f"/metrics on {where}"      # how Sinks names this output should it fail

    def generation(self) -> tuple[int, int]:
        return self.exporter.generation, self.tasks.generation if self.tasks else 0

    def snapshot(self) -> Snapshot:
        snap = self.exporter.snapshot()
        if self.tasks:
            snap.tasks = self.tasks.snapshot()
        return snap

    def publish(self) -> None:
        """The server serves the state as of now once this returns (ServerGone, an OSError, if it cannot)."""
        self.server.update(self.generation(), self.snapshot())

    def renders(self) -> int:
        """Bodies the server process has rendered (once per change and format, not per scrape)."""
        return self.server.renders()

    def attached(self) -> None:
        """The BPF programs are attached: /ready answers 200 and iotrace_attached is 1 from now on."""
        self.exporter.attached = True
        try:
            self.publish()
        except ServerGone as exc:
            raise UserError(str(exc)) from None
        print(f"iotrace: serving block I/O metrics on http://{self.where}/metrics{self.scope}; "
              f"SIGTERM or Ctrl-C to end", file=sys.stderr)

    def on_end(self, reason: str) -> None:
        """The run ended (SIGTERM, Ctrl-C): what was folded, in one line."""
        if self.out is not None:
            e = self.exporter
            self.out.write(f"iotrace serve: {e.drains} intervals folded, {len(e.owners)} labelled owners, "
                           f"{e.folded} folded into \"{OTHER}\"\n")

    def on_dump(self, window) -> None:
        self.exporter.fold(window)
        if self.tasks:
            self.tasks.fold(window)
        self.publish()

    def abandon(self) -> None:
        """The server failed (Sinks drops this output): make sure it is gone and reaped."""
        self.server.close(kill=True)

    def close(self, status: int) -> int:
        self.server.close()
        return status


def from_args(ns, ctx) -> PrometheusSink | None:
    """Listens at once, before the BPF programs load (seconds of compiling): a port in use fails first; the
    server process serves from then on (iotrace_attached 0, /ready 503 until attached())."""
    if ctx.mode != "serve":
        return None
    host, port = listen_address(ns.listen)
    import_prometheus()
    exporter = Exporter(top=ns.top, idle_s=ns.idle)
    tasks = taskmetrics.TaskCounters(exporter) if getattr(ns, "tasks", False) else None
    listener = listen_socket(host, port)
    bound = listener.getsockname()[1]
    scope = (f", every {ns.interval:g}s" if getattr(ns, "interval", None) else "") + \
        (f" on {', '.join(ns.devs)}" if getattr(ns, "devs", None) else "") + \
        (f" in {ns.cgroup}" if getattr(ns, "cgroup", None) else "")
    sink = PrometheusSink(exporter, None, _where(host, bound), tasks, scope, getattr(ctx, "out", None))
    sink.server = ServerProcess.start(listener, sink.generation(), sink.snapshot(), tasks=tasks is not None)
    return sink
