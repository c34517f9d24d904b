"""End to end with real TensorFlow: a Keras model trained for 3 epochs under
`iotrace -o run.jsonl -- python tests/tf_train.py train ...`, with
tracer.integrations.keras.IOTraceCallback marking each epoch and each
checkpoint save.

The data set (TFRecord shards) lives on ext4 on a fresh loop device, evicted
from the page cache before the run and read at most SLOW_BPS bytes a second
(the disk under the loop device throttled for the run's processes), so
epoch 1 must read it from the device and wait for it, and epochs 2 and 3
read it from the page cache: iotrace's verdict (tracer.views.verdict, with
--tasks) calls epoch 1 I/O-bound and the others not.  TensorFlow comes from .venv-tf
(`make setup-tf`, scripts/setup_tf.sh), never from the main venv.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path

import pytest
from conftest import ROOT, bytes_of, epoch_windows, evict, framework_python, run_iotrace, run_traced_group, series_of

pytestmark = [pytest.mark.bpf, pytest.mark.slow]

TRAINER = (Path(__file__).resolve().parent.parent / "tf_train.py")
SHARDS, RECORDS_PER_SHARD = 8, 384      # 16 KiB records: 8 shards of 6 MiB
EPOCHS = 3
TIMEOUT_S = 600                         # TensorFlow's start-up alone is several seconds on a slow machine
SLOW_BPS = 12_000_000                   # epoch 1 reads the shards at this rate: seconds of waiting


@pytest.fixture
def tf_python() -> Path:
    return framework_python(".venv-tf", "setup-tf")


def test_keras_training_dumps_per_epoch_and_checkpoint(tf_python, ext4_mnt, slow_reads, tmp_path):
    loop, mnt = ext4_mnt
    data = mnt / "data"
    w = subprocess.run([str(tf_python), str(TRAINER), "write", str(data), "--shards", str(SHARDS),
                        "--records-per-shard", str(RECORDS_PER_SHARD)], capture_output=True, text=True, timeout=300)
    assert w.returncode == 0, w.stderr
    data_bytes = sum(p.stat().st_size for p in data.iterdir())
    assert data_bytes > 40 << 20
    procs = slow_reads(loop, SLOW_BPS)
    evict(data, loop.backing)

    out = tmp_path / "run.jsonl"
    # As root, not as a sudo-invoking user: the trainer writes into a root-owned temp dir.
    env = {k: v for k, v in os.environ.items() if not k.startswith("SUDO_") and k != "IOTRACE_CONTROL"}
    # the trainer imports this checkout's tracer even when .venv-tf was made by another one
    env["PYTHONPATH"] = str(ROOT)
    ckpt = str(mnt / "ckpt-{epoch}.keras")
    # The callback's markers wait for the tracer to confirm them by default, so that a checkpoint's
    # writes cannot land in the epoch's dump however slowly the tracer gets to the marker.
    rc, stdout, stderr = run_traced_group(
        ["--tasks", "-o", str(out), "--", str(tf_python), str(TRAINER), "train", str(data), "--epochs", str(EPOCHS),
         "--checkpoint", ckpt, "--join-cgroup", str(procs)], env, TIMEOUT_S)
    context = f"\nstdout:\n{stdout}\nstderr:\n{stderr}"
    assert rc == 0, context
    found = re.search(r"^tf_train: pid (\d+)$", stdout, re.M)
    assert found, context
    trainer = int(found.group(1))

    # each epoch a window, its checkpoint a window nested in it (the epoch's end after it is a dump too)
    by_label = epoch_windows(out, EPOCHS, context)

    # Epoch 1 reads the data set from the device; later epochs find it in the page cache.
    reads = [bytes_of(by_label[f"epoch {n}"], loop.name, "read") for n in range(1, EPOCHS + 1)]
    assert reads[0] >= 0.9 * data_bytes, (reads, data_bytes)
    assert all(r <= 0.05 * reads[0] for r in reads[1:]), (reads, data_bytes)
    assert bytes_of(by_label["epoch 1"], loop.name, "read", trainer) >= 0.9 * data_bytes, reads

    # The callback fsyncs each save, so its file reaches the device within its "epoch N / checkpoint"
    # dump, written in the trainer's context (not later by the flusher).
    for n in range(1, EPOCHS + 1):
        ckpt = by_label[f"epoch {n} / checkpoint"]
        saved = (mnt / f"ckpt-{n}.keras").stat().st_size
        written = bytes_of(ckpt, loop.name, "write", trainer)
        assert written >= saved, (n, written, saved, [series_of(d, device=loop.name) for d in ckpt])
        # and nothing of the data set is read while saving
        assert bytes_of(ckpt, loop.name, "read") <= 0.05 * data_bytes
        assert [d["enclosing"] for d in ckpt] == [f"epoch {n}"]
        # the epoch's end carries the loop's timing: every batch, and how long it waited for them
        loop_stats = by_label[f"epoch {n}"][-1]["loop"]
        assert loop_stats["steps"] > 0 and 0 < loop_stats["data_wait_s"] < loop_stats["wall_s"], loop_stats

    # The verdict: epoch 1 waited for the disk (tf.data's reader threads are the trainer's own), the
    # warm epochs did not.
    r = run_iotrace(["report", "--by", "label", "--json", str(out)])
    assert r.returncode == 0, r.stderr
    verdicts = {w["label"]: w["verdict"] for w in map(json.loads, r.stdout.splitlines()) if "verdict" in w}
    context += "".join(f"\n{n}: {verdicts[f'epoch {n}']}" for n in range(1, EPOCHS + 1))
    cold = verdicts["epoch 1"]
    assert cold["trainer_pid"] == trainer and cold["state"] == "I/O-bound", context
    assert cold["data_wait"] >= 0.1 and cold["from_disk"] >= 0.9, context
    for n in range(2, EPOCHS + 1):
        assert verdicts[f"epoch {n}"]["state"] == "not I/O-bound", context
        assert verdicts[f"epoch {n}"]["from_disk"] <= 0.05, context
    text = run_iotrace(["report", "--by", "label", str(out)]).stdout.splitlines()
    for n in range(1, EPOCHS + 1):
        assert f"  epoch {n}: {verdicts[f'epoch {n}']['line']}" in text, text
