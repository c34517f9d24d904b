"""Workloads with known per-process and per-thread I/O, for the attribution tests.

    attrload.py threads DEVICE COUNT...              one named thread per COUNT
    attrload.py mp METHOD DEVICE COUNT... [--parent N]
                                                     one multiprocessing worker per COUNT
    attrload.py prefork DEVICE --go PATH --early N --late N --parent N --thread N
                                                     a child forked before PATH exists, one after
    attrload.py write PATH MIB [--fsync]             buffered writes, optionally fsync'd
    attrload.py leader-exit DEVICE --go PATH COUNT   the main thread exits, another thread reads
    attrload.py thread-exec DEVICE --go PATH COUNT   a second thread execs `read DEVICE COUNT`
    attrload.py read DEVICE COUNT                    just read

Every reader reads its own range of 4 KiB blocks with O_DIRECT (one request
per block, see ioload.py), so each process or thread has an exact count.
Each command prints one JSON object saying who read how much.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import multiprocessing
import os
import sys
import threading
import time

from ioload import read_blocks

PR_SET_NAME = 15


def set_thread_name(name: str) -> None:
    """Name the calling thread in the kernel (its comm), as PyTorch and tf.data name theirs."""
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_NAME, name.encode()[:15], 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_NAME)")


def offsets(counts: list[int]) -> list[int]:
    """First block of each reader: disjoint ranges, back to back."""
    out, at = [], 0
    for n in counts:
        out.append(at)
        at += n
    return out


def run_threads(device: str, counts: list[int]) -> dict:
    barrier = threading.Barrier(len(counts))
    found: dict[int, tuple[int, str]] = {}

    def reader(i: int, count: int, first: int) -> None:
        name = f"reader{i}"
        set_thread_name(name)
        # all alive at once, so no thread id is reused by the next thread
        barrier.wait()
        read_blocks(device, count, first)
        found[i] = (threading.get_native_id(), name)
        barrier.wait()

    threads = [threading.Thread(target=reader, args=(i, n, first))
               for i, (n, first) in enumerate(zip(counts, offsets(counts), strict=True))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return {"pid": os.getpid(), "comm": _comm(), "threads": [
        {"tid": found[i][0], "name": found[i][1], "count": n} for i, n in enumerate(counts)]}


def _comm() -> str:
    with open("/proc/self/comm") as f:
        return f.read().strip()


def _worker(device: str, count: int, first: int) -> None:
    read_blocks(device, count, first)


def run_mp(method: str, device: str, counts: list[int], parent: int) -> dict:
    ctx = multiprocessing.get_context(method)
    starts = offsets([*counts, parent])
    procs = [ctx.Process(target=_worker, args=(device, n, first)) for n, first in zip(counts, starts, strict=False)]
    for p in procs:
        p.start()
    for p in procs:
        p.join()
        if p.exitcode != 0:
            raise SystemExit(f"worker {p.pid} exited with {p.exitcode}")
    if parent:
        read_blocks(device, parent, starts[-1])
    return {"pid": os.getpid(), "workers": [{"pid": p.pid, "count": n} for p, n in zip(procs, counts, strict=True)]}


def run_prefork(device: str, go: str, early: int, late: int, parent: int, thread: int) -> dict:
    """A child and a thread made before `go` exists (before tracing starts), a child forked after.

    Prints the pids first, so the tracer can be pointed at this process.
    """
    first = offsets([early, late, parent, thread])

    def wait_go() -> None:
        while not os.path.exists(go):
            time.sleep(0.01)

    early_pid = os.fork()
    if early_pid == 0:
        wait_go()
        read_blocks(device, early, first[0])
        os._exit(0)
    t = threading.Thread(target=lambda: (wait_go(), read_blocks(device, thread, first[3])))
    t.start()
    print(json.dumps({"pid": os.getpid(), "early": early_pid}), flush=True)
    wait_go()
    late_pid = os.fork()
    if late_pid == 0:
        read_blocks(device, late, first[1])
        os._exit(0)
    for child in (early_pid, late_pid):
        _, status = os.waitpid(child, 0)
        if status:
            raise SystemExit(f"child {child} failed: {status}")
    t.join()
    read_blocks(device, parent, first[2])
    return {"pid": os.getpid(), "early": early_pid, "late": late_pid}


def run_write(path: str, mib: int, fsync: bool) -> dict:
    chunk = os.urandom(1 << 20)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        for _ in range(mib):
            os.write(fd, chunk)
        if fsync:
            os.fsync(fd)
    finally:
        os.close(fd)
    return {"pid": os.getpid(), "comm": _comm()}


def run_leader_exit(device: str, go: str, count: int) -> None:
    """Once `go` exists, the main thread exits alone (pthread_exit) and another thread reads.

    The process lives on with a zombie leader, as processes whose main()
    calls pthread_exit do.  Prints the pid first; the reader ends the process.
    """
    def wait_go() -> None:
        while not os.path.exists(go):
            time.sleep(0.01)

    def reader() -> None:
        wait_go()
        while _leader_state() != "Z":   # read only once the leader is gone
            time.sleep(0.01)
        read_blocks(device, count, 0)
        print(json.dumps({"pid": os.getpid(), "tid": threading.get_native_id()}), flush=True)
        os._exit(0)

    threading.Thread(target=reader).start()
    print(json.dumps({"pid": os.getpid()}), flush=True)
    wait_go()
    # ctypes releases the GIL around foreign calls, so the reader carries on
    ctypes.CDLL(None).pthread_exit(None)


def run_thread_exec(device: str, go: str, count: int) -> None:
    """Once `go` exists, a thread other than the main one execs a reader.

    exec from a non-leader thread ends every other thread, the leader
    included, and the process goes on under its old pid with the new image.
    """
    def execer() -> None:
        while not os.path.exists(go):
            time.sleep(0.01)
        os.execv(sys.executable, [sys.executable, os.path.abspath(__file__), "read", device, str(count)])

    threading.Thread(target=execer).start()
    print(json.dumps({"pid": os.getpid()}), flush=True)
    while True:
        time.sleep(1)


def _leader_state() -> str:
    with open(f"/proc/{os.getpid()}/task/{os.getpid()}/stat") as f:
        return f.read().rsplit(")", 1)[1].split()[0]


def main() -> int:
    p = argparse.ArgumentParser()
    sub = p.add_subparsers(dest="cmd", required=True)
    t = sub.add_parser("threads")
    t.add_argument("device")
    t.add_argument("counts", type=int, nargs="+")
    m = sub.add_parser("mp")
    m.add_argument("method", choices=("fork", "spawn", "forkserver"))
    m.add_argument("device")
    m.add_argument("counts", type=int, nargs="+")
    m.add_argument("--parent", type=int, default=0)
    f = sub.add_parser("prefork")
    f.add_argument("device")
    f.add_argument("--go", required=True)
    for name in ("early", "late", "parent", "thread"):
        f.add_argument(f"--{name}", type=int, required=True)
    w = sub.add_parser("write")
    w.add_argument("path")
    w.add_argument("mib", type=int)
    w.add_argument("--fsync", action="store_true")
    e = sub.add_parser("leader-exit")
    e.add_argument("device")
    e.add_argument("--go", required=True)
    e.add_argument("count", type=int)
    x = sub.add_parser("thread-exec")
    x.add_argument("device")
    x.add_argument("--go", required=True)
    x.add_argument("count", type=int)
    r = sub.add_parser("read")
    r.add_argument("device")
    r.add_argument("count", type=int)
    a = p.parse_args()
    if a.cmd == "leader-exit":
        run_leader_exit(a.device, a.go, a.count)   # does not return: the reader ends the process
    elif a.cmd == "thread-exec":
        run_thread_exec(a.device, a.go, a.count)   # does not return: the exec replaces it
    elif a.cmd == "read":
        read_blocks(a.device, a.count, 0)
        out = {"pid": os.getpid(), "tid": threading.get_native_id()}
    elif a.cmd == "threads":
        out = run_threads(a.device, a.counts)
    elif a.cmd == "mp":
        out = run_mp(a.method, a.device, a.counts, a.parent)
    elif a.cmd == "prefork":
        out = run_prefork(a.device, a.go, a.early, a.late, a.parent, a.thread)
    else:
        out = run_write(a.path, a.mib, a.fsync)
    print(json.dumps(out), flush=True)
    return 0

if __name__ == "__main__":
    sys.exit(main())
