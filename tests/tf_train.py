"""A small real TensorFlow trainer for tests/test_tensorflow.py, run with .venv-tf's python.

`write DIR` makes a synthetic image data set as TFRecord shards in DIR;
`train DIR` trains a small Keras model on it through tf.data, with iotrace's
Keras callback marking each epoch and each checkpoint save.  Not collected
by pytest (no test_ prefix) and never imported by the test itself: the main
venv has no TensorFlow.

The input pipeline deliberately has no .cache(): every epoch reads the shards
again, so only the page cache decides whether an epoch touches the disk.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")   # keep TensorFlow's C++ start-up chatter out of the logs

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

SIDE, CHANNELS = 64, 4                # one record: a 64x64x4 uint8 image, 16 KiB of incompressible bytes
RECORD_BYTES = SIDE * SIDE * CHANNELS


def write(out_dir: Path, shards: int, records_per_shard: int, seed: int) -> None:
    """Write `shards` files of `records_per_shard` labelled random images each."""
    rng = np.random.default_rng(seed)
    out_dir.mkdir(parents=True, exist_ok=True)
    for i in range(shards):
        labels = rng.integers(0, 2, records_per_shard)
        # Learnable but noisy: the positive class is brighter on average.
        images = rng.integers(0, 200, (records_per_shard, RECORD_BYTES), dtype=np.uint8) + \
            (labels[:, None] * 55).astype(np.uint8)
        with tf.io.TFRecordWriter(str(out_dir / f"train-{i:05d}-of-{shards:05d}.tfrecord")) as w:
            for image, label in zip(images, labels, strict=True):
                example = tf.train.Example(features=tf.train.Features(feature={
                    "image": tf.train.Feature(bytes_list=tf.train.BytesList(value=[image.tobytes()])),
                    "label": tf.train.Feature(int64_list=tf.train.Int64List(value=[int(label)])),
                }))
                w.write(example.SerializeToString())


def dataset(data_dir: Path, batch: int) -> tf.data.Dataset:
    files = sorted(str(p) for p in data_dir.glob("*.tfrecord"))
    if not files:
        sys.exit(f"tf_train: no *.tfrecord files in {data_dir}")
    spec = {"image": tf.io.FixedLenFeature([], tf.string), "label": tf.io.FixedLenFeature([], tf.int64)}

    def parse(record):
        ex = tf.io.parse_single_example(record, spec)
        image = tf.reshape(tf.io.decode_raw(ex["image"], tf.uint8), (SIDE, SIDE, CHANNELS))
        return tf.cast(image, tf.float32) / 255.0, tf.cast(ex["label"], tf.float32)

    return (tf.data.TFRecordDataset(files, num_parallel_reads=4)
            .map(parse, num_parallel_calls=tf.data.AUTOTUNE)
            .batch(batch)
            .prefetch(2))


def train(data_dir: Path, epochs: int, batch: int, checkpoint: str | None, use_iotrace: bool,
          marker_wait: float | None, join_cgroup: str | None = None) -> None:
    import keras

    print(f"tf_train: pid {os.getpid()}", flush=True)   # the test tells the trainer's rows by it
    if join_cgroup:     # the test's slowed disk, once TensorFlow's own files are read
        Path(join_cgroup).write_text(f"{os.getpid()}\n")
    model = keras.Sequential([
        keras.Input((SIDE, SIDE, CHANNELS)),
        keras.layers.AveragePooling2D(8),
        keras.layers.Flatten(),
        keras.layers.Dense(16, activation="relu"),
        keras.layers.Dense(1, activation="sigmoid"),
    ])
    model.compile(optimizer="adam", loss="binary_crossentropy", metrics=["accuracy"])
    callbacks = []
    if use_iotrace:
        from tracer.integrations.keras import IOTraceCallback
        callbacks.append(IOTraceCallback(checkpoint_path=checkpoint, wait=marker_wait))
    history = model.fit(dataset(data_dir, batch), epochs=epochs, callbacks=callbacks, verbose=2, shuffle=False)
    losses = history.history["loss"]
    if len(losses) != epochs or not all(np.isfinite(losses)):
        sys.exit(f"tf_train: training went wrong, losses {losses}")
    print(f"tf_train: {epochs} epochs, loss {losses[0]:.4f} -> {losses[-1]:.4f}")


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    w = sub.add_parser("write", help="write synthetic TFRecord shards")
    w.add_argument("dir", type=Path)
    w.add_argument("--shards", type=int, default=8)
    w.add_argument("--records-per-shard", type=int, default=384, help="16 KiB each (default: 6 MiB a shard)")
    w.add_argument("--seed", type=int, default=0)
    t = sub.add_parser("train", help="train on the shards in DIR")
    t.add_argument("dir", type=Path)
    t.add_argument("--epochs", type=int, default=3)
    t.add_argument("--batch", type=int, default=64)
    t.add_argument("--checkpoint", help="IOTraceCallback's checkpoint_path, e.g. /mnt/ckpt-{epoch}.keras")
    t.add_argument("--marker-wait", type=float, default=None,
                   help="IOTraceCallback's wait: seconds to wait for the tracer to confirm each marker "
                        "(default: tracer.marker's, which waits)")
    t.add_argument("--no-iotrace", action="store_true", help="train without the callback (to run it alone)")
    t.add_argument("--join-cgroup", metavar="PROCS", help="once imported, move into the cgroup whose cgroup.procs "
                   "this is")
    a = p.parse_args(argv)
    if a.cmd == "write":
        write(a.dir, a.shards, a.records_per_shard, a.seed)
    else:
        train(a.dir, a.epochs, a.batch, a.checkpoint, not a.no_iotrace, a.marker_wait, a.join_cgroup)


if __name__ == "__main__":
    main()
