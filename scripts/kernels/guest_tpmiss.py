"""Inside a kernel-matrix guest: which block_rq_complete events the perf-event path skips, and what held
the CPU's guard when it did (`scripts/kernels/run.py --probe-misses`).

Perf-event tracepoint programs (iotrace's --attach tracepoint) run under one per-CPU guard
(bpf_prog_active): an event that fires while it is held on that CPU runs none of the tracepoint's
perf-event programs, and the kernel adds one to each program's recursion_misses.  Who holds it: any
perf-event or kprobe BPF program running on the CPU, and a BPF map system call between
bpf_disable_instrumentation() and its end (user space reading or writing a map).

This loads, before iotrace, a perf-event program on block:block_rq_complete that adds one to its CPU's mark, and
after it a raw tracepoint program on the same event (a guard of its own, called after the perf-event
handler) that takes one off.  A completion the raw program finds unmarked ran no perf-event program:
it counts it by the comm of the task current on the CPU (the task the completion interrupted, or the
loop worker completing in its own context).  Then it runs fio under iotrace as guest_fio.py does, per
variant, and prints one JSON object: per variant the completions, the unmarked ones by comm, the
diagnostic perf program's and iotrace's own block_rq_complete recursion_misses, and iotrace's counts.

  python3 guest_tpmiss.py SRC_DIR WORK_DIR > tpmiss.json
"""

from __future__ import annotations

import ctypes as ct
import json
import os
import subprocess
import sys
import time
from pathlib import Path

TEXT = r"""
struct comm_key { char comm[16]; };
BPF_PERCPU_ARRAY(mark, u64, 1);
BPF_ARRAY(counts, u64, 4);          /* 0 perf runs, 1 raw runs, 2 unmarked, 3 unmarked on loop dev */
BPF_HASH(by_comm, struct comm_key, u64, 1024);

static __always_inline void add(u32 i)
{
    u64 *n = counts.lookup(&i);
    if (n)
        __sync_fetch_and_add(n, 1);
}

int pe_complete(void *args)
{
    u32 zero = 0;
    u64 *m = mark.lookup(&zero);
    if (m)
        __sync_fetch_and_add(m, 1);
    add(0);
    return 0;
}

int raw_complete(struct bpf_raw_tracepoint_args *ctx)
{
    u32 zero = 0;
    u64 *m = mark.lookup(&zero);
    struct comm_key k = {};
    u64 one = 1, *n;

    add(1);
    if (!m)
        return 0;
    if (*m) {
        /* a count, not a flag: a completion nested between the two programs leaves the outer one marked */
        __sync_fetch_and_add(m, -1);
        return 0;
    }
    add(2);
    bpf_get_current_comm(&k.comm, sizeof(k.comm));
    n = by_comm.lookup(&k);
    if (n)
        __sync_fetch_and_add(n, 1);
    else
        by_comm.update(&k, &one);
    return 0;
}
"""

sys.path.insert(0, str(Path(__file__).resolve().parent))
import guest_fio  # noqa: E402


def load():
    from bcc import BPF
    b = BPF(text=TEXT)
    # in this order: the tracepoint's probes run in the order they were registered, and the raw program
    # must run after the perf-event one (bcc's autoload attached the raw one first: then each CPU's first
    # event, and the event after each skip, looked unmarked)
    b.attach_tracepoint(tp="block:block_rq_complete", fn_name="pe_complete")
    b.attach_raw_tracepoint(tp="block_rq_complete", fn_name="raw_complete")
    return b


def prog_misses(fd: int) -> int:
    sys.path.insert(0, sys.argv[1])
    from tracer.testing import prog_stats
    return prog_stats(fd).recursion_misses


def read(b) -> dict:
    c = b["counts"]
    out = {"perf_runs": c[ct.c_int(0)].value, "raw_runs": c[ct.c_int(1)].value,
           "unmarked": c[ct.c_int(2)].value,
           "unmarked_by_comm": {k.comm.decode(errors="replace"): v.value for k, v in b["by_comm"].items()}}
    for name, fn in b.funcs.items():
        n = name.decode() if isinstance(name, bytes) else name
        if n == "pe_complete":
            out["diag_perf_recursion_misses"] = prog_misses(fn.fd)
    return out


def reset(b) -> None:
    for i in range(4):
        b["counts"][ct.c_int(i)] = ct.c_ulonglong(0)
    b["by_comm"].clear()


def main() -> None:
    src, work = Path(sys.argv[1]), Path(sys.argv[2])
    work.mkdir(parents=True, exist_ok=True)
    try:
        Path("/proc/sys/kernel/bpf_stats_enabled").write_text("1\n")
    except OSError:
        pass
    b = load()
    # the perf-event path three times (its skips are rare and vary), then without the per-process rows
    variants = [("none", "tracepoint", []), ("none", "tracepoint", []), ("none", "tracepoint", []),
                ("none", "tracepoint", ["--no-tasks"])]
    out = []
    for sched, attach, extra in variants:
        reset(b)
        base = read(b).get("diag_perf_recursion_misses", 0)
        if attach is None:
            rec = fio_alone(work, sched)
        else:
            rec = guest_fio.one_run(src, work, sched, attach, 600, extra)
        got = read(b)
        got["diag_perf_recursion_misses"] = got.get("diag_perf_recursion_misses", 0) - base
        rec["variant"] = " ".join([attach or "fio alone", *extra])
        rec["diag"] = got
        print(f"guest_tpmiss: {json.dumps(rec)}", file=sys.stderr, flush=True)
        out.append(rec)
    json.dump({"kernel": os.uname().release, "runs": out}, sys.stdout, indent=1)


def fio_alone(work: Path, sched: str) -> dict:
    backing = work / "alone.img"
    with open(backing, "wb") as f:
        f.truncate(256 << 20)
    loop = guest_fio.sh("losetup", "--find", "--show", "--direct-io=off", str(backing))
    try:
        t0 = time.monotonic()
        subprocess.run(guest_fio.fio_cmd(loop, work / "alone.json"), check=True, capture_output=True)
        return {"scheduler": sched, "seconds": round(time.monotonic() - t0, 1)}
    finally:
        subprocess.run(["losetup", "-d", loop], check=False)
        backing.unlink(missing_ok=True)


if __name__ == "__main__":
    main()
