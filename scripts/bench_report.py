#!/usr/bin/env python3
"""What `iotrace report` costs on a big file: time and peak RSS of report, report --by label, diff and plot.

A synthetic .jsonl of --mb megabytes (default 200, ~70k dumps as a long
`iotrace -i 0.1` run with markers writes them) is written into a temporary
directory: dumps built with the model's own types (tracer.model.dump,
histograms from log-normal latencies) and written with the codec
(tracer.codec.jsonl), a few dozen distinct dumps repeated with new times,
labels and pids, so that the file holds many series rows per label, as a
real run's does.  Each command runs in its own subprocess; its peak RSS is
that child's ru_maxrss (os.wait4).  Target: report of a 200 MB file in under
300 MB peak RSS (TARGET_RSS_MB, scaled to --mb).  No root needed.

  scripts/bench_report.py [--mb 200] [--json FILE] [--keep FILE.jsonl] [--plot]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import numpy as np

from tracer.codec import jsonl
from tracer.model.dump import Dump, PhaseStats, Series
from tracer.model.histogram import Histogram
from tracer.model.sections import Attach

ROOT = Path(__file__).resolve().parent.parent

TARGET_RSS_MB = 300     # for 200 MB of dumps
TEMPLATES = 48
COMMS = ("python", "python", "pt_data_worker", "kworker/u8:1", "kworker/u8:3", "fio", "jbd2/loop0-8")
DEVICES = (("loop0", "7:0"), ("loop1", "7:1"), ("nvme0n1", "259:0"))
EPOCHS = 40             # distinct labels


def _phase(rng, n: int, median_us: float) -> PhaseStats:
    ns = np.maximum(rng.lognormal(np.log(median_us * 1e3), 0.6, n), 1).astype(np.int64)
    return PhaseStats(Histogram.from_values(ns), float(ns.sum()), int(ns.min()), int(ns.max()))


def _series(rng, pid: int) -> Series:
    comm = COMMS[int(rng.integers(len(COMMS)))]
    device, devno = DEVICES[int(rng.integers(len(DEVICES)))]
    op = ("read", "write")[int(rng.integers(2))]
    n = int(rng.integers(20, 400))
    med = float(rng.uniform(50, 2000))
    phases = {"total": _phase(rng, n, med), "queue": _phase(rng, n, med / 10), "device": _phase(rng, n, med * 0.9)}
    return Series(pid, comm, device, devno, op, n, n * 4096 * int(rng.integers(1, 8)), phases, pid)


def templates(rng) -> list[dict]:
    """Distinct dumps as JSON objects: 1 to 4 series each."""
    t0 = datetime(2026, 1, 1, tzinfo=UTC)
    out = []
    for _ in range(TEMPLATES):
        series = [_series(rng, int(rng.integers(1000, 1100))) for _ in range(int(rng.integers(1, 5)))]
        d = Dump("interval", t0, t0 + timedelta(seconds=0.1), "benchhost", "6.1.0", series,
                 dropped={"map_full": 0}, events={}, attach=Attach("raw_tp"))
        out.append(jsonl.to_json(d))
    return out


def write_file(path: Path, mb: float, seed: int = 1) -> int:
    """About `mb` MB of dumps at `path`; returns how many."""
    rng = np.random.default_rng(seed)
    tpl = templates(rng)
    t0 = datetime(2026, 1, 1, tzinfo=UTC)
    target, size, n = mb * 1e6, 0, 0
    with open(path, "w") as f:
        while size < target:
            obj = dict(tpl[n % len(tpl)])
            start = t0 + timedelta(seconds=0.1 * n)
            obj["start"], obj["end"] = start.isoformat(), (start + timedelta(seconds=0.1)).isoformat()
            # every 20th dump closes a marked window: labelled, with the loop's timing and a tasks row
            if n % 20 == 19:
                epoch = (n // 20) % EPOCHS
                obj.update(kind="marker", label=f"epoch {epoch}", enclosing=None,
                           loop={"data_wait_s": 0.25, "steps": 10, "wall_s": 2.0}, sender_pid=1000,
                           tasks=[{"pid": 1000, "ppid": 1, "comm": "python", "io_wait_s": 0.125, "io_waits": 3,
                                   "read_bytes": 1 << 20, "reads": 8, "disk_read_bytes": 1 << 19, "fsync_s": 0.0,
                                   "fsyncs": 0, "throttled_s": 0.0, "throttles": 0, "started": False,
                                   "exited": False}])
            # pids drift over the run (loader workers restarted): rows per pid grow, rows per name do not
            obj["series"] = [{**s, "pid": s["pid"] + 100 * (n // 5000)} for s in obj["series"]]
            line = json.dumps(obj, separators=(",", ":")) + "\n"
            f.write(line)
            size += len(line)
            n += 1
    return n


def measure(argv: list[str]) -> dict:
    """Run `iotrace ARGV` in a child; its wall time and peak RSS."""
    t = time.perf_counter()
    proc = subprocess.Popen([sys.executable, "-m", "tracer.cli", *argv], cwd=ROOT, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE)
    out, err = b"", b""
    # read before waiting, so a big output cannot block the child; then wait4 for its own rusage
    out, err = proc.stdout.read(), proc.stderr.read()
    _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    seconds = time.perf_counter() - t
    if proc.returncode:
        raise SystemExit(f"iotrace {' '.join(argv)} failed ({proc.returncode}): {err.decode()[-2000:]}")
    return {"argv": argv, "seconds": round(seconds, 2), "peak_rss_mb": round(usage.ru_maxrss / 1024, 1),
            "output_bytes": len(out)}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--mb", type=float, default=200.0, help="size of the synthetic file (default 200)")
    p.add_argument("--json", metavar="FILE", help="also write the results here")
    p.add_argument("--keep", metavar="FILE.jsonl", help="write the synthetic file here and keep it")
    p.add_argument("--plot", action="store_true", help="also time `iotrace plot` (needs matplotlib)")
    ns = p.parse_args()
    with tempfile.TemporaryDirectory(prefix="iotrace-bench-report-") as tmp:
        path = Path(ns.keep) if ns.keep else Path(tmp) / "big.jsonl"
        t = time.perf_counter()
        dumps = write_file(path, ns.mb)
        mb = path.stat().st_size / 1e6
        print(f"wrote {path}: {mb:.0f} MB, {dumps} dumps ({time.perf_counter() - t:.0f} s)", flush=True)
        runs = [["report", str(path)], ["report", str(path), "--by", "label"],
                ["diff", str(path), "--labels", "epoch 1", "epoch 2"]]
        if ns.plot:
            runs.append(["plot", str(path), "-o", str(Path(tmp) / "big.png")])
        results = []
        for argv in runs:
            r = measure(argv)
            results.append(r)
            print(f"  iotrace {' '.join(a if a != str(path) else 'FILE' for a in argv)}: {r['seconds']:.1f} s, "
                  f"peak RSS {r['peak_rss_mb']:.0f} MB", flush=True)
    target = TARGET_RSS_MB * max(ns.mb, 1.0) / 200 if ns.mb > 200 else TARGET_RSS_MB
    ok = all(r["peak_rss_mb"] < target for r in results[:2])
    print(f"report and report --by label under {target:.0f} MB peak RSS: {'ok' if ok else 'MISSED'}")
    if ns.json:
        Path(ns.json).write_text(json.dumps({"file_mb": round(mb, 1), "dumps": dumps, "target_rss_mb": target,
                                             "ok": ok, "runs": results}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
