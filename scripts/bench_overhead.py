#!/usr/bin/env python3
"""What tracing costs the traced: fio IOPS and latency under iotrace and its peers.

On a fast request-based device (a loop device over a file in /dev/shm),
fio random 4 KiB reads with direct=1 run under: no tracer (the baseline),
iotrace, bpftrace running an equivalent per-(pid, device) latency
histogram, and blktrace recording to /dev/shm where it can run; and, to
show where the cost lies, two floors: "empty" (bcc programs that return at
once on the three tracepoints) and "floor" (bpftrace reading the clock
there).  Runs are
interleaved (each repetition runs every tracer once, in a rotating order),
and each tracer's IOPS is divided by the baseline's *of the same
repetition*, so slow drifts of this noisy VM cancel out.  The table shows
the median of those ratios and their spread (min..max).

A separate pass with kernel.bpf_stats_enabled=1 reads each iotrace BPF
program's cost per event from the kernel's own statistics; it is kept out
of the IOPS runs because the statistics themselves cost a little.

    sudo .venv/bin/python scripts/bench_overhead.py            # make bench
    sudo .venv/bin/python scripts/bench_overhead.py --quick    # a smoke run
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import select
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PYTHON = str(ROOT / ".venv" / "bin" / "python") if (ROOT / ".venv").exists() else sys.executable
BACKING_MB = 256

# The bpftrace peer: the same question iotrace answers (latency per pid and device, from the
# request's start to its completion), written the way a bpftrace user would.
BPFTRACE_PROG = r"""
tracepoint:block:block_io_start { @start[args->dev, args->sector] = nsecs; @who[args->dev, args->sector] = pid; }
tracepoint:block:block_rq_complete /@start[args->dev, args->sector]/ {
    @usecs[@who[args->dev, args->sector], args->dev] = hist((nsecs - @start[args->dev, args->sector]) / 1000);
    delete(@start[args->dev, args->sector]); delete(@who[args->dev, args->sector]);
}
"""


# The floor: programs on the same three tracepoints that only read the clock, which any latency
# tracer must do; what iotrace costs beyond this is its own work.
FLOOR_PROG = r"""
tracepoint:block:block_io_start, tracepoint:block:block_rq_issue, tracepoint:block:block_rq_complete {
    $t = nsecs; if ($t == 1) { printf("never\\n"); }
}
"""


@dataclass(frozen=True)
class Workload:
    name: str
    iodepth: int
    jobs: int

    def fio_args(self, device: str, seconds: float) -> list[str]:
        return ["fio", f"--name={self.name}", f"--filename={device}", "--rw=randread", "--bs=4k", "--direct=1",
                "--ioengine=libaio", f"--iodepth={self.iodepth}", f"--numjobs={self.jobs}", "--group_reporting",
                "--time_based", f"--runtime={seconds}", "--ramp_time=1", "--norandommap", "--randrepeat=0",
                "--output-format=json"]


WORKLOADS = [Workload("qd1", 1, 1), Workload("qd32", 32, 1), Workload("qd1x2", 1, 2), Workload("qd32x2", 32, 2)]


@dataclass
class Run:
    tracer: str
    workload: str
    rep: int
    iops: float
    clat_p50_us: float
    clat_p99_us: float


@dataclass
class Result:
    environment: dict
    seconds: float
    reps: int
    runs: list[Run] = field(default_factory=list)
    unavailable: dict[str, str] = field(default_factory=dict)   # tracer -> why it did not run
    program_cost: dict[str, dict] = field(default_factory=dict)


# ---- tracers -----------------------------------------------------------------

class Tracer:
    """Start before a run, stop after it; `why_not()` says why it cannot run here, or None."""

    name = "none"

    def why_not(self) -> str | None:
        return None

    def start(self, device: str) -> None:
        pass

    def stop(self) -> None:
        pass


class Untraced(Tracer):
    name = "none"


def _wait_line(proc: subprocess.Popen, stream, needle: str, timeout: float) -> str | None:
    """Read the stream until needle shows up; None if the process ended or time ran out."""
    deadline = time.monotonic() + timeout
    fd = stream.fileno()
    buf = b""
    while time.monotonic() < deadline:
        ready, _, _ = select.select([fd], [], [], 0.1)
        if ready:
            chunk = os.read(fd, 4096)
            if not chunk:
                return None
            buf += chunk
            if needle.encode() in buf:
                return buf.decode(errors="replace")
        elif proc.poll() is not None:
            return None
    return None


class IOTrace(Tracer):
    name = "iotrace"

    def __init__(self, output: Path, extra: list[str] | None = None):
        self.output = output
        self.extra = extra or []
        self.proc: subprocess.Popen | None = None

    def start(self, device: str) -> None:
        # the default a user would run: every process, every device, a report every 10 s
        self.proc = subprocess.Popen([PYTHON, "-m", "tracer.cli", "-i", "10", "-o", str(self.output), *self.extra],
                                     cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        if _wait_line(self.proc, self.proc.stderr, "tracing block I/O", 60) is None:
            err = self.proc.stderr.read() if self.proc.poll() is not None else ""
            self.proc.kill()
            raise RuntimeError(f"iotrace did not start: {err.strip()}")

    def stop(self) -> None:
        assert self.proc
        self.proc.send_signal(signal.SIGINT)
        self.proc.wait(60)
        self.proc = None


# Below the floor: programs on the same tracepoints that return at once, loaded with bcc as
# iotrace's are.  What they cost is the kernel's price for running any BPF program there (the
# perf-event path fills the tracepoint's record before calling it).
EMPTY_PROG = """
TRACEPOINT_PROBE(block, block_io_start) { return 0; }
TRACEPOINT_PROBE(block, block_rq_issue) { return 0; }
TRACEPOINT_PROBE(block, block_rq_complete) { return 0; }
"""
EMPTY_TRACEPOINTS = ("block_io_start", "block_rq_issue", "block_rq_complete")


class Empty(Tracer):
    name = "empty"

    def __init__(self):
        self.bpf = None
        self._why: str | None = None

    def why_not(self) -> str | None:
        if self.bpf is None and self._why is None:
            try:
                import bcc  # noqa: PLC0415 - only this tracer needs it

                self.bpf = bcc.BPF(text=EMPTY_PROG)
                for tp in EMPTY_TRACEPOINTS:
                    self.bpf.detach_tracepoint(f"block:{tp}".encode())
            except Exception as exc:  # bcc raises bare Exception on compile/load errors
                self._why = f"cannot load empty programs with bcc: {str(exc).strip().splitlines()[-1]}"
        return self._why

    def start(self, device: str) -> None:
        for tp in EMPTY_TRACEPOINTS:
            self.bpf.attach_tracepoint(tp=f"block:{tp}".encode(), fn_name=f"tracepoint__block__{tp}".encode())

    def stop(self) -> None:
        for tp in EMPTY_TRACEPOINTS:
            self.bpf.detach_tracepoint(f"block:{tp}".encode())


class BPFTrace(Tracer):
    name = "bpftrace"

    def __init__(self, prog: str = BPFTRACE_PROG, name: str = "bpftrace"):
        self.prog = prog
        self.name = name
        self.proc: subprocess.Popen | None = None

    def why_not(self) -> str | None:
        return None if shutil.which("bpftrace") else "not installed (apt install bpftrace)"

    def start(self, device: str) -> None:
        self.proc = subprocess.Popen(["bpftrace", "-e", self.prog], stdout=subprocess.PIPE,
                                     stderr=subprocess.STDOUT, text=True)
        if _wait_line(self.proc, self.proc.stdout, "Attach", 60) is None:
            out = self.proc.stdout.read() if self.proc.poll() is not None else ""
            self.proc.kill()
            raise RuntimeError(f"bpftrace did not start: {out.strip()}")
        time.sleep(0.5)     # it prints "Attaching" before the last probe is in

    def stop(self) -> None:
        assert self.proc
        self.proc.send_signal(signal.SIGINT)
        self.proc.communicate(timeout=60)
        self.proc = None


class BlkTrace(Tracer):
    name = "blktrace"

    def __init__(self, outdir: Path):
        self.outdir = outdir
        self.proc: subprocess.Popen | None = None
        self._why: str | None = None
        self._probed = False

    def why_not(self) -> str | None:
        if not shutil.which("blktrace"):
            return "not installed (apt install blktrace)"
        return self._why

    def probe(self, device: str) -> None:
        """Try it once: on some machines opening its debugfs relay files is denied."""
        if self._probed or not shutil.which("blktrace"):
            return
        self._probed = True
        debug = Path("/sys/kernel/debug")
        mounted = False
        if not (debug / "block").is_dir():
            # blktrace's relay files live in debugfs; a blktrace user mounts it first
            mounted = subprocess.run(["mount", "-t", "debugfs", "none", str(debug)], capture_output=True,
                                     check=False).returncode == 0
        try:
            self.start(device)
            self.stop()
        except RuntimeError as exc:
            self._why = f"cannot run here: {exc}"
            self.proc = None
            if mounted:
                subprocess.run(["umount", str(debug)], capture_output=True, check=False)

    def start(self, device: str) -> None:
        self.proc = subprocess.Popen(["blktrace", "-d", device, "-D", str(self.outdir)], stdout=subprocess.DEVNULL,
                                     stderr=subprocess.PIPE, text=True)
        time.sleep(1.0)
        if self.proc.poll() is not None:
            err = [line for line in self.proc.stderr.read().strip().splitlines() if line.strip()]
            self.proc = None
            raise RuntimeError(err[0] if err else "exited at once")

    def stop(self) -> None:
        if self.proc:
            self.proc.send_signal(signal.SIGINT)
            self.proc.communicate(timeout=60)
            self.proc = None
        for f in self.outdir.glob("*.blktrace.*"):
            f.unlink()


# ---- the bench -----------------------------------------------------------------

def run_fio(w: Workload, device: str, seconds: float) -> tuple[float, float, float]:
    r = subprocess.run(w.fio_args(device, seconds), capture_output=True, text=True, check=True)
    job = json.loads(r.stdout[r.stdout.index("{"):])["jobs"][0]["read"]
    pct = job["clat_ns"]["percentile"]
    return job["iops"], pct["50.000000"] / 1e3, pct["99.000000"] / 1e3


def make_device(shm: Path) -> tuple[str, Path]:
    backing = shm / "iotrace-bench.img"
    with open(backing, "wb") as f:
        os.posix_fallocate(f.fileno(), 0, BACKING_MB << 20)   # real pages: no reads of holes
    dev = subprocess.run(["losetup", "--find", "--show", str(backing)], check=True, capture_output=True,
                         text=True).stdout.strip()
    return dev, backing


def environment() -> dict:
    cpu = ""
    try:
        cpu = next(line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo") if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    fio = subprocess.run(["fio", "--version"], capture_output=True, text=True).stdout.strip()
    return {"kernel": platform.release(), "cpu": cpu, "nproc": os.cpu_count(), "fio": fio,
            "date": time.strftime("%Y-%m-%dT%H:%M:%S%z")}


def program_cost(device: str, w: Workload, seconds: float, shm: Path) -> dict[str, dict]:
    """Per-program cost per event from the kernel's own statistics, in a pass of its own."""
    out = shm / "iotrace-bench-stats.jsonl"
    stats = Path("/proc/sys/kernel/bpf_stats_enabled")
    old = stats.read_text().strip()
    stats.write_text("1")
    try:
        t = IOTrace(out)
        t.start(device)
        try:
            run_fio(w, device, seconds)
        finally:
            t.stop()
    finally:
        stats.write_text(old)
    final = [json.loads(line) for line in out.read_text().splitlines()][-1]
    out.unlink()
    progs = final.get("bpf_programs", {})
    return {name: {**p, "ns_per_run": p["run_time_ns"] / p["runs"] if p["runs"] else 0.0} for name, p in progs.items()}


def bench(args) -> Result:
    shm = Path(tempfile.mkdtemp(prefix="iotrace-bench-", dir="/dev/shm"))
    device, backing = make_device(shm)
    tracers: list[Tracer] = [Untraced(), Empty(), BPFTrace(FLOOR_PROG, "floor"), IOTrace(shm / "iotrace.jsonl"),
                             BPFTrace(), BlkTrace(shm)]
    tracers = [t for t in tracers if t.name in args.tracers]
    workloads = [w for w in WORKLOADS if w.name in args.workloads]
    res = Result(environment={**environment(), "device": f"{device} over {backing} (tmpfs)"},
                 seconds=args.seconds, reps=args.reps)
    try:
        for t in tracers:
            if isinstance(t, BlkTrace):
                t.probe(device)
            why = t.why_not()
            if why:
                res.unavailable[t.name] = why
        active = [t for t in tracers if t.name not in res.unavailable]
        for rep in range(args.reps):
            order = active[rep % len(active):] + active[:rep % len(active)]
            for w in workloads:
                for t in order:
                    t.start(device)
                    try:
                        iops, p50, p99 = run_fio(w, device, args.seconds)
                    finally:
                        t.stop()
                    res.runs.append(Run(t.name, w.name, rep, iops, p50, p99))
                    print(f"  rep {rep + 1}/{args.reps} {w.name:7} {t.name:9} {iops:10.0f} IOPS", file=sys.stderr)
        if "iotrace" in args.tracers:
            heavy = next((w for w in workloads if w.iodepth > 1), workloads[0])
            res.program_cost = program_cost(device, heavy, args.seconds, shm)
    finally:
        subprocess.run(["losetup", "-d", device], check=False)
        shutil.rmtree(shm, ignore_errors=True)
    return res


# ---- the table -----------------------------------------------------------------

def summarize(res: Result) -> list[dict]:
    """Per (workload, tracer): median IOPS ratio to the same repetition's baseline, and its spread."""
    rows = []
    base = {(r.workload, r.rep): r for r in res.runs if r.tracer == "none"}
    for w in dict.fromkeys(r.workload for r in res.runs):
        for t in dict.fromkeys(r.tracer for r in res.runs):
            runs = [r for r in res.runs if r.workload == w and r.tracer == t]
            ratios = [r.iops / base[(w, r.rep)].iops for r in runs if (w, r.rep) in base]
            rows.append({
                "workload": w, "tracer": t, "iops": statistics.median(r.iops for r in runs),
                "ratio": statistics.median(ratios) if ratios else None,
                "ratio_min": min(ratios) if ratios else None, "ratio_max": max(ratios) if ratios else None,
                "clat_p50_us": statistics.median(r.clat_p50_us for r in runs),
                "clat_p99_us": statistics.median(r.clat_p99_us for r in runs),
            })
    return rows


def print_table(res: Result, rows: list[dict], out=sys.stdout) -> None:
    env = res.environment
    out.write(f"\niotrace overhead bench: {env['kernel']}, {env['nproc']} CPUs, {env['cpu']}\n"
              f"device {env['device']}; fio randread 4k direct=1 libaio, {res.seconds:g} s x {res.reps} "
              f"interleaved repetitions\n\n")
    out.write(f"{'workload':8} {'tracer':9} {'IOPS':>9} {'vs none':>8} {'spread':>15} {'lost':>7} "
              f"{'clat p50':>9} {'clat p99':>9}\n")
    for r in rows:
        ratio = "" if r["ratio"] is None else f"{r['ratio']:8.3f}"
        spread = "" if r["ratio"] is None else f"{r['ratio_min']:.3f}..{r['ratio_max']:.3f}"
        lost = "" if r["ratio"] is None else f"{(1 - r['ratio']) * 100:6.1f}%"
        out.write(f"{r['workload']:8} {r['tracer']:9} {r['iops']:9.0f} {ratio:>8} {spread:>15} {lost:>7} "
                  f"{r['clat_p50_us']:7.1f}us {r['clat_p99_us']:7.1f}us\n")
    for name, why in res.unavailable.items():
        out.write(f"{name}: not measured: {why}\n")
    if res.program_cost:
        out.write("\niotrace BPF programs (kernel.bpf_stats_enabled, separate pass):\n")
        out.write(f"  {'program':22} {'events':>10} {'ns/event':>9} {'skipped':>8}\n")
        for name, p in sorted(res.program_cost.items(), key=lambda kv: -kv[1]["run_time_ns"]):
            out.write(f"  {name:22} {p['runs']:10d} {p['ns_per_run']:9.0f} {p['missed']:8d}\n")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--reps", type=int, default=5, help="interleaved repetitions (default 5)")
    p.add_argument("--seconds", type=float, default=5, help="fio run time per run (default 5)")
    p.add_argument("--workloads", default=",".join(w.name for w in WORKLOADS),
                   help="comma-separated subset of " + ", ".join(w.name for w in WORKLOADS))
    p.add_argument("--tracers", default="none,empty,floor,iotrace,bpftrace,blktrace",
                   help="comma-separated subset; empty = bcc programs that return at once on the three "
                        "tracepoints (the kernel's price for running any BPF program there); floor = "
                        "bpftrace reading only the clock there, the least any latency tracer can cost")
    p.add_argument("--json", metavar="FILE", help="also write the runs and the summary as JSON")
    p.add_argument("--quick", action="store_true", help="2 reps of 2 s, qd32 only: a smoke run")
    args = p.parse_args()
    if args.quick:
        args.reps, args.seconds, args.workloads = 2, 2, "qd32"
    args.workloads = args.workloads.split(",")
    args.tracers = args.tracers.split(",")
    unknown = set(args.workloads) - {w.name for w in WORKLOADS}
    if unknown:
        print(f"bench_overhead: unknown workload {', '.join(sorted(unknown))}", file=sys.stderr)
        return 2
    if os.geteuid() != 0:
        print("bench_overhead: needs root (BPF, losetup): run it with sudo, or `make bench`", file=sys.stderr)
        return 2
    if not shutil.which("fio"):
        print("bench_overhead: fio not found: run `make setup`", file=sys.stderr)
        return 2
    res = bench(args)
    rows = summarize(res)
    print_table(res, rows)
    if args.json:
        Path(args.json).write_text(json.dumps({**asdict(res), "summary": rows}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
