"""PyTorch: time how long the training loop waits for each batch, mark epochs and checkpoints.

    from tracer import marker
    from tracer.integrations.torch import save_checkpoint, timed

    loader = timed(DataLoader(ds, batch_size=64, num_workers=2))   # any iterable of batches will do
    for epoch in marker.epochs(3):                  # the windows "epoch 1" .. "epoch 3"
        for x, y in loader:                         # each next() timed: the loop's wait for data
            step(x, y)
        save_checkpoint(model.state_dict(), f"ckpt/{epoch}.pt")   # the window "epoch N / checkpoint"

    sudo iotrace -o run.jsonl -- python train.py
    iotrace report run.jsonl --by label             # each epoch's reads, each checkpoint's writes

timed() wraps a DataLoader (or any iterable of batches): iterating it
iterates the loader, timing each next() (the first one includes iter(),
where a DataLoader starts its workers) and handing the time to
tracer.marker.loop_step, so each marker window the loop ran in closes with
"loop": {"data_wait_s", "steps", "wall_s"} in its dump.  Other attributes
(len, .dataset, .sampler) are the loader's.  It needs no torch.

save_checkpoint() saves with torch.save inside marker.phase("checkpoint")
and fsyncs the file, so its writes reach the disk inside that window, in the
trainer's context (without the fsync the kernel's flusher writes it later).

IOTraceLightningCallback (only where `lightning` or `pytorch_lightning`
imports; this module imports without either): each training epoch is the
window "epoch N" with the loop's wait for batches (time from a batch's end
to the next one's start).  Lightning writes its ModelCheckpoint files after
the epoch's hooks, so they fall between epoch windows ("before epoch N+1").

This module owns these hooks only; the windows and the wire are
tracer.marker's.  Markers never raise into the training loop.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterable, Iterator

from tracer import marker
from tracer.integrations import fsync_saved


class TimedLoader:
    """An iterable of batches whose every next() is timed into tracer.marker.loop_step."""

    def __init__(self, batches: Iterable):
        self.batches = batches

    def __iter__(self) -> Iterator:
        t0 = time.perf_counter()
        it = iter(self.batches)
        while True:
            try:
                batch = next(it)
            except StopIteration:
                return
            marker.loop_step(time.perf_counter() - t0)
            yield batch
            t0 = time.perf_counter()

    def __len__(self) -> int:
        return len(self.batches)

    def __getattr__(self, name: str):
        if name == "batches":       # not set yet (copy, unpickling): no recursion
            raise AttributeError(name)
        return getattr(self.batches, name)


def timed(batches: Iterable) -> TimedLoader:
    """`batches` (a DataLoader or any iterable of batches) with each next() timed as the loop's wait for data."""
    return batches if isinstance(batches, TimedLoader) else TimedLoader(batches)


def save_checkpoint(obj, path: str, label: str = "checkpoint", fsync: bool = True) -> None:
    """torch.save(obj, path) as the window `label` (nested: "epoch N / checkpoint"), fsynced inside it."""
    import torch

    with marker.phase(label):
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        torch.save(obj, path)
        if fsync:
            fsync_saved(path)


def _lightning_callback_class():
    try:
        from lightning.pytorch import Callback
    except ImportError:
        try:
            from pytorch_lightning import Callback
        except ImportError:
            raise ImportError("IOTraceLightningCallback needs Lightning (pip install lightning); "
                              "without it use timed() and tracer.marker.epochs()") from None

    class IOTraceLightningCallback(Callback):
        """Each training epoch is the window "epoch N", with the loop's wait for its batches."""

        def __init__(self, wait: float | None = None):
            super().__init__()
            self.wait = wait
            self._depth: int | None = None
            self._last = 0.0

        def on_train_epoch_start(self, trainer, pl_module) -> None:
            self._depth = marker.depth()
            marker.begin(f"epoch {trainer.current_epoch + 1}", self.wait)
            self._last = time.perf_counter()

        def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
            marker.loop_step(time.perf_counter() - self._last)

        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
            self._last = time.perf_counter()

        def on_train_epoch_end(self, trainer, pl_module) -> None:
            if self._depth is not None:
                marker.end(self.wait, self._depth)
                self._depth = None

        def on_train_end(self, trainer, pl_module) -> None:
            self.on_train_epoch_end(trainer, pl_module)

        def on_exception(self, trainer, pl_module, exception) -> None:
            self.on_train_epoch_end(trainer, pl_module)

    return IOTraceLightningCallback


def __getattr__(name: str):
    if name == "IOTraceLightningCallback":
        cls = _lightning_callback_class()
        globals()[name] = cls
        return cls
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
