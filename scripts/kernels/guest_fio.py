"""Inside the kernel-matrix guest: how many of fio's requests iotrace records, beside what the kernel says.

One fio job (4 KiB randread, O_DIRECT, libaio, 2 jobs x iodepth 16, 4096 requests in all) on a loop
device backed by a file on ext4 (where the loop device takes no scheduler, as on 5.10, the scheduler's
rows run on a null_blk disk), for each I/O scheduler (none, mq-deadline) and attach path (raw_tp,
tracepoint), traced by `python -m tracer.cli -j --dev loopN --attach PATH -- fio ...`.  For the same
run it counts the device's completed requests in /sys/block/loopN/stat and the block tracepoints
that fired for it (a private tracefs instance, filtered on the device).  This is what the BPF side's
choice of start event is judged by: block_io_start exists only from 6.5 on, and before that
block_rq_insert fires only for requests that pass through a scheduler.

  python3 guest_fio.py SRC_DIR WORK_DIR > fio.json
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

EVENTS = ("block_getrq", "block_rq_insert", "block_rq_issue", "block_rq_complete", "block_io_start", "block_io_done")
TRACING = Path("/sys/kernel/tracing")
REQUESTS = 4096
JOBS = 2


def sh(*args: str, **kw) -> str:
    return subprocess.run(args, check=True, capture_output=True, text=True, **kw).stdout.strip()


def stat_ios(dev: str) -> dict[str, int]:
    """Completed requests of /sys/block/DEV/stat: reads, writes, discards, flushes (what exists), and the
    reads merged into others (a scheduler may merge fio's adjacent random reads: fewer requests)."""
    f = [int(x) for x in Path(f"/sys/block/{dev}/stat").read_text().split()]
    out = {"read": f[0], "read_merges": f[1], "write": f[4]}
    if len(f) >= 15:
        out["discard"] = f[11]
    if len(f) >= 17:
        out["flush"] = f[15]
    return out


class Instance:
    """A private tracefs instance with the block events on, each filtered to one device."""

    def __init__(self, devno: int):
        self.dir = TRACING / "instances" / f"iotrace-matrix-{os.getpid()}"
        self.dir.mkdir()
        (self.dir / "buffer_size_kb").write_text("16384\n")   # ~4 events x 4096 requests, with room
        self.events = []
        for ev in EVENTS:
            d = self.dir / "events" / "block" / ev
            if not d.is_dir():
                continue                                      # block_io_start: 6.5+
            (d / "filter").write_text(f"dev == {devno}\n")
            self.events.append(ev)

    def on(self, on: bool) -> None:
        for ev in self.events:
            (self.dir / "events" / "block" / ev / "enable").write_text("1\n" if on else "0\n")

    def counts(self) -> dict[str, int]:
        n = dict.fromkeys(self.events, 0)
        with open(self.dir / "trace") as f:
            for line in f:
                if line.startswith("#"):
                    continue
                for ev in self.events:
                    if f" {ev}:" in line:
                        n[ev] += 1
                        break
        overrun = 0
        for cpu in (self.dir / "per_cpu").iterdir():
            for line in (cpu / "stats").read_text().splitlines():
                if line.startswith("overrun:"):
                    overrun += int(line.split()[1])
        n["overrun"] = overrun
        return n

    def close(self) -> None:
        self.on(False)
        self.dir.rmdir()


def fio_cmd(loop: str, out: Path) -> list[str]:
    """The measured fio job on `loop`, its JSON report written to `out`."""
    return ["fio", "--name=matrix", f"--filename={loop}", "--rw=randread", "--bs=4k", "--direct=1",
            "--ioengine=libaio", "--iodepth=16", f"--numjobs={JOBS}", f"--number_ios={REQUESTS // JOBS}",
            "--size=128M", "--group_reporting", "--output-format=json", f"--output={out}"]


def offers(dev: str, sched: str) -> bool:
    """Whether /sys/block/DEV/queue/scheduler lists `sched`."""
    return sched in Path(f"/sys/block/{dev}/queue/scheduler").read_text().replace("[", " ").replace("]", " ").split()


def null_disk() -> str:
    """/dev/nullb0, a null_blk disk with blk-mq (Debian's kernels ship the module): where a loop device takes
    no I/O scheduler (5.10's offer [none] only), the scheduler rows run on it."""
    if not Path("/dev/nullb0").exists():
        sh("modprobe", "null_blk", "nr_devices=1", "queue_mode=2", "gb=1")
    return "/dev/nullb0"


def one_run(src: Path, work: Path, sched: str, attach: str, timeout: float, extra: list[str] = ()) -> dict:
    backing = work / f"fio-{sched}-{attach}.img"
    with open(backing, "wb") as f:
        f.truncate(256 << 20)
    loop = sh("losetup", "--find", "--show", "--direct-io=off", str(backing))
    disk = loop if offers(os.path.basename(loop), sched) else null_disk()
    dev = os.path.basename(disk)
    rec: dict = {"scheduler": sched, "attach": attach, "device": dev}
    if disk != loop:
        rec["note"] = f"{os.path.basename(loop)} offers no {sched}: null_blk"
    inst = None
    try:
        qs = Path(f"/sys/block/{dev}/queue/scheduler")
        rec["schedulers_offered"] = qs.read_text().strip()
        try:
            qs.write_text(sched + "\n")
        except OSError as e:
            rec["error"] = f"cannot select {sched}: {e}"
            return rec
        rec["scheduler_set"] = qs.read_text().strip()
        major, minor = (int(x) for x in Path(f"/sys/block/{dev}/dev").read_text().split(":"))
        inst = Instance((major << 20) | minor)
        fio_json = work / f"fio-{sched}-{attach}.json"
        fio = fio_cmd(disk, fio_json)
        before = stat_ios(dev)
        inst.on(True)
        t0 = time.monotonic()
        cmd = [sys.executable, "-m", "tracer.cli", "-j", "--dev", dev, "--attach", attach, *extra, "--", *fio]
        r = subprocess.run(cmd, cwd=src, capture_output=True, text=True, timeout=timeout)
        rec["seconds"] = round(time.monotonic() - t0, 1)
        inst.on(False)
        after = stat_ios(dev)
        rec["iotrace_rc"] = r.returncode
        rec["diskstats"] = {k: after[k] - before[k] for k in after}
        rec["tracefs"] = inst.counts()
        dumps = [json.loads(x) for x in r.stdout.splitlines() if x.startswith("{")]
        final = [d for d in dumps if d.get("kind") == "final"]
        if final:
            d = final[-1]
            rows = [s for s in d.get("series", []) if s.get("device") == dev]
            rec["iotrace_recorded"] = sum(s["count"] for s in rows)
            by: dict[str, int] = {}
            for s in rows:
                by[f'{s["comm"]}/{s["op"]}'] = by.get(f'{s["comm"]}/{s["op"]}', 0) + s["count"]
            rec["iotrace_by_comm"] = by
            rec["iotrace_dropped"] = {k: v for k, v in d.get("dropped", {}).items() if v}
            rec["iotrace_attach"] = d.get("attach")
            rec["iotrace_coverage"] = d.get("coverage", {}).get("devices", {}).get(dev)
            # the per-process programs, loaded beside the block ones (absent: they did not load; why in stderr)
            rec["iotrace_tasks_sources"] = d.get("tasks_sources")
            # the kernel's own count of completions it ran no program for (the perf-event path's guard)
            rec["iotrace_complete_missed"] = (d.get("bpf_programs") or {}).get("block_rq_complete", {}).get("missed")
        else:
            rec["iotrace_recorded"] = None
        if r.returncode != 0 or not final or not rec.get("iotrace_tasks_sources"):
            rec["iotrace_stderr"] = r.stderr[-1500:]
        try:
            rec["fio_total_ios"] = json.loads(fio_json.read_text())["jobs"][0]["read"]["total_ios"]
        except (OSError, ValueError, KeyError, IndexError):
            rec["fio_total_ios"] = None
    except subprocess.TimeoutExpired:
        rec["error"] = f"iotrace + fio took over {timeout:.0f} s"
    except Exception as e:       # one broken run must not lose the others' numbers
        rec["error"] = f"{type(e).__name__}: {e}"
    finally:
        if inst is not None:
            try:
                inst.close()
            except OSError:
                pass
        subprocess.run(["losetup", "-d", loop], check=False)
        backing.unlink(missing_ok=True)
        if disk != loop:
            subprocess.run(["modprobe", "-r", "null_blk"], check=False)
    return rec


def main() -> None:
    src, work = Path(sys.argv[1]), Path(sys.argv[2])
    timeout = float(os.environ.get("IOTRACE_FIO_TIMEOUT", "600"))
    work.mkdir(parents=True, exist_ok=True)
    runs = []
    for sched in ("none", "mq-deadline"):
        for attach in ("raw_tp", "tracepoint"):
            rec = one_run(src, work, sched, attach, timeout)
            print(f"guest_fio: {json.dumps(rec)}", file=sys.stderr, flush=True)
            runs.append(rec)
    json.dump({"kernel": os.uname().release, "requests": REQUESTS, "runs": runs}, sys.stdout, indent=1)


if __name__ == "__main__":
    main()
