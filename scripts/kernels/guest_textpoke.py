"""Inside a kernel-matrix guest: attach and detach raw tracepoint programs in a loop while two pairs of
processes switch context as fast as they can (`scripts/kernels/run.py --text-poke N`).

Every attach of the first program to a tracepoint, and every detach of the last, has the kernel
rewrite its own code while the other CPU may be running it (text_poke_bp: the call site takes an int3,
all CPUs are synced, the new instruction is written): a static key turns the tracepoint's jump on or
off and a static call points the site at the one probe left or at the iterator.  iotrace does this on
every start and exit, and most on sched_switch, whose call site in __schedule runs on every context
switch.  This is the guest-side reproducer of what wedged or crashed guests under qemu's multi-threaded
TCG (docs/kernels.md): a guest that survives prints one JSON object,

  python3 guest_textpoke.py CYCLES > textpoke.json

with the cycles done, the seconds they took and the events churned; one that does not never prints it.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

from bcc import BPF

# The tracepoints iotrace's programs sit on whose call sites run most often: sched_switch in
# __schedule, sched_wakeup in try_to_wake_up, block_rq_complete on every request.
EVENTS = ("sched_switch", "sched_wakeup", "block_rq_complete")
TEXT = "".join(f"RAW_TRACEPOINT_PROBE({e}) {{ return 0; }}\n" for e in EVENTS)

# One pair of processes bouncing a byte over two pipes: each round trip is two context switches.
PING_PONG = """
import os
a_r, a_w = os.pipe()
b_r, b_w = os.pipe()
if os.fork() == 0:
    while os.read(a_r, 1):
        os.write(b_w, b"x")
    os._exit(0)
while True:
    os.write(a_w, b"x")
    os.read(b_r, 1)
"""


def main() -> int:
    cycles = int(sys.argv[1])
    load = [subprocess.Popen([sys.executable, "-c", PING_PONG], start_new_session=True,
                             stdin=subprocess.DEVNULL) for _ in range(2)]
    try:
        b = BPF(text=TEXT)           # RAW_TRACEPOINT_PROBE attaches each program on load
        t0 = time.monotonic()
        for i in range(1, cycles + 1):
            for e in EVENTS:
                b.detach_raw_tracepoint(tp=e.encode())
            time.sleep(0.01)         # the load runs with the tracepoints off, as between two iotrace runs
            for e in EVENTS:
                b.attach_raw_tracepoint(tp=e.encode(), fn_name=f"raw_tracepoint__{e}".encode())
            if i % 50 == 0 or i == cycles:
                print(f"guest_textpoke: {i} of {cycles} attach/detach cycles, {time.monotonic() - t0:.0f} s",
                      file=sys.stderr, flush=True)
        seconds = time.monotonic() - t0
        b.cleanup()
    finally:
        for p in load:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()
    json.dump({"cycles": cycles, "seconds": round(seconds, 1), "events": list(EVENTS),
               "load": f"{len(load)} pipe ping-pong pairs"}, sys.stdout)
    return 0


if __name__ == "__main__":
    sys.exit(main())
