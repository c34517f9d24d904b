"""iotrace serve scraped by a real Prometheus server while fio reads a loop device.

The test starts Debian's /usr/bin/prometheus itself (not the package's service), on a free
loopback port, with a config and a storage directory of its own and a 1 s scrape interval.
`iotrace serve --interval 1 -o FILE` writes every dump it folds into the metrics, so
Prometheus' answers can be checked against iotrace's own dumps of the same window:

- a warm-up fio run creates the series; once its dumps are folded and scraped (the drain
  counter tells which), time t0 is quiet;
- the main fio run; once it is folded and scraped, time t1;
- the window's counts (`x - x offset (t1-t0)`) must equal the dumps' exactly: Prometheus
  stores what the exporter said, and nothing ran on the device between the runs;
- histogram_quantile over the window's buckets must be what Prometheus' interpolation gives
  for the dumps' histograms, and lie in the Prometheus bucket that holds iotrace's own p50 / p99
  (that bucket's width is the resolution: 1-2.5-5 steps per decade);
- increase() and rate() extrapolate to the ends of their range: they may exceed the exact
  count by the share of the range before the first and after the last sample in it
  (about a scrape interval at each end), never fall short of it.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import time
import urllib.parse
import urllib.request
from datetime import datetime
from pathlib import Path

import numpy as np
import pytest
from conftest import PYTHON, REQUIRE_BPF, ROOT, assert_count, fio_cmd, read_dumps

from tracer.codec import jsonl
from tracer.model.histogram import Histogram, bucket_index
from tracer.sinks import prometheus as serve

pytestmark = pytest.mark.bpf
SCRAPE_S = 1
PROMETHEUS = "/usr/bin/prometheus"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def prometheus_bin() -> str:
    found = shutil.which("prometheus") or (PROMETHEUS if os.access(PROMETHEUS, os.X_OK) else None)
    if found is None:
        msg = "Debian's prometheus is not installed (make setup installs it)"
        if REQUIRE_BPF:
            pytest.fail(msg)
        pytest.skip(msg)
    pytest.importorskip("prometheus_client")
    return found


class Prom:
    """A Prometheus server of our own on loopback, scraping one target."""

    def __init__(self, binary: str, workdir: Path, target: str):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        cfg = workdir / "prometheus.yml"
        cfg.write_text(f"global:\n  scrape_interval: {SCRAPE_S}s\n  scrape_timeout: {SCRAPE_S}s\n"
                       f"scrape_configs:\n  - job_name: iotrace\n    static_configs:\n"
                       f"      - targets: ['{target}']\n")
        self.log = open(workdir / "prometheus.log", "w")  # noqa: SIM115 - closed in stop()
        self.proc = subprocess.Popen(
            [binary, f"--config.file={cfg}", f"--storage.tsdb.path={workdir / 'tsdb'}",
             f"--web.listen-address=127.0.0.1:{self.port}", "--storage.tsdb.retention.time=1h"],
            cwd=workdir, stdout=self.log, stderr=subprocess.STDOUT)

    def wait_ready(self, timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            assert self.proc.poll() is None, "prometheus exited; see its log"
            try:
                with urllib.request.urlopen(f"{self.url}/-/ready", timeout=2) as r:
                    if r.status == 200:
                        return
            except OSError:
                pass
            time.sleep(0.2)
        raise AssertionError("prometheus did not become ready")

    def query(self, expr: str, at: float | None = None) -> list[dict]:
        params = {"query": expr}
        if at is not None:
            params["time"] = f"{at:.3f}"
        with urllib.request.urlopen(f"{self.url}/api/v1/query?{urllib.parse.urlencode(params)}", timeout=10) as r:
            body = json.load(r)
        assert body["status"] == "success", body
        return body["data"]["result"]

    def scalar(self, expr: str, at: float | None = None) -> float | None:
        result = self.query(expr, at)
        assert len(result) <= 1, result
        return float(result[0]["value"][1]) if result else None

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()


def prom_quantile(q: float, per_bucket: np.ndarray) -> float:
    """Prometheus' histogram_quantile for our bounds and per-bucket (not cumulative) counts."""
    cum = np.cumsum(per_bucket)
    rank = q * cum[-1]
    b = int(np.searchsorted(cum, rank, side="left"))
    if b == len(serve.BOUNDS_S):             # the +Inf bucket: the highest finite bound
        return serve.BOUNDS_S[-1]
    start = serve.BOUNDS_S[b - 1] if b else 0.0
    below = cum[b - 1] if b else 0
    return start + (serve.BOUNDS_S[b] - start) * (rank - below) / (cum[b] - below)


def test_prometheus_agrees_with_the_dumps(prometheus_bin, loop, tmp_path):
    port = free_port()
    out = tmp_path / "serve.jsonl"
    err = open(tmp_path / "serve.err", "w")  # noqa: SIM115 - closed below
    tracer = subprocess.Popen([PYTHON, "-m", "tracer.cli", "serve", "--listen", f"127.0.0.1:{port}", "--interval", "1",
                               "--dev", loop.name, "-o", str(out)],
                              cwd=ROOT, stdout=subprocess.PIPE, stderr=err, text=True)
    prom = Prom(prometheus_bin, tmp_path, f"127.0.0.1:{port}")
    try:
        prom.wait_ready()
        sel = f'device="{loop.name}",op="read",comm="fio"'
        ios = f"{serve.IOS}{{{sel}}}"

        def settled(after: float, timeout: float = 180) -> tuple[float, int]:
            """Wait for a dump drained after `after` (so it holds all I/O before) to be scraped.

            Returns (a time at which Prometheus' latest sample includes it, dumps in the file then).
            """
            deadline = time.monotonic() + timeout
            k = None
            while k is None:
                assert tracer.poll() is None, (tmp_path / "serve.err").read_text()
                assert time.monotonic() < deadline, "no dump after the fio run"
                ends = [datetime.fromisoformat(d["end"]).timestamp() for d in read_dumps(out)] if out.exists() else []
                k = next((i + 1 for i, end in enumerate(ends) if end > after), None)
                time.sleep(0.2)
            while (prom.scalar(serve.DRAINS) or 0) < k:
                assert time.monotonic() < deadline, "prometheus never scraped the dump"
                time.sleep(0.2)
            return time.time(), k

        # iotrace serve is up once Prometheus has scraped a first drain (loading BPF takes seconds)
        settled(time.time())
        warm = subprocess.run(fio_cmd(loop.path, name="warm", number_ios=64), check=True,
                              capture_output=True, text=True, timeout=120)
        t0, k0 = settled(time.time())
        time.sleep(2.5 * SCRAPE_S)     # quiet samples after t0: increase() below starts from one
        main = subprocess.run(fio_cmd(loop.path, name="main", time_based=1, runtime=4, rate_iops=1500), check=True,
                              capture_output=True, text=True, timeout=120)
        t1, _ = settled(time.time())
        window_ms = int((t1 - t0) * 1000)
        t1 = t0 + window_ms / 1000
        dumps = list(jsonl.read(str(out)))
        raw = read_dumps(out)

        def fio_reads(ds) -> list:
            return [s for d in ds for s in d.series if s.comm == "fio" and s.device == loop.name and s.op == "read"]

        before, during = fio_reads(dumps[:k0]), fio_reads(dumps[k0:])
        n_before, n_during = sum(s.count for s in before), sum(s.count for s in during)
        fio_ios = json.loads(main.stdout)["jobs"][0]["read"]["total_ios"]
        assert_count(n_during, fio_ios, raw[k0:], device=loop.name)
        assert_count(n_before, json.loads(warm.stdout)["jobs"][0]["read"]["total_ios"], raw[:k0], device=loop.name)

        def in_window(series: str) -> str:
            """The window's part of a cumulative series: exact, no extrapolation."""
            return f"sum({series}) - sum({series} offset {window_ms}ms)"

        # counters: cumulative values and the window's difference are exact
        assert prom.scalar(f"sum({ios})", t0) == n_before
        assert prom.scalar(f"sum({ios})", t1) == n_before + n_during
        assert prom.scalar(in_window(ios), t1) == n_during
        nbytes = sum(s.bytes for s in during)
        assert prom.scalar(in_window(f"{serve.BYTES}{{{sel}}}"), t1) == nbytes

        # increase() and rate() extrapolate towards the range's ends, by up to ~1.1 scrape intervals each
        slack = window_ms / 1000 / (window_ms / 1000 - 2.2 * SCRAPE_S - 0.5)
        inc = prom.scalar(f"sum(increase({ios}[{window_ms}ms]))", t1)
        assert n_during <= inc + 1e-6 and inc <= n_during * slack, (inc, n_during, slack)
        rate = prom.scalar(f"sum(rate({serve.BYTES}{{{sel}}}[{window_ms}ms]))", t1)
        assert nbytes <= rate * window_ms / 1000 + 1e-3 and rate * window_ms / 1000 <= nbytes * slack

        # quantiles of the window, from its buckets
        hist = Histogram.merge_all(s.phases["total"].hist for s in during)
        per_bucket = serve.prometheus_buckets([hist])[0]
        bucket = f'{serve.LATENCY}_bucket{{{sel},phase="total"}}'
        window = f"sum by (le) ({bucket}) - sum by (le) ({bucket} offset {window_ms}ms)"
        for q in (0.5, 0.99):
            got = prom.scalar(f"histogram_quantile({q}, {window})", t1)
            assert got == pytest.approx(prom_quantile(q, per_bucket), rel=1e-9), q
            # iotrace's own percentile, and the Prometheus bucket it falls in
            mine_ns = float(hist.percentiles([q * 100])[0])
            j = int(np.searchsorted(serve.CUTS, bucket_index(int(mine_ns)), side="right"))
            lo = serve.BOUNDS_S[j - 1] if j else 0.0
            hi = serve.BOUNDS_S[j] if j < len(serve.BOUNDS_S) else float("inf")
            assert lo <= got <= hi, (q, got, mine_ns / 1e9, lo, hi)
            assert abs(got - mine_ns / 1e9) <= (hi - lo) * (1 + 1 / 128), (q, got, mine_ns)
        # the histogram's _count and _sum agree with the dumps too
        count = prom.scalar(in_window(f'{serve.LATENCY}_count{{{sel},phase="total"}}'), t1)
        assert count == hist.total == n_during
        total_s = sum(s.phases["total"].sum_ns for s in during) / 1e9
        got_s = prom.scalar(in_window(f'{serve.LATENCY}_sum{{{sel},phase="total"}}'), t1)
        # the dump keeps the mean to 1 ns (a JSON number in us, 3 decimals): its sum is within n/2 ns
        assert abs(got_s - total_s) <= 0.5e-9 * n_during + 1e-9, (got_s, total_s)
        # every drop reason has a series, from the first scrape on
        assert len(prom.query(serve.DROPPED, t1)) >= 7

        # SIGTERM ends it cleanly, with a last dump
        tracer.send_signal(signal.SIGTERM)
        stdout, _ = tracer.communicate(timeout=60)
        assert tracer.returncode == 0, (tmp_path / "serve.err").read_text()
        assert "intervals folded" in stdout
        assert read_dumps(out)[-1]["kind"] == "final"
    finally:
        if tracer.poll() is None:
            tracer.kill()
            tracer.wait()
        prom.stop()
        err.close()
