#!/usr/bin/env python3
"""What a scrape of `iotrace serve` costs under I/O load: /metrics latency (p50, p99) and body size, and the
same series in ebpf_exporter's classic-bucket layout.

A real `iotrace serve` (the default exporter: --top 20, its default
--interval unless given; --dev the bench's devices only, so that other I/O
on the machine leaves the body alone) listens on a free 127.0.0.1 port; two
loop devices over files in /dev/shm are created for the run and torn down
after it (fio's processes ended first).  A
bounded fio load runs on them: --procs copies of fio under their own names
(fioload-00, ...), so that the exporter has many (comm, device, op) series as
on a busy node, each reading and writing both devices at --iops (20) per job.
Once the exporter has folded a drain holding every copy, --gets GETs of
/metrics are spread over --threads threads (all traffic to 127.0.0.1); each
is timed from the request to the last byte of the body.  Also reported: how
many drains serve folded meanwhile (a scrape that overlaps one is the slow
kind), and the CPU time serve and its /metrics server process used.  Target:
p99 at most TARGET_P99_MS.

The comparison: the same series (the last body's label sets and counts) in
the layout of ebpf_exporter's biolatency example, a classic histogram of 28
exp2 buckets (`le` 1 us .. 2^27 us: its `bucket_type: exp2, bucket_max: 27,
bucket_multiplier: 1e-6`) plus +Inf, against iotrace's 19 plus +Inf: body
size plain and gzipped, the time to render it (prometheus_client's
generate_latest over the snapshot's families, as the server renders a
snapshot; best of 5), and --gets GETs of it served by the same server process
(tracer.sinks.promserver, started by this script) under the same load.  The
count at an exp2 bound is iotrace's at the nearest bound below it, so the
numbers have the digits a real body would.

Needs root (BPF, losetup), like the tracer: `make bench` runs it.

  scripts/bench_scrape.py [--gets 2000] [--threads 8] [--procs 16] [--interval S] [--json FILE]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TARGET_P99_MS = 50.0
NBUCKETS = 20       # iotrace's: len(exposition.BOUNDS_S) + 1
# ebpf_exporter's examples/biolatency.yaml: exp2 buckets 0..27 of microseconds
EBPF_EXPORTER_BOUNDS_S = tuple(2 ** k * 1e-6 for k in range(28))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def get(url: str, timeout: float = 30) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as r:
            return r.status, r.read()
    except OSError:
        return 0, b""


def make_loops(workdir: Path, n: int, size_mb: int) -> list[str]:
    loops = []
    try:
        for i in range(n):
            backing = workdir / f"backing{i}.img"
            with open(backing, "wb") as f:
                f.truncate(size_mb << 20)
            loops.append(subprocess.run(["losetup", "--find", "--show", "--direct-io=off", str(backing)],
                                        check=True, capture_output=True, text=True).stdout.strip())
    except BaseException:
        drop_loops(loops)
        raise
    return loops


def drop_loops(loops: list[str]) -> None:
    for dev in loops:
        subprocess.run(["losetup", "-d", dev], check=False, capture_output=True)


def start_load(workdir: Path, loops: list[str], procs: int, iops: int, seconds: float) -> list[subprocess.Popen]:
    """`procs` fio processes under their own names, each with a randrw job per loop device."""
    out = []
    for i in range(procs):
        exe = workdir / f"fioload-{i:02d}"
        shutil.copy("/usr/bin/fio", exe)
        argv = [str(exe)]
        for j, dev in enumerate(loops):
            argv += [f"--name=j{j}", f"--filename={dev}", "--rw=randrw", "--bs=4k", "--direct=1",
                     "--ioengine=psync", f"--rate_iops={iops}", "--time_based", f"--runtime={seconds:g}",
                     "--size=32m"]
        out.append(subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
    return out


def _children(pid: int) -> list[int]:
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


def stop_load(load: list[subprocess.Popen]) -> None:
    """End each fio this bench started and the job processes it forked (each in a session of its own)."""
    for proc in load:
        for child in _children(proc.pid):
            try:
                os.kill(child, signal.SIGKILL)
            except ProcessLookupError:
                pass
        proc.kill()
        proc.wait()


def scrape(url: str, gets: int, threads: int) -> tuple[list[float], list[int], int]:
    """`gets` GETs over `threads` threads: their times (ms), body sizes, and failures."""
    times: list[float] = []
    sizes: list[int] = []
    failed = [0]
    lock = threading.Lock()
    todo = iter(range(gets))

    def worker() -> None:
        while True:
            with lock:
                if next(todo, None) is None:
                    return
            t = time.perf_counter()
            code, body = get(url)
            ms = (time.perf_counter() - t) * 1e3
            with lock:
                if code == 200:
                    times.append(ms)
                    sizes.append(len(body))
                else:
                    failed[0] += 1

    pool = [threading.Thread(target=worker) for _ in range(threads)]
    for t in pool:
        t.start()
    for t in pool:
        t.join()
    return times, sizes, failed[0]


def cpu_s(pid: int) -> float:
    """User + system CPU seconds of process `pid` so far (0 if it is gone)."""
    try:
        f = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(f[11]) + int(f[12])) / os.sysconf("SC_CLK_TCK")


def drains(body: bytes) -> int:
    for line in body.decode().splitlines():
        if line.startswith("iotrace_drains_total "):
            return int(float(line.split()[1]))
    return -1


def snapshot_of(body: bytes):
    """The Snapshot (tracer.sinks.exposition) a /metrics body was rendered from (without --tasks' part)."""
    from prometheus_client.parser import text_string_to_metric_families

    from tracer.sinks import exposition as x

    lat: dict[tuple, list] = {}
    io: dict[tuple, list] = {}
    dropped, scalars = [], {}
    for fam in text_string_to_metric_families(body.decode()):
        for smp in fam.samples:
            if smp.name == f"{x.LATENCY}_bucket":
                lat.setdefault(tuple(smp.labels[n] for n in x.LATENCY_LABELS), [[], 0.0])[0].append(int(smp.value))
            elif smp.name == f"{x.LATENCY}_sum":
                lat[tuple(smp.labels[n] for n in x.LATENCY_LABELS)][1] = smp.value
            elif smp.name in (x.IOS, x.BYTES):
                io.setdefault(tuple(smp.labels[n] for n in x.IO_LABELS), [0, 0])[smp.name == x.BYTES] = int(smp.value)
            elif smp.name == x.DROPPED:
                dropped.append((smp.labels["reason"], int(smp.value)))
            elif not smp.labels:
                scalars[smp.name] = int(smp.value)
    return x.Snapshot([(k, cum, sum_s) for k, (cum, sum_s) in lat.items()], [(k, n, b) for k, (n, b) in io.items()],
                      dropped, scalars.get(x.DRAINS, 0), scalars.get(x.LABELLED, 0), scalars.get(x.FOLDED, 0),
                      scalars.get(x.ATTACHED, 0))


def in_layout(snap, bounds: tuple[float, ...]):
    """`snap` with its histograms' cumulative counts stepped onto `bounds` (+Inf kept)."""
    import bisect
    from dataclasses import replace

    from tracer.sinks.exposition import BOUNDS_S

    def step(cum: list[int]) -> list[int]:
        return [cum[i - 1] if (i := bisect.bisect_right(BOUNDS_S, b)) else 0 for b in bounds] + [cum[-1]]
    return replace(snap, latency=[(k, step(cum), sum_s) for k, cum, sum_s in snap.latency], bounds=bounds)


def layout_costs(snap) -> dict:
    """Body size (plain; gzip level 1, as the server sends it) and render time (the best of 5: its cost, not
    the machine's load) of `snap`, in the text format as the server renders it once per snapshot."""
    import gzip

    from prometheus_client import generate_latest

    from tracer.sinks.promhttp import SnapshotCollector

    times = []
    for _ in range(5):
        t = time.perf_counter()
        text = generate_latest(SnapshotCollector(lambda: snap, False))
        times.append((time.perf_counter() - t) * 1e3)
    return {"body_kb": round(len(text) / 1024, 1), "gzip_kb": round(len(gzip.compress(text, 1)) / 1024, 1),
            "render_ms": round(min(times), 2),
            "buckets_per_series": len(snap.bounds) + 1 if snap.bounds else NBUCKETS}


def scrape_stats(times: list[float], sizes: list[int], failed: int, wall: float) -> dict:
    if not times:
        raise SystemExit(f"every GET failed ({failed})")
    return {"gets": len(times), "failed": failed, "wall_s": round(wall, 2), "p50_ms": round(pct(times, 50), 2),
            "p99_ms": round(pct(times, 99), 2), "max_ms": round(max(times), 2),
            "mean_ms": round(statistics.fmean(times), 2), "body_kb_median": round(statistics.median(sizes) / 1024, 1),
            "body_kb_max": round(max(sizes) / 1024, 1)}


def serve_layout(snap, gets: int, threads: int) -> dict:
    """`snap` served by iotrace's own server process (started and ended here), scraped as /metrics was."""
    from tracer.sinks.prometheus import listen_socket
    from tracer.sinks.promserver import ServerProcess

    listener = listen_socket("127.0.0.1", 0)
    port = listener.getsockname()[1]
    server = ServerProcess.start(listener, (1, 0), snap, tasks=False)
    try:
        t = time.perf_counter()
        times, sizes, failed = scrape(f"http://127.0.0.1:{port}/metrics", gets, threads)
        wall = time.perf_counter() - t
    finally:
        server.close()
    return scrape_stats(times, sizes, failed, wall)


def pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, max(0, int(-(-q * len(xs) // 100)) - 1))]


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--gets", type=int, default=2000)
    p.add_argument("--threads", type=int, default=8)
    p.add_argument("--procs", type=int, default=16, help="fio processes, each under its own name")
    p.add_argument("--iops", type=int, default=20,
                   help="per fio job (two jobs per process); enough for every series to change at every drain "
                        "without fio's own processes taking the 2 CPUs of the VM the bench was made on")
    p.add_argument("--interval", type=float, help="serve's --interval (default: its own default)")
    p.add_argument("--json", metavar="FILE")
    ns = p.parse_args()
    if os.geteuid() != 0:
        raise SystemExit("bench_scrape needs root (BPF and losetup)")
    port = free_port()
    url = f"http://127.0.0.1:{port}/metrics"
    with tempfile.TemporaryDirectory(prefix="iotrace-bench-scrape-", dir="/dev/shm") as tmp:
        workdir = Path(tmp)
        loops = make_loops(workdir, 2, 64)
        serve = load = None
        try:
            # only the bench's devices, so that other I/O on the machine does not change the body
            argv = [sys.executable, "-m", "tracer.cli", "serve", "--listen", f"127.0.0.1:{port}",
                    *(a for dev in loops for a in ("--dev", dev))]
            if ns.interval:
                argv += ["--interval", f"{ns.interval:g}"]
            serve = subprocess.Popen(argv, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
            deadline = time.monotonic() + 180
            while get(f"http://127.0.0.1:{port}/ready", timeout=2)[0] != 200:
                if serve.poll() is not None or time.monotonic() > deadline:
                    raise SystemExit(f"iotrace serve did not get ready: {serve.stderr.read().decode()[-2000:]}")
                time.sleep(0.2)
            load = start_load(workdir, loops, ns.procs, ns.iops, 600)
            # wait for a drain that holds every fio copy, so the body is as big as it gets
            while True:
                _, body = get(url)
                if sum(f'comm="fioload-{i:02d}"'.encode() in body for i in range(ns.procs)) >= min(ns.procs, 20):
                    break
                if time.monotonic() > deadline:
                    raise SystemExit("the fio copies never showed in /metrics")
                time.sleep(0.5)
            server = _children(serve.pid)
            before = {"drains": drains(get(url)[1]), "cpu": [cpu_s(p) for p in [serve.pid, *server]]}
            t = time.perf_counter()
            times, sizes, failed = scrape(url, ns.gets, ns.threads)
            wall = time.perf_counter() - t
            cpu = [round(b - a, 2) for a, b in zip(before["cpu"], [cpu_s(p) for p in [serve.pid, *server]],
                                                    strict=True)]
            last = get(url)[1]
            folded = drains(last) - before["drains"]
            # the comparison, under the same load: the same series in ebpf_exporter's layout
            ours = snapshot_of(last)
            theirs = in_layout(ours, EBPF_EXPORTER_BOUNDS_S)
            compare = {"iotrace": {**layout_costs(ours), "buckets_per_series": NBUCKETS},
                       "ebpf_exporter_layout": layout_costs(theirs)}
            compare["ebpf_exporter_layout"]["scrape"] = serve_layout(theirs, ns.gets, ns.threads)
        finally:
            stop_load(load or [])
            if serve is not None:
                serve.send_signal(signal.SIGTERM)
                try:
                    serve.wait(timeout=60)
                except subprocess.TimeoutExpired:
                    serve.kill()
                    serve.wait()
            drop_loops(loops)
    if not times:
        raise SystemExit(f"every GET failed ({failed})")
    res = {**scrape_stats(times, sizes, failed, wall), "threads": ns.threads, "procs": ns.procs,
           "interval_s": ns.interval, "drains_during": folded, "cpu_s": {"serve": cpu[0], "server": sum(cpu[1:])},
           "target_p99_ms": TARGET_P99_MS, "compare": compare}
    res["ok"] = res["p99_ms"] <= TARGET_P99_MS and not failed
    print(f"/metrics: {res['gets']} GETs on {ns.threads} threads in {wall:.1f} s ({failed} failed, {folded} drains "
          f"folded meanwhile): p50 {res['p50_ms']:.1f} ms, p99 {res['p99_ms']:.1f} ms, max {res['max_ms']:.0f} ms; "
          f"body {res['body_kb_median']:.0f} KB (max {res['body_kb_max']:.0f} KB); CPU s: serve {cpu[0]:.2f}, its "
          f"server process {sum(cpu[1:]):.2f}; p99 <= {TARGET_P99_MS:g} ms: {'ok' if res['ok'] else 'MISSED'}")
    print(f"the same {len(ours.latency)} histograms and {len(ours.io)} counter pairs, in two layouts:")
    for name, c in compare.items():
        sc = c.get("scrape")
        print(f"  {name:<22} {c['buckets_per_series']:>2} buckets/series: body {c['body_kb']:.0f} KB "
              f"(gzip {c['gzip_kb']:.0f} KB), rendered in {c['render_ms']:.1f} ms"
              + (f"; served: p50 {sc['p50_ms']:.1f} ms, p99 {sc['p99_ms']:.1f} ms ({sc['failed']} failed)"
                 if sc else f"; served: p50 {res['p50_ms']:.1f} ms, p99 {res['p99_ms']:.1f} ms (above)"))
    if ns.json:
        Path(ns.json).write_text(json.dumps(res, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
