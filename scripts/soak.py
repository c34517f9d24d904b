#!/usr/bin/env python3
"""A long run does not grow: the real tracer, steady I/O, processes coming and going.

Runs `iotrace -i INTERVAL --pid <this script>` while a churn of
short-lived readers (a new child every few milliseconds, each reading a
few blocks with O_DIRECT from a loop device over /dev/shm) keeps the
kernel's tables busy: every child joins the pid filter at its fork and
must leave it at its exit.  Samples the tracer's resident memory every
second.  Passes when the peak stays under 150 MB, the second half grows by
less than 5 MB, nothing was dropped for lack of room (full in-flight,
histogram, series or pid tables), the pid filter ends as small as it
began, and every interval's dump was written.

    sudo .venv/bin/python scripts/soak.py --seconds 3600   # the hour
    sudo .venv/bin/python scripts/soak.py --seconds 30     # what make bench runs
    sudo .venv/bin/python scripts/soak.py --seconds 300 --markers 10000
                                                           # and a marker flood meanwhile

--markers N sends N markers (distinct labels, each waiting for its dump, as
`iotrace mark` does) as fast as the tracer takes them, from the start; the
line at the end says how many were sent.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tracer.marker import ENV_RUN_DIR, SOCKET_SUFFIX, send  # noqa: E402
from tracer.sources.probe import USER_DROPS  # noqa: E402

PYTHON = str(ROOT / ".venv" / "bin" / "python") if (ROOT / ".venv").exists() else sys.executable
RSS_LIMIT_MB = 150
GROWTH_LIMIT_MB = 5
PID_FILTER_LIMIT = 10     # this script, and the few readers alive at the end
ROOM_REASONS = ("inflight_full", "hist_full", "series_full", "pid_full")


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


def send_markers(control: str, n: int, sent: list[int]) -> None:
    """n markers with distinct labels, each waiting for the tracer to close its dump; sent[0] counts them."""
    while not os.path.exists(control):      # bound once the programs are attached
        time.sleep(0.05)
    for i in range(n):
        try:
            confirmed = send(f"flood {i}", control, wait=2.0)
        except OSError:         # the tracer is ending
            return
        sent[0] += confirmed


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--seconds", type=float, default=60, help="length of the run (default 60; 3600 for the hour)")
    p.add_argument("--interval", type=float, default=1.0, help="the tracer's -i (default 1 s)")
    p.add_argument("--json", metavar="FILE", help="also write the samples and the verdict as JSON")
    p.add_argument("--markers", type=int, default=0, metavar="N",
                   help="also send N markers at full speed (a flood of distinct labels)")
    args = p.parse_args()
    if os.geteuid() != 0:
        print("soak: needs root (BPF, losetup): run it with sudo, or `make bench`", file=sys.stderr)
        return 2
    work = Path(tempfile.mkdtemp(prefix="iotrace-soak-", dir="/dev/shm"))
    backing = work / "disk.img"
    with open(backing, "wb") as f:
        os.posix_fallocate(f.fileno(), 0, 64 << 20)
    dev = subprocess.run(["losetup", "--find", "--show", str(backing)], check=True, capture_output=True,
                         text=True).stdout.strip()
    out = work / "soak.jsonl"
    tracer = None
    samples: list[tuple[float, float]] = []
    spawned = 0
    marked = [0]
    try:
        tracer = subprocess.Popen([PYTHON, "-m", "tracer.cli", "-i", str(args.interval), "-o", str(out),
                                   "--pid", str(os.getpid())],
                                  cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                                  env={**without_sudo(), ENV_RUN_DIR: str(work)})   # -o: root's scratch file
        if "tracing block I/O" not in tracer.stderr.readline():
            raise SystemExit(f"soak: the tracer did not start: {tracer.stderr.read().strip()}")
        if args.markers:
            control = str(work / f"{tracer.pid}{SOCKET_SUFFIX}")
            flood = threading.Thread(target=send_markers, args=(control, args.markers, marked), daemon=True)
            flood.start()
        start = time.monotonic()
        next_sample = start
        readers: list[subprocess.Popen] = []
        rng = random.Random(1)
        while (now := time.monotonic()) < start + args.seconds:
            # processes come and go: each reader is a new pid with its own series
            readers = [r for r in readers if r.poll() is None]
            if len(readers) < 8:
                readers.append(subprocess.Popen(
                    ["dd", f"if={dev}", "of=/dev/null", "bs=4k", f"count={rng.randint(1, 64)}",
                     f"skip={rng.randint(0, 16000)}", "iflag=direct", "status=none"]))
                spawned += 1
            if now >= next_sample:
                samples.append((round(now - start, 1), round(rss_mb(tracer.pid) or 0.0, 1),
                                round(rss_mb(tracer.pid, "RssAnon") or 0.0, 1)))
                next_sample += 1.0
            time.sleep(0.002)
        for r in readers:
            r.wait()
        tracer.send_signal(signal.SIGINT)
        tracer.wait(60)
    finally:
        if tracer and tracer.poll() is None:
            tracer.kill()
        subprocess.run(["losetup", "-d", dev], check=False)
        # the dumps first, then the scratch directory, which goes whatever happened
        dumps = [json.loads(line) for line in out.read_text().splitlines() if line.strip()] if out.exists() else []
        shutil.rmtree(work, ignore_errors=True)

    rss = [m for _, m, _ in samples]
    half = rss[len(rss) // 2:]
    growth = max(half) - half[0] if half else 0.0
    lost = {k: sum(d["dropped"].get(k, 0) for d in dumps) for k in ROOM_REASONS}
    expected = int(args.seconds / args.interval)
    rows = [len(d["series"]) for d in dumps]
    verdict = {
        "seconds": args.seconds, "processes": spawned, "dumps": len(dumps), "expected_dumps_at_least": expected - 1,
        "rss_first_mb": rss[0] if rss else None, "rss_max_mb": max(rss) if rss else None,
        "growth_second_half_mb": round(growth, 1), "rows_per_dump_max": max(rows, default=0),
        "lost_for_room": lost, "skipped_by_kernel": sum(d["dropped"].get(r, 0) for d in dumps for r in USER_DROPS),
        "pid_filter_at_end": dumps[-1].get("traced_pids") if dumps else None,
        "rss_last_mb": rss[-1] if rss else None, "markers_sent": marked[0],
    }
    pid_filter = verdict["pid_filter_at_end"]
    ok = (bool(rss) and max(rss) < RSS_LIMIT_MB and growth < GROWTH_LIMIT_MB and not any(lost.values())
          and len(dumps) >= expected - 1 and pid_filter is not None and pid_filter <= PID_FILTER_LIMIT)
    print(f"soak: {args.seconds:g} s, {spawned} short-lived processes, {len(dumps)} dumps; tracer resident "
          f"{verdict['rss_first_mb']} -> {rss[-1] if rss else None} MB (peak {verdict['rss_max_mb']}, "
          f"second half {growth:+.1f} MB; limits {RSS_LIMIT_MB} MB, +{GROWTH_LIMIT_MB} MB); "
          f"lost for lack of room: {sum(lost.values())}; pid filter at the end: {pid_filter} "
          f"(of {spawned + 1} traced); skipped by the kernel: {verdict['skipped_by_kernel']}"
          f"{f'; markers sent: {marked[0]} of {args.markers}' if args.markers else ''}: "
          f"{'ok' if ok else 'FAILED'}")
    if args.json:
        Path(args.json).write_text(json.dumps({"samples": samples, **verdict, "ok": ok}, indent=1))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
