"""The Prometheus sink of `iotrace serve`: block-I/O latency for a long-running exporter.

This module owns the exporter: its metric names (the one list deploy/ and
its tests check the Grafana dashboard against), the Prometheus bucket bounds
and how iotrace's fine buckets fold into them, the cumulative state with its
bounded label cardinality, and the HTTP server (/metrics, /ready).

Every --interval it drains the kernel's histograms (as `iotrace -i` does)
and adds the dump to cumulative counters, which a Prometheus scrape reads:

    iotrace_io_latency_seconds{device,op,phase,comm,container}   histogram
    iotrace_ios_total{device,op,comm,container}                   counter: requests completed
    iotrace_bytes_total{device,op,comm,container}                 counter
    iotrace_dropped_events_total{reason}                          counter (README, "Dropped events")
    iotrace_drains_total                                          counter: intervals folded in
    iotrace_labelled_owners                                       gauge: (comm, container) pairs with own labels
    iotrace_folded_owners_total                                   counter: owners folded into comm="other"
    iotrace_attached                                              gauge: 0 while the BPF programs load, then 1
    iotrace_task_*{comm,container}     with --tasks: per-process I/O wait, read bytes, fsync... (taskmetrics.py)

/ready answers 200 once the programs are attached and 503 before (a readiness
probe); /metrics answers from the start, so a scrape tells "not attached yet"
(iotrace_attached 0) from "no I/O".

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
import functools
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

# ---- metric names: the one source of truth ------------------------------------

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

    `fold` runs in the serve loop, `collect` in the HTTP server's threads: a
    lock keeps a scrape from seeing half a dump.
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

    # ---- prometheus_client's Collector protocol

    def collect(self):
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily
        from prometheus_client.utils import floatToGoString

        les = [floatToGoString(b) for b in BOUNDS_S] + ["+Inf"]
        lat = HistogramMetricFamily(LATENCY, HELP[LATENCY], labels=LATENCY_LABELS)
        ios = CounterMetricFamily(IOS, HELP[IOS], labels=IO_LABELS)
        nbytes = CounterMetricFamily(BYTES, HELP[BYTES], labels=IO_LABELS)
        dropped = CounterMetricFamily(DROPPED, HELP[DROPPED], labels=("reason",))
        snap = self._snapshot()
        for (device, op, phase, comm, ctr), cum, sum_s in snap.latency:
            lat.add_metric((device, op, phase, comm, ctr), list(zip(les, cum, strict=True)), sum_s)
        for (device, op, comm, ctr), n, b in snap.io:
            ios.add_metric((device, op, comm, ctr), n)
            nbytes.add_metric((device, op, comm, ctr), b)
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

    def _snapshot(self) -> _Snapshot:
        """Everything a scrape shows, copied under the lock (cumulative buckets as lists of ints)."""
        with self._lock:
            owners = [(comm, ctr, o) for (comm, ctr), o in self.owners.items()] + [(OTHER, "", self.other)]
            lat = [((device, op, phase, comm, ctr), cum, h.sum_ns / 1e9)
                   for comm, ctr, o in owners for (device, op, phase), h in o.latency.items()
                   for cum in (np.cumsum(h.buckets).tolist(),)]
            io = [((device, op, comm, ctr), n, b) for comm, ctr, o in owners for (device, op), (n, b) in o.io.items()]
            dropped = sorted({**dict.fromkeys(drop_reasons(), 0), **self.dropped}.items())
            return _Snapshot(lat, io, dropped, self.drains, len(self.owners), self.folded, int(self.attached))

    def render_text(self) -> str:
        """What prometheus_client's generate_latest writes for this collector (text format 0.0.4), byte for
        byte, but formatted here: the labels of a series once, not once per bucket, so that a scrape of a
        busy node's thousands of buckets costs milliseconds."""
        from prometheus_client.utils import floatToGoString

        def num(v) -> str:
            # floatToGoString's own result for the common case (an int below 10**6), without its call
            return f"{v}.0" if type(v) is int and 0 <= v < 1_000_000 else floatToGoString(v)

        les = [floatToGoString(b) for b in BOUNDS_S] + ["+Inf"]
        snap = self._snapshot()
        out = [_head(LATENCY, "histogram")]
        for (device, op, phase, comm, ctr), cum, sum_s in snap.latency:
            first = f'comm="{_esc(comm)}",container="{_esc(ctr)}",device="{_esc(device)}"'
            last = f'op="{_esc(op)}",phase="{_esc(phase)}"'
            pre, post = f'{LATENCY}_bucket{{{first},le="', f'",{last}}} '
            out.extend([f"{pre}{le}{post}{num(c)}\n" for le, c in zip(les, cum, strict=True)])
            out.append(f"{LATENCY}_count{{{first},{last}}} {num(cum[-1])}\n")
            out.append(f"{LATENCY}_sum{{{first},{last}}} {num(sum_s)}\n")
        for name, col in ((IOS, 1), (BYTES, 2)):
            out.append(_head(name, "counter"))
            for (device, op, comm, ctr), *values in snap.io:
                out.append(f'{name}{{comm="{_esc(comm)}",container="{_esc(ctr)}",device="{_esc(device)}",'
                           f'op="{_esc(op)}"}} {num(values[col - 1])}\n')
        out.append(_head(DROPPED, "counter"))
        out.extend(f'{DROPPED}{{reason="{_esc(reason)}"}} {num(n)}\n' for reason, n in snap.dropped)
        for name, kind, v in ((DRAINS, "counter", snap.drains), (LABELLED, "gauge", snap.labelled),
                              (FOLDED, "counter", snap.folded), (ATTACHED, "gauge", snap.attached)):
            out.append(f"{_head(name, kind)}{name} {num(v)}\n")
        return "".join(out)


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
class _Snapshot:
    latency: list       # ((device, op, phase, comm, container), cumulative buckets, sum in s)
    io: list            # ((device, op, comm, container), ios, bytes)
    dropped: list       # (reason, n), every reason
    drains: int
    labelled: int
    folded: int
    attached: int


@functools.lru_cache(maxsize=4096)
def _esc(value: str) -> str:
    """A label value as the text format writes it (as prometheus_client escapes it)."""
    return value.replace("\\", r"\\").replace("\n", r"\n").replace('"', r'\"')


def _head(name: str, kind: str) -> str:
    return f"# HELP {name} {HELP[name].replace(chr(92), chr(92) * 2)}\n# TYPE {name} {kind}\n"


def drop_reasons() -> list[str]:
    """Every drop reason, so each has a series (at 0) from the first scrape."""
    from tracer import contract
    from tracer.sources.probe import USER_DROPS

    kernel = [r.removeprefix("drop_") for r in contract.load().reasons if r.startswith("drop_")]
    return list(dict.fromkeys(kernel + list(USER_DROPS)))     # lost_completion is counted on both sides


# ---- the command -----------------------------------------------------------------

DEFAULT_LISTEN = "127.0.0.1:9464"
LISTEN_BACKLOG = 128
SWITCH_INTERVAL_S = 0.0005


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


def start_server(prom, host: str, port: int, registry):
    """The HTTP server in its own thread; UserError, one line, if it cannot listen."""
    where = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    try:
        server, _thread = prom.start_http_server(port, addr=host, registry=registry)
    except socket.gaierror:
        raise UserError(f"--listen {where}: unknown host {host!r}") from None
    except OSError as exc:
        why = {errno.EADDRINUSE: "the port is in use (another exporter?): choose another --listen port",
               errno.EADDRNOTAVAIL: "not an address of this machine",
               errno.EACCES: "permission denied (ports below 1024 need root)"}.get(exc.errno, exc.strerror)
        raise UserError(f"cannot listen on {where}: {why}") from None
    # socketserver listens with a backlog of 5: a sixth client connecting while the accept thread waits for
    # the GIL has its SYN dropped and retries a second later (scrapes of 1 s and 3 s under load); listen()
    # again sets a deeper one
    server.socket.listen(LISTEN_BACKLOG)
    return server


class ScrapeCache:
    """The /metrics body, rendered once per change of the metrics and served as bytes to every scrape
    until the next one.

    The metrics change only when a drain is folded in (every --interval) or
    the programs attach, so scrapes in between all get the same bytes: the
    sink renders them right after folding (refresh), in the serve loop's
    thread, and a scrape only copies them out.  Each format a client asks for
    (text 0.0.4, written by Exporter.render_text; OpenMetrics, by
    prometheus_client) and its gzip are made at most once per change, under a
    lock, so that concurrent scrapes after a change wait for one rendering,
    not do eight.
    """

    def __init__(self, exporter: Exporter, registry, tasks: taskmetrics.TaskCounters | None = None):
        self.exporter = exporter
        self.registry = registry
        self.tasks = tasks
        self._lock = threading.Lock()          # guards _bodies
        self._render = threading.Lock()        # held while rendering
        self._bodies: dict[tuple[str, bool], tuple[tuple, bytes]] = {}    # (format, gzip) -> (generation, body)
        self.renders = 0        # bodies rendered (the tests read it)

    def generation(self) -> tuple[int, int]:
        return self.exporter.generation, self.tasks.generation if self.tasks else 0

    def _text(self) -> bytes:
        text = self.exporter.render_text()
        if self.tasks:
            from prometheus_client import CollectorRegistry, generate_latest

            only = CollectorRegistry(auto_describe=False)
            only.register(self.tasks)
            text += generate_latest(only).decode()
        return text.encode()

    def body(self, content_type: str, encoder, gzipped: bool = False) -> bytes:
        """The body `encoder` (from prometheus_client's choose_encoder) makes, gzipped or not; the text
        format (generate_latest) is written by Exporter.render_text instead.

        While a newer body is being rendered, a scrape gets the last one made
        (one drain older) at once rather than waiting for it.
        """
        want = (content_type, gzipped)
        with self._lock:
            got = self._bodies.get(want)
            if got is not None and (got[0] == self.generation() or self._render.locked()):
                return got[1]
        with self._render:         # one rendering at a time; the others serve what there is meanwhile
            key = self.generation()
            with self._lock:
                got = self._bodies.get(want)
                if got is not None and got[0] == key:
                    return got[1]
                plain = self._bodies.get((content_type, False))
            if plain is None or plain[0] != key:
                plain = (key, self._plain(encoder))
            body = plain if not gzipped else (key, self._gzip(plain[1]))
            with self._lock:
                self._bodies[(content_type, False)] = plain
                self._bodies[want] = body
            return body[1]

    def _plain(self, encoder) -> bytes:
        from prometheus_client.exposition import generate_latest

        self.renders += 1
        # rendered for the key read before: a drain folded in meanwhile makes the next scrape render anew
        return self._text() if encoder is generate_latest else encoder(self.registry)

    @staticmethod
    def _gzip(data: bytes) -> bytes:
        import gzip

        return gzip.compress(data, compresslevel=1)

    def refresh(self) -> None:
        """Render the text format now (after a fold), so that the next scrapes find it ready."""
        from prometheus_client.exposition import choose_encoder

        encoder, content_type = choose_encoder("")
        self.body(content_type, encoder)


def metrics_app(app, exporter: Exporter, cache: ScrapeCache | None = None):
    """The metrics WSGI app: GET of any path but READY_PATH serves `cache`'s bytes (prometheus_client's own
    app answers what the cache does not: other methods, name[] filters, /favicon.ico); READY_PATH answers
    200 once the exporter is attached, 503 before."""
    def wsgi(environ, start_response):
        path = environ.get("PATH_INFO")
        if path == READY_PATH:
            ready = exporter.attached
            start_response("200 OK" if ready else "503 Service Unavailable", [("Content-Type", "text/plain")])
            return [b"ready: tracing\n" if ready else b"not ready: loading the BPF programs\n"]
        if (cache is None or environ.get("REQUEST_METHOD") != "GET" or path == "/favicon.ico"
                or "name[]" in environ.get("QUERY_STRING", "")):
            return app(environ, start_response)
        from prometheus_client.exposition import choose_encoder

        encoder, content_type = choose_encoder(environ.get("HTTP_ACCEPT", ""))
        gzipped = "gzip" in environ.get("HTTP_ACCEPT_ENCODING", "")
        body = cache.body(content_type, encoder, gzipped)
        headers = [("Content-Type", content_type), ("Content-Length", str(len(body)))]
        if gzipped:
            headers.append(("Content-Encoding", "gzip"))
        start_response("200 OK", headers)
        return [body]
    return wsgi


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
    owners the exporter just ranked), which `server` serves; close() stops the server."""

    def __init__(self, exporter: Exporter, server, where: str, tasks: taskmetrics.TaskCounters | None = None,
                 cache: ScrapeCache | None = None, what: str = "", out=None):
        self.exporter = exporter
        self.server = server
        self.where = where
        self.tasks = tasks
        self.cache = cache
        self.what = what        # "every 5s on nvme0n1 in /kubepods.slice": said once attached
        self.out = out          # where the run's summary goes at its end

    def attached(self) -> None:
        """The BPF programs are attached: /ready answers 200 and iotrace_attached is 1 from now on."""
        self.exporter.attached = True
        if self.cache:
            self.cache.refresh()
        print(f"iotrace: serving block I/O metrics on http://{self.where}/metrics{self.what}; "
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
        if self.cache:
            self.cache.refresh()    # here, not in the next scrape: scrapes only copy bytes out

    def close(self, status: int) -> int:
        self.server.shutdown()
        self.server.server_close()
        return status


def from_args(ns, ctx) -> PrometheusSink | None:
    """Listens at once, before the BPF programs load (seconds of compiling): a port in use fails first."""
    if ctx.mode != "serve":
        return None
    host, port = listen_address(ns.listen)
    prom = import_prometheus()
    exporter = Exporter(top=ns.top, idle_s=ns.idle)
    registry = prom.CollectorRegistry(auto_describe=False)
    registry.register(exporter)
    tasks = taskmetrics.TaskCounters(exporter) if getattr(ns, "tasks", False) else None
    if tasks:
        registry.register(tasks)
    server = start_server(prom, host, port, registry)
    # a scrape thread takes the GIL again at each of its socket calls; while the serve loop drains,
    # Python hands it over only every switch interval (5 ms by default): more often here, where
    # answering scrapes is the point (max scrape time under load ~100 ms instead of 120-330 ms)
    sys.setswitchinterval(SWITCH_INTERVAL_S)
    cache = ScrapeCache(exporter, registry, tasks)
    server.set_app(metrics_app(server.get_app(), exporter, cache))
    bound = server.server_address[1]
    what = (f", every {ns.interval:g}s" if getattr(ns, "interval", None) else "") + \
        (f" on {', '.join(ns.devs)}" if getattr(ns, "devs", None) else "") + \
        (f" in {ns.cgroup}" if getattr(ns, "cgroup", None) else "")
    return PrometheusSink(exporter, server, f"[{host}]:{bound}" if ":" in host else f"{host}:{bound}", tasks,
                          cache, what, getattr(ctx, "out", None))
