"""IOTraceCallback: a Keras callback that gives each epoch (and checkpoint) its own iotrace dump.

    from tracer.integrations.keras import IOTraceCallback

    model.fit(ds, epochs=3, callbacks=[IOTraceCallback(checkpoint_path="ckpt/model-{epoch}.keras")])

    sudo iotrace -o run.jsonl -- python train.py     # dumps "epoch 1", "checkpoint 1", "epoch 2", ...

At the end of epoch N (1-based, as Keras prints it) it marks "epoch N": the
epoch's I/O (training, validation, whatever ran since the previous marker)
is one dump.  With checkpoint_path it then saves the model to
checkpoint_path.format(epoch=N), fsyncs it, and marks "checkpoint N", so
the save's I/O is a dump of its own.  The fsync makes the checkpoint's
writes happen in the trainer's context, inside that dump; without it the
kernel's flusher threads write it back later, outside the traced command.

Paths ending in .weights.h5 save the weights only (model.save_weights);
others go to model.save (Keras 3 wants .keras or .h5).  Other callbacks
that write (ModelCheckpoint, TensorBoard) run in list order: put this one
last so their I/O is in the epoch's dump.  Markers never raise and never
block (see tracer.marker); with no tracer running they do nothing.
"""

from __future__ import annotations

import os
import warnings

from .. import marker

try:
    import keras
except ImportError:
    try:
        from tensorflow import keras
    except ImportError:
        raise ImportError("tracer.integrations.keras needs Keras (with TensorFlow): "
                          "pip install 'iotrace[keras]' (tensorflow-cpu), or use tracer.marker directly") from None


def _fsync_tree(path: str) -> None:
    """Flush a saved file (or a SavedModel directory) and the directory entry naming it."""
    files = [path]
    if os.path.isdir(path):
        files = [os.path.join(d, n) for d, _, names in os.walk(path) for n in names] + [path]
    for f in files + [os.path.dirname(os.path.abspath(path))]:
        fd = os.open(f, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


class IOTraceCallback(keras.callbacks.Callback):
    """Marks "epoch N" at each epoch's end; with checkpoint_path, saves and marks "checkpoint N"."""

    def __init__(self, checkpoint_path: str | None = None, fsync: bool = True, wait: float = 0.0):
        super().__init__()
        self.checkpoint_path = checkpoint_path
        self.fsync = fsync
        self.wait = wait        # see marker.mark: > 0 waits for the tracer to close each dump

    def on_epoch_end(self, epoch: int, logs=None) -> None:
        n = epoch + 1
        marker.mark(f"epoch {n}", self.wait)
        if not self.checkpoint_path:
            return
        path = self.checkpoint_path.format(epoch=n)
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        if path.endswith(".weights.h5"):
            self.model.save_weights(path)
        else:
            self.model.save(path)
        if self.fsync:
            try:
                _fsync_tree(path)
            except OSError as exc:
                warnings.warn(f"iotrace: cannot fsync checkpoint {path}: {exc.strerror or exc}", RuntimeWarning,
                              stacklevel=2)
        marker.mark(f"checkpoint {n}", self.wait)
