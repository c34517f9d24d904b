"""test_serve: the tests that load BPF programs (need root).

The rest, and the helpers both share, are in tests/unit/test_serve.py.
"""

from __future__ import annotations

import csv
import http.client
import json
import mmap
import os
import selectors
import signal
import socket
import subprocess
import sys
import threading
import time

import numpy as np
import pytest
from conftest import PYTHON, ROOT, reaped
from unit.test_serve import (
    by_comm,
    children_of,
    exposition,
    free_port,
    get,
    gone,
)

from tracer.sinks import prometheus as serve

sys.path.insert(0, str(ROOT / "scripts"))
from soak import rss_mb, scrape  # noqa: E402 - the soak's scrape flood, the same clients


@pytest.mark.bpf
def test_real_serve_goes_from_0_to_1_and_ready():
    port = free_port()
    proc = subprocess.Popen([PYTHON, "-m", "tracer.cli", "serve", "--listen", f"127.0.0.1:{port}", "--interval", "1"],
                            cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    states = []     # (/ready status, attached) of each round that answered, in order; /ready asked first
    with reaped(proc):
        deadline = time.monotonic() + 120
        while not states or states[-1] != (200, 1):
            assert proc.poll() is None and time.monotonic() < deadline, states
            ready = get(port, serve.READY_PATH)[0]
            code, text = get(port, "/metrics")
            if ready and code == 200:
                states.append((ready, exposition(text)[(serve.ATTACHED, ())]))
            time.sleep(0.05)
        proc.send_signal(signal.SIGTERM)
        proc.communicate(timeout=60)
    assert proc.returncode == 0
    # not ready (503) until attached; attached goes from 0 to 1 and never back
    assert (200, 0) not in states and {r for r, _ in states} <= {200, 503}, states
    attached = [a for _, a in states]
    assert attached == sorted(attached) and attached[-1] == 1


@pytest.mark.bpf
@pytest.mark.parametrize("how", ["SIGTERM", "SIGKILL"])
def test_real_serves_server_process_ends_with_it(how):
    """/metrics is answered by a process of serve's own (tracer.sinks.promserver): it is gone once serve has
    exited, whether serve ended normally (SIGTERM: its final dump, then the server) or was killed."""
    port = free_port()
    proc = subprocess.Popen([PYTHON, "-m", "tracer.cli", "serve", "--listen", f"127.0.0.1:{port}", "--interval", "1"],
                            cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    with reaped(proc):
        deadline = time.monotonic() + 120
        while get(port, serve.READY_PATH)[0] != 200:
            assert proc.poll() is None and time.monotonic() < deadline, proc.stderr.read() if proc.poll() else ""
            time.sleep(0.1)
        servers = children_of(proc.pid)
        assert len(servers) == 1, servers
        proc.send_signal(getattr(signal, how))
        _, stderr = proc.communicate(timeout=60)
    assert proc.returncode == (0 if how == "SIGTERM" else -signal.SIGKILL), stderr
    assert gone(servers[0]), f"serve's server process {servers[0]} outlived it ({how})"
    assert get(port, "/metrics")[0] == 0


@pytest.mark.bpf
def test_real_serve_writes_jsonl_csv_and_alerts_through_the_trace_modes_sinks(loop, tmp_path):
    """serve takes -o, --csv, --alert and --fail-on-alert as trace mode does: each interval folded into the
    metrics is also a JSON line carrying its alerts and CSV rows beside iostat's columns; exit 3 at the end."""
    out, csv_path = tmp_path / "fold.jsonl", tmp_path / "io.csv"
    port = free_port()
    proc = subprocess.Popen([PYTHON, "-m", "tracer.cli", "serve", "--listen", f"127.0.0.1:{port}", "--interval", "1",
                             "--dev", loop.name, "-o", str(out), "--csv", str(csv_path), "--alert", "p99>1ns",
                             "--fail-on-alert"], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    with reaped(proc):
        deadline = time.monotonic() + 120
        while get(port, serve.READY_PATH)[0] != 200:
            assert proc.poll() is None and time.monotonic() < deadline, proc.stderr.read() if proc.poll() else ""
            time.sleep(0.1)
        # O_DIRECT: one request per read (a buffered read's readahead may still hold the next page locked
        # when POSIX_FADV_DONTNEED runs, and the next read then finds it cached)
        fd, buf = os.open(loop.path, os.O_RDONLY | os.O_DIRECT), mmap.mmap(-1, 4096)
        try:
            for i in range(64):
                os.preadv(fd, [buf], i * 8192)
        finally:
            os.close(fd)
        time.sleep(2.5)
        proc.send_signal(signal.SIGTERM)
        _, stderr = proc.communicate(timeout=60)
    assert proc.returncode == 3, stderr
    dumps = [json.loads(line) for line in out.read_text().splitlines()]
    assert dumps[-1]["kind"] == "final" and len(dumps) >= 2
    reads = sum(s["count"] for d in dumps for s in d["series"] if s["device"] == loop.name and s["op"] == "read")
    # a request the kernel completed without firing block_rq_complete is counted, never silent (docs/design.md)
    lost = sum(d["dropped"]["lost_completion"] for d in dumps)
    assert reads + lost >= 64 and reads >= 60, (reads, lost)
    fired = [a for d in dumps for a in d.get("alerts", [])]
    assert fired and all(a["device"] == loop.name for a in fired)
    assert "iotrace: alert:" in stderr and "exit 3 (--fail-on-alert)" in stderr
    with open(csv_path) as f:
        rows = list(csv.DictReader(f))
    mine = [r for r in rows if r["device"] == loop.name and r["op"] == "read"]
    assert sum(int(r["count"]) for r in mine) == reads and all(r["r/s"] != "" for r in mine)


def _evict(path) -> None:
    """`path` written back and dropped from the page cache: the next buffered read of it comes from the disk."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


@pytest.mark.bpf
def test_real_serve_exports_a_readers_task_counters(tmp_path):
    from tracer.sinks import taskmetrics

    data = tmp_path / "data.bin"
    data.write_bytes(np.random.default_rng(1).bytes(8 << 20))
    port = free_port()
    # --top 500: dd keeps labels of its own even when other processes on a busy machine do more I/O
    proc = subprocess.Popen([PYTHON, "-m", "tracer.cli", "serve", "--tasks", "--listen", f"127.0.0.1:{port}",
                             "--interval", "0.5", "--top", "500"], cwd=ROOT, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    names = {field: name for field, name, _ in taskmetrics.FIELDS}
    READ, DISK, IOW = names["read_bytes"], names["disk_read_bytes"], names["io_wait_s"]
    with reaped(proc):
        deadline = time.monotonic() + 120
        while get(port, serve.READY_PATH)[0] != 200:
            assert proc.poll() is None and time.monotonic() < deadline, proc.stderr.read() if proc.poll() else ""
            time.sleep(0.1)
        # out of the page cache first: every byte from the disk, in a buffered reader of our own name (the
        # default per-process rows count the page cache's reads; O_DIRECT is not in them)
        _evict(data)
        reader = subprocess.run(["dd", f"if={data}", "of=/dev/null", "bs=256k", "status=none"])
        assert reader.returncode == 0
        got = {}
        while time.monotonic() < deadline:
            time.sleep(0.6)
            s = exposition(get(port, "/metrics")[1])
            got = {name: by_comm(s, name).get(("dd", ""), 0) for name in (READ, DISK, IOW)}
            if got[READ] >= 8 << 20 and got[DISK] >= 8 << 20:
                break
        proc.send_signal(signal.SIGTERM)
        proc.communicate(timeout=60)
    assert proc.returncode == 0
    assert got[READ] >= 8 << 20 and got[DISK] >= 8 << 20, got
    assert got[IOW] > 0, got


@pytest.mark.bpf
def test_a_reader_between_the_two_drains_of_a_cut_keeps_its_own_task_counters(ext4_mnt, tmp_path):
    """A cut drains the per-process counters and the block-I/O probe one after the other.  A reader that runs
    start to end between the two (a drain can take a few hundred ms under load) must have its counters in the
    same window as its block I/O or in a later one, never an earlier: serve labels a process by its block I/O,
    so counters a window ahead went to comm="other" for good (the test above, flaky under load, read 0)."""
    import shutil

    from tracer.pipeline.windows import DumpWindows
    from tracer.sinks import taskmetrics
    from tracer.sources.devices import device_filter
    from tracer.sources.probe import Probe, ProbeOptions
    from tracer.sources.tasks import TaskTracer

    loop, mnt = ext4_mnt
    data = mnt / "data.bin"
    data.write_bytes(np.random.default_rng(2).bytes(1 << 20))
    os.sync()
    reader = tmp_path / "iotrace-gap"       # its comm
    shutil.copy("/usr/bin/dd", reader)
    probe = Probe(ProbeOptions(devs=device_filter([loop.path])))
    try:
        tasks = TaskTracer()
        try:
            windows = DumpWindows(probe, tasks)
            windows.start()
            exporter = serve.Exporter(top=500)
            counters = taskmetrics.TaskCounters(exporter)

            def fold() -> None:
                d = windows.build(windows.cut(), "interval")
                exporter.fold(d)
                counters.fold(d)

            fold()
            ran = []
            for source in (probe, tasks):      # whichever the cut drains first, the reader runs right after it
                def drain(*args, _drain=source.drain, **kwargs):
                    out = _drain(*args, **kwargs)
                    if not ran:
                        _evict(data)
                        ran.append(subprocess.run([str(reader), f"if={data}", "of=/dev/null", "bs=256k",
                                                   "status=none"]).returncode)
                    return out
                source.drain = drain
            fold()      # the reader runs inside this cut
            fold()      # what of it the cut's second drain did not see
        finally:
            tasks.close()
    finally:
        probe.close()
    assert ran == [0]
    fields = [f for f, _, _ in taskmetrics.FIELDS]
    mine = {ctr: dict(zip(fields, values, strict=True)) for comm, ctr, values in counters.snapshot()
            if comm == "iotrace-gap"}
    assert len(mine) == 1, counters.snapshot()
    got = next(iter(mine.values()))
    assert got["read_bytes"] >= 1 << 20 and got["disk_read_bytes"] >= 1 << 20, got
    assert got["io_wait_s"] > 0, got


# ---- a scrape is answered whatever other clients do (issue 32) ----

class Crowd:
    """Other clients of the port, in one thread of their own: `idle` connections that send nothing, each closed
    and opened again every `reopen_s` (the issue's 300 every 8 s), and `slow` ones sending a request that never
    ends, a byte a second, each opened again at once when the server closes it.  All from 127.0.0.1, as the
    scraper: the server cannot tell them apart by address.  Bounded: it stops by itself after `limit_s`."""

    def __init__(self, port: int, idle: int = 300, slow: int = 50, reopen_s: float = 8.0, limit_s: float = 60.0):
        self.port, self.idle, self.slow, self.reopen_s, self.limit_s = port, idle, slow, reopen_s, limit_s
        self.sel = selectors.DefaultSelector()
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, name="crowd", daemon=True)
        self.opened = 0         # connections made
        self.closed_by_server = 0
        self.slow_bytes = 0
        self.error: BaseException | None = None       # what ended the thread early, if anything
        self.state: dict[socket.socket, dict] = {}
        self.waiting: list[tuple[tuple[str, int], float]] = []     # idle slots closed by the server: when to reopen

    def __enter__(self) -> Crowd:
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop.set()
        self.thread.join(timeout=30)
        assert not self.thread.is_alive()

    def _open(self, slot: tuple[str, int], now: float) -> None:
        s = socket.socket()
        s.setblocking(False)
        s.connect_ex(("127.0.0.1", self.port))
        self.opened += 1
        # a slow client's request: valid so far, never finished
        todo = b"GET /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\n" + b"X-Slow: " + b"a" * 4096 if slot[0] == "slow" else b""
        self.state[s] = {"slot": slot, "since": now, "next": now + 1.0, "todo": todo, "up": False}
        self.sel.register(s, selectors.EVENT_READ | selectors.EVENT_WRITE)

    def _drop(self, s: socket.socket) -> dict:
        self.sel.unregister(s)
        s.close()
        return self.state.pop(s)

    def _run(self) -> None:
        start = time.monotonic()
        try:
            for i in range(self.idle):
                self._open(("idle", i), start)
            for i in range(self.slow):
                self._open(("slow", i), start)
            while not self.stop.is_set() and time.monotonic() - start < self.limit_s:
                now = time.monotonic()
                for key, ev in self.sel.select(timeout=0.05):
                    s, st = key.fileobj, self.state.get(key.fileobj)
                    if st is None:
                        continue
                    if ev & selectors.EVENT_WRITE and not st["up"]:
                        st["up"] = not s.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)
                        self.sel.modify(s, selectors.EVENT_READ)
                    if ev & selectors.EVENT_READ:
                        try:
                            data = s.recv(65536)
                        except OSError:
                            data = b""
                        if not data:        # the server closed it (or reset it): open another at once
                            self.closed_by_server += 1
                            slot = self._drop(s)["slot"]
                            if slot[0] == "slow":
                                self._open(slot, now)
                            else:
                                self.waiting.append((slot, st["since"] + self.reopen_s))
                for s, st in list(self.state.items()):
                    if st["slot"][0] == "idle" and now - st["since"] >= self.reopen_s:
                        self._drop(s)
                        self._open(st["slot"], now)
                    elif st["slot"][0] == "slow" and st["up"] and st["todo"] and now >= st["next"]:
                        st["next"] = now + 1.0
                        try:
                            self.slow_bytes += s.send(st["todo"][:1])
                            st["todo"] = st["todo"][1:]
                        except OSError:
                            pass
                for item in [w for w in self.waiting if now >= w[1]]:
                    self.waiting.remove(item)
                    self._open(item[0], now)
        except BaseException as exc:  # noqa: BLE001 - the test says so, rather than pass without a crowd
            self.error = exc
        finally:
            for s in list(self.state):
                self._drop(s)
            self.sel.close()


def started_serve(interval: str) -> tuple[int, subprocess.Popen]:
    """(port, process) of a real `iotrace serve --interval INTERVAL` on a free port, once it says it is ready."""
    port = free_port()
    proc = subprocess.Popen([PYTHON, "-m", "tracer.cli", "serve", "--listen", f"127.0.0.1:{port}",
                             "--interval", interval], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    deadline = time.monotonic() + 120
    while get(port, serve.READY_PATH)[0] != 200:
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            _, err = proc.communicate()
            pytest.fail(f"serve did not become ready: {err[-2000:]}")
        time.sleep(0.1)
    return port, proc


def scrape_within(port: int, seconds: float, timeout_s: float = 1.0) -> tuple[list[float], list[str]]:
    """GET /metrics every 0.2 s for `seconds`: each one's time (s) from connecting to its last byte, and what
    went wrong with those that were not a whole 200 within `timeout_s`."""
    times, failures = [], []
    until = time.monotonic() + seconds
    while time.monotonic() < until:
        t = time.monotonic()
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout_s)
        try:
            conn.request("GET", "/metrics")
            r = conn.getresponse()
            body = r.read()
            took = time.monotonic() - t
            if r.status != 200 or b"iotrace_drains_total" not in body:
                failures.append(f"{r.status} {body[:80]!r}")
            elif took > timeout_s:
                failures.append(f"took {took:.2f} s")
            times.append(took)
        except OSError as exc:
            failures.append(f"after {time.monotonic() - t:.2f} s: {exc!r}")
        finally:
            conn.close()
        time.sleep(max(0.0, 0.2 - (time.monotonic() - t)))
    return times, failures


@pytest.mark.parametrize("interval", ["60", "1"], ids=["quiet", "draining-every-second"])
def test_every_scrape_is_answered_within_1s_beside_idle_and_slow_clients(interval):
    """300 idle connections opened again every 8 s and 50 sending a byte a second, beside a scraper: for 20 s
    every scrape is a whole 200 within 1 s, no reset (before: the server held 256 connections, each up to
    10 s, and closed a new one unanswered: a reset), also while serve drains every second (-i 1)."""
    port, proc = started_serve(interval)
    with reaped(proc):
        with Crowd(port) as crowd:
            time.sleep(1.0)         # the crowd in place first
            times, failures = scrape_within(port, 20.0)
        drains = exposition(get(port, "/metrics")[1])[(serve.DRAINS, ())]
        proc.send_signal(signal.SIGTERM)
        _, stderr = proc.communicate(timeout=60)
    assert proc.returncode == 0, stderr
    # the crowd was there: its connections came and went, the slow ones did send
    assert crowd.error is None and crowd.opened >= 350 and crowd.slow_bytes >= 50, vars(crowd)
    assert len(times) + len(failures) >= 50
    assert not failures, f"{len(failures)} of {len(times) + len(failures)} scrapes failed: {failures[:5]}"
    if interval == "1":
        assert drains >= 15     # it did drain meanwhile


# ---- a scrape flood leaves serve's memory bounded (issue 32, item 3) ----

SCRAPE_FLOOD_S = 30
SCRAPERS = 16
# Measured on this VM (-i 1, 16 scrapers back to back beside 300 idle and 50 slow clients, 30 s, 29,968
# scrapes): the tracer 80.0 -> 83.2 MB, its server process 28.8 -> 31.6 MB from 5 s in to the end.
SCRAPE_GROWTH_MB = {"tracer": 8.0, "server": 8.0}


def test_a_scrape_flood_leaves_the_tracer_and_its_server_bounded():
    """16 clients scraping back to back, beside 300 idle and 50 slow ones, for 30 s while serve drains every
    second: neither the tracer nor its /metrics server process grows past a few MB from 5 s in to the end."""
    port, proc = started_serve("1")
    with reaped(proc):
        (server,) = children_of(proc.pid)
        pids = {"tracer": proc.pid, "server": server}
        with Crowd(port, limit_s=SCRAPE_FLOOD_S + 15) as crowd:
            until = time.monotonic() + SCRAPE_FLOOD_S
            done = [0]
            threads = [threading.Thread(target=scrape, args=(port, until, done), daemon=True)
                       for _ in range(SCRAPERS)]
            for t in threads:
                t.start()
            time.sleep(5)       # the warm-up: bodies cached, the crowd's buffers allocated
            warm = {k: rss_mb(p) for k, p in pids.items()}
            for t in threads:
                t.join(SCRAPE_FLOOD_S + 10)
            end = {k: rss_mb(p) for k, p in pids.items()}
        proc.send_signal(signal.SIGTERM)
        _, stderr = proc.communicate(timeout=60)
    print(f"scrapes {done[0]}; RSS MB after 5 s {warm}, at the end {end}")
    assert proc.returncode == 0, stderr
    assert crowd.error is None and done[0] >= 1000, (done, vars(crowd))
    for k, bound in SCRAPE_GROWTH_MB.items():
        assert end[k] - warm[k] <= bound, f"{k}: RSS {warm[k]:.1f} MB after 5 s of scrapes, {end[k]:.1f} at the end"
