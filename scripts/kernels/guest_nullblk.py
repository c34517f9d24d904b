"""Inside a kernel-matrix guest: IOPS traced / untraced where the device costs nothing (null_blk).

The host kernel has no null_blk; Debian's kernels ship it as a module.  A null_blk disk completes
each request at once (irqmode=0), so the block layer and what runs on its events are nearly all a
request costs: the ratio of fio's IOPS with iotrace's request path loaded to without it is the
tracer's price at high IOPS.  Rounds alternate the order of:

  untraced   fio alone
  floor      three raw-tracepoint programs that return at once (scripts/overhead's empty_raw)
  iotrace    iotrace's block-layer programs as `serve` and `top` load them (no file rows)
  kernel     the same on the kernel's request stamps (--stamps kernel; where the guest's kernel
             has none, iotrace's own: the run's "stamps" says which)

each round compiling iotrace afresh (a loaded probe cannot be taken off the events and put back).
BPF ns per request come from each program's own run time (its fdinfo, with BPF statistics on).
Under TCG every instruction is emulated, the kernel's and the programs' alike: the ratios, not the
IOPS, are what carries over to hardware.

  python3 guest_nullblk.py SRC_DIR [ROUNDS] [SECONDS] > nullblk.json
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
from pathlib import Path

SRC = Path(sys.argv[1]).resolve()
ROUNDS = int(sys.argv[2]) if len(sys.argv) > 2 else 3
SECONDS = int(sys.argv[3]) if len(sys.argv) > 3 else 5
sys.path[:0] = [str(SRC), str(SRC / "scripts")]

from overhead.tracers import EmptyRaw  # noqa: E402

from tracer.testing import BPFStats  # noqa: E402

DEV = "/dev/nullb0"


def run_time_ns(fds: dict[str, int]) -> dict[str, int]:
    """The run time of each program behind these fds (this process's), by program name."""
    out = {}
    for name, fd in fds.items():
        info = dict(ln.split(":", 1) for ln in Path(f"/proc/self/fdinfo/{fd}").read_text().splitlines() if ":" in ln)
        out[name] = int(info.get("run_time_ns", "0").strip() or 0)
    return out


def fio() -> dict:
    out = subprocess.run(["fio", "--name=nullblk", f"--filename={DEV}", "--rw=randread", "--bs=4k", "--direct=1",
                          "--ioengine=libaio", "--iodepth=32", "--time_based", f"--runtime={SECONDS}",
                          "--output-format=json"], check=True, capture_output=True, text=True).stdout
    job = json.loads(out)["jobs"][0]["read"]
    return {"iops": job["iops"], "ios": job["total_ios"]}


def run_one(name: str, floor: EmptyRaw) -> dict:
    fds: dict[str, int] = {}
    probe = None
    if name == "floor":
        floor.start(DEV)
        fds = {n.decode(): fn.fd for n, fn in floor.b.funcs.items()}
    elif name in ("iotrace", "kernel"):
        from tracer.sources.probe import Probe, ProbeOptions

        probe = Probe(ProbeOptions(files=False, stamps="kernel" if name == "kernel" else "own"))
        fds = {n.decode(): fn.fd for n, fn in probe.bpf.bpf.funcs.items()}
    try:
        with BPFStats():
            ns0 = run_time_ns(fds)
            r = fio()
            ns1 = run_time_ns(fds)
    finally:
        if name == "floor":
            floor.stop()
        stamps = probe.stamps if probe is not None else ""
        if probe is not None:
            probe.close()
    # each program's run time per request fio completed (where it ran at all), and their sum
    per = {n.removeprefix("raw_tracepoint__"): (ns1[n] - ns0[n]) / r["ios"] for n in fds if r["ios"]}
    r["bpf_ns_per_request"] = sum(per.values())
    r["programs"] = {n: round(v, 1) for n, v in per.items() if v}
    if name == "kernel":
        r["stamps"] = stamps
    return r


def main() -> int:
    subprocess.run(["modprobe", "null_blk", "nr_devices=1", "queue_mode=2", "irqmode=0", "gb=4", "bs=4096",
                    "hw_queue_depth=64", "submit_queues=1"], check=True)
    floor = EmptyRaw()
    why = floor.why_not()
    if why:
        print(json.dumps({"error": why}))
        return 1
    names = ["untraced", "floor", "iotrace", "kernel"]
    runs: dict[str, list[dict]] = {n: [] for n in names}
    for i in range(ROUNDS):
        for name in names[i % len(names):] + names[:i % len(names)]:
            r = run_one(name, floor)
            runs[name].append(r)
            print(f"iotrace-guest: null_blk round {i + 1}/{ROUNDS} {name:9} {r['iops']:9.0f} IOPS "
                  f"{r['bpf_ns_per_request']:6.0f} BPF ns/request", file=sys.stderr, flush=True)
    med = {n: statistics.median(r["iops"] for r in v) for n, v in runs.items()}
    ns = {n: statistics.median(r["bpf_ns_per_request"] for r in v) for n, v in runs.items()}
    by_program = {n: {prog: statistics.median(r["programs"].get(prog, 0) for r in v)
                      for prog in sorted({k for r in v for k in r["programs"]})} for n, v in runs.items()}
    # a clock read is a helper call in every program that stamps: under TCG its price is the clocksource's
    clock = Path("/sys/devices/system/clocksource/clocksource0/current_clocksource").read_text().strip()
    print(json.dumps({"device": "null_blk (irqmode=0, queue_mode=2)", "fio": "4 KiB randread O_DIRECT libaio qd32",
                      "seconds": SECONDS, "rounds": ROUNDS, "runs": runs, "iops": med, "bpf_ns_per_request": ns,
                      "by_program": by_program, "clocksource": clock,
                      "kernel_stamps": sorted({r.get("stamps", "") for r in runs["kernel"]}),
                      "ratio": {n: med[n] / med["untraced"] for n in names if med["untraced"]}}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
