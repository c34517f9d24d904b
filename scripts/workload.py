#!/usr/bin/env python3
"""A stand-in for a deep-learning input pipeline, to give iotrace something to trace.

    workload.py prepare DATA_DIR [--files 2000] [--shards 4] [--shard-mib 16]
    workload.py DATA_DIR [--epochs 3] [--workers 4] [--checkpoint-dir DIR] [--step-ms 25]

`prepare` writes the data set: many small files (image-folder style samples
of 16-64 KiB in class subdirectories) and a few large shards (TFRecord
style).  Run mode then trains for some epochs; each epoch

  * a pool of worker processes (multiprocessing, 'fork' start method, kept
    across epochs like DataLoader(persistent_workers=True)) reads every
    sample file in a freshly shuffled order, in batches of 16, and streams
    each shard front to back in 1 MiB reads, at most two tasks per worker
    ahead of the training loop (DataLoader's prefetch_factor=2);
  * the training loop "trains" on each batch for --step-ms (a sleep in
    place of the GPU), which paces the reading as in a real run, and counts
    how long it waited for data;
  * the main process writes a checkpoint (32 MiB by default), fsyncs it and
    renames it into place, as torch.save + a careful trainer would.

One line per epoch reports the wall time, the bytes read and the time the
training loop waited for data.  With --mark, each epoch is an iotrace
marker window (tracer.marker) "epoch N" with its checkpoint nested in it,
"epoch N / checkpoint", and the loop's wait for each batch goes with the
epoch's marker (marker.loop_step), so a tracer's dumps line up with the
epochs, the checkpoint writes get dumps of their own, and iotrace can say
whether the epoch waited for the disk (its verdict).  The workers
are named loader-0, loader-1, ... and the main process trainer (the comm
iotrace shows), so the rows of iotrace's table say who did what.

Only the standard library is used (and tracer.marker with --mark).  Import
it to drive `run()` yourself: its `on_epoch_begin`, `on_wait`, `on_data_end`
and `on_epoch_end` callbacks are the places for per-epoch hooks.
"""

from __future__ import annotations

import argparse
import ctypes
import itertools
import multiprocessing as mp
import os
import random
import signal
import sys
import time
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

KiB = 1 << 10
MiB = 1 << 20
CHUNK = 1 * MiB                 # shard read size (and checkpoint write size)
SAMPLES_DIR = "samples"
SHARDS_DIR = "shards"
CLASSES = 20                    # sample subdirectories, like an image-folder data set
BATCH = 16                      # sample files per worker task
PREFETCH = 2                    # tasks queued per worker, like DataLoader's prefetch_factor


# ---- prepare -----------------------------------------------------------------

def prepare(data_dir: str | os.PathLike, files: int = 2000, shards: int = 4, shard_mib: int = 16,
            min_kib: int = 16, max_kib: int = 64, seed: int = 0) -> int:
    """Create the data set under data_dir; returns the bytes written."""
    root = Path(data_dir)
    rng = random.Random(seed)
    block = rng.randbytes(CHUNK)           # content does not matter, only sizes do
    written = 0
    for c in range(CLASSES):
        (root / SAMPLES_DIR / f"class_{c:02d}").mkdir(parents=True, exist_ok=True)
    for i in range(files):
        size = rng.randrange(min_kib * KiB, max_kib * KiB + 1, 512)
        path = root / SAMPLES_DIR / f"class_{i % CLASSES:02d}" / f"img_{i:05d}.bin"
        off = rng.randrange(0, CHUNK - size)
        path.write_bytes(block[off:off + size])
        written += size
    (root / SHARDS_DIR).mkdir(parents=True, exist_ok=True)
    for s in range(shards):
        with open(root / SHARDS_DIR / f"train-{s:04d}-of-{shards:04d}.tfrecord", "wb") as f:
            for _ in range(shard_mib):
                f.write(block)
        written += shard_mib * MiB
    return written


# ---- the workers -------------------------------------------------------------

def set_comm(name: str) -> None:
    """Set this process's name as the kernel sees it (15 bytes max), like DataLoader workers'."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(15, name.encode()[:15], 0, 0, 0)   # PR_SET_NAME
    except (OSError, AttributeError):
        pass


def _worker_init(counter) -> None:
    # Ctrl-C is the main process's business: it terminates the pool
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    with counter.get_lock():
        index = counter.value
        counter.value += 1
    set_comm(f"loader-{index}")


def read_samples(paths: list[str]) -> int:
    """One batch: read each sample file whole, as an image decoder would."""
    n = 0
    for p in paths:
        with open(p, "rb") as f:
            n += len(f.read())
    return n


def stream_shard(path: str) -> int:
    """Read one shard front to back in CHUNK-sized reads."""
    n = 0
    with open(path, "rb", buffering=0) as f:
        while chunk := f.read(CHUNK):
            n += len(chunk)
    return n


def _do(task: tuple[str, object]) -> int:
    kind, arg = task
    return stream_shard(arg) if kind == "shard" else read_samples(arg)


# ---- the epoch loop ----------------------------------------------------------

@dataclass
class EpochStats:
    epoch: int                  # 1-based
    seconds: float              # wall time of the whole epoch
    data_wait_seconds: float    # of which the training loop waited for the next batch
    checkpoint_seconds: float   # of which writing + fsyncing the checkpoint
    bytes_read: int
    samples: int
    shards: int
    checkpoint_bytes: int


def find_dataset(data_dir: str | os.PathLike) -> tuple[list[str], list[str]]:
    root = Path(data_dir)
    samples = sorted(str(p) for p in (root / SAMPLES_DIR).glob("*/*.bin"))
    shards = sorted(str(p) for p in (root / SHARDS_DIR).glob("*.tfrecord"))
    return samples, shards


def epoch_tasks(samples: list[str], shards: list[str], rng: random.Random) -> list[tuple[str, object]]:
    """Shuffled sample batches with the shards spread evenly among them."""
    order = samples[:]
    rng.shuffle(order)
    tasks: list[tuple[str, object]] = [("batch", order[i:i + BATCH]) for i in range(0, len(order), BATCH)]
    for k, shard in enumerate(shards):
        tasks.insert(k * (len(tasks) + 1) // len(shards) + k, ("shard", shard))
    return tasks


def load(pool, tasks: list[tuple[str, object]], prefetch: int) -> Iterator[int]:
    """Bytes read per task, in order, with at most `prefetch` tasks queued ahead (DataLoader style)."""
    pending: deque = deque()
    it = iter(tasks)
    for task in itertools.islice(it, prefetch):
        pending.append(pool.apply_async(_do, (task,)))
    while pending:
        n = pending.popleft().get()
        task = next(it, None)
        if task is not None:
            pending.append(pool.apply_async(_do, (task,)))
        yield n


def write_checkpoint(ckpt_dir: Path, epoch: int, size: int) -> None:
    """Write, fsync and atomically rename a checkpoint of `size` bytes."""
    block = random.Random(epoch).randbytes(CHUNK)
    tmp = ckpt_dir / f".checkpoint-{epoch}.tmp"
    with open(tmp, "wb", buffering=0) as f:
        left = size
        while left > 0:
            left -= f.write(block[:min(left, CHUNK)])
        os.fsync(f.fileno())
    os.replace(tmp, ckpt_dir / "checkpoint.bin")
    dfd = os.open(ckpt_dir, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(dfd)
    finally:
        os.close(dfd)


def run(data_dir: str | os.PathLike, epochs: int = 3, workers: int = 4,
        checkpoint_dir: str | os.PathLike | None = None, checkpoint_mib: int = 32, step_ms: float = 25,
        seed: int = 0, on_epoch_end: Callable[[EpochStats], None] | None = None,
        log: Callable[[str], None] = print,
        on_data_end: Callable[[int], None] | None = None,
        on_epoch_begin: Callable[[int], None] | None = None,
        on_wait: Callable[[float], None] | None = None) -> list[EpochStats]:
    """Train for `epochs` epochs; on_epoch_end(stats) runs after each one's checkpoint.

    on_epoch_begin(epoch) runs first in each epoch; on_wait(seconds) after each batch
    arrives, with the time the loop waited for it; on_data_end(epoch) runs between an
    epoch's reading and its checkpoint.

    Each batch the workers hand over is "trained on" for step_ms (a sleep,
    standing in for the GPU), so reading is paced as in a real run.
    """
    set_comm("trainer")
    samples, shards = find_dataset(data_dir)
    if not samples and not shards:
        raise SystemExit(f"workload: no data set in {data_dir}: run 'workload.py prepare {data_dir}' first")
    ckpt_dir = Path(checkpoint_dir) if checkpoint_dir else Path(data_dir) / "checkpoints"
    ckpt_dir.mkdir(parents=True, exist_ok=True)
    rng = random.Random(seed)
    ctx = mp.get_context("fork")
    log(f"workload: {len(samples)} samples, {len(shards)} shards, {workers} workers, {epochs} epochs, "
        f"{step_ms:g} ms steps, {checkpoint_mib} MiB checkpoints in {ckpt_dir}")
    history: list[EpochStats] = []
    pool = ctx.Pool(workers, initializer=_worker_init, initargs=(ctx.Value("i", 0),))
    try:
        for epoch in range(1, epochs + 1):
            if on_epoch_begin:
                on_epoch_begin(epoch)
            t0 = time.monotonic()
            got = 0
            wait = 0.0
            loader = load(pool, epoch_tasks(samples, shards, rng), prefetch=workers * PREFETCH)
            while True:
                w0 = time.monotonic()
                n = next(loader, None)
                waited = time.monotonic() - w0
                wait += waited
                if n is None:
                    break
                if on_wait:
                    on_wait(waited)
                got += n
                time.sleep(step_ms / 1e3)      # the training step (forward, backward) on this batch
            t1 = time.monotonic()
            if on_data_end:     # e.g. an iotrace marker: the checkpoint's I/O goes in the next dump
                on_data_end(epoch)
            write_checkpoint(ckpt_dir, epoch, checkpoint_mib * MiB)
            t2 = time.monotonic()
            stats = EpochStats(epoch, t2 - t0, wait, t2 - t1, got, len(samples), len(shards),
                               checkpoint_mib * MiB)
            history.append(stats)
            log(f"epoch {epoch}/{epochs}: {stats.seconds:5.2f} s, read {got / 1e6:.1f} MB, "
                f"waited {stats.data_wait_seconds:.2f} s for data, "
                f"checkpoint {checkpoint_mib} MiB + fsync {stats.checkpoint_seconds:.2f} s "
                f"[ended {time.strftime('%H:%M:%S')}]")
            if on_epoch_end:    # the hook, e.g. an iotrace epoch marker
                on_epoch_end(stats)
        pool.close()
    finally:
        pool.terminate()
        pool.join()
    return history


# ---- command line ------------------------------------------------------------

# Wait this long at most for the tracer to close each dump: the boundaries are
# then exact (no read of the next epoch slips into this one's dump), at a cost
# of a few milliseconds per marker.
MARK_WAIT_S = 0.5


def _marker():
    from tracer import marker
    return marker


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] == "prepare":
        p = argparse.ArgumentParser(prog="workload.py prepare", description="Create the data set.")
        p.add_argument("data_dir", metavar="DATA_DIR")
        p.add_argument("--files", type=int, default=2000, help="small sample files (default 2000)")
        p.add_argument("--shards", type=int, default=4, help="large shard files (default 4)")
        p.add_argument("--shard-mib", type=int, default=16, help="size of each shard in MiB (default 16)")
        p.add_argument("--seed", type=int, default=0)
        ns = p.parse_args(argv[1:])
        t0 = time.monotonic()
        n = prepare(ns.data_dir, ns.files, ns.shards, ns.shard_mib, seed=ns.seed)
        print(f"workload: wrote {ns.files} samples and {ns.shards} x {ns.shard_mib} MiB shards "
              f"({n / 1e6:.1f} MB) to {ns.data_dir} in {time.monotonic() - t0:.2f} s")
        return 0
    p = argparse.ArgumentParser(
        prog="workload.py", formatter_class=argparse.RawDescriptionHelpFormatter,
        description="A deep-learning input pipeline stand-in: worker processes read small samples and "
                    "stream shards, the main process writes and fsyncs a checkpoint each epoch.",
        epilog="Create the data set first with: workload.py prepare DATA_DIR [--files N] [--shards N] "
               "[--shard-mib N]")
    p.add_argument("data_dir", metavar="DATA_DIR")
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--workers", type=int, default=4, help="loader worker processes (default 4)")
    p.add_argument("--checkpoint-dir", metavar="DIR", help="default: DATA_DIR/checkpoints")
    p.add_argument("--checkpoint-mib", type=int, default=32, help="checkpoint size in MiB (default 32)")
    p.add_argument("--step-ms", type=float, default=25,
                   help="simulated training step per batch, in ms (default 25; 0: read as fast as possible)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--mark", action="store_true",
                   help="iotrace marker windows 'epoch N' and, nested, 'epoch N / checkpoint', with the loop's "
                        "wait for data")
    ns = p.parse_args(argv)
    epoch_begin = wait = data_end = epoch_end = None
    if ns.mark:
        marker = _marker()

        def epoch_begin(epoch: int) -> None:
            # the first epoch closes what ran before it ("before epoch 1"); the others follow at once
            marker.begin(f"epoch {epoch}", MARK_WAIT_S, split=epoch == 1)

        wait = marker.loop_step

        def data_end(epoch: int) -> None:
            marker.begin("checkpoint", MARK_WAIT_S)     # "epoch N / checkpoint"

        def epoch_end(stats: EpochStats) -> None:
            marker.end(MARK_WAIT_S, depth=0)            # the checkpoint, then the epoch with its loop
    try:
        run(ns.data_dir, ns.epochs, ns.workers, ns.checkpoint_dir, ns.checkpoint_mib, ns.step_ms, ns.seed,
            log=lambda line: print(line, flush=True), on_epoch_end=epoch_end, on_data_end=data_end,
            on_epoch_begin=epoch_begin, on_wait=wait)
    except KeyboardInterrupt:
        print("workload: interrupted", file=sys.stderr)
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())
