#!/usr/bin/env python3
"""The request path's price: BPF ns per block request, feature by feature, as work grows, and a gate.

    sudo .venv/bin/python scripts/bench_cost.py [--rounds 3] [--ios 100000] [--base REV] [--json FILE]
    sudo .venv/bin/python scripts/bench_cost.py --quick            # a smoke run (make bench runs the default)

Every figure is kernel.bpf_stats_enabled's run time of the programs one
loader process holds (found from its /proc/PID/fdinfo, so other BPF tools
on the machine are not charged), divided by the requests fio completed, in
interleaved rounds, median shown: fio 4 KiB O_DIRECT random reads (libaio)
on a loop device over a file in /dev/shm.  In the same run:

  floor       three raw-tracepoint programs that return at once (the price
              the kernel asks of any BPF program on the start, issue and
              completion events; scripts/overhead's empty_raw)
  lean        the least an exact per-process tracer does on those events
              (scripts/overhead's: stamps, the submitter, three log2 counts)
  lean_kernel the same least work on the kernel's stamps: the submitter at
              the start, one clock read and start_time_ns at the completion

  reference   the libbpf-tools design (raw tracepoints, a hash keyed by the
              request, per-CPU log2 histograms; scripts/overhead's)
  request     iotrace's block-layer programs as `serve` and `top` load them:
              every process, every device, no file rows
  kernel      the same on the kernel's stamps (--stamps kernel)
  +files / +pid / +cgroup / +dev / -writeback / +tasks
              the same with one feature switched on (or write-back
              attribution compiled out): what that feature adds to a request
  trace       what `iotrace` loads by default: file rows and the
              per-process rows' programs (tracer.sources.tasks) beside

Each program set beside the floor is then priced again on the same requests
(--pairs runs, attached together with the request path, which attaches first
alternating): the difference from the request path without the machine's
drift between rounds, and the request path beside itself for the method's
own error.

Then the request path as work grows: in-flight depth (1, 32, 256), live
series (10 and 1,000 fio threads, series per thread), devices (1 and 16).
Each feature's programs on events of their own (fork, exit, exec, the
scheduler's) are reported per run of their own event too.

--base REV also loads the request path of another revision (a git worktree
of it, removed at the end) in the same rounds and exits 1 when this tree's
ns per request exceed the base's by more than the noise band (the larger of
10% and the spread of the base's rounds): the gate that keeps a new feature
from quietly adding to every request.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from overhead.programs import bpf_programs, held_program_ids
from overhead.run import environment
from overhead.tracers import EmptyRaw, Lean, LeanKernel, Reference, Tracer

from tracer.testing import BPFStats

ROOT = Path(__file__).resolve().parent.parent
PYTHON = str(ROOT / ".venv" / "bin" / "python")
# Targets of the cost issue, as ratios from this run
TARGET_FLOOR_RATIO = 2.0        # iotrace's request path <= 2.0x the three empty raw programs
TARGET_PEER_RATIO = 0.7         # and <= 0.7x the libbpf-tools design
GATE_BAND = 0.10                # the gate's least noise band

# A loader: this (or the base) tree's Probe, and with "tasks" its per-process tracer, held until stdin closes.
LOADER = r"""
import json, os, sys
root, opts = sys.argv[1], json.loads(sys.argv[2])
sys.path.insert(0, root)
os.environ.pop("IOTRACE_BPF_DIR", None)
from tracer.sources.probe import Probe, ProbeOptions
tasks = opts.pop("tasks", False)
if opts.get("devs"):
    # a tree from before the one device option takes dev_t's as a list; newer ones a DeviceFilter
    try:
        from tracer.sources.devices import DeviceFilter
    except ImportError:
        pass
    else:
        opts["devs"] = DeviceFilter(devs=tuple(opts["devs"]))
probe = Probe(ProbeOptions(**opts))
tracer = None
if tasks:
    from tracer.sources.tasks import TaskTracer
    tracer = TaskTracer(opts.get("pids", []), opts.get("follow_children", True))
print("ready", flush=True)
sys.stdin.read()
# what the programs counted (reasons and notes since load): a tree without the ledger says nothing
try:
    print(json.dumps({n: int(v) for n, v in zip(probe.ledger.names, probe.ledger.reason_totals())}), flush=True)
except Exception:
    print("{}", flush=True)
if tracer is not None:
    tracer.close()
probe.close()
"""


@dataclass
class Config:
    """One set of programs to price: ProbeOptions' fields (plus "tasks"), from `root`'s tree."""

    name: str
    opts: dict = field(default_factory=dict)
    root: Path = ROOT
    what: str = ""


class Loaded(Tracer):
    """A loader process holding one Config's programs; its programs are the ones it holds."""

    bpf = True

    def __init__(self, cfg: Config):
        super().__init__()
        self.name, self.cfg, self.proc = cfg.name, cfg, None
        self.reasons: dict[str, int] = {}     # what its programs counted in the last run, by reason

    def start(self, device: str) -> None:
        opts = dict(self.cfg.opts)
        if opts.pop("pid_self", False):
            opts["pids"] = [os.getpid()]        # fio is this bench's child: followed at its fork
        if opts.pop("cgroup_self", False):
            opts["cgroup_id"], opts["cgroup_level"] = own_cgroup()
        if opts.pop("dev_self", False):
            opts["devs"] = [kdev(device)]
        self.proc = subprocess.Popen([PYTHON, "-c", LOADER, str(self.cfg.root), json.dumps(opts)],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, cwd=self.cfg.root)
        if self.proc.stdout.readline().strip() != "ready":
            self.proc.wait()
            raise SystemExit(f"bench_cost: {self.name}: the programs did not load (rc {self.proc.returncode})")
        self.prog_ids = dict.fromkeys(held_program_ids(self.proc.pid), "")

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.stdin.close()
            try:
                self.reasons = json.loads(self.proc.stdout.readline() or "{}")
            except ValueError:
                self.reasons = {}
            self.proc.wait(timeout=60)
            self.proc = None


def own_cgroup() -> tuple[int, int]:
    """This process's cgroup v2 id (the directory's inode) and depth below the root."""
    rel = next(line.split(":", 2)[2] for line in Path("/proc/self/cgroup").read_text().splitlines()
               if line.startswith("0::")).strip()
    path = Path("/sys/fs/cgroup") / rel.lstrip("/")
    return os.stat(path).st_ino, len([p for p in rel.split("/") if p])


def kdev(device: str) -> int:
    """The kernel's dev_t of a block device node, as the tracepoints give it (MKDEV: major << 20 | minor)."""
    rdev = os.stat(device).st_rdev
    return (os.major(rdev) << 20) | os.minor(rdev)


def fio(devices: list[str], ios: int, depth: int = 32, jobs: int = 1) -> dict:
    """fio 4 KiB O_DIRECT random reads of `devices`, `ios` in all (jobs > 1: threads, psync, one each in flight)."""
    argv = ["fio", "--name=cost", f"--filename={':'.join(devices)}", "--rw=randread", "--bs=4k", "--direct=1",
            "--size=256M", "--output-format=json", "--group_reporting"]
    if jobs > 1:
        argv += ["--thread", f"--numjobs={jobs}", "--ioengine=psync", f"--number_ios={max(1, ios // jobs)}"]
    else:
        argv += ["--ioengine=libaio", f"--iodepth={depth}", f"--number_ios={ios}", "--file_service_type=random"]
    out = subprocess.run(argv, capture_output=True, text=True, check=True).stdout
    return json.loads(out)["jobs"][0]["read"]


def measure(t: Tracer, devices: list[str], ios: int, depth: int = 32, jobs: int = 1) -> dict:
    """One run: `t`'s programs' run time per request (and per run of each program) while fio runs."""
    return together([t], devices, ios, depth, jobs)[t.name]


def together(tracers: list[Tracer], devices: list[str], ios: int, depth: int = 32, jobs: int = 1) -> dict[str, dict]:
    """One fio run with every tracer's programs attached at once, in list order (the order the kernel runs a
    tracepoint's programs in), each charged the run time of its own programs: charge()'s figures by name."""
    held: dict[str, set[int]] = {}
    try:
        for t in tracers:
            t.start(devices[0])
            held[t.name] = set(t.prog_ids)
        with BPFStats():
            p0 = bpf_programs()
            job = fio(devices, ios, depth, jobs)
            p1 = bpf_programs()
    finally:
        for t in tracers:
            if t.name in held:
                t.stop()
    out = {name: charge(ids, p0, p1, job) for name, ids in held.items()}
    for t in tracers:
        if t.name in out:
            out[t.name]["reasons"] = dict(getattr(t, "reasons", {}))
    return out


def charge(ids: set[int], p0: dict, p1: dict, job: dict) -> dict:
    """The run time of programs `ids` between two readings of every program's statistics, per request of
    fio's `job`, in all and per program."""
    reqs = job["total_ios"]
    progs = {}
    for i in ids & set(p0) & set(p1):
        runs = p1[i].get("run_cnt", 0) - p0[i].get("run_cnt", 0)
        ns = p1[i].get("run_time_ns", 0) - p0[i].get("run_time_ns", 0)
        if runs:
            name = p1[i].get("name", str(i))
            progs[name] = {"runs": runs, "ns": ns}
    block = sum(p["ns"] for n, p in progs.items() if is_block(n))
    # the programs watch every disk: other I/O on the machine meanwhile runs them too, so where the
    # completion program ran more often than fio's requests, its runs are the divisor
    seen = max([reqs, *(p["runs"] for n, p in progs.items() if "block_rq_complete" in n)])
    return {"requests": reqs, "seen": seen, "iops": job["iops"],
            "ns_per_request": sum(p["ns"] for p in progs.values()) / seen,
            "block_ns_per_request": block / seen, "programs": progs}


BLOCK_EVENTS = ("block_io_start", "block_getrq", "block_rq_insert", "block_rq_issue", "block_rq_complete",
                "block_rq_merge", "block_rq_requeue")


def is_block(prog: str) -> bool:
    """Whether a program (by bcc's name, cut at 15 characters by the kernel) is on a block request event."""
    return any(ev in prog or prog == ev[:15] for ev in BLOCK_EVENTS)


def in_pairs(base: Tracer, others: list[Tracer], n: int, devices: list[str], ios: int) -> dict[str, list[float]]:
    """What each of `others` adds to `base` per request, on the same requests: `n` fio runs each with both
    attached, the one attached first alternating (measured: the set attached first to a tracepoint pays ~100
    ns a request more for the same work), so that neither the machine's drift between rounds nor the order
    is in the median difference."""
    out: dict[str, list[float]] = {}
    for other in others:
        out[other.name] = []
        for r in range(n):
            m = together([base, other] if r % 2 == 0 else [other, base], devices, ios)
            out[other.name].append(m[other.name]["ns_per_request"] - m[base.name]["ns_per_request"])
            print(f"  pair {r + 1}/{n} {other.name:12} {out[other.name][-1]:+7.0f} ns/request", file=sys.stderr)
    return out


def rounds(tracers: list[Tracer], n: int, devices: list[str], ios: int, depth: int = 32, jobs: int = 1,
           label: str = "") -> dict[str, list[dict]]:
    """`n` interleaved rounds of every tracer (a rotating order), each run's measure() by tracer name."""
    out: dict[str, list[dict]] = {t.name: [] for t in tracers}
    for r in range(n):
        for t in tracers[r % len(tracers):] + tracers[:r % len(tracers)]:
            m = measure(t, devices, ios, depth, jobs)
            out[t.name].append(m)
            print(f"  {label}round {r + 1}/{n} {t.name:12} {m['ns_per_request']:7.0f} ns/request "
                  f"(block events {m['block_ns_per_request']:6.0f}) {m['iops']:9.0f} IOPS", file=sys.stderr)
    return out


def med(runs: list[dict], key: str = "ns_per_request") -> float:
    return statistics.median(r[key] for r in runs)


def overflow(runs: list[dict]) -> str:
    """The histogram samples a request that found no cell (the note hist_overflow: the slower hash took them),
    median over the runs, as a remark; "" when none did or the tree does not say."""
    per = [r["reasons"]["note_hist_overflow"] / r["seen"] for r in runs if "note_hist_overflow" in r.get("reasons", {})]
    if not per or not statistics.median(per):
        return ""
    return f"   {statistics.median(per):.2g} histogram samples a request overflowed the cells (--hist-cells)"


def per_event(runs: list[dict]) -> dict[str, float]:
    """ns per run of each program, median over the runs."""
    names = {n for r in runs for n in r["programs"]}
    return {n: statistics.median(r["programs"][n]["ns"] / r["programs"][n]["runs"] for r in runs
                                 if n in r["programs"]) for n in sorted(names)}


def gate(mine: list[float], base: list[float]) -> tuple[bool, float]:
    """(whether this tree's request path grew past the noise band, the band): the band is the base's spread
    between rounds relative to its median, or GATE_BAND where that is smaller; medians are compared."""
    b = statistics.median(base)
    band = max(GATE_BAND, (max(base) - min(base)) / b)
    return statistics.median(mine) > b * (1 + band), band


# the request path priced beside itself: what the pairs' differences are worth
SAME = "request again"

# the request paths the targets are for, each beside the least work of its design (lean, lean_kernel)
TARGET_PATHS = (("request", "request path", "lean"), ("kernel", "request path, --stamps kernel", "lean_kernel"))


def targets(ns: dict[str, float]) -> list[tuple[str, bool, str]]:
    """(target, met, detail) for each request path priced in this run (`ns`: median ns per request by
    program set).  The floor target's detail also says where the least work of the path's design (the
    same events, stamps and counts, nothing else) already stands, so a target beneath it reads as such."""
    floor, ref = ns.get("empty_raw"), ns.get("reference")
    checks = []
    for name, path, least in TARGET_PATHS:
        if name not in ns:
            continue
        mine = ns[name]
        if floor:
            detail = f"{mine:.0f} ns = {mine / floor:.2f}x {floor:.0f}"
            if least in ns:
                x = ns[least] / floor
                detail += (f" ({least}, this design's least work, {x:.2f}x"
                           f"{': the target is beneath it here' if x > TARGET_FLOOR_RATIO else ''})")
            checks.append((f"{path} <= {TARGET_FLOOR_RATIO}x the floor", mine <= TARGET_FLOOR_RATIO * floor, detail))
        if ref:
            checks.append((f"{path} <= {TARGET_PEER_RATIO}x the libbpf-tools design", mine <= TARGET_PEER_RATIO * ref,
                           f"{mine:.0f} ns = {mine / ref:.2f}x {ref:.0f}"))
    return checks


def base_tree(rev: str, where: Path) -> Path:
    """A worktree of `rev` (its own venv is not needed: the loader runs this tree's venv on its sources)."""
    subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--detach", "-q", str(where), rev], check=True)
    return where


FEATURES = [
    Config("request", {"files": False}, what="block-layer programs, every process and device (serve, top)"),
    Config("kernel", {"files": False, "stamps": "kernel"},
           what="the same on the kernel's request stamps (--stamps kernel): one clock read, no issue program"),
    Config("+files", {"files": True}, what="per-file rows (page-cache requests pay; O_DIRECT stops at its page)"),
    Config("+pid", {"files": False, "pid_self": True}, what="--pid of the bench, fork following on"),
    Config("+cgroup", {"files": False, "cgroup_self": True}, what="--cgroup of the bench's own cgroup"),
    Config("+dev", {"files": False, "dev_self": True}, what="--dev of the loop device"),
    Config("-writeback", {"files": False, "writeback": False}, what="write-back attribution compiled out"),
    Config("+tasks", {"files": False, "tasks": True}, what="per-process rows (scheduler, page-cache events)"),
    Config("trace", {"files": True, "tasks": True}, what="`iotrace` as run with no option"),
    Config("trace+kernel", {"files": True, "tasks": True, "stamps": "kernel"}, what="`iotrace --stamps kernel`"),
]


def loop_devices(n: int, tmp: Path) -> list[str]:
    devs = []
    for i in range(n):
        img = tmp / f"img{i}"
        with open(img, "wb") as f:
            f.truncate(256 << 20)
        devs.append(subprocess.run(["losetup", "-f", "--show", str(img)], capture_output=True, text=True,
                                   check=True).stdout.strip())
    return devs


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rounds", type=int, default=3, help="interleaved rounds (default 3)")
    p.add_argument("--ios", type=int, default=100_000, help="fio requests a run (default 100000)")
    p.add_argument("--base", metavar="REV", help="gate: also price REV's request path; exit 1 if this tree's grew")
    p.add_argument("--pairs", type=int, default=4, metavar="N",
                   help="fio runs a program set shares with the request path, to price it on the same requests "
                        "(default 4; 0 skips)")
    p.add_argument("--no-scaling", action="store_true", help="skip the depth, series and devices runs")
    p.add_argument("--quick", action="store_true", help="2 rounds of 30000 requests, 2 pairs: a smoke run")
    p.add_argument("--json", metavar="FILE", help="also write every run as JSON")
    p.add_argument("--only", metavar="NAMES", help="price only these of the program sets (comma-separated, e.g. "
                   "request,kernel; the floor, lean and the libbpf-tools design always run)")
    args = p.parse_args()
    if args.quick:
        args.rounds, args.ios, args.pairs = 2, 30_000, min(args.pairs, 2)
    if args.rounds < 1 or args.ios < 1000 or args.pairs < 0:
        print("bench_cost: --rounds takes at least 1, --ios at least 1000, --pairs 0 or more", file=sys.stderr)
        return 2
    if os.geteuid() != 0:
        print("bench_cost: needs root (BPF, losetup): run it with sudo, or `make bench`", file=sys.stderr)
        return 2
    tmp = Path(tempfile.mkdtemp(prefix="iotrace-cost-", dir="/dev/shm"))
    devices: list[str] = []
    base_dir: Path | None = None
    try:
        devices = loop_devices(16, tmp)
        floor, ref = EmptyRaw(), Reference()
        peers = [t for t in (floor, Lean(), LeanKernel(), ref) if t.why_not() is None]
        configs = list(FEATURES)
        if args.only:
            wanted = set(args.only.split(",")) | {"request"}     # the request path: every figure is beside it
            unknown = wanted - {c.name for c in FEATURES}
            if unknown:
                print(f"bench_cost: --only: no program set {', '.join(sorted(unknown))}", file=sys.stderr)
                return 2
            configs = [c for c in FEATURES if c.name in wanted]
        if args.base:
            base_dir = base_tree(args.base, tmp / "base")
            configs.append(Config(f"base:{args.base}", {"files": False}, root=base_dir,
                                  what=f"{args.base}'s request path"))
        tracers = peers + [Loaded(c) for c in configs]
        print(f"bench_cost: {args.rounds} rounds of {len(tracers)} program sets, {args.ios} requests each",
              file=sys.stderr)
        main_runs = rounds(tracers, args.rounds, devices[:1], args.ios)
        pairs: dict[str, list[float]] = {}
        if args.pairs:
            # the request path beside itself first: the method's own error, which every other difference has
            again = Config(SAME, {"files": False}, what="the request path again: the pairing's own error")
            pairs = in_pairs(Loaded(configs[0]), [Loaded(c) for c in [again, *configs[1:]] if c.root == ROOT],
                             args.pairs, devices[:1], args.ios)
        scaling: dict[str, dict[str, list[dict]]] = {}
        if not args.no_scaling:
            req = [Loaded(configs[0])]
            for depth in (1, 256):
                scaling[f"depth {depth}"] = rounds(req + [floor], args.rounds, devices[:1],
                                                   args.ios // (8 if depth == 1 else 1), depth, label=f"qd{depth} ")
            for jobs in (10, 1000):
                scaling[f"series {jobs}"] = rounds([Loaded(Config("request", {"files": False, "per_thread": True})),
                                                    floor], args.rounds, devices[:1], args.ios // 4, jobs=jobs,
                                                   label=f"{jobs} threads ")
            scaling["devices 16"] = rounds(req + [floor], args.rounds, devices, args.ios, label="16 devices ")
        return report(args, main_runs, scaling, configs, pairs)
    finally:
        for d in devices:
            subprocess.run(["losetup", "-d", d], check=False)
        if base_dir is not None:
            subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(base_dir)], check=False)
        subprocess.run(["rm", "-rf", str(tmp)], check=False)


def report(args, runs: dict[str, list[dict]], scaling: dict[str, dict[str, list[dict]]],
           configs: list[Config], pairs: dict[str, list[float]]) -> int:
    env = environment()
    floor = med(runs["empty_raw"]) if runs.get("empty_raw") else None
    req = med(runs["request"])
    print(f"\nBPF ns per request, median of {args.rounds} rounds; {env['kernel']}, {env['nproc']} CPUs, {env['cpu']}")
    print(f"{'programs':14} {'ns/request':>10} {'vs request':>10} {'x floor':>8}  what")
    rows = []
    for name, what in [("empty_raw", "three empty raw programs: the floor"),
                       ("lean", "stamps, submitter, three log2 counts: the work's own floor"),
                       ("lean_kernel", "the same on the kernel's stamps: two programs, one clock read, one count"),
                       ("reference", "the libbpf-tools design"), *((c.name, c.what) for c in configs)]:
        if not runs.get(name):
            continue
        ns = med(runs[name])
        added = (f"{ns - req:+10.0f}" if name not in ("empty_raw", "lean", "lean_kernel", "reference", "request")
                 else f"{'':>10}")
        x = f"{ns / floor:8.2f}" if floor else f"{'':>8}"
        print(f"{name:14} {ns:10.0f} {added} {x}  {what}")
        rows.append({"programs": name, "ns_per_request": ns, "added": ns - req, "what": what,
                     "rounds": [r["ns_per_request"] for r in runs[name]]})
    if pairs:
        print(f"\nwhat each adds on the same requests (attached beside the request path, {args.pairs} fio runs, "
              "which attaches first alternating): ns/request, median [least, most]")
        for name, ds in pairs.items():
            print(f"  {name:14} {statistics.median(ds):+7.0f}  [{min(ds):+.0f}, {max(ds):+.0f}]")
    if runs.get("trace"):
        print("\nper run of a feature's own events (ns, median), in `trace`:")
        for prog, ns in per_event(runs["trace"]).items():
            if not is_block(prog):
                print(f"  {prog:28} {ns:7.0f}")
    if scaling:
        print("\nthe request path as work grows (ns/request, median; the floor beside it in the same rounds):")
        for what, r in scaling.items():
            mine = next(k for k in r if k != "empty_raw")
            print(f"  {what:14} {med(r[mine]):7.0f}   floor {med(r['empty_raw']):5.0f}{overflow(r[mine])}")
    checks = targets({name: med(r) for name, r in runs.items() if r})
    gate_failed = False
    if args.base:
        base = [r["ns_per_request"] for r in runs[f"base:{args.base}"]]
        gate_failed, band = gate([r["ns_per_request"] for r in runs["request"]], base)
        b = statistics.median(base)
        checks.append((f"gate: request path within {band:.0%} of {args.base}'s", not gate_failed,
                       f"{req:.0f} vs {b:.0f} ns ({req / b - 1:+.1%})"))
    print("\ntargets, from this run:")
    for what, ok, detail in checks:
        print(f"  {'met' if ok else 'NOT MET':8} {what}: {detail}")
    if args.json:
        Path(args.json).write_text(json.dumps({"environment": env, "rows": rows, "runs": runs, "scaling": scaling,
                                               "pairs": pairs,
                                               "checks": [{"target": w, "met": o, "detail": d}
                                                          for w, o, d in checks]}, indent=1))
    return 1 if gate_failed else 0


if __name__ == "__main__":
    sys.exit(main())
