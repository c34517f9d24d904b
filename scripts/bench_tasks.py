"""What the per-process programs (bpf/tasks.bpf.c) cost: by default (page-cache events) and with --tasks (syscalls).

    sudo .venv/bin/python scripts/bench_tasks.py [--seconds 1] [--rounds 5] [--filter] [--skips 10]

Costs: in each of --rounds rounds, runs the workloads with nothing loaded
("untraced"), with the default per-process programs ("default": reads,
misses and fsync from the page cache's and ext4's events, no syscall hook),
and with --tasks' programs timing syscalls on the syscalls' perf-event
tracepoints ("tracepoint", the fallback) and on raw sys_enter/sys_exit
("raw_tp"), in an order that rotates each round, loading
the programs afresh each time (every process traced, or with --filter only
this script's own process).  The workloads: a pipe ping-pong between two
processes (two context switches per round trip; sched_switch and
sched_wakeup run for every switch on the machine, and the pipe reads are
read syscalls, on no regular file), pread() of 4 KiB of a regular file (a
buffered read: a timed read on the syscall variants, one
mm_filemap_get_pages by default) and getppid() (a syscall no program
watches: on "tracepoint" it takes the syscall-tracepoint slow path, on
"raw_tp" the raw tracepoints' two programs return at their first compares,
by default nothing runs).  Reported per mode: the median
over rounds of traced/untraced of the same round, and of traced - untraced
in ns.  The wall-clock rounds run with kernel.bpf_stats_enabled off (the
stats themselves cost two clock reads per program run); one more pass per
mode with it on gives ns per program run, with two more workloads for the
default mode's other events: a cold read of 64 KiB (the file dropped from the
page cache first: mm_filemap_add_to_page_cache per folio) and a 4 KiB write
with fsync (ext4_sync_file_enter/exit; the file is on this script's
temporary directory: ext4 on the machines measured).

--skips S: the other cost of the perf-event variant.  Perf-event tracepoint
and kprobe programs share one per-CPU recursion guard (bpf_prog_active): an
event that fires on a CPU while any of them runs there is skipped.  With fio
reading a file on an ext4 on a loop device (O_DIRECT pread: every read a
block completion) for S seconds per mode, a perf-event program on
block:block_rq_complete counts completions; reported: its recursion_misses
and its count against the loop device's completed I/Os (/sys/block/*/stat).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from tracer.sources.tasks import TaskTracer
from tracer.testing import prog_stats

STATS = Path("/proc/sys/kernel/bpf_stats_enabled")
MODES = ("untraced", "default", "tracepoint", "raw_tp")

COUNTER = r"""
BPF_PERCPU_ARRAY(done, u64, 1);
TRACEPOINT_PROBE(block, block_rq_complete)
{
    u32 zero = 0;
    u64 *n;

    if (args->dev != LOOP_DEV)
        return 0;
    n = done.lookup(&zero);
    if (n)
        (*n)++;
    return 0;
}
"""


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


def workloads(fd: int) -> dict:
    return {"pingpong_ns": pingpong,
            "pread_4k_ns": lambda s: syscalls(s, lambda: os.pread(fd, 4096, 0)),
            "getppid_ns": lambda s: syscalls(s, os.getppid)}


def cold_read(fd: int) -> None:
    """64 KiB read after the file was dropped from the page cache: readahead adds its folios."""
    os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    os.pread(fd, 1 << 16, 0)


def fsync_4k(fd: int) -> None:
    os.pwrite(fd, b"x" * 4096, 0)
    os.fsync(fd)


def event_workloads(fd: int, wfd: int) -> dict:
    """The bpf_stats pass's workloads: the timed ones, and those that fire the default mode's other events."""
    return {**workloads(fd), "cold_read_64k_ns": lambda s: syscalls(s / 10, lambda: cold_read(fd)),
            "fsync_4k_ns": lambda s: syscalls(s / 100, lambda: fsync_4k(wfd))}


def run_all(seconds: float, fd: int) -> dict[str, float]:
    return {name: fn(seconds) for name, fn in workloads(fd).items()}


def load(mode: str, filtered: bool) -> TaskTracer:
    pids = [os.getpid()] if filtered else []
    if mode == "default":
        tr = TaskTracer(pids, True)
        missing = {k: v for k, v in tr.sources.items() if v.startswith("unavailable")}
        assert not missing, missing
        return tr
    tr = TaskTracer(pids, True, syscalls=mode, syscall_hooks=True)
    assert tr.syscalls == mode, (mode, tr.syscalls, tr.syscalls_note)
    return tr


def costs(ns: argparse.Namespace, fd: int) -> dict:
    per_round: list[dict[str, dict[str, float]]] = []
    for r in range(ns.rounds):
        order = MODES[r % len(MODES):] + MODES[:r % len(MODES)]
        got: dict[str, dict[str, float]] = {}
        for mode in order:
            tr = None if mode == "untraced" else load(mode, ns.filter)
            try:
                got[mode] = run_all(ns.seconds, fd)
            finally:
                if tr:
                    tr.close()
        per_round.append(got)
        print(f"  round {r + 1}: " + "  ".join(f"{m} " + "/".join(f"{v:.0f}" for v in got[m].values())
                                               for m in MODES), file=sys.stderr)
    keys = list(per_round[0]["untraced"])
    out: dict = {"untraced": {k: statistics.median(g["untraced"][k] for g in per_round) for k in keys}}
    for mode in MODES[1:]:
        out[mode] = {k: {"ratio": statistics.median(g[mode][k] / g["untraced"][k] for g in per_round),
                         "added_ns": statistics.median(g[mode][k] - g["untraced"][k] for g in per_round)}
                     for k in keys}
    out["rounds"] = per_round
    return out


def program_costs(ns: argparse.Namespace, fd: int, wfd: int) -> dict[str, dict[str, dict[str, dict]]]:
    """mode -> workload -> program -> its runs, ns per run and skips during that workload."""
    out: dict[str, dict[str, dict[str, dict]]] = {}
    old = STATS.read_text().strip()
    STATS.write_text("1\n")
    try:
        for mode in MODES[1:]:
            tr = load(mode, ns.filter)
            out[mode] = {}
            try:
                for work, fn in event_workloads(fd, wfd).items():
                    before = tr.program_costs()
                    fn(ns.seconds)
                    after = tr.program_costs()
                    progs = out[mode][work.removesuffix("_ns")] = {}
                    for name, a in after.items():
                        runs = a["runs"] - before[name]["runs"]
                        if runs:
                            spent = a["run_time_ns"] - before[name]["run_time_ns"]
                            progs[name.removeprefix("raw_tracepoint__").removeprefix("tracepoint__syscalls__")] = {
                                "runs": runs, "ns_per_run": round(spent / runs, 1),
                                "missed": a["missed"] - before[name]["missed"]}
            finally:
                tr.close()
    finally:
        STATS.write_text(old + "\n")
    return out


def _completed(dev: str) -> int:
    f = Path(f"/sys/block/{Path(dev).name}/stat").read_text().split()
    return int(f[0]) + int(f[4])     # reads and writes completed


def skips(ns: argparse.Namespace, workdir: Path) -> dict[str, dict[str, int]]:
    from tracer.testing import import_bcc

    bcc = import_bcc()
    img, mnt = workdir / "loop.img", workdir / "mnt"
    with open(img, "wb") as f:
        f.truncate(256 << 20)
    dev = subprocess.run(["losetup", "--find", "--show", "--direct-io=off", str(img)],
                         check=True, capture_output=True, text=True).stdout.strip()
    out: dict[str, dict[str, int]] = {m: {"completions": 0, "counted": 0, "recursion_misses": 0} for m in MODES}
    try:
        subprocess.run(["mkfs.ext4", "-q", "-F", "-E", "lazy_itable_init=0,lazy_journal_init=0", dev],
                       check=True, capture_output=True)
        mnt.mkdir()
        subprocess.run(["mount", "-o", "noatime", dev, str(mnt)], check=True, capture_output=True)
        st = os.stat(dev)
        # the tracepoint's dev is the kernel's dev_t: major << 20 | minor
        counter = bcc.BPF(text=COUNTER.replace("LOOP_DEV", str(os.major(st.st_rdev) << 20 | os.minor(st.st_rdev))))
        fn = counter.funcs[b"tracepoint__block__block_rq_complete"]
        fio = ["fio", "--name=skips", f"--directory={mnt}", "--size=32m", "--rw=randread", "--bs=4k",
               "--direct=1", "--ioengine=psync", "--numjobs=4", "--time_based", f"--runtime={ns.skips}",
               "--group_reporting", "--output-format=terse"]
        subprocess.run([*fio[:-3], "--runtime=1"], check=True, capture_output=True)     # lays the files out
        for r in range(ns.skip_rounds):
            for mode in MODES[r % len(MODES):] + MODES[:r % len(MODES)]:
                tr = None if mode == "untraced" else load(mode, False)
                try:
                    c0, s0, d0 = sum(counter["done"][0]), prog_stats(fn.fd).recursion_misses, _completed(dev)
                    subprocess.run(fio, check=True, capture_output=True)
                    c1, s1, d1 = sum(counter["done"][0]), prog_stats(fn.fd).recursion_misses, _completed(dev)
                finally:
                    if tr:
                        tr.close()
                out[mode]["completions"] += d1 - d0
                out[mode]["counted"] += c1 - c0
                out[mode]["recursion_misses"] += s1 - s0
                print(f"  skips round {r + 1} {mode}: completions {d1 - d0} counted {c1 - c0} "
                      f"recursion_misses {s1 - s0}", file=sys.stderr)
        counter.cleanup()
    finally:
        subprocess.run(["umount", str(mnt)], capture_output=True)
        subprocess.run(["losetup", "-d", dev], capture_output=True)
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seconds", type=float, default=1.0, help="per workload and mode, each round")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--filter", action="store_true", help="trace only this process (the pid filter's path)")
    p.add_argument("--skips", type=float, default=0, metavar="S",
                   help="also the perf-event block program's skips: S seconds of fio per mode and round")
    p.add_argument("--skip-rounds", type=int, default=3)
    p.add_argument("--json", metavar="FILE")
    ns = p.parse_args()
    result: dict = {"filter": ns.filter, "seconds": ns.seconds, "rounds": ns.rounds}
    with tempfile.TemporaryDirectory(prefix="bench_tasks.") as tmp:
        data = Path(tmp) / "data"
        data.write_bytes(os.urandom(1 << 16))
        fd = os.open(data, os.O_RDONLY)
        # the fsync workload's file: in the current directory (the checkout: a real disk), not a tmpfs /tmp
        wfd, wpath = tempfile.mkstemp(prefix=".bench_tasks.", dir=os.getcwd())
        try:
            result["costs"] = costs(ns, fd)
            result["programs"] = program_costs(ns, fd, wfd)
        finally:
            os.close(fd)
            os.close(wfd)
            os.unlink(wpath)
        if ns.skips:
            result["skips"] = skips(ns, Path(tmp))
    if ns.json:
        Path(ns.json).write_text(json.dumps(result, indent=1) + "\n")
    c = result["costs"]
    print(f"mode: {'pid filter (this process)' if ns.filter else 'every process'}; medians of {ns.rounds} rounds")
    for k, base in c["untraced"].items():
        line = f"  {k:12s} untraced {base:8.1f} ns"
        for mode in MODES[1:]:
            line += f"  {mode} x{c[mode][k]['ratio']:.3f} ({c[mode][k]['added_ns']:+7.1f} ns)"
        print(line)
    for mode, works in result["programs"].items():
        print(f"  {mode}, bpf_stats ns per program run (runs) during each workload:")
        for work, progs in works.items():
            print(f"    {work:10s} " + "  ".join(f"{name} {st['ns_per_run']:.0f} ({st['runs']})"
                                               for name, st in sorted(progs.items())))
    for mode, s in result.get("skips", {}).items():
        print(f"  skips, {mode:10s}: loop completions {s['completions']}, counted by the perf-event program "
              f"{s['counted']}, its recursion_misses {s['recursion_misses']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
