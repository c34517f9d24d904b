"""End to end with real TensorFlow: a Keras model trained for 3 epochs under
`iotrace -o run.jsonl -- python tests/tf_train.py train ...`, with
tracer.integrations.keras.IOTraceCallback marking each epoch and each
checkpoint save.

The data set (TFRecord shards) lives on ext4 on a fresh loop device with the
page cache dropped before the run, so epoch 1 must read it from the device
and epochs 2 and 3 from the page cache.  TensorFlow comes from .venv-tf
(`make setup-tf`, scripts/setup_tf.sh), never from the main venv.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
from pathlib import Path

import pytest
from conftest import PYTHON, REQUIRE_BPF, ROOT, read_dumps, series_of

pytestmark = [pytest.mark.bpf, pytest.mark.slow]

TF_PYTHON = ROOT / ".venv-tf" / "bin" / "python"
TRAINER = Path(__file__).with_name("tf_train.py")
SHARDS, RECORDS_PER_SHARD = 8, 384      # 16 KiB records: 8 shards of 6 MiB
EPOCHS = 3
TIMEOUT_S = 600                         # TensorFlow's start-up alone is several seconds on a slow machine


@pytest.fixture
def tf_python() -> Path:
    if not TF_PYTHON.exists():
        why = f"no TensorFlow venv at {TF_PYTHON}: run `make setup-tf` (scripts/setup_tf.sh)"
        if REQUIRE_BPF:
            pytest.fail(why)
        pytest.skip(why)
    return TF_PYTHON


def _umount(mnt: Path) -> None:
    if subprocess.run(["umount", str(mnt)], capture_output=True).returncode != 0:
        # something still holds it (a trainer that outlived a failure): detach it lazily so the
        # loop device's own teardown can still let go of it once the holder exits
        subprocess.run(["umount", "-l", str(mnt)], capture_output=True)


@pytest.fixture
def ext4_mnt(make_loop, tmp_path):
    """(loop device, mount point): a fresh ext4 on a 256 MiB loop device; unmounted at teardown."""
    loop = make_loop(256)
    # Initialise inode tables and journal now: ext4lazyinit would otherwise write while we trace.
    subprocess.run(["mkfs.ext4", "-q", "-F", "-E", "lazy_itable_init=0,lazy_journal_init=0", loop.path],
                   check=True, capture_output=True)
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    # noatime: reading the shards must not write inodes; no bitmap prefetch: no background reads
    subprocess.run(["mount", "-o", "noatime,no_prefetch_block_bitmaps", loop.path, str(mnt)],
                   check=True, capture_output=True)
    try:
        yield loop, mnt
    finally:
        _umount(mnt)


def _run_traced(args: list[str], env: dict[str, str]) -> tuple[int, str, str]:
    """Run `python -m tracer.cli ARGS` in its own session, killing the whole group on a timeout.

    conftest.run_iotrace would kill only the tracer and leave the trainer
    holding the mount; here the trainer (in the tracer's process group) goes too.
    """
    p = subprocess.Popen([PYTHON, "-m", "tracer.cli", *args], cwd=ROOT, env=env, text=True,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)
    try:
        out, err = p.communicate(timeout=TIMEOUT_S)
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGKILL)
        out, err = p.communicate()
        pytest.fail(f"the traced training run took more than {TIMEOUT_S}s\nstdout:\n{out}\nstderr:\n{err}")
    return p.returncode, out, err


def _bytes(dump: dict, device: str, op: str, tgid: int | None = None) -> int:
    return sum(s["bytes"] for s in series_of(dump, device=device, op=op) if tgid is None or s["tgid"] == tgid)


def test_keras_training_dumps_per_epoch_and_checkpoint(tf_python, ext4_mnt, tmp_path):
    loop, mnt = ext4_mnt
    data = mnt / "data"
    w = subprocess.run([str(tf_python), str(TRAINER), "write", str(data), "--shards", str(SHARDS),
                        "--records-per-shard", str(RECORDS_PER_SHARD)], capture_output=True, text=True, timeout=300)
    assert w.returncode == 0, w.stderr
    data_bytes = sum(p.stat().st_size for p in data.iterdir())
    assert data_bytes > 40 << 20
    subprocess.run(["sync"], check=True)
    Path("/proc/sys/vm/drop_caches").write_text("3\n")

    out = tmp_path / "run.jsonl"
    # As root, not as a sudo-invoking user: the trainer writes into a root-owned temp dir.
    env = {k: v for k, v in os.environ.items() if not k.startswith("SUDO_") and k != "IOTRACE_CONTROL"}
    ckpt = str(mnt / "ckpt-{epoch}.keras")
    # The callback waits for the tracer to confirm each marker, so that a checkpoint's writes (right after
    # "epoch N") cannot land in the epoch's dump however slowly the tracer gets to the marker.
    rc, stdout, stderr = _run_traced(
        ["-o", str(out), "--", str(tf_python), str(TRAINER), "train", str(data), "--epochs", str(EPOCHS),
         "--checkpoint", ckpt, "--marker-wait", "5"], env)
    context = f"\nstdout:\n{stdout}\nstderr:\n{stderr}"
    assert rc == 0, context
    found = re.search(r"^tf_train: pid (\d+)$", stdout, re.M)
    assert found, context
    trainer = int(found.group(1))

    dumps = read_dumps(out)
    markers = [d for d in dumps if d["kind"] == "marker"]
    expected = [f"{what} {n}" for n in range(1, EPOCHS + 1) for what in ("epoch", "checkpoint")]
    assert [d["label"] for d in markers] == expected, context
    by_label = {d["label"]: d for d in markers}

    # Epoch 1 reads the data set from the device; later epochs find it in the page cache.
    reads = [_bytes(by_label[f"epoch {n}"], loop.name, "read") for n in range(1, EPOCHS + 1)]
    assert reads[0] >= 0.9 * data_bytes, (reads, data_bytes)
    assert all(r <= 0.05 * reads[0] for r in reads[1:]), (reads, data_bytes)
    assert _bytes(by_label["epoch 1"], loop.name, "read", trainer) >= 0.9 * data_bytes, reads

    # The callback fsyncs each save, so its file reaches the device within its "checkpoint N" dump,
    # written in the trainer's context (not later by the flusher).
    for n in range(1, EPOCHS + 1):
        saved = (mnt / f"ckpt-{n}.keras").stat().st_size
        written = _bytes(by_label[f"checkpoint {n}"], loop.name, "write", trainer)
        assert written >= saved, (n, written, saved, series_of(by_label[f"checkpoint {n}"], device=loop.name))
        # and nothing of the data set is read while saving
        assert _bytes(by_label[f"checkpoint {n}"], loop.name, "read") <= 0.05 * data_bytes
