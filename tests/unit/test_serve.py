"""iotrace serve without the kernel: bucket folding, the bounded cumulative state, the
exposition a scrape sees, readiness, and the command's errors.  No root needed, except for
the last test, which starts the real exporter."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections import defaultdict
from datetime import UTC, datetime, timedelta
from pathlib import Path

import numpy as np
import pytest

prometheus_client = pytest.importorskip("prometheus_client")
from prometheus_client.parser import text_string_to_metric_families  # noqa: E402

from tracer import cli  # noqa: E402
from tracer.cli import serve as servecli  # noqa: E402
from tracer.errors import UserError  # noqa: E402
from tracer.model.dump import Dump, PhaseStats, Series  # noqa: E402
from tracer.model.histogram import Histogram, bucket_index, bucket_lower  # noqa: E402
from tracer.model.sections import TaskRow, Tasks  # noqa: E402
from tracer.sinks import prometheus as serve  # noqa: E402
from tracer.sinks import promhttp  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent.parent

RNG = np.random.default_rng(6)


def latencies(n: int, median_us: float = 200.0) -> np.ndarray:
    return np.maximum(RNG.lognormal(np.log(median_us * 1e3), 1.5, n), 1).astype(np.int64)


def series(comm: str, vals: np.ndarray, container: str = "", device: str = "loop0", op: str = "read",
           pid: int = 100) -> Series:
    st = PhaseStats(Histogram.from_values(vals), float(vals.sum()), int(vals.min()), int(vals.max()))
    return Series(pid, comm, device, "7:0", op, len(vals), 4096 * len(vals), {"total": st}, container=container)


def dump_of(ss: list[Series], dropped: dict | None = None) -> Dump:
    t = datetime(2026, 1, 2, tzinfo=UTC)
    return Dump("interval", t, t + timedelta(seconds=1), "h", "k", ss, dropped=dropped or {})


def scrape(exporter: serve.Exporter) -> dict[tuple, float]:
    """(sample name, sorted labels) -> value, as a scrape would read it."""
    registry = prometheus_client.CollectorRegistry(auto_describe=False)
    registry.register(exporter)
    text = prometheus_client.generate_latest(registry).decode()
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for fam in text_string_to_metric_families(text) for s in fam.samples}


def values(samples: dict, name: str, **match) -> dict[tuple, float]:
    return {labels: v for (n, labels), v in samples.items()
            if n == name and all(dict(labels).get(k) == want for k, want in match.items())}


class FakeClock:
    def __init__(self):
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


# ---- buckets ----

def test_edges_are_iotrace_boundaries_near_the_bounds():
    bounds_ns = np.array(serve.BOUNDS_S) * 1e9
    assert np.all(np.abs(serve.EDGES_NS / bounds_ns - 1) <= 1 / 256)     # half of an iotrace bucket
    assert np.array_equal(bucket_lower(bucket_index(serve.EDGES_NS)), serve.EDGES_NS)
    assert np.all(np.diff(serve.EDGES_NS) > 0)


def test_prometheus_buckets_are_exact_for_their_edges():
    hists, expected = [], []
    for n, median in ((1, 5), (1000, 30), (5000, 400), (20000, 3000), (0, 1)):
        vals = latencies(n, median)
        vals[:3] = serve.EDGES_NS[[0, 5, 9]][:len(vals[:3])]   # right on an edge: counted above it
        hists.append(Histogram.from_values(vals))
        expected.append(np.bincount(np.searchsorted(serve.EDGES_NS, vals, side="right"), minlength=serve.NBUCKETS))
    got = serve.prometheus_buckets(hists)
    assert got.shape == (5, serve.NBUCKETS)
    assert np.array_equal(got, np.array(expected))
    assert serve.prometheus_buckets([]).shape == (0, serve.NBUCKETS)


# ---- what a scrape reads ----

def test_scrape_matches_the_dumps_folded():
    e = serve.Exporter(top=5)
    all_vals = []
    for _ in range(3):
        vals = latencies(800)
        all_vals.append(vals)
        e.fold(dump_of([series("fio", vals, "docker:abc123def456"), series("dd", latencies(10), op="write")],
                       dropped={"no_start": 2, "clamped": 0}))
    vals = np.concatenate(all_vals)
    s = scrape(e)
    sel = dict(comm="fio", container="docker:abc123def456", device="loop0", op="read")
    (ios,) = values(s, serve.IOS, **sel).values()
    (nbytes,) = values(s, serve.BYTES, **sel).values()
    assert ios == len(vals) and nbytes == 4096 * len(vals)
    buckets = values(s, f"{serve.LATENCY}_bucket", phase="total", **sel)
    by_le = {float(dict(k)["le"]): v for k, v in buckets.items()}
    cum = np.cumsum(np.bincount(np.searchsorted(serve.EDGES_NS, vals, side="right"), minlength=serve.NBUCKETS))
    assert [by_le[b] for b in (*serve.BOUNDS_S, float("inf"))] == cum.tolist()
    (count,) = values(s, f"{serve.LATENCY}_count", phase="total", **sel).values()
    (total_s,) = values(s, f"{serve.LATENCY}_sum", phase="total", **sel).values()
    assert count == len(vals)
    assert total_s == pytest.approx(vals.sum() / 1e9, rel=1e-9)
    assert values(s, serve.DROPPED, reason="no_start") == {(("reason", "no_start"),): 6}
    assert values(s, serve.DROPPED, reason="inflight_full") == {(("reason", "inflight_full"),): 0}
    assert s[(serve.DRAINS, ())] == 3
    assert set(s) and {name for name, _ in s} <= set(serve.metric_labels())
    for (name, labels) in s:
        assert {k for k, _ in labels} == set(serve.metric_labels()[name]), name


def test_kernel_workers_are_one_owner():
    e = serve.Exporter(top=5)
    e.fold(dump_of([series("kworker/u8:1", latencies(5)), series("kworker/3:2", latencies(7))]))
    s = scrape(e)
    assert {dict(k)["comm"]: v for k, v in values(s, serve.IOS).items()} == {"kworker/*": 12}


# ---- cardinality ----

def test_many_processes_keep_series_bounded_and_counters_monotonic():
    clock = FakeClock()
    e = serve.Exporter(top=3, idle_s=30, clock=clock)
    folded_ios = 0
    previous: dict = {}
    ever = set()
    for step in range(120):
        clock.t += 1
        # a steady big reader, and short-lived processes of many names, several at a time
        ss = [series("trainer", latencies(50), container="k8s:podx/abc")]
        for j in range(3):
            name = f"job{(step * 3 + j) // 4}"
            ss.append(series(name, latencies(int(RNG.integers(1, 40)))))
        folded_ios += sum(x.count for x in ss)
        e.fold(dump_of(ss))
        s = scrape(e)
        comms = {dict(k)["comm"] for k in values(s, serve.IOS)}
        ever |= comms
        assert len(comms) <= 3 + 1, comms
        assert s[(serve.LABELLED, ())] <= 3
        # all requests are counted, in exactly one series
        assert sum(values(s, serve.IOS).values()) == folded_ios
        for key, v in s.items():
            if key[0].endswith(("_total", "_bucket", "_count", "_sum")) and key in previous:
                assert v >= previous[key], key
        previous = s
    assert "trainer" in comms                       # the big one keeps its own labels
    assert serve.OTHER in comms
    assert len(ever) > 4                            # names did come and go
    assert len(e.candidates) <= e.max_candidates


def test_exited_processes_fold_into_other():
    clock = FakeClock()
    e = serve.Exporter(top=10, idle_s=30, clock=clock)
    e.fold(dump_of([series("loader", latencies(100)), series("trainer", latencies(10))]))
    assert {dict(k)["comm"] for k in values(scrape(e), serve.IOS)} == {"loader", "trainer"}
    for _ in range(40):             # the loader exited; the trainer goes on
        clock.t += 1
        e.fold(dump_of([series("trainer", latencies(10))]))
    s = scrape(e)
    ios = {dict(k)["comm"]: v for k, v in values(s, serve.IOS).items()}
    assert ios == {"trainer": 410, serve.OTHER: 100}
    assert s[(serve.FOLDED, ())] == 1
    assert len(e.owners) == 1
    # the loader's latency went along: other's histogram holds its 100 requests
    assert values(s, f"{serve.LATENCY}_count", comm=serve.OTHER) == {
        tuple(sorted(dict(comm=serve.OTHER, container="", device="loop0", op="read", phase="total").items())): 100}


def test_a_busier_newcomer_displaces_the_weakest():
    clock = FakeClock()
    e = serve.Exporter(top=2, idle_s=1e9, clock=clock)
    for _ in range(5):
        clock.t += 1
        e.fold(dump_of([series("a", latencies(20)), series("b", latencies(2))]))
    assert set(e.owners) == {("a", ""), ("b", "")}
    clock.t += 1
    e.fold(dump_of([series("c", latencies(5))]))       # not yet 2x b's recent I/O
    assert ("c", "") not in e.owners
    for _ in range(3):
        clock.t += 1
        e.fold(dump_of([series("a", latencies(20)), series("c", latencies(60))]))
    assert set(e.owners) == {("a", ""), ("c", "")}
    ios = {dict(k)["comm"]: v for k, v in values(scrape(e), serve.IOS).items()}
    # c's own series start at its promotion; what it did before, and all of b, is in other
    assert ios["a"] == 8 * 20 and ios[serve.OTHER] + ios["c"] == 10 + 5 + 3 * 60 and ios["c"] < 3 * 60 + 5
    assert sum(ios.values()) == 8 * 20 + 10 + 5 + 3 * 60


def test_top_zero_puts_everything_in_other():
    e = serve.Exporter(top=0)
    e.fold(dump_of([series("a", latencies(3)), series("b", latencies(4), container="crio:1")]))
    assert {dict(k)["comm"]: v for k, v in values(scrape(e), serve.IOS).items()} == {serve.OTHER: 7}


# ---- the command ----

@pytest.mark.parametrize(("text", "want"), [
    ("127.0.0.1:9464", ("127.0.0.1", 9464)), (":9464", ("0.0.0.0", 9464)), ("[::1]:80", ("::1", 80)),
    ("localhost:0", ("localhost", 0)), ("0.0.0.0:65535", ("0.0.0.0", 65535)),
])
def test_listen_address(text, want):
    assert serve.listen_address(text) == want


@pytest.mark.parametrize("text", ["9464", "127.0.0.1", "127.0.0.1:", "host:port", "1.2.3.4:70000", "::1:80", ""])
def test_bad_listen_is_one_line(text, capsys):
    assert cli.main(["serve", "--listen", text]) == 2
    err = capsys.readouterr().err
    assert err.startswith("iotrace: --listen") and err.count("\n") == 1


def test_port_in_use_is_one_line():
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        with pytest.raises(UserError, match=f"cannot listen on 127.0.0.1:{port}: the port is in use"):
            serve.listen_socket("127.0.0.1", port)


def test_unknown_host():
    with pytest.raises(UserError, match="unknown host"):
        serve.listen_socket("no-such-host.invalid", 0)


def test_missing_prometheus_client_is_one_line(monkeypatch):
    monkeypatch.setitem(sys.modules, "prometheus_client", None)    # import now raises ImportError
    with pytest.raises(UserError, match=r"pip install 'iotrace\[prometheus\]'"):
        servecli.run(["--listen", "127.0.0.1:0"])


@pytest.mark.parametrize("argv", [["--top", "-1"], ["--interval", "0"], ["--idle", "x"], ["--nope"]])
def test_bad_options(argv, capsys):
    assert cli.main(["serve", *argv]) == 2
    assert capsys.readouterr().err.startswith("iotrace: ")


def test_help_names_the_metrics(capsys):
    with pytest.raises(SystemExit) as exc:
        cli.main(["serve", "--help"])
    assert exc.value.code == 0
    text = capsys.readouterr().out
    for name in (serve.LATENCY, serve.IOS, serve.BYTES, serve.DROPPED, "--top", "--listen"):
        assert name in text


def test_collect_is_safe_while_folding():
    """Scrapes run in the HTTP server's threads while the loop folds."""
    import threading

    e = serve.Exporter(top=4)
    stop = threading.Event()
    seen: list = defaultdict(list)

    def scraper():
        while not stop.is_set():
            s = scrape(e)
            seen["ios"].append(sum(values(s, serve.IOS).values()))
            seen["count"].append(sum(values(s, f"{serve.LATENCY}_count").values()))

    t = threading.Thread(target=scraper)
    t.start()
    try:
        for i in range(200):
            e.fold(dump_of([series(f"p{i % 9}", latencies(10))]))
    finally:
        stop.set()
        t.join()
    # every scrape saw whole dumps: requests and histogram counts agree, in tens
    assert seen["ios"] and seen["ios"] == seen["count"]
    assert all(v % 10 == 0 for v in seen["ios"])


# ---- readiness: iotrace_attached and /ready ----

def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def get(port: int, path: str) -> tuple[int, str]:
    """(HTTP status, body) of GET path; (0, why) when nothing answers."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=10) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()
    except OSError as exc:
        return 0, str(exc)


def exposition(text: str) -> dict[tuple, float]:
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for fam in text_string_to_metric_families(text) for s in fam.samples}


def test_not_ready_and_attached_0_until_the_probe_is_loaded(monkeypatch, capsys):
    """While the BPF programs load, /metrics answers with iotrace_attached 0 and every drop reason at 0,
    and /ready with 503; once loaded, 1 and 200."""
    import tracer.runtime.session
    import tracer.sources.probe

    port = free_port()
    seen = {}

    class LoadingProbe:     # the scrapes happen while "loading": inside the constructor
        start_note = ""     # the start event sees every request
        stamps_note = ""    # iotrace's own stamps (no --stamps kernel)
        unavailable: dict = {}

        def __init__(self, opts):
            seen["loading"] = get(port, "/metrics"), get(port, serve.READY_PATH)

        def close(self):
            seen["closed"] = True

    class OneRound:     # the live loop, replaced: one scrape once attached
        def __init__(self, *args, **kwargs):
            pass

        def run(self):
            seen["attached"] = get(port, "/metrics"), get(port, serve.READY_PATH)
            return 0

    monkeypatch.setattr(tracer.sources.probe, "Probe", LoadingProbe)
    monkeypatch.setattr(tracer.runtime.session, "Live", OneRound)     # the loop every live mode runs
    assert servecli.run(["--listen", f"127.0.0.1:{port}"]) == 0
    (code, text), (ready, body) = seen["loading"]
    samples = exposition(text)
    assert code == 200 and samples[(serve.ATTACHED, ())] == 0
    dropped = values(samples, serve.DROPPED)
    assert set(serve.drop_reasons()) == {dict(k)["reason"] for k in dropped} and not any(dropped.values())
    # the kernel's skips
    assert {"skipped_start", "skipped_complete", "lost_completion"} <= {dict(k)["reason"] for k in dropped}
    assert ready == 503 and "not ready" in body
    (code, text), (ready, body) = seen["attached"]
    assert code == 200 and exposition(text)[(serve.ATTACHED, ())] == 1
    assert ready == 200 and body.startswith("ready")
    assert seen["closed"]


# ---- --tasks: per-process counters (tracer.sinks.taskmetrics) ----

def task_row(pid: int, comm: str, io_wait_s: float = 0.0, read: int = 0, disk: int = 0, fsync_s: float = 0.0,
             throttled_s: float = 0.0) -> TaskRow:
    return TaskRow(pid=pid, ppid=1, comm=comm, io_wait_s=io_wait_s, read_bytes=read, disk_read_bytes=disk,
                   fsync_s=fsync_s, throttled_s=throttled_s)


def scrape_all(*collectors) -> dict[tuple, float]:
    registry = prometheus_client.CollectorRegistry(auto_describe=False)
    for c in collectors:
        registry.register(c)
    text = prometheus_client.generate_latest(registry).decode()
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for fam in text_string_to_metric_families(text) for s in fam.samples}


def by_comm(samples: dict, name: str) -> dict[tuple[str, str], float]:
    return {(dict(k)["comm"], dict(k)["container"]): v for k, v in values(samples, name).items()}


def test_task_counters_follow_the_exporters_labels_and_stay_monotonic():
    from tracer.sinks import taskmetrics

    clock = FakeClock()
    e = serve.Exporter(top=1, idle_s=30, clock=clock)
    t = taskmetrics.TaskCounters(e)
    IOW, READ, DISK = (name for _, name, _ in taskmetrics.FIELDS[:3])
    d = dump_of([series("trainer", latencies(50), container="k8s:podx/abc", pid=7)])
    # the trainer (pid 7) has block I/O and gets labels; its loader (pid 8) only hit the page cache
    # (rows that are no rows, as in a hand-edited file, are the reader's error: tests/unit/test_sections.py)
    d.tasks = Tasks([task_row(7, "trainer", 1.5, 4096, 4096, fsync_s=0.25), task_row(8, "loader", 0.5, 1 << 20),
                     task_row(9, "kworker/u8:1", 0.1)])
    e.fold(d)
    t.fold(d)
    s = scrape_all(e, t)
    assert by_comm(s, IOW) == {("trainer", "k8s:podx/abc"): 1.5, (serve.OTHER, ""): pytest.approx(0.6)}
    assert by_comm(s, READ) == {("trainer", "k8s:podx/abc"): 4096, (serve.OTHER, ""): 1 << 20}
    assert by_comm(s, DISK)[("trainer", "k8s:podx/abc")] == 4096
    assert by_comm(s, "iotrace_task_fsync_seconds_total")[("trainer", "k8s:podx/abc")] == 0.25
    # every sample is a declared metric with its declared labels
    for (name, labels) in s:
        assert {k for k, _ in labels} == set(serve.metric_labels()[name]), name
    # the trainer goes idle, another process takes the one place: the trainer's totals move into other
    for _ in range(40):
        clock.t += 1
        d = dump_of([series("fio", latencies(20), pid=11)])
        d.tasks = Tasks([task_row(11, "fio", 0.25, 100, 100)])
        e.fold(d)
        t.fold(d)
    s = scrape_all(e, t)
    assert set(by_comm(s, IOW)) == {("fio", ""), (serve.OTHER, "")}
    total = sum(by_comm(s, IOW).values())
    assert total == pytest.approx(1.5 + 0.6 + 40 * 0.25)       # nothing lost, nothing twice
    assert by_comm(s, IOW)[(serve.OTHER, "")] >= 0.6 + 1.5        # other only grows
    # a dump without rows (serve without --tasks) folds nothing
    t.fold(dump_of([]))
    assert sum(by_comm(scrape_all(t), IOW).values()) == pytest.approx(total)


# ---- the scrape: written by prometheus_client, rendered once per snapshot ----

def busy_exporter(top: int = 5) -> serve.Exporter:
    e = serve.Exporter(top=top)
    odd = 'we"ird\\name\n'      # a comm needing every escape of the text format
    for step in range(4):
        e.fold(dump_of([series(f"job{j}", latencies(30), container="k8s:pod/x" if j % 2 else "",
                               device=("loop0", "nvme0n1")[j % 2], op=("read", "write")[step % 2], pid=100 + j)
                        for j in range(8)] + [series(odd, latencies(5))], dropped={"map_full": step}))
    e.attached = True
    return e


def with_tasks(e: serve.Exporter):
    tasks = serve.taskmetrics.TaskCounters(e)
    tasks.fold(Dump("interval", datetime(2026, 1, 3, tzinfo=UTC), datetime(2026, 1, 3, 0, 0, 1, tzinfo=UTC), "h",
                    "k", [], tasks=Tasks([TaskRow(pid=1, comm="job1", io_wait_s=1.0)])))
    return tasks


def cached(e: serve.Exporter, tasks=None):
    """The ScrapeCache the server process would hold for the exporter's (and task counters') snapshot, and the
    publish that hands it the current one (the snapshot over the wire, as the sink sends it)."""
    import marshal

    sink = serve.PrometheusSink(e, None, "127.0.0.1:0", tasks)

    def wire():
        return sink.generation(), serve.Snapshot.from_wire(marshal.loads(marshal.dumps(sink.snapshot().wire())))
    cache = serve.ScrapeCache(*wire(), tasks=tasks is not None)
    return cache, lambda due=(): cache.update(*wire(), due=due)


def registry_of(*collectors):
    registry = prometheus_client.CollectorRegistry(auto_describe=False)
    for c in collectors:
        registry.register(c)
    return registry


def test_the_text_body_is_what_prometheus_client_writes_for_the_collectors():
    """The plain /metrics body is generate_latest's for the exporter (and the task counters) as collectors,
    escapes and all, also before anything was folded."""
    import gzip

    from prometheus_client.exposition import choose_encoder, generate_latest

    encoder, content_type = choose_encoder("")
    assert encoder is generate_latest
    for e in (busy_exporter(), serve.Exporter()):
        tasks = with_tasks(e)
        for t in (None, tasks):
            cache, _ = cached(e, t)
            want = generate_latest(registry_of(e, *[t] if t else []))
            assert cache.body(content_type, encoder) == want
            assert gzip.decompress(cache.body(content_type, encoder, gzipped=True)) == want
            assert cache.renders == 1       # the gzip is of the plain body rendered before
    e = busy_exporter(top=20)       # the odd comm keeps its labels: escaped as prometheus_client escapes it
    cache, _ = cached(e)
    assert b'{comm="we\\"ird\\\\name\\n",container=""' in cache.body(content_type, encoder)
    assert cache.body(content_type, encoder) == generate_latest(registry_of(e))


def test_openmetrics_is_what_prometheus_client_writes_rendered_when_asked():
    """Prometheus asks for OpenMetrics 1.0.0: prometheus_client's writer for it, task counters included,
    rendered the first time a client asks for it, then served as the same bytes."""
    from prometheus_client.exposition import choose_encoder
    from prometheus_client.openmetrics.exposition import generate_latest as openmetrics

    for e in (busy_exporter(), serve.Exporter()):
        tasks = with_tasks(e)
        for t in (None, tasks):
            registry = registry_of(e, *[t] if t else [])
            cache, _ = cached(e, t)
            assert cache.renders == 0
            seen = set()
            for accept in ("application/openmetrics-text; version=1.0.0; charset=utf-8",
                           "application/openmetrics-text;version=1.0.0,application/openmetrics-text;version=0.0.1;"
                           "q=0.75,text/plain;version=0.0.4;q=0.5,*/*;q=0.1",       # Prometheus 2.42's
                           "application/openmetrics-text"):
                encoder, content_type = choose_encoder(accept)
                seen.add(content_type)
                body = cache.body(content_type, encoder)
                assert body == openmetrics(registry) == encoder(registry), accept
                assert cache.body(content_type, encoder) is body and cache.renders == len(seen)


def test_the_cache_renders_once_per_snapshot_and_serves_every_format():
    """The bodies live with the snapshot: a second scrape of the same snapshot is the same bytes, not a render;
    a fold changes nothing until its snapshot is handed over; then the next scrape renders it."""
    import gzip

    from prometheus_client.exposition import choose_encoder, generate_latest
    from prometheus_client.openmetrics.exposition import CONTENT_TYPE_LATEST as OPENMETRICS

    e = busy_exporter()
    tasks = serve.taskmetrics.TaskCounters(e)
    registry = registry_of(e, tasks)
    cache, publish = cached(e, tasks)
    text_enc, ct = choose_encoder("")
    first = cache.body(ct, text_enc)
    assert first == generate_latest(registry)
    assert cache.body(ct, text_enc) is first and cache.renders == 1         # the same bytes until a snapshot
    assert cache.peek(ct) is first
    assert gzip.decompress(cache.body(ct, text_enc, gzipped=True)) == first and cache.renders == 1
    om_enc, om_ct = choose_encoder("application/openmetrics-text;version=1.0.0")
    assert om_ct.startswith(OPENMETRICS.split(";")[0])
    assert cache.body(om_ct, om_enc) == om_enc(registry) and cache.renders == 2
    e.fold(dump_of([series("job1", latencies(10))]))      # a drain, not handed over yet: the snapshot's body
    assert cache.body(ct, text_enc) is first and cache.renders == 2
    publish()                                             # handed over: the next scrape renders it, once
    assert cache.peek(ct) is None
    second = cache.body(ct, text_enc)
    assert second != first and second == generate_latest(registry) and cache.renders == 3
    assert cache.body(ct, text_enc) is second and cache.renders == 3
    tasks.fold(Dump("interval", datetime(2026, 1, 3, tzinfo=UTC), datetime(2026, 1, 3, 0, 0, 1, tzinfo=UTC), "h", "k",
                    [], tasks=Tasks.from_json([{"pid": 1, "comm": "job1", "io_wait_s": 1.0}])))
    publish()
    assert cache.body(ct, text_enc) == generate_latest(registry) != second
    e.attached = False
    publish()
    last = cache.body(ct, text_enc)
    assert b"iotrace_attached 0.0" in last
    # as the server hands a snapshot over: the formats it renders again at once are due, and a scrape meanwhile
    # gets the snapshot before's body at once; a format not due waits for its render
    e.fold(dump_of([series("job2", latencies(10))]))
    publish(due={(ct, False)})
    assert cache.peek(ct) is last and cache.peek(om_ct) is None
    new = cache.body(ct, text_enc)
    assert new != last and new == generate_latest(registry) and cache.peek(ct) is new


def test_a_served_scrape_is_the_cached_body():
    """Through the real HTTP server: GET /metrics (plain and gzip, OpenMetrics) gives the collectors' exposition,
    rendered once per snapshot (when a dump was folded, or OpenMetrics first asked for), not per scrape; name[]
    filters go to prometheus_client's own app."""
    import gzip
    from types import SimpleNamespace

    port = free_port()
    sink = serve.from_args(SimpleNamespace(listen=f"127.0.0.1:{port}", top=5, idle=600.0, tasks=False),
                           SimpleNamespace(mode="serve"))
    try:
        for d in [dump_of([series(f"p{j}", latencies(20), pid=j) for j in range(6)]) for _ in range(3)]:
            sink.on_dump(d)
        sink.attached()
        renders = sink.renders()
        registry = prometheus_client.CollectorRegistry(auto_describe=False)
        registry.register(sink.exporter)
        want = prometheus_client.generate_latest(registry)
        for _ in range(5):
            code, text = get(port, "/metrics")
            assert code == 200 and text.encode() == want
        req = urllib.request.Request(f"http://127.0.0.1:{port}/metrics", headers={"Accept-Encoding": "gzip"})
        with urllib.request.urlopen(req, timeout=10) as r:
            assert r.headers["Content-Encoding"] == "gzip" and gzip.decompress(r.read()) == want
        assert sink.renders() == renders        # rendered after the fold and on attaching, not per scrape
        # OpenMetrics: rendered when first asked for, then the same bytes until the next snapshot
        from prometheus_client.openmetrics.exposition import generate_latest as openmetrics

        om = urllib.request.Request(f"http://127.0.0.1:{port}/metrics",
                                    headers={"Accept": "application/openmetrics-text; version=1.0.0"})
        for _ in range(3):
            with urllib.request.urlopen(om, timeout=10) as r:
                assert r.read() == openmetrics(registry)
        assert sink.renders() == renders + 1
        sink.on_dump(dump_of([series("p0", latencies(20), pid=0)]))     # a snapshot: both formats, once each
        assert sink.renders() == renders + 3    # (OpenMetrics after the ack: stats waits for the renderings queued)
        for _ in range(3):
            with urllib.request.urlopen(om, timeout=10) as r:
                assert r.read() == openmetrics(registry)
            assert get(port, "/metrics")[1].encode() == prometheus_client.generate_latest(registry)
        assert sink.renders() == renders + 3
        # a name[] filter is prometheus_client's own app's to answer (as before the cache)
        assert get(port, f"/metrics?name[]={serve.DRAINS}")[0] == 200
        assert get(port, serve.READY_PATH)[0] == 200
    finally:
        sink.close(0)


# ---- the /metrics server process (tracer.sinks.promserver): never outlives the tracer ----

def children_of(pid: int) -> list[int]:
    out = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                # the field after the parenthesised comm: state, then ppid
                if int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1]) == pid:
                    out.append(int(entry.name))
            except (OSError, ValueError, IndexError):
                pass
    return out


def gone(pid: int, within_s: float = 10.0) -> bool:
    """`pid` has ended (no such process, or a zombie waiting for whoever reaps orphans) within `within_s`."""
    until = time.monotonic() + within_s
    while True:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except (OSError, IndexError):
            return True
        if state in ("Z", "X"):
            return True
        if time.monotonic() > until:
            return False
        time.sleep(0.05)


def serve_sink(port: int, top: int = 5, tasks: bool = False):
    from types import SimpleNamespace

    return serve.from_args(SimpleNamespace(listen=f"127.0.0.1:{port}", top=top, idle=600.0, tasks=tasks),
                           SimpleNamespace(mode="serve"))


def test_the_server_process_serves_and_ends_with_the_sink():
    port = free_port()
    sink = serve_sink(port)
    pid = sink.server.pid
    try:
        assert pid in children_of(os.getpid()) and pid != os.getpid()
        assert get(port, "/metrics")[0] == 200 and get(port, serve.READY_PATH)[0] == 503
        sink.attached()
        assert get(port, serve.READY_PATH)[0] == 200        # served once attached() returns
    finally:
        sink.close(0)
    assert sink.server.status is not None and os.waitstatus_to_exitcode(sink.server.status) == 0   # reaped
    assert gone(pid, 0) and get(port, "/metrics")[0] == 0       # and nothing listens any more


def test_the_server_process_ends_when_the_tracer_is_killed(tmp_path):
    """SIGKILL of the process that started the server (no close, no end of file first): PR_SET_PDEATHSIG."""
    port = free_port()
    script = tmp_path / "fake_tracer.py"
    script.write_text(
        "import sys, time\n"
        "from types import SimpleNamespace\n"
        "from tracer.sinks import prometheus as serve\n"
        f"sink = serve.from_args(SimpleNamespace(listen='127.0.0.1:{port}', top=5, idle=600.0, tasks=False),\n"
        "                        SimpleNamespace(mode='serve'))\n"
        "sink.attached()\n"
        "print(sink.server.pid, flush=True)\n"
        "time.sleep(600)\n")
    proc = subprocess.Popen([sys.executable, str(script)], cwd=ROOT, stdout=subprocess.PIPE, text=True,
                            env={**os.environ, "PYTHONPATH": str(ROOT)})
    try:
        pid = int(proc.stdout.readline())
        assert get(port, serve.READY_PATH)[0] == 200
        proc.kill()
        proc.wait()
        assert gone(pid), f"the server process {pid} outlived its tracer"
        assert get(port, "/metrics")[0] == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_a_server_that_died_is_one_lost_output_and_is_reaped(capsys):
    """The server killed under the tracer: the next fold says so on one line and the trace goes on (Sinks
    drops the output, exit 1 at the end); no traceback, no BrokenPipeError ending the run."""
    import signal

    from tracer.runtime.loop import LOST_OUTPUT_EXIT, Sinks

    sink = serve_sink(free_port())
    sinks = Sinks([sink])
    os.kill(sink.server.pid, signal.SIGKILL)
    sinks.on_dump(dump_of([series("p", latencies(5))]))
    assert sinks.sinks == [] and sink.server.status is not None      # dropped, and reaped
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "/metrics on 127.0.0.1:" in err and "server process exited" in err, err
    assert "killed by signal 9" in err
    assert sinks.close(0) == LOST_OUTPUT_EXIT


def test_the_server_answers_every_path_and_format_it_did_in_process():
    """GET of /ready, /metrics in the text format (plain, gzip), OpenMetrics and a name[] filter, other
    methods and /favicon.ico: what prometheus_client's own app answered, from the snapshot handed over."""
    import gzip

    from prometheus_client.exposition import make_wsgi_app
    from prometheus_client.openmetrics.exposition import generate_latest as openmetrics

    port = free_port()
    sink = serve_sink(port, tasks=True)
    try:
        d = dump_of([series(f"p{j}", latencies(20), pid=j) for j in range(6)])
        d.tasks = Tasks([task_row(j, f"p{j}", 0.5, 4096, 4096) for j in range(6)])
        sink.on_dump(d)
        registry = prometheus_client.CollectorRegistry(auto_describe=False)
        registry.register(sink.exporter)
        registry.register(sink.tasks)

        def ask(path: str, method: str = "GET", **headers) -> tuple[int, dict, bytes]:
            req = urllib.request.Request(f"http://127.0.0.1:{port}{path}", method=method, headers=headers)
            try:
                with urllib.request.urlopen(req, timeout=10) as r:
                    return r.status, dict(r.headers), r.read()
            except urllib.error.HTTPError as exc:
                return exc.code, dict(exc.headers), exc.read()

        code, _, body = ask("/metrics")
        assert code == 200 and body == prometheus_client.generate_latest(registry)
        code, headers, body = ask("/anything", **{"Accept-Encoding": "gzip"})
        assert headers["Content-Encoding"] == "gzip"
        assert gzip.decompress(body) == prometheus_client.generate_latest(registry)
        code, headers, body = ask("/metrics", Accept="application/openmetrics-text; version=1.0.0")
        assert headers["Content-Type"].startswith("application/openmetrics-text") and body == openmetrics(registry)
        in_process = make_wsgi_app(registry)
        for method, path, query in (("POST", "/metrics", ""), ("OPTIONS", "/metrics", ""),
                                    ("GET", "/favicon.ico", ""), ("GET", "/metrics", f"name[]={serve.DRAINS}")):
            got = {}
            want = b"".join(in_process({"REQUEST_METHOD": method, "PATH_INFO": path, "QUERY_STRING": query},
                                       lambda status, headers, got=got: got.update(status=int(status[:3]))))
            code, _, body = ask(f"{path}?{query}" if query else path, method)
            assert (code, body) == (got["status"], want), (method, path, query)
        assert ask(serve.READY_PATH)[0] == 503
    finally:
        sink.close(0)


def test_formats_named_by_clients_are_bounded():
    """OpenMetrics' version is the client's to name: a thousand versions keep a thousand bodies neither in the
    cache nor in what the server renders at every snapshot, and every scrape is still answered."""
    from prometheus_client.exposition import choose_encoder

    e = busy_exporter()
    cache, _ = cached(e)
    text_enc, ct = choose_encoder("")
    for minor in range(40):
        encoder, content_type = choose_encoder(f"application/openmetrics-text; version=1.{minor}.0")
        assert cache.body(content_type, encoder).endswith(b"# EOF\n")
        assert len(cache._bodies) <= promhttp.MAX_BODIES
    assert cache.body(ct, text_enc) == prometheus_client.generate_latest(registry_of(e))

    port = free_port()
    sink = serve_sink(port)
    try:
        for minor in range(20):
            req = urllib.request.Request(f"http://127.0.0.1:{port}/metrics",
                                         headers={"Accept": f"application/openmetrics-text; version=1.{minor}.0"})
            with urllib.request.urlopen(req, timeout=10) as r:
                assert r.status == 200 and r.read().endswith(b"# EOF\n")
        sink.on_dump(dump_of([series("p", latencies(5))]))      # a snapshot: at most MAX_WANTED rendered anew
        renders = sink.renders()
        sink.on_dump(dump_of([series("p", latencies(5))]))
        assert sink.renders() - renders <= promhttp.MAX_WANTED
        assert get(port, "/metrics")[0] == 200
    finally:
        sink.close(0)


# ---- issue 32: HEAD, and a scrape answered whatever other clients do ----

def test_head_is_answered_wherever_get_is():
    """HEAD of /metrics (each format), /ready, /favicon.ico and a name[] filter: GET's status and headers,
    Content-Length included, and no body; OPTIONS and a 405 name HEAD among the methods allowed."""
    import http.client

    port = free_port()
    sink = serve_sink(port)
    try:
        sink.on_dump(dump_of([series("p", latencies(20))]))

        def ask(method: str, path: str, **headers) -> tuple[int, dict, bytes]:
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
            try:
                conn.request(method, path, headers=headers)
                r = conn.getresponse()
                return r.status, {k.lower(): v for k, v in r.getheaders()}, r.read()
            finally:
                conn.close()

        for path, headers in (("/metrics", {}), ("/metrics", {"Accept-Encoding": "gzip"}),
                              ("/metrics", {"Accept": "application/openmetrics-text; version=1.0.0"}),
                              (serve.READY_PATH, {}), ("/favicon.ico", {}), (f"/metrics?name[]={serve.DRAINS}", {})):
            code, got, body = ask("GET", path, **headers)
            assert code in (200, 503) and int(got["content-length"]) == len(body), path
            assert ask("HEAD", path, **headers) == (code, got, b""), path
        for method in ("OPTIONS", "POST"):
            code, got, _ = ask(method, "/metrics")
            assert code == (200 if method == "OPTIONS" else 405)
            assert {m.strip() for m in got["allow"].split(",")} == {"GET", "HEAD", "OPTIONS"}
    finally:
        sink.close(0)


def test_a_scrape_gets_through_300_idle_connections_from_its_own_address():
    """The issue's 300 idle connections, all from the scraper's own address, held open: the scrape after them
    is answered (before: the server held 256 and closed the 257th unanswered, a reset)."""
    port = free_port()
    sink = serve_sink(port)
    idle = []
    try:
        for _ in range(300):
            idle.append(socket.create_connection(("127.0.0.1", port), timeout=10))
        for _ in range(3):
            code, text = get(port, "/metrics")
            assert code == 200 and (serve.DRAINS, ()) in exposition(text), text
    finally:
        for s in idle:
            s.close()
        sink.close(0)


def test_idle_and_slow_connections_are_closed(monkeypatch):
    """A connection that sends nothing is closed after IDLE_TIMEOUT_S; one that keeps sending a request, a
    byte at a time more often than that, after HEADER_TIMEOUT_S: both with an end of file, not a reset."""
    monkeypatch.setattr(promhttp, "IDLE_TIMEOUT_S", 0.3)       # the server process is forked with these
    monkeypatch.setattr(promhttp, "HEADER_TIMEOUT_S", 1.0)
    port = free_port()
    sink = serve_sink(port)
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=30) as quiet:
            assert quiet.recv(1) == b""
        with socket.create_connection(("127.0.0.1", port), timeout=30) as slow:
            sent = 0
            request = b"GET /metrics HTTP/1.1\r\nX-Slow: " + b"a" * 1000
            slow.settimeout(0.1)        # a byte each 0.1 s (the idle timeout is 0.3 s), until the server closes
            while sent < len(request):
                slow.send(request[sent:sent + 1])
                sent += 1
                try:
                    got = slow.recv(1)
                except TimeoutError:
                    continue
                assert got == b""
                break
            assert sent < len(request), "the slow request was never closed"
            assert sent > 3     # it did outlast the idle timeout: closed by the header deadline
        assert get(port, "/metrics")[0] == 200
    finally:
        sink.close(0)


def test_an_answer_is_not_lost_to_what_the_client_sent_after_its_request():
    """A client that sent more than its request (a pipelined request, a body) still reads the whole answer: the
    server reads what is left before it closes (closing with it unread sends a reset, which can discard the
    answer before the client reads it)."""
    import http.client

    port = free_port()
    sink = serve_sink(port)
    try:
        # a body bigger than the sockets' buffers: some of it is still the server's to send when it closes
        sink.on_dump(dump_of([series("p", latencies(20), device=f"disk{j}") for j in range(600)]))
        want = get(port, "/metrics")[1].encode()
        assert len(want) > 1 << 20
        for _ in range(3):
            with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
                s.setblocking(False)
                out = memoryview(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n" + b"x" * (1 << 20))
                try:
                    while out:
                        out = out[s.send(out):]
                except BlockingIOError:
                    pass        # what the socket's buffers hold: more than the server's first read
                s.setblocking(True)
                time.sleep(0.2)         # the server has sent what fits, and is done with the request
                r = http.client.HTTPResponse(s)
                r.begin()
                assert r.status == 200 and r.read() == want
    finally:
        sink.close(0)


class FakeConn:
    def __init__(self, client: str, started: float, reading: bool = True):
        self.client, self.started, self.reading = client, started, reading


def test_admission_takes_room_from_the_client_that_needs_it():
    a = promhttp.Admission(total=6, per_client=3, grace_s=0.25)
    a1, a2 = FakeConn("a", 0.0, reading=False), FakeConn("a", 1.0)     # a1: its answer is on its way
    for c in (a1, a2, FakeConn("b", 0.5)):
        assert a.make_room(c.client, c.started) is None
        a.add(c)
    a3 = FakeConn("a", 2.0)
    assert a.make_room("a", 2.0) is None
    a.add(a3)
    # a's fourth: its oldest still sending its request goes, not its oldest (being answered), not b's
    assert a.make_room("a", 2.1) is a2
    a.remove(a2)
    a.add(FakeConn("a", 2.1))
    # when every one of a's still sending is younger than the grace, its oldest of all (past it) goes
    a4 = FakeConn("a", 2.2)
    assert a.make_room("a", 2.2) is a1
    # ... and when every one is that young, the new one comes in beyond a's share
    b = promhttp.Admission(total=6, per_client=3, grace_s=0.25)
    for t in (5.0, 5.05, 5.1):
        b.add(FakeConn("a", t))
    assert b.make_room("a", 5.2) is None
    # in all at most `total`: then the biggest client's oldest still sending goes, however young
    a.add(a4)
    a.add(FakeConn("c", 2.25))
    assert a.count == 6 and a.make_room("d", 2.3) is a3
    assert a.make_room("b", 2.3) is a3 and a.make_room("c", 2.3) is a3


@pytest.mark.parametrize(("addr", "client"), [
    (("10.1.2.3", 5000), "10.1.2.3"), (("::ffff:10.1.2.3", 5000, 0, 0), "10.1.2.3"),
    (("2001:db8:1:2:aaaa::1", 5000, 0, 0), "2001:db8:1:2::/64"),
    (("2001:db8:1:2:bbbb::9", 1, 0, 0), "2001:db8:1:2::/64"), (("2001:db8:1:3::1", 1, 0, 0), "2001:db8:1:3::/64"),
    (("fe80::1%eth0", 5000, 0, 2), "fe80::/64"),
])
def test_a_client_is_an_address_or_an_ipv6_64(addr, client):
    assert promhttp.client_of(addr) == client
