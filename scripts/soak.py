#!/usr/bin/env python3
"""A long run does not grow: the real tracer under each flood in turn, its resident memory at each one's start and end.

Runs `iotrace -i INTERVAL --pid <this script>` on a loop device over
/dev/shm, then `iotrace serve`, and puts each through its floods, one after
another, sampling the tracer's resident memory every second:

  warm-up   processes coming and going (as churn), not judged: the whole-run
            table and the caches fill to their bounds (2000 rows) here
  churn     short-lived readers (a new child every few milliseconds, each
            reading a few blocks with O_DIRECT): every child is a new series,
            joins the pid filter at its fork and must leave it at its exit
  dumps     steady O_DIRECT reads from this script's own thread, no new
            process: a dump every INTERVAL and nothing else changing
  markers   markers with distinct labels as fast as the tracer confirms them
            (each one a dump: `iotrace mark`'s way), up to --markers
  scrapes   `iotrace serve -i INTERVAL` scraped back to back by 8 clients
            beside 100 idle connections and 20 sending a byte a second:
            the tracer's and its /metrics server process's memory

Each flood prints its resident memory at its start and end and fails when it
grew by more than GROWTH_LIMIT_MB.  The run also fails when the peak passes
150 MB, the second half grows by 5 MB or more, anything was dropped for lack
of room (full in-flight, histogram, series or pid tables), the pid filter
ends larger than it began, or an interval's dump is missing.

    sudo .venv/bin/python scripts/soak.py --seconds 3600   # the hour
    sudo .venv/bin/python scripts/soak.py --seconds 60     # what make bench runs
"""

from __future__ import annotations

import argparse
import http.client
import json
import mmap
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from tracer.marker import ENV_RUN_DIR, SOCKET_SUFFIX, send
from tracer.testing import USER_DROPS

ROOT = Path(__file__).resolve().parent.parent

PYTHON = str(ROOT / ".venv" / "bin" / "python") if (ROOT / ".venv").exists() else sys.executable
RSS_LIMIT_MB = 150
GROWTH_LIMIT_MB = 5       # the second half of the traced floods; and each flood, its start to its end
PID_FILTER_LIMIT = 10     # this script, and the few readers alive at the end
ROOM_REASONS = ("inflight_full", "hist_full", "series_full", "pid_full")
# shares of --seconds: the trace tracer's floods in this order, then serve's
SHARES = (("warm-up", 0.25), ("churn", 0.25), ("dumps", 0.15), ("markers", 0.15), ("scrapes", 0.2))
BLOCK = 4096


def rss_mb(pid: int, field: str = "VmRSS") -> float | None:
    try:
        for line in open(f"/proc/{pid}/status"):
            if line.startswith(field + ":"):
                return int(line.split()[1]) / 1024
    except OSError:
        return None
    return None


def without_sudo() -> dict[str, str]:
    """This environment without SUDO_*: under sudo, iotrace opens -o as the invoking user (tracer.osutil)."""
    return {k: v for k, v in os.environ.items() if not k.startswith("SUDO_")}


class Flood:
    """One flood's resident memory (MB) of the processes it watches, at its start and end."""

    def __init__(self, name: str, pids: dict[str, int], judged: bool = True):
        self.name, self.pids, self.judged = name, pids, judged
        self.start = {k: rss_mb(p) or 0.0 for k, p in pids.items()}
        self.end: dict[str, float] = {}
        self.what = ""

    def close(self, what: str) -> None:
        self.end = {k: rss_mb(p) or 0.0 for k, p in self.pids.items()}
        self.what = what

    @property
    def ok(self) -> bool:
        return not self.judged or all(self.end[k] - self.start[k] <= GROWTH_LIMIT_MB for k in self.pids)

    def line(self) -> str:
        rss = ", ".join(f"{k} {self.start[k]:.1f} -> {self.end[k]:.1f} MB ({self.end[k] - self.start[k]:+.1f})"
                        for k in self.pids)
        verdict = f"limit +{GROWTH_LIMIT_MB} MB: {'ok' if self.ok else 'FAILED'}" if self.judged else "not judged"
        return f"soak: {self.name}: {self.what}; resident {rss}; {verdict}"

    def json(self) -> dict:
        return {"name": self.name, "what": self.what, "start_mb": self.start, "end_mb": self.end,
                "judged": self.judged, "ok": self.ok}


def churn(dev: str, until: float, rng: random.Random, tick) -> int:
    """Short-lived dd readers, 8 at a time, until `until`: how many were started."""
    readers: list[subprocess.Popen] = []
    spawned = 0
    while time.monotonic() < until:
        readers = [r for r in readers if r.poll() is None]
        if len(readers) < 8:
            readers.append(subprocess.Popen(
                ["dd", f"if={dev}", "of=/dev/null", "bs=4k", f"count={rng.randint(1, 64)}",
                 f"skip={rng.randint(0, 16000)}", "iflag=direct", "status=none"]))
            spawned += 1
        tick()
        time.sleep(0.002)
    for r in readers:
        r.wait()
    return spawned


def steady_reads(dev: str, until: float, tick) -> int:
    """O_DIRECT reads from this process (traced: --pid), a few hundred a second, until `until`."""
    fd = os.open(dev, os.O_RDONLY | os.O_DIRECT)
    buf = mmap.mmap(-1, BLOCK)      # page-aligned, as O_DIRECT wants
    blocks = os.lseek(fd, 0, os.SEEK_END) // BLOCK
    n = 0
    try:
        while time.monotonic() < until:
            os.preadv(fd, [buf], (n * 7919 % blocks) * BLOCK)
            n += 1
            tick()
            time.sleep(0.002)
    finally:
        os.close(fd)
    return n


def send_markers(control: str, n: int, until: float, tick) -> int:
    """Markers with distinct labels, each waiting for the tracer to close its dump, until n or `until`."""
    sent = 0
    while sent < n and time.monotonic() < until:
        try:
            sent += send(f"flood {sent}", control, wait=2.0)
        except OSError:         # the tracer is ending
            break
        tick()
    return sent


def scrape(port: int, until: float, done: list[int]) -> None:
    """GET /metrics back to back on one keep-alive connection (a new one when the server closes it)."""
    conn = None
    while time.monotonic() < until:
        try:
            conn = conn or http.client.HTTPConnection("127.0.0.1", port, timeout=5)
            conn.request("GET", "/metrics")
            conn.getresponse().read()
            done[0] += 1
        except (OSError, http.client.HTTPException):
            if conn:
                conn.close()
            conn = None
    if conn:
        conn.close()


def crowd(port: int, until: float, idle: int = 100, slow: int = 20) -> None:
    """`idle` connections that send nothing and `slow` ones sending an unfinished request a byte a second:
    each opened again when the server closes it (its header deadline)."""
    socks: dict[socket.socket, bytes] = {}

    def connect(todo: bytes) -> None:
        try:
            s = socket.create_connection(("127.0.0.1", port), timeout=1)
            s.setblocking(False)
            socks[s] = todo
        except OSError:
            pass

    slow_req = b"GET /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: " + b"a" * 4096
    for i in range(idle + slow):
        connect(slow_req if i >= idle else b"")
    while time.monotonic() < until:
        for s, todo in list(socks.items()):
            try:
                if s.recv(4096) == b"":     # closed by the server: open another in its place
                    raise ConnectionResetError
            except BlockingIOError:
                pass
            except OSError:
                s.close()
                del socks[s]
                connect(todo)
                continue
            if todo:
                try:
                    socks[s] = todo[s.send(todo[:1]):]
                except OSError:
                    pass
        time.sleep(1.0)
    for s in socks:
        s.close()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def serve_floods(seconds: float, interval: float, floods: list[Flood]) -> str | None:
    """`iotrace serve` scraped for `seconds` (after a warm-up of a fifth of them); None, or why it failed."""
    port = free_port()
    proc = subprocess.Popen([PYTHON, "-m", "tracer.cli", "serve", "--listen", f"127.0.0.1:{port}",
                             "--interval", str(interval)], cwd=ROOT, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True, env=without_sudo())
    try:
        deadline = time.monotonic() + 120
        while True:
            if proc.poll() is not None or time.monotonic() > deadline:
                return f"serve did not start: {proc.stderr.read().strip() if proc.poll() is not None else ''}"
            try:
                conn = http.client.HTTPConnection("127.0.0.1", port, timeout=1)
                conn.request("GET", "/ready")
                if conn.getresponse().status == 200:
                    break
            except OSError:
                pass
            time.sleep(0.1)
        server = [int(t) for t in Path(f"/proc/{proc.pid}/task/{proc.pid}/children").read_text().split()]
        if len(server) != 1:
            return f"serve has {len(server)} child processes, not its one /metrics server"
        pids = {"tracer": proc.pid, "server": server[0]}
        warm = seconds / 5
        until = time.monotonic() + warm + seconds
        done = [0]
        threads = [threading.Thread(target=crowd, args=(port, until), daemon=True)]
        threads += [threading.Thread(target=scrape, args=(port, until, done), daemon=True) for _ in range(8)]
        for t in threads:
            t.start()
        time.sleep(warm)        # bodies cached, the clients' buffers allocated
        flood = Flood("scrapes", pids)
        for t in threads:
            t.join(seconds + 30)
        flood.close(f"{seconds:.0f} s, {done[0]} scrapes by 8 clients beside 100 idle and 20 slow")
        floods.append(flood)
        proc.send_signal(signal.SIGINT)
        proc.wait(60)
        return None if proc.returncode == 0 else f"serve ended with {proc.returncode}: {proc.stderr.read()[-500:]}"
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--seconds", type=float, default=60, help="length of the run (default 60; 3600 for the hour)")
    p.add_argument("--interval", type=float, default=1.0, help="the tracer's -i (default 1 s)")
    p.add_argument("--json", metavar="FILE", help="also write the samples and the verdict as JSON")
    p.add_argument("--markers", type=int, default=10_000, metavar="N",
                   help="the marker flood's most markers (default 10,000; it also ends with its share of the time)")
    args = p.parse_args()
    if os.geteuid() != 0:
        print("soak: needs root (BPF, losetup): run it with sudo, or `make bench`", file=sys.stderr)
        return 2
    share = {name: args.seconds * part for name, part in SHARES}
    work = Path(tempfile.mkdtemp(prefix="iotrace-soak-", dir="/dev/shm"))
    backing = work / "disk.img"
    with open(backing, "wb") as f:
        os.posix_fallocate(f.fileno(), 0, 64 << 20)
    dev = subprocess.run(["losetup", "--find", "--show", str(backing)], check=True, capture_output=True,
                         text=True).stdout.strip()
    out = work / "soak.jsonl"
    tracer = None
    samples: list[tuple[float, float, float]] = []
    spawned = marked = 0
    floods: list[Flood] = []
    serve_error = None
    try:
        tracer = subprocess.Popen([PYTHON, "-m", "tracer.cli", "-i", str(args.interval), "-o", str(out),
                                   "--pid", str(os.getpid())],
                                  cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                                  env={**without_sudo(), ENV_RUN_DIR: str(work)})   # -o: root's scratch file
        if "tracing block I/O" not in tracer.stderr.readline():
            raise SystemExit(f"soak: the tracer did not start: {tracer.stderr.read().strip()}")
        control = str(work / f"{tracer.pid}{SOCKET_SUFFIX}")
        start = time.monotonic()
        next_sample = [start]

        def tick() -> None:
            now = time.monotonic()
            if now >= next_sample[0]:
                samples.append((round(now - start, 1), round(rss_mb(tracer.pid) or 0.0, 1),
                                round(rss_mb(tracer.pid, "RssAnon") or 0.0, 1)))
                next_sample[0] += 1.0

        rng = random.Random(1)
        pids = {"tracer": tracer.pid}
        for name, judged in (("warm-up", False), ("churn", True)):
            flood = Flood(name, pids, judged)
            n = churn(dev, time.monotonic() + share[name], rng, tick)
            spawned += n
            flood.close(f"{share[name]:.0f} s, {n} short-lived processes")
            floods.append(flood)
        flood = Flood("dumps", pids)
        n = steady_reads(dev, time.monotonic() + share["dumps"], tick)
        flood.close(f"{share['dumps']:.0f} s, a dump every {args.interval:g} s, {n} reads by one process")
        floods.append(flood)
        while not os.path.exists(control):      # bound once the programs are attached: long since
            time.sleep(0.05)
        flood = Flood("markers", pids)
        marked = send_markers(control, args.markers, time.monotonic() + share["markers"], tick)
        flood.close(f"{share['markers']:.0f} s, {marked} markers confirmed")
        floods.append(flood)
        tracer.send_signal(signal.SIGINT)
        tracer.wait(60)
        serve_error = serve_floods(share["scrapes"], args.interval, floods)
    finally:
        if tracer and tracer.poll() is None:
            tracer.kill()
        subprocess.run(["losetup", "-d", dev], check=False)
        # the dumps first, then the scratch directory, which goes whatever happened
        dumps = [json.loads(line) for line in out.read_text().splitlines() if line.strip()] if out.exists() else []
        shutil.rmtree(work, ignore_errors=True)

    traced_s = args.seconds - share["scrapes"]
    rss = [m for _, m, _ in samples]
    half = rss[len(rss) // 2:]
    growth = max(half) - half[0] if half else 0.0
    lost = {k: sum(d["dropped"].get(k, 0) for d in dumps) for k in ROOM_REASONS}
    expected = int(traced_s / args.interval)
    rows = [len(d["series"]) for d in dumps]
    verdict = {
        "seconds": args.seconds, "processes": spawned, "dumps": len(dumps), "expected_dumps_at_least": expected - 1,
        "rss_first_mb": rss[0] if rss else None, "rss_max_mb": max(rss) if rss else None,
        "growth_second_half_mb": round(growth, 1), "rows_per_dump_max": max(rows, default=0),
        "lost_for_room": lost, "skipped_by_kernel": sum(d["dropped"].get(r, 0) for d in dumps for r in USER_DROPS),
        "pid_filter_at_end": dumps[-1].get("traced_pids") if dumps else None,
        "rss_last_mb": rss[-1] if rss else None, "markers_sent": marked,
        "floods": [f.json() for f in floods], "serve_error": serve_error,
    }
    pid_filter = verdict["pid_filter_at_end"]
    ok = (bool(rss) and max(rss) < RSS_LIMIT_MB and growth < GROWTH_LIMIT_MB and not any(lost.values())
          and len(dumps) >= expected - 1 and pid_filter is not None and pid_filter <= PID_FILTER_LIMIT
          and len(floods) == len(SHARES) and all(f.ok for f in floods) and serve_error is None)
    for f in floods:
        print(f.line())
    if serve_error:
        print(f"soak: scrapes: {serve_error}")
    print(f"soak: {args.seconds:g} s, {spawned} short-lived processes, {len(dumps)} dumps; tracer resident "
          f"{verdict['rss_first_mb']} -> {rss[-1] if rss else None} MB (peak {verdict['rss_max_mb']}, "
          f"second half {growth:+.1f} MB; limits {RSS_LIMIT_MB} MB, +{GROWTH_LIMIT_MB} MB); "
          f"lost for lack of room: {sum(lost.values())}; pid filter at the end: {pid_filter} "
          f"(of {spawned + 1} traced); skipped by the kernel: {verdict['skipped_by_kernel']}; "
          f"markers confirmed: {marked}: {'ok' if ok else 'FAILED'}")
    if args.json:
        Path(args.json).write_text(json.dumps({"samples": samples, **verdict, "ok": ok}, indent=1))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
