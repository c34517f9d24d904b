"""What the per-file rows (bpf/files.bpf.h) cost: the raw-path programs' ns per run with and without them.

    sudo .venv/bin/python scripts/bench_files.py [--before DIR] [--seconds 10] [--rounds 3] [--json FILE]

Makes an ext4 on a loop device (torn down at the end) with a 512 MiB file.  In each of --rounds
rounds, for buffered and then O_DIRECT 4 KiB random reads of it by fio (POSIX_FADV_RANDOM, the cache
dropped first: a request per buffered read, each for a page-cache page whose file the completion
looks up; O_DIRECT's user pages stop the lookup at their anonymous mapping), loads the raw-tracepoint
programs from this tree's bpf/ with file rows ("files") and without them ("before": the same sources
compiled with IOTRACE_NO_FILES, as top and serve load them; or, with --before DIR, a bpf/ without
files.bpf.h, e.g. `mkdir /tmp/b && git archive 091f0a3 bpf | tar -x -C /tmp/b`, DIR=/tmp/b/bpf), in
alternating order, tracing only the fio it forks.  Prints JSON lines: ns per run (BPF_ENABLE_STATS:
run_time_ns / run_cnt) and runs of every program, per mode and round; then the completion program's
median over the rounds.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from tracer.testing import BPFStats

ROOT = Path(__file__).resolve().parent.parent


def sh(*args: str, **kw) -> str:
    return subprocess.run(args, check=True, capture_output=True, text=True, **kw).stdout.strip()


def one(bpf_dir: str, path: Path, seconds: float, direct: bool, files: bool = True) -> dict[str, float]:
    """ns per run of each program while fio runs, with the sources of `bpf_dir` (`files`: with file rows)."""
    code = f"""
import json, os, sys, time, subprocess
os.environ["IOTRACE_BPF_DIR"] = {bpf_dir!r}
from tracer.sources.probe import Probe, ProbeOptions
fd = os.open({str(path)!r}, os.O_RDONLY)
os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
r, w = os.pipe()
child = os.fork()
if child == 0:
    os.close(w)
    if not os.read(r, 1):
        os._exit(1)     # the tracer did not start
    os.execvp("fio", {["fio", "--name=bench", f"--filename={path}", "--rw=randread", "--bs=4k",
                       f"--direct={int(direct)}", "--fadvise_hint=1", "--ioengine=psync",
                       f"--runtime={seconds}", "--time_based", "--output-format=terse"]!r})
os.close(r)
p = Probe(ProbeOptions(attach="raw_tp", pids=[child], files={files!r}))
try:
    p.bpf["files0"]
except KeyError:
    p.files = None      # sources from before the file rows
before = p.program_costs()
os.write(w, b"g")
os.waitpid(child, 0)
after = p.program_costs()
p.drain(final=True)
p.close()
out = {{}}
for name, a in after.items():
    runs = a["runs"] - before[name]["runs"]
    if runs:
        out[name] = [round((a["run_time_ns"] - before[name]["run_time_ns"]) / runs, 1), runs]
print(json.dumps(out))
"""
    return json.loads(sh(sys.executable, "-c", code).splitlines()[-1])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=10)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--before", help="a bpf/ directory without files.bpf.h (default: this tree's, without file rows)")
    ap.add_argument("--json", metavar="FILE", help="also write the rounds and the medians to FILE")
    ns = ap.parse_args()
    with BPFStats():        # counted, unlike the sysctl: other sessions' setting is neither needed nor undone
        return measure(ns)


def measure(ns: argparse.Namespace) -> int:
    """The rounds, on a scratch ext4 file system over a loop device made here and removed after."""
    tmp = Path(tempfile.mkdtemp(prefix="iotrace-bench-files-"))
    backing, mnt = tmp / "backing", tmp / "mnt"
    loop = None
    try:
        with open(backing, "wb") as f:
            f.truncate(768 << 20)
        loop = sh("losetup", "--find", "--show", str(backing))
        sh("mkfs.ext4", "-q", "-F", loop)
        mnt.mkdir()
        sh("mount", loop, str(mnt))
        data = mnt / "data"
        sh("dd", "if=/dev/urandom", f"of={data}", "bs=1M", "count=512", "conv=fsync")
        modes = {"files": (str(ROOT / "bpf"), True), "before": (ns.before or str(ROOT / "bpf"), bool(ns.before))}
        rounds, medians = [], []
        done: dict[tuple[str, bool], list[float]] = {}
        for rnd in range(ns.rounds):
            for direct in (False, True):
                order = list(modes) if rnd % 2 == 0 else list(reversed(modes))
                for mode in order:
                    bpf_dir, files = modes[mode]
                    costs = one(bpf_dir, data, ns.seconds, direct, files=files)
                    rounds.append({"round": rnd, "mode": mode, "direct": direct, "ns_per_run": costs})
                    print(json.dumps(rounds[-1]))
                    done.setdefault((mode, direct), []).append(costs.get("block_rq_complete", [0])[0])
        for (mode, direct), v in sorted(done.items()):
            medians.append({"mode": mode, "direct": direct, "block_rq_complete_median_ns": statistics.median(v)})
            print(json.dumps(medians[-1]))
        if ns.json:
            Path(ns.json).write_text(json.dumps({"rounds": rounds, "medians": medians}, indent=1) + "\n")
    finally:
        subprocess.run(["umount", str(mnt)], capture_output=True)
        if loop:
            subprocess.run(["losetup", "-d", loop], capture_output=True)
        backing.unlink(missing_ok=True)
        for d in (mnt, tmp):
            try:
                d.rmdir()
            except OSError:
                pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
