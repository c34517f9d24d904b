#!/usr/bin/env python3
"""Whether the kernel's own request stamps could replace iotrace's: rq->start_time_ns and io_start_time_ns
against the clock read at block_io_start and block_rq_issue, request by request.

    sudo .venv/bin/python scripts/kernel_stamps.py [--ios 20000]

A completion-side design (one program on block_rq_complete reading the
stamps the block layer keeps) would need no start map and no issue program.
This measures, on this kernel and a loop device over /dev/shm, for fio 4 KiB
O_DIRECT random reads at queue depth 32 (libaio) and 1 (psync): how many
requests have RQF_STATS (io_start_time_ns set) and RQF_IO_STAT
(start_time_ns set), how many have io_start_time_ns == start_time_ns, and
the signed difference "event clock - kernel stamp" in log2 ns buckets.
Since Linux 6.9 both stamps come from blk_time_get_ns(), which inside a plug
returns the plug's first reading: a request submitted and issued under one
plug (every O_DIRECT read through iomap, an io_submit batch) gets the same
value for both, and a queue phase of 0.  Offsets and flag bits come from the
running kernel's BTF (tracer.sources.kernel).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from tracer.sources import kernel

ROOT = Path(__file__).resolve().parent.parent

PROG = r"""
struct st { u64 start; u64 issue; };
BPF_HASH(seen, u64, struct st, 65536);
BPF_HISTOGRAM(dstart, int, 128);        /* log2 |event - start_time_ns|, +64 where the event is earlier */
BPF_HISTOGRAM(dissue, int, 128);        /* the same for block_rq_issue - io_start_time_ns (RQF_STATS only) */
BPF_ARRAY(counts, u64, 4);              /* completions, RQF_STATS, RQF_IO_STAT, io_start == start */
static __always_inline void inc(int i) { u64 *c = counts.lookup(&i); if (c) __sync_fetch_and_add(c, 1); }
static __always_inline int bucket(u64 ev, u64 k)
{
    s64 d = (s64)(ev - k);
    u64 a = d < 0 ? -d : d;
    return (a ? bpf_log2l(a) : 0) + (d < 0 ? 64 : 0);
}
RAW_TRACEPOINT_PROBE(block_io_start)
{
    u64 rq = ctx->args[0];
    struct st v = {.start = bpf_ktime_get_ns()};
    seen.update(&rq, &v);
    return 0;
}
RAW_TRACEPOINT_PROBE(block_rq_issue)
{
    u64 rq = ctx->args[0];
    struct st *v = seen.lookup(&rq);
    if (v)
        v->issue = bpf_ktime_get_ns();
    return 0;
}
RAW_TRACEPOINT_PROBE(block_rq_complete)
{
    u64 rq = ctx->args[0], st = 0, io = 0;
    u32 flags = 0;
    struct st *v = seen.lookup(&rq);
    if (!v)
        return 0;
    bpf_probe_read_kernel(&st, 8, (void *)(rq + OFF_START));
    bpf_probe_read_kernel(&io, 8, (void *)(rq + OFF_IO_START));
    bpf_probe_read_kernel(&flags, 4, (void *)(rq + OFF_FLAGS));
    inc(0);
    if (flags & (1U << BIT_STATS))
        inc(1);
    if (flags & (1U << BIT_IO_STAT))
        inc(2);
    if (io == st)
        inc(3);
    if (v->issue) {
        dstart.increment(bucket(v->start, st));
        if (flags & (1U << BIT_STATS))
            dissue.increment(bucket(v->issue, io));
    }
    seen.delete(&rq);
    return 0;
}
"""


def offsets() -> dict[str, int]:
    btf = kernel.open_btf()
    return {"OFF_START": btf.member("request", "start_time_ns").offset,
            "OFF_IO_START": btf.member("request", "io_start_time_ns").offset,
            "OFF_FLAGS": btf.member("request", "rq_flags").offset,
            "BIT_STATS": btf.enumerator("__RQF_STATS"), "BIT_IO_STAT": btf.enumerator("__RQF_IO_STAT")}


def spell(hist: dict[int, int]) -> str:
    out = []
    for k in sorted(hist, key=lambda b: (-(b % 64) if b >= 64 else b % 64 + 1000)):
        lo = 1 << (k % 64)
        out.append(f"{'-' if k >= 64 else '+'}{lo}..{2 * lo} ns: {hist[k]}")
    return ", ".join(out)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--ios", type=int, default=20_000)
    args = p.parse_args()
    if os.geteuid() != 0:
        print("kernel_stamps: needs root (BPF, losetup)", file=sys.stderr)
        return 2
    from bcc import BPF  # noqa: PLC0415 - root and bcc only here

    b = BPF(text=PROG, cflags=[f"-D{k}={v}" for k, v in offsets().items()])
    tmp = Path(tempfile.mkdtemp(prefix="iotrace-stamps-", dir="/dev/shm"))
    img = tmp / "img"
    with open(img, "wb") as f:
        f.truncate(256 << 20)
    dev = subprocess.run(["losetup", "-f", "--show", str(img)], capture_output=True, text=True,
                         check=True).stdout.strip()
    try:
        for engine, depth in (("libaio", 32), ("psync", 1)):
            for name in ("counts", "dstart", "dissue"):
                b[name].clear()
            subprocess.run(["fio", "--name=stamps", f"--filename={dev}", "--rw=randread", "--bs=4k", "--direct=1",
                            f"--ioengine={engine}", f"--iodepth={depth}", f"--number_ios={args.ios}",
                            "--size=256M", "--output-format=terse"], stdout=subprocess.DEVNULL, check=True)
            c = [b["counts"][i].value for i in range(4)]
            print(f"{engine} qd{depth}: {c[0]} completions (other disks' too), RQF_STATS {c[1]}, RQF_IO_STAT {c[2]}, "
                  f"io_start_time_ns == start_time_ns {c[3]}")
            for name, what in (("dstart", "block_io_start - start_time_ns"),
                               ("dissue", "block_rq_issue - io_start_time_ns")):
                h = {k.value: v.value for k, v in b[name].items() if v.value}
                print(f"  {what}: {spell(h)}")
    finally:
        subprocess.run(["losetup", "-d", dev], check=False)
        subprocess.run(["rm", "-rf", str(tmp)], check=False)
    return 0


if __name__ == "__main__":
    sys.exit(main())
