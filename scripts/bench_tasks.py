"""What the per-process programs (bpf/tasks.bpf.c) cost per context switch and per syscall.

    sudo .venv/bin/python scripts/bench_tasks.py [--seconds 2] [--filter]

With kernel.bpf_stats_enabled on (restored after), loads tracer.sources.tasks.TaskTracer
(every process, or with --filter only this script's own process) and runs:
a pipe ping-pong between two processes (two context switches per round trip;
sched_switch and sched_wakeup run for every switch on the machine), reads of
a regular file (the read syscalls' tracepoints) and getppid() (a syscall no
program watches, but which takes the syscall-tracepoint slow path once any
syscall tracepoint is enabled).  Prints ns per program run from bpf_stats,
and the wall-clock cost per round trip / syscall against the same loop with
nothing loaded.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tracer.sources.tasks import TaskTracer  # noqa: E402

STATS = Path("/proc/sys/kernel/bpf_stats_enabled")


def pingpong(seconds: float) -> float:
    """ns per round trip of one byte between two processes over pipes."""
    a_r, a_w = os.pipe()
    b_r, b_w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(a_w)
        os.close(b_r)
        while os.read(a_r, 1):
            os.write(b_w, b"x")
        os._exit(0)
    os.close(a_r)
    os.close(b_w)
    n, t0 = 0, time.perf_counter()
    end = t0 + seconds
    while time.perf_counter() < end:
        for _ in range(200):
            os.write(a_w, b"x")
            os.read(b_r, 1)
        n += 200
    dt = time.perf_counter() - t0
    os.close(a_w)
    os.waitpid(pid, 0)
    os.close(b_r)
    return dt / n * 1e9


def syscalls(seconds: float, fn) -> float:
    n, t0 = 0, time.perf_counter()
    end = t0 + seconds
    while time.perf_counter() < end:
        for _ in range(1000):
            fn()
        n += 1000
    return (time.perf_counter() - t0) / n * 1e9


def run_all(seconds: float, fd: int) -> dict[str, float]:
    return {"pingpong_ns": pingpong(seconds),
            "pread_4k_ns": syscalls(seconds, lambda: os.pread(fd, 4096, 0)),
            "getppid_ns": syscalls(seconds, os.getppid)}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seconds", type=float, default=2.0)
    p.add_argument("--filter", action="store_true", help="trace only this process (the pid filter's path)")
    p.add_argument("--json", metavar="FILE")
    ns = p.parse_args()
    with tempfile.NamedTemporaryFile() as f:
        f.write(os.urandom(1 << 16))
        f.flush()
        fd = os.open(f.name, os.O_RDONLY)
        base = run_all(ns.seconds, fd)
        old = STATS.read_text().strip()
        STATS.write_text("1\n")
        try:
            tr = TaskTracer([os.getpid()] if ns.filter else [], True)
            try:
                before = tr.program_costs()
                traced = run_all(ns.seconds, fd)
                after = tr.program_costs()
            finally:
                tr.close()
        finally:
            STATS.write_text(old + "\n")
        os.close(fd)
    progs = {}
    for name, a in after.items():
        runs = a["runs"] - before[name]["runs"]
        if runs:
            spent = a["run_time_ns"] - before[name]["run_time_ns"]
            progs[name] = {"runs": runs, "ns_per_run": round(spent / runs, 1),
                           "missed": a["missed"] - before[name]["missed"]}
    result = {"filter": ns.filter, "untraced": base, "traced": traced,
              "added_ns": {k: round(traced[k] - base[k], 1) for k in base}, "programs": progs}
    print(f"mode: {'pid filter (this process)' if ns.filter else 'every process'}")
    for k in base:
        print(f"  {k:14s} untraced {base[k]:8.1f}  traced {traced[k]:8.1f}  added {traced[k] - base[k]:+7.1f} ns")
    for name, st in sorted(progs.items()):
        print(f"  {name:48s} {st['runs']:>10d} runs  {st['ns_per_run']:7.1f} ns/run  missed {st['missed']}")
    if ns.json:
        Path(ns.json).write_text(json.dumps(result, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
