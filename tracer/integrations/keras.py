"""IOTraceCallback: a Keras callback that gives each epoch (and checkpoint) its own iotrace window.

    from tracer.integrations.keras import IOTraceCallback

    model.fit(ds, epochs=3, callbacks=[IOTraceCallback(checkpoint_path="ckpt/model-{epoch}.keras")])

    sudo iotrace -o run.jsonl -- python train.py     # windows "epoch 1", "epoch 1 / checkpoint", ...
    iotrace report run.jsonl --by label

Epoch N (1-based, as Keras prints it) is the tracer.marker window
"epoch N", opened at the epoch's start (the first one closes what ran
before fit() trained as "before epoch 1") and closed at its end, with the
training loop's wait for its batches ("loop" in the dump: the time from
one batch's end to the next one's start, summed, the batches, and the
epoch's wall time).  On TensorFlow with Keras 3 a batch is fetched inside the
compiled step (the input pipeline's get_next is part of the graph), so the
time between batches misses the wait for data: there, with
steps_per_execution 1, the callback fetches each batch itself, timed, and
hands it to the model's step (its train_function, restored at the end of
fit); elsewhere it times the gap between batches.  With checkpoint_path it saves the model, at the end of
each epoch, to checkpoint_path.format(epoch=N) inside the window
"epoch N / checkpoint", and fsyncs it there, so that the save's writes are
a dump of their own, in the trainer's context; without the fsync the
kernel's flusher threads write it back later, outside the traced command.

Paths ending in .weights.h5 save the weights only (model.save_weights);
others go to model.save (Keras 3 wants .keras or .h5).  Other callbacks
that write (ModelCheckpoint, TensorBoard) run in list order: put this one
last so their I/O is in the epoch's window.  Markers never raise (see
tracer.marker); with no tracer running they do nothing.
"""

from __future__ import annotations

import os
import time
import warnings

from tracer import marker
from tracer.integrations import fsync_saved

try:
    import keras
except ImportError:
    try:
        from tensorflow import keras
    except ImportError:
        raise ImportError("tracer.integrations.keras needs Keras (with TensorFlow): "
                          "pip install 'iotrace[keras]' (tensorflow-cpu), or use tracer.marker directly") from None


class IOTraceCallback(keras.callbacks.Callback):
    """The window "epoch N" per epoch, with the loop's data wait; checkpoints in "epoch N / checkpoint"."""

    def __init__(self, checkpoint_path: str | None = None, fsync: bool = True, wait: float | None = None):
        super().__init__()
        self.checkpoint_path = checkpoint_path
        self.fsync = fsync
        self.wait = wait        # see marker.mark: None waits for the tracer to close each dump (by default)
        self._depth: int | None = None      # windows open outside the epoch's, while it is open
        self._first = True
        self._last = 0.0        # when the last batch ended (or the epoch began)
        self._inner = None      # the model's own train_function, while ours times its input

    def on_train_begin(self, logs=None) -> None:
        self._first = True
        self._time_input()

    def _time_input(self) -> None:
        """Fetch each batch in front of the model's step, timed (Keras 3 on TensorFlow, one step per call)."""
        model = getattr(self, "model", None)
        try:
            import tensorflow as tf

            if keras.backend.backend() != "tensorflow" or int(keras.__version__.split(".")[0]) < 3:
                return
            if getattr(model, "steps_per_execution", 1) != 1:
                return
            inner = model.train_function
            iterators = (tf.data.Iterator, tf.distribute.DistributedIterator)
        except Exception:  # noqa: BLE001 - another Keras: the gap between batches is timed instead
            return
        if not callable(inner) or getattr(inner, "_iotrace_timed", False):
            return

        def timed(iterator):
            if not isinstance(iterator, iterators):
                return inner(iterator)
            t0 = time.perf_counter()
            try:
                batch = iterator.get_next()
            except tf.errors.OutOfRangeError:
                raise StopIteration from None      # as Keras's own function does at the end of the data
            marker.loop_step(time.perf_counter() - t0)
            return inner(iter((batch,)))            # a plain iterator: Keras runs one step on the batch

        timed._iotrace_timed = True
        self._inner = inner
        model.train_function = timed

    def on_epoch_begin(self, epoch: int, logs=None) -> None:
        self._close_epoch()
        self._depth = marker.depth()
        # the first epoch splits off what ran before it; later ones follow the previous epoch at once
        marker.begin(f"epoch {epoch + 1}", self.wait, split=self._first)
        self._first = False
        self._last = time.perf_counter()

    def on_train_batch_begin(self, batch: int, logs=None) -> None:
        if self._inner is None:     # else the batch's fetch was timed (_time_input)
            marker.loop_step(time.perf_counter() - self._last)

    def on_train_batch_end(self, batch: int, logs=None) -> None:
        self._last = time.perf_counter()

    def on_epoch_end(self, epoch: int, logs=None) -> None:
        if self.checkpoint_path:
            with marker.phase("checkpoint", self.wait):
                self._save(self.checkpoint_path.format(epoch=epoch + 1))
        self._close_epoch()

    def on_train_end(self, logs=None) -> None:
        self._close_epoch()      # an epoch stopped early (model.stop_training) still gets its window
        if self._inner is not None:
            if getattr(getattr(self.model, "train_function", None), "_iotrace_timed", False):
                self.model.train_function = self._inner
            self._inner = None

    def _close_epoch(self) -> None:
        if self._depth is not None:
            marker.end(self.wait, self._depth)
            self._depth = None

    def _save(self, path: str) -> None:
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        if path.endswith(".weights.h5"):
            self.model.save_weights(path)
        else:
            self.model.save(path)
        if self.fsync:
            try:
                fsync_saved(path)
            except OSError as exc:
                warnings.warn(f"iotrace: cannot fsync checkpoint {path}: {exc.strerror or exc}", RuntimeWarning,
                              stacklevel=2)
