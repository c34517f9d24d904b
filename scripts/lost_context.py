#!/usr/bin/env python3
"""Which block completions the kernel runs no BPF program for, and in whose context: the cause of
iotrace's `lost_completion`, completion by completion.

    sudo .venv/bin/python scripts/lost_context.py [--seconds 8] [--runs 1]

A loop device over a file on ext4 over a loop device over /dev/shm (where
lost completions were measured), fio 4 KiB O_DIRECT random reads at qd32,
and three recorders of its block_rq_complete events: a private tracefs
instance (the kernel's own event, clock `mono`), a raw-tracepoint BPF
program and a perf-event tracepoint BPF program, each writing (sector, time)
into an array.  An event tracefs recorded that a program did not, matched by
sector and time, is one that program missed; the report counts the events
and the misses by the task the completion ran on (softirq runs on whichever
task an interrupt found), so that a miss's context is named, not guessed.
The programs' own recursion misses (bpf_stats) are printed beside.
"""

from __future__ import annotations

import argparse
import bisect
import os
import re
import subprocess
import sys
import tempfile
from collections import Counter, defaultdict
from dataclasses import dataclass
from pathlib import Path

SLOTS = 1 << 23           # records a recorder keeps; a run of 8 s makes ~1.5M here
MATCH_NS = 1_000_000      # a record this near in time, of the same sector, is the event's
STALL_NS = 50_000_000     # then, for what is left: a stalled vCPU can part the two stamps by more
INSTANCE_KB = 400_000     # the tracefs instance's buffer a CPU: room for every event of a run

PROG = r"""
struct rec { u64 sector; u64 ns; };
BPF_ARRAY(raw_recs, struct rec, SLOTS);      /* index -> a completion the raw program saw */
BPF_ARRAY(tp_recs, struct rec, SLOTS);       /* index -> one the perf-event program saw */
BPF_ARRAY(cursors, u64, 2);                  /* 0: raw_recs used, 1: tp_recs used */

static __always_inline struct rec *next(u32 which)
{
    u64 *c = cursors.lookup(&which), i;
    u32 k;

    if (!c)
        return 0;
    i = __sync_fetch_and_add(c, 1);
    if (i >= SLOTS)
        return 0;      /* full: the report says so (a cursor past SLOTS) */
    k = i;
    return which ? tp_recs.lookup(&k) : raw_recs.lookup(&k);
}

/* block_rq_complete(rq, error, nr_bytes): the disk as the tracepoint computes it, rq->q->disk */
RAW_TRACEPOINT_PROBE(block_rq_complete)
{
    u64 rq = ctx->args[0], q = 0, disk = 0, sector = 0;
    u32 mm[2] = {};
    struct rec *r;

    if (bpf_probe_read_kernel(&q, 8, (void *)(rq + OFF_RQ_Q)) || !q ||
        bpf_probe_read_kernel(&disk, 8, (void *)(q + OFF_Q_DISK)) || !disk ||
        bpf_probe_read_kernel(mm, 8, (void *)(disk + OFF_DISK_MAJOR)) || ((mm[0] << 20) | mm[1]) != DEV)
        return 0;
    bpf_probe_read_kernel(&sector, 8, (void *)(rq + OFF_RQ_SECTOR));
    r = next(0);
    if (r) {
        r->sector = sector;
        r->ns = bpf_ktime_get_ns();
    }
    return 0;
}

TRACEPOINT_PROBE(block, block_rq_complete)
{
    struct rec *r;

    if (args->dev != DEV)
        return 0;
    r = next(1);
    if (r) {
        r->sector = args->sector;
        r->ns = bpf_ktime_get_ns();
    }
    return 0;
}
"""

# "  <comm>-<pid>  [cpu] <flags> <seconds>: block_rq_complete: M,m R () <sector> + <n> ..."
LINE = re.compile(r"^\s*(?P<comm>.+?)-(?P<pid>\d+)\s+\[(?P<cpu>\d+)\]\s+(?P<flags>\S+)\s+(?P<s>\d+)\.(?P<us>\d{6}): "
                  r"block_rq_complete: \d+,\d+ \S+ \(.*?\) (?P<sector>\d+) \+ \d+")


@dataclass(frozen=True)
class Completion:
    """One block_rq_complete event as tracefs printed it."""

    comm: str
    pid: int
    cpu: int
    flags: str
    ns: int         # CLOCK_MONOTONIC (the instance's trace_clock mono), to the microsecond
    sector: int


def parse(line: str) -> Completion | None:
    """A completion from a line of the instance's `trace` file; None for anything else (its header)."""
    m = LINE.match(line)
    if not m:
        return None
    return Completion(m["comm"], int(m["pid"]), int(m["cpu"]), m["flags"],
                      int(m["s"]) * 1_000_000_000 + int(m["us"]) * 1000, int(m["sector"]))


def unmatched(events: list[Completion], times_of: dict[int, list[int]], within: int) -> list[Completion]:
    """The events with no record (a time in `times_of[sector]`, sorted) within `within` ns; a matched time is
    taken out, so that it stands for one event only."""
    out = []
    for ev in sorted(events, key=lambda e: e.ns):
        times = times_of.get(ev.sector, [])
        i = bisect.bisect_left(times, ev.ns - within)
        if i < len(times) and times[i] <= ev.ns + within:
            del times[i]
        else:
            out.append(ev)
    return out


def missed(events: list[Completion], seen: list[tuple[int, int]], within: int = MATCH_NS,
           stall: int = STALL_NS) -> list[Completion]:
    """The events no record of `seen` ((sector, ns) pairs) stands for: a record of the same sector within
    `within` ns, or, among those left, within `stall` ns."""
    times_of: dict[int, list[int]] = defaultdict(list)
    for sector, ns in seen:
        times_of[sector].append(ns)
    for times in times_of.values():
        times.sort()
    return unmatched(unmatched(events, times_of, within), times_of, stall)


def by_task(events: list[Completion]) -> Counter:
    """Events counted by the task they ran on (its comm, a kernel thread's without its /N)."""
    return Counter(e.comm.split("/")[0] for e in events)


def sh(*argv: str) -> str:
    return subprocess.run(argv, check=True, capture_output=True, text=True).stdout.strip()


def offsets() -> dict[str, int]:
    from tracer.sources import kernel  # noqa: PLC0415 - the BTF, read when the programs are built

    btf = kernel.open_btf()
    return {"OFF_RQ_Q": btf.member("request", "q").offset, "OFF_RQ_SECTOR": btf.member("request", "__sector").offset,
            "OFF_Q_DISK": btf.member("request_queue", "disk").offset,
            "OFF_DISK_MAJOR": btf.member("gendisk", "major").offset}


def one_run(seconds: int, scratch: Path) -> dict:
    """One fio run on a fresh stack of devices, recorded three ways; everything it made is undone."""
    import numpy as np  # noqa: PLC0415 - the records' reader, as the bench's
    from bcc import BPF, libbcc  # noqa: PLC0415 - root and bcc only here
    from overhead.programs import bpf_programs, held_program_ids  # noqa: PLC0415

    from tracer.sources.devices import kdev  # noqa: PLC0415
    from tracer.sources.drain import read_array  # noqa: PLC0415

    outer = inner = None
    mnt = scratch / "mnt"
    mnt.mkdir()
    inst = Path(f"/sys/kernel/tracing/instances/iotrace-lostctx-{os.getpid()}")
    event = inst / "events/block/block_rq_complete"
    try:
        with open(scratch / "outer", "wb") as f:
            f.truncate(1 << 30)
        outer = sh("losetup", "-f", "--show", str(scratch / "outer"))
        sh("mkfs.ext4", "-q", outer)
        sh("mount", outer, str(mnt))
        sh("fallocate", "-l", "512M", str(mnt / "inner"))
        inner = sh("losetup", "-f", "--show", "--direct-io=on", str(mnt / "inner"))
        rdev = os.stat(inner).st_rdev
        dev = kdev(os.major(rdev), os.minor(rdev))
        inst.mkdir()
        (inst / "buffer_size_kb").write_text(str(INSTANCE_KB))
        (inst / "trace_clock").write_text("mono")
        (event / "filter").write_text(f"dev == {dev}")
        try:
            b = BPF(text=PROG, cflags=[f"-D{k}={v}" for k, v in {**offsets(), "DEV": dev, "SLOTS": SLOTS}.items()])
        except Exception as exc:  # bcc raises a bare Exception when it cannot compile or load
            why = (str(exc).strip().splitlines() or [type(exc).__name__])[-1]
            raise RuntimeError(f"cannot load the recorders: {why}") from None
        (event / "enable").write_text("1")
        sh("fio", "--name=lost", f"--filename={inner}", "--rw=randread", "--bs=4k", "--direct=1", "--ioengine=libaio",
           "--iodepth=32", f"--runtime={seconds}", "--time_based", "--size=512M", "--output-format=terse")
        (event / "enable").write_text("0")
        used = [min(b["cursors"][i].value, SLOTS) for i in (0, 1)]
        recs = {}
        for name, table, n in (("raw", b["raw_recs"], used[0]), ("perf-event", b["tp_recs"], used[1])):
            got = read_array(table, np.zeros(n, np.uint32), np.zeros(n, np.dtype(table.Leaf)), libbcc.lib)
            if len(got) != n:
                raise RuntimeError(f"read {len(got)} of the {name} program's {n} records")
            recs[name] = list(zip(got["sector"].tolist(), got["ns"].tolist(), strict=True))
        mine = held_program_ids()
        progs = {p["name"]: p.get("recursion_misses", 0) for i, p in bpf_programs().items() if i in mine}
        # events the instance's buffer lost, every CPU's: its `trace` is then short, and the report says so
        overrun = sum(int(line.split(":")[1]) for stats in (inst / "per_cpu").glob("cpu*/stats")
                      for line in stats.read_text().splitlines() if line.startswith("overrun:"))
        events = [c for c in map(parse, (inst / "trace").read_text().splitlines()) if c]
        b.cleanup()
        return {"events": events, "recs": recs, "full": any(n >= SLOTS for n in used), "misses": progs,
                "overrun": overrun}
    finally:
        if event.exists():
            (event / "enable").write_text("0")
        if inst.exists():
            inst.rmdir()
        if inner:
            subprocess.run(["losetup", "-d", inner], check=False)
        subprocess.run(["umount", str(mnt)], check=False, capture_output=True)
        if outer:
            subprocess.run(["losetup", "-d", outer], check=False)


def report(run: dict) -> None:
    events = run["events"]
    tasks = by_task(events)
    print(f"tracefs: {len(events)} completions; by task: "
          + ", ".join(f"{t} {n}" for t, n in tasks.most_common(8)))
    for name, recs in run["recs"].items():
        lost = missed(events, recs)
        where = by_task(lost)
        stray = len(recs) - (len(events) - len(lost))    # records no event matched: the matching's own error
        print(f"{name} program: {len(recs)} records, {len(lost)} completions missed"
              + (": " + ", ".join(f"on {t} {n} of {tasks[t]}" for t, n in where.most_common()) if lost else "")
              + (f" ({stray} records matched no event)" if stray else ""))
        for ev in lost[:5]:
            print(f"    cpu {ev.cpu} {ev.flags} {ev.comm}-{ev.pid} sector {ev.sector}")
    print(f"recursion misses (bpf_stats): {run['misses']}; tracefs buffer overruns: {run['overrun']}"
          + ("; a recorder ran out of room: counts are short" if run["full"] else ""))


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--seconds", type=int, default=8, help="fio run time (default 8)")
    p.add_argument("--runs", type=int, default=1, help="runs, each on a fresh device stack (default 1)")
    args = p.parse_args()
    if os.geteuid() != 0:
        print("lost_context: needs root (BPF, tracefs, losetup, mount)", file=sys.stderr)
        return 2
    if args.seconds < 1 or args.runs < 1:
        print("lost_context: --seconds and --runs take a positive count", file=sys.stderr)
        return 2
    for i in range(args.runs):
        scratch = Path(tempfile.mkdtemp(prefix="iotrace-lostctx-", dir="/dev/shm"))
        try:
            print(f"run {i + 1}/{args.runs}:")
            report(one_run(args.seconds, scratch))
        except subprocess.CalledProcessError as exc:
            print(f"lost_context: {' '.join(exc.cmd)} failed: {(exc.stderr or '').strip()}", file=sys.stderr)
            return 1
        except (OSError, RuntimeError) as exc:
            print(f"lost_context: {exc}", file=sys.stderr)
            return 1
        except KeyboardInterrupt:
            print("lost_context: interrupted; devices and the tracefs instance removed", file=sys.stderr)
            return 130
        finally:
            subprocess.run(["rm", "-rf", str(scratch)], check=False)
    return 0


if __name__ == "__main__":
    sys.exit(main())
