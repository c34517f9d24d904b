"""Process trees that exist before a tracer attaches with --pid, for tests/privileged/test_attach.py.

    treeload.py tree DEVICE CTRL BLOCKS      root -> child -> a multiprocessing pool of 2 workers
    treeload.py forker DEVICE CTRL BLOCKS    a parent forking short-lived readers in a tight loop
    treeload.py busy DEVICE CTRL BLOCKS      the tree of `tree`, every process reading from the start

tree: every process is up before CTRL/ready appears; once CTRL/go exists the
root, the child and the pool (8 tasks) each read BLOCKS 4 KiB blocks with
O_DIRECT (one request each, ioload.read_blocks), then the root writes
CTRL/result: {pid: requests} for every process, and exits.

forker: from the start until CTRL/stop exists, the parent forks children
one after another; each reads BLOCKS blocks and exits.  The parent notes each
child's pid with the time.monotonic() of its fork, and writes them to
CTRL/result as [[pid, t], ...] before it exits.

busy: the tree of `tree` (root, child, a pool of 2), each of the 4 processes
reading its own BLOCKS blocks over and over, one request at a time, from
before CTRL/ready appears until CTRL/stop exists: a tree that is the only
I/O on DEVICE all through a tracer's attach.  CTRL/result: {pid: requests}.

Each reader reads a range of its own, so any count can be checked exactly.
"""

from __future__ import annotations

import json
import multiprocessing
import os
import sys
import time
from pathlib import Path

from ioload import read_blocks

POOL_TASKS = 8


def wait_for(path: Path) -> None:
    while not path.exists():
        time.sleep(0.005)


def _pool_task(args: tuple[str, int, int]) -> tuple[int, int]:
    device, blocks, first = args
    read_blocks(device, blocks, first)
    return os.getpid(), blocks


def _child(device: str, ctrl: Path, blocks: int, w: int) -> None:
    ctx = multiprocessing.get_context("fork")
    with ctx.Pool(2) as pool:
        workers = [p.pid for p in pool._pool]   # noqa: SLF001 - the test wants the workers' pids now
        os.write(w, (json.dumps({"child": os.getpid(), "workers": workers}) + "\n").encode())
        wait_for(ctrl / "go")
        read_blocks(device, blocks, blocks)
        done: dict[int, int] = {os.getpid(): blocks}
        tasks = [(device, blocks, (2 + i) * blocks) for i in range(POOL_TASKS)]
        for pid, n in pool.map(_pool_task, tasks, chunksize=1):
            done[pid] = done.get(pid, 0) + n
    os.write(w, (json.dumps(done) + "\n").encode())


def _spawn(body, device: str, ctrl: Path, blocks: int):
    """Fork the child running `body(device, ctrl, blocks, w)`; once it has said who is up (its first line on
    the pipe), CTRL/ready names them with this root: (the child's pid, the pipe's remaining lines)."""
    r, w = os.pipe()
    child = os.fork()
    if child == 0:
        os.close(r)
        try:
            body(device, ctrl, blocks, w)
        finally:
            os._exit(0)
    os.close(w)
    lines = os.fdopen(r)
    up = json.loads(lines.readline())
    (ctrl / "ready").write_text(json.dumps({"root": os.getpid(), **up}))
    return child, lines


def tree(device: str, ctrl: Path, blocks: int) -> int:
    child, lines = _spawn(_child, device, ctrl, blocks)
    wait_for(ctrl / "go")
    read_blocks(device, blocks, 0)
    done = {int(k): v for k, v in json.loads(lines.readline()).items()}
    os.waitpid(child, 0)
    done[os.getpid()] = blocks
    (ctrl / "result").write_text(json.dumps(done))
    return 0


def _read_until(device: str, ctrl: Path, blocks: int, first: int) -> int:
    """BLOCKS blocks from `first`, again and again until CTRL/stop exists: the requests made."""
    n = 0
    while not (ctrl / "stop").exists():
        read_blocks(device, blocks, first)
        n += blocks
    return n


def _busy_task(args: tuple[str, str, int, int]) -> tuple[int, int]:
    device, ctrl, blocks, first = args
    return os.getpid(), _read_until(device, Path(ctrl), blocks, first)


def _busy_child(device: str, ctrl: Path, blocks: int, w: int) -> None:
    ctx = multiprocessing.get_context("fork")
    with ctx.Pool(2) as pool:
        workers = [p.pid for p in pool._pool]   # noqa: SLF001 - the test wants the workers' pids now
        # one endless task per worker (chunksize 1, two tasks): both read all along
        running = pool.map_async(_busy_task, [(device, str(ctrl), blocks, (2 + i) * blocks) for i in range(2)],
                                 chunksize=1)
        os.write(w, (json.dumps({"child": os.getpid(), "workers": workers}) + "\n").encode())
        done = {os.getpid(): _read_until(device, ctrl, blocks, blocks)}
        for pid, n in running.get():
            done[pid] = done.get(pid, 0) + n
    os.write(w, (json.dumps(done) + "\n").encode())


def busy(device: str, ctrl: Path, blocks: int) -> int:
    child, lines = _spawn(_busy_child, device, ctrl, blocks)
    mine = _read_until(device, ctrl, blocks, 0)
    done = {int(k): v for k, v in json.loads(lines.readline()).items()}
    os.waitpid(child, 0)
    done[os.getpid()] = mine
    (ctrl / "result").write_text(json.dumps(done))
    return 0


def forker(device: str, ctrl: Path, blocks: int) -> int:
    forked: list[tuple[int, float]] = []
    (ctrl / "ready").write_text(str(os.getpid()))
    i = 0
    while not (ctrl / "stop").exists():
        t = time.monotonic()
        pid = os.fork()
        if pid == 0:
            try:
                read_blocks(device, blocks, (i % 4096) * blocks)
            finally:
                os._exit(0)
        forked.append((pid, t))
        os.waitpid(pid, 0)
        i += 1
    (ctrl / "result").write_text(json.dumps(forked))
    return 0


def main() -> int:
    mode, device, ctrl, blocks = sys.argv[1], sys.argv[2], Path(sys.argv[3]), int(sys.argv[4])
    return {"tree": tree, "forker": forker, "busy": busy}[mode](device, ctrl, blocks)


if __name__ == "__main__":
    sys.exit(main())
