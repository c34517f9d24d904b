#!/usr/bin/env python3
"""Check iotrace against an exact reference, on loop devices made for the purpose.

    sudo .venv/bin/python scripts/verify.py [--workload NAME|all] [--keep] [--list] [-v]

For each workload it makes sparse files in a temp dir, attaches them as loop
devices (formatting and mounting ext4 where the workload needs a file
system), starts the reference recorder (scripts/reference/groundtruth.py: every block
event from a private tracefs instance, matched offline into exact
per-request latencies, timed by BPF stamps that bracket iotrace's own),
runs the workload under iotrace in the same run, and prints iotrace against
the exact values per series (process, device, op) and phase: count, bytes,
p50 / p99 / p99.9 / max on both sides and a verdict.  A series passes when
counts and bytes are equal, each of p50, p90, p99 and p99.9 is within 2% of
the exact nearest-rank percentile or in the same histogram bucket, the max
is in the same bucket, and the mean agrees, each up to the stamps' measured
jitter (docs/design.md: "Checked against a reference: `scripts/verify.py`").  Series seen by only one
side fail, unless the reference explains them (requests that started
before iotrace attached, processes iotrace was not told to trace, events
the kernel ran no BPF program for).

Exit status: 0 all workloads pass, 1 any mismatch, 2 could not run (not
root, no tracefs, iotrace failed to start, ...).  Loop devices, mounts and
the tracefs instance are always removed; --keep only keeps the temp dir
(iotrace's dumps, the reference's requests as CSV and its raw events) for a closer look.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from reference import groundtruth as gt  # scripts/reference/: beside this script, outside the product

from tracer.sources.devices import devno

ROOT = Path(__file__).resolve().parent.parent

PY = sys.executable


@dataclass
class Disk:
    path: str
    name: str
    dev: int          # kernel dev_t


@dataclass
class Ctx:
    tmp: Path
    disks: list[Disk]
    mnt: Path | None = None


def fio(name: str, filename: str, **opts) -> list[str]:
    base = {"bs": "4k", "ioengine": "psync", "output-format": "terse"}
    base.update(opts)
    return ["fio", f"--name={name}", f"--filename={filename}", *(f"--{k}={v}" for k, v in base.items())]


@dataclass
class Workload:
    name: str
    help: str
    command: Callable[[Ctx], list[str]]
    disks: int = 1
    fs: bool = False               # ext4 on the first disk, mounted at ctx.mnt
    mode: str = "command"          # "command": iotrace -- CMD; "system": every process on the disks
    # (comm, disk index, op): series that must exist and be compared
    required: list[tuple[str, int, str]] = field(default_factory=list)


WORKLOADS = [
    Workload("randread-qd1", "random 4 KiB reads, queue depth 1 (psync, O_DIRECT)",
             lambda c: fio("qd1", c.disks[0].path, rw="randread", size="16M", direct=1),
             required=[("fio", 0, "read")]),
    Workload("randread-qd32", "random 4 KiB reads, queue depth 32 (libaio, O_DIRECT)",
             lambda c: fio("qd32", c.disks[0].path, rw="randread", size="32M", direct=1, ioengine="libaio",
                           iodepth=32),
             required=[("fio", 0, "read")]),
    Workload("seqread-1m", "sequential 1 MiB reads (O_DIRECT)",
             lambda c: fio("seq", c.disks[0].path, rw="read", bs="1M", size="64M", loops=4, direct=1),
             required=[("fio", 0, "read")]),
    Workload("buffered-fsync", "buffered 4 KiB writes then fsync, ext4; every process on the disk",
             lambda c: fio("buf", str(c.mnt / "buf.dat"), rw="write", size="16M", end_fsync=1),
             fs=True, mode="system", required=[("fio", 0, "write")]),
    Workload("randrw", "mixed random reads and writes, 70/30 (libaio, queue depth 8, O_DIRECT)",
             lambda c: fio("rw", c.disks[0].path, rw="randrw", rwmixread=70, size="16M", direct=1,
                           ioengine="libaio", iodepth=8),
             required=[("fio", 0, "read"), ("fio", 0, "write")]),
    Workload("flush", "writes with fsync every 8, overwrites with fdatasync every 4, ext4; every process on the disk",
             lambda c: ["sh", "-c",
                        " && ".join(" ".join(cmd) for cmd in (
                            fio("fsync", str(c.mnt / "a.dat"), rw="randwrite", size="2M", fsync=8),
                            fio("fdatasync", str(c.mnt / "b.dat"), rw="randwrite", size="2M", fdatasync=4,
                                overwrite=1)))],
             fs=True, mode="system", required=[("fio", 0, "write"), ("fio", 0, "flush")]),
    Workload("discard", "discards of 64 KiB (fio rw=trim, O_DIRECT)",
             lambda c: fio("trim", c.disks[0].path, rw="trim", bs="64k", size="32M", direct=1),
             required=[("fio", 0, "discard")]),
    # each job on its own 8 MiB: two requests at one sector in flight together are paired only by order
    Workload("multi", "two fio processes with 2 jobs each at once, one per disk (reads / writes)",
             lambda c: ["sh", "-c", " ".join(fio("mr", c.disks[0].path, rw="randread", size="8M", direct=1,
                                                ioengine="libaio", iodepth=4, numjobs=2,
                                                offset_increment="8M")) + " & " +
                        " ".join(fio("mw", c.disks[1].path, rw="randwrite", size="8M", direct=1,
                                     numjobs=2, offset_increment="8M")) + " & wait"],
             disks=2, required=[("fio", 0, "read"), ("fio", 1, "write")]),
]
BY_NAME = {w.name: w for w in WORKLOADS}


# ---- setup and teardown ------------------------------------------------------

def run(cmd: list[str], **kw) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, check=True, capture_output=True, text=True, **kw)


class Setup:
    """Loop devices (and a mounted ext4) for one workload; close() undoes everything made."""

    def __init__(self, tmp: Path, n: int, fs: bool, size_mb: int = 128):
        self.tmp = tmp
        self.disks: list[Disk] = []
        self.mnt: Path | None = None
        try:
            for i in range(n):
                img = tmp / f"disk{i}.img"
                with open(img, "wb") as f:
                    f.truncate(size_mb << 20)
                path = run(["losetup", "--find", "--show", "--direct-io=off", str(img)]).stdout.strip()
                self.disks.append(Disk(path, os.path.basename(path), gt.kdev_of_path(path)))
            if fs:
                run(["mkfs.ext4", "-q", "-F", "-E", "lazy_itable_init=0,lazy_journal_init=0", self.disks[0].path])
                mnt = tmp / "mnt"
                mnt.mkdir()
                run(["mount", "-o", "no_prefetch_block_bitmaps", self.disks[0].path, str(mnt)])
                self.mnt = mnt
        except BaseException:
            self.close()
            raise

    def close(self) -> None:
        if self.mnt is not None:
            subprocess.run(["umount", str(self.mnt)], capture_output=True)
            self.mnt = None
        for d in reversed(self.disks):
            subprocess.run(["losetup", "-d", d.path], capture_output=True)
        self.disks = []


# ---- one workload --------------------------------------------------------------

@dataclass
class Outcome:
    workload: Workload
    comparison: gt.Comparison
    truth: gt.Truth
    missing: list[str]

    @property
    def ok(self) -> bool:
        return self.comparison.ok and not self.missing


def write_truth_csv(truth: gt.Truth, path: Path) -> None:
    with open(path, "w") as f:
        f.write("tgid,tid,comm,dev,op,rwbs,sector,bytes,start_ns,issue_ns,complete_ns\n")
        for r in truth.requests:
            f.write(f"{r.tgid},{r.tid},{r.comm},{devno(r.dev)},{r.op},{r.rwbs},{r.sector},{r.bytes},"
                    f"{r.start_ns},{'' if r.issue_ns is None else r.issue_ns},{r.complete_ns}\n")


def run_workload(w: Workload, tmp: Path, verbose: bool = False) -> Outcome:
    tmp = tmp / w.name
    tmp.mkdir()
    setup = Setup(tmp, w.disks, w.fs)
    try:
        ctx = Ctx(tmp, setup.disks, setup.mnt)
        devs = [d.dev for d in setup.disks]
        dev_args = [a for d in setup.disks for a in ("--dev", d.name)]
        cmd = w.command(ctx)
        if verbose:
            print(f"verify: {w.name}: {' '.join(cmd)}", file=sys.stderr)
        runner = gt.run_command if w.mode == "command" else gt.run_system
        run = runner(dev_args, cmd, devs, PY, ROOT, tmp)
        (tmp / f"{w.name}.trace.txt").write_text(run.trace_text)
        cmp = run.comparison
        missing = []
        for comm, idx, op in w.required:
            found = [s for s in cmp.find(comm=comm, device=setup.disks[idx].name, op=op) if s.status == "compared"]
            if not found:
                missing.append(f"no {op} series of {comm} on {setup.disks[idx].name} on both sides")
        write_truth_csv(run.truth, tmp / f"{w.name}.truth.csv")
        return Outcome(w, cmp, run.truth, missing)
    finally:
        setup.close()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="verify.py", formatter_class=argparse.RawDescriptionHelpFormatter,
        description=__doc__.split("\n\n", 2)[1] + "\n\n" + __doc__.split("\n\n", 2)[2],
        epilog="workloads:\n" + "\n".join(f"  {w.name:<15} {w.help}" for w in WORKLOADS))
    p.add_argument("--workload", "-w", default="all", metavar="NAME|all",
                   help="the workload to run (default: all of them, one after the other)")
    p.add_argument("--keep", action="store_true",
                   help="keep the temp dir: per workload iotrace's dumps (iotrace.jsonl), the exact requests "
                        "(NAME.truth.csv) and the raw events (NAME.trace.txt)")
    p.add_argument("--list", action="store_true", help="list the workloads and exit")
    p.add_argument("-v", "--verbose", action="store_true", help="show every check, and the commands run")
    ns = p.parse_args(argv)
    if ns.list:
        for w in WORKLOADS:
            print(f"{w.name:<15} {w.help}")
        return 0
    if ns.workload != "all" and ns.workload not in BY_NAME:
        print(f"verify: no workload {ns.workload!r}; one of: all, {', '.join(BY_NAME)}", file=sys.stderr)
        return 2
    if os.geteuid() != 0:
        print("verify: must run as root (loop devices, tracefs, BPF): sudo .venv/bin/python scripts/verify.py",
              file=sys.stderr)
        return 2
    for tool in ("fio", "losetup", "mkfs.ext4", "mount"):
        if shutil.which(tool) is None:
            print(f"verify: {tool} not found in PATH", file=sys.stderr)
            return 2
    chosen = WORKLOADS if ns.workload == "all" else [BY_NAME[ns.workload]]
    tmp = Path(tempfile.mkdtemp(prefix="iotrace-verify-"))
    failed = []
    try:
        for w in chosen:
            print(f"\n=== {w.name}: {w.help}")
            try:
                o = run_workload(w, tmp, ns.verbose)
            except (gt.TruthError, subprocess.CalledProcessError, subprocess.TimeoutExpired) as e:
                detail = getattr(e, "stderr", "") or ""
                print(f"verify: {w.name}: could not run: {e}\n{detail}", file=sys.stderr)
                return 2
            print(gt.render(o.comparison, all_checks=ns.verbose))
            for m in o.missing:
                print(f"  MISSING: {m}")
            if not o.ok:
                failed.append(w.name)
    except KeyboardInterrupt:
        print("verify: interrupted", file=sys.stderr)
        return 2
    finally:
        if ns.keep:
            print(f"\nverify: kept {tmp}", file=sys.stderr)
        else:
            shutil.rmtree(tmp, ignore_errors=True)
    print(f"\nverify: {len(chosen) - len(failed)} of {len(chosen)} workload(s) match"
          + (f"; mismatches in: {', '.join(failed)}" if failed else ""))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
