"""End to end with real PyTorch: a DataLoader with 2 workers over files on
ext4 on a loop device, wrapped in tracer.integrations.torch.timed, under
`iotrace -o run.jsonl -- python tests/torch_train.py ...`; each epoch is a
tracer.marker window with a save_checkpoint() window nested in it.

Each epoch drops the page cache first, so each reads the data set from the
device.  PyTorch comes from .venv-torch (`make setup-torch`,
scripts/setup_torch.sh), never from the main venv.
"""

from __future__ import annotations

import json
import math
import os
import re
from pathlib import Path

import pytest
from conftest import (
    ROOT,
    bytes_of,
    drop_caches,
    epoch_windows,
    evict,
    framework_python,
    run_iotrace,
    run_traced_group,
    series_of,
)

pytestmark = [pytest.mark.bpf, pytest.mark.slow]

TRAINER = (Path(__file__).resolve().parent.parent / "torch_train.py")
FILES, FILE_KIB, BATCH, EPOCHS = 48, 512, 4, 2
TIMEOUT_S = 300


@pytest.fixture
def torch_python() -> Path:
    return framework_python(".venv-torch", "setup-torch")


def test_dataloader_epochs_checkpoints_and_data_wait(torch_python, ext4_mnt, tmp_path):
    loop, mnt = ext4_mnt
    data, ckpt = mnt / "data", mnt / "ckpt"
    data.mkdir()
    for i in range(FILES):
        (data / f"{i:04d}.bin").write_bytes(os.urandom(FILE_KIB << 10))
    data_bytes = FILES * FILE_KIB << 10
    drop_caches()

    out = tmp_path / "run.jsonl"
    env = {k: v for k, v in os.environ.items() if not k.startswith("SUDO_") and k != "IOTRACE_CONTROL"}
    rc, stdout, stderr = run_traced_group(
        ["-o", str(out), "--dev", loop.name, "--", str(torch_python), str(TRAINER), str(data), str(ckpt),
         "--epochs", str(EPOCHS), "--batch", str(BATCH)], env, TIMEOUT_S)
    context = f"\nstdout:\n{stdout}\nstderr:\n{stderr}"
    assert rc == 0, context
    assert re.search(r"^torch_train: pid \d+$", stdout, re.M), context

    by_label = epoch_windows(out, EPOCHS, context)

    for n in range(1, EPOCHS + 1):
        epoch, saving = by_label[f"epoch {n}"], by_label[f"epoch {n} / checkpoint"]
        # the workers' reads (the cache dropped at the epoch's start) are the epoch's, metadata aside
        read = bytes_of(epoch, loop.name, "read")
        assert data_bytes <= read <= 1.05 * data_bytes, (n, read, data_bytes)
        assert bytes_of(saving, loop.name, "read") <= 0.01 * data_bytes, n
        saved = (ckpt / f"ckpt-{n}.pt").stat().st_size
        written = bytes_of(saving, loop.name, "write")
        assert written >= saved, (n, written, saved, [series_of(d, device=loop.name) for d in saving])
        assert [d["enclosing"] for d in saving] == [f"epoch {n}"]
        # the epoch's closing dump carries the loop: every batch, and its wait for them
        stats = epoch[-1]["loop"]
        assert stats["steps"] == math.ceil(FILES / BATCH), stats
        assert 0 < stats["data_wait_s"] < stats["wall_s"], stats


# a cold epoch the loop waits through (small files, one request each, from a disk slowed to SLOW_BPS), then
# a warm one served by the page cache
SMALL_FILES, SMALL_KIB, SMALL_BATCH, SLOW_BPS = 800, 16, 16, 8_000_000


def test_the_cold_epoch_is_io_bound_and_the_warm_one_is_not(torch_python, ext4_mnt, slow_reads, tmp_path):
    loop, mnt = ext4_mnt
    data, ckpt = mnt / "data", mnt / "ckpt"
    data.mkdir()
    for i in range(SMALL_FILES):
        (data / f"{i:04d}.bin").write_bytes(os.urandom(SMALL_KIB << 10))
    procs = slow_reads(loop, SLOW_BPS)
    evict(data, loop.backing)

    out = tmp_path / "run.jsonl"
    # PYTHONPATH: the trainer imports this checkout's tracer even when .venv-torch was made by another one
    env = {k: v for k, v in os.environ.items() if not k.startswith("SUDO_") and k != "IOTRACE_CONTROL"}
    env["PYTHONPATH"] = str(ROOT)
    rc, stdout, stderr = run_traced_group(
        ["-o", str(out), "--dev", loop.name, "--", str(torch_python), str(TRAINER), str(data), str(ckpt),
         "--epochs", "2", "--batch", str(SMALL_BATCH), "--cold", "none", "--join-cgroup", str(procs)], env, TIMEOUT_S)
    context = f"\nstdout:\n{stdout}\nstderr:\n{stderr}"
    assert rc == 0, context
    trainer = int(re.search(r"^torch_train: pid (\d+)$", stdout, re.M).group(1))

    r = run_iotrace(["report", "--by", "label", "--json", str(out)])
    assert r.returncode == 0, r.stderr
    verdicts = {w["label"]: w["verdict"] for w in map(json.loads, r.stdout.splitlines()) if "verdict" in w}
    cold, warm = verdicts["epoch 1"], verdicts["epoch 2"]
    context += f"\ncold: {cold}\nwarm: {warm}"
    # the marker sender is the trainer; its two DataLoader workers are the loaders
    assert cold["trainer_pid"] == trainer and cold["loaders"] == 2, context
    assert cold["state"] == "I/O-bound", context
    assert cold["from_disk"] >= 0.9 and cold["loader_io_wait"] >= 0.2, context
    assert warm["state"] == "not I/O-bound", context
    assert warm["from_disk"] <= 0.05, context
    text = run_iotrace(["report", "--by", "label", str(out)]).stdout
    assert f"  epoch 1: {cold['line']}" in text.splitlines()
    assert f"  epoch 2: {warm['line']}" in text.splitlines()
    # the end of the traced run says the same
    assert f"  epoch 1: {cold['line']}" in stdout.splitlines(), context


# two ranks under torch.multiprocessing.spawn (tests/torch_spawn.py), each with its own shard of files read with
# O_DIRECT (every epoch from the device, its bytes exactly), 2 DataLoader workers a rank
SPAWN = Path(__file__).resolve().parent.parent / "torch_spawn.py"
RANK_FILES, RANK_FILE_KIB = 32, 256
OWNED = re.compile(r"^  (rank \d: (?:before )?epoch \d)(?: +|: )(.*)$", re.M)


def test_two_spawned_ranks_each_have_their_own_windows_steps_and_loaders(torch_python, ext4_mnt, tmp_path):
    loop, mnt = ext4_mnt
    data = mnt / "data"
    data.mkdir()
    for i in range(RANK_FILES):
        (data / f"{i:04d}.bin").write_bytes(os.urandom(RANK_FILE_KIB << 10))
    drop_caches()
    ranks_dir = tmp_path / "ranks"
    ranks_dir.mkdir()
    out = tmp_path / "run.jsonl"
    env = {k: v for k, v in os.environ.items() if not k.startswith("SUDO_") and k not in ("IOTRACE_CONTROL", "RANK")}
    env["PYTHONPATH"] = str(ROOT)
    rc, stdout, stderr = run_traced_group(
        ["-o", str(out), "--dev", loop.name, "--", str(torch_python), str(SPAWN), str(data), str(ranks_dir),
         "--epochs", "2"], env, TIMEOUT_S)
    context = f"\nstdout:\n{stdout}\nstderr:\n{stderr}"
    assert rc == 0, context
    ranks = {r: json.loads((ranks_dir / f"rank-{r}.json").read_text()) for r in (0, 1)}
    dumps = [json.loads(line) for line in out.read_text().splitlines()]

    for r, info in ranks.items():
        mine = [d for d in dumps if d.get("owner") == {"pid": info["pid"], "rank": r}]
        # one dump per window of this rank, none shared with the other rank
        assert [d["label"] for d in mine] == ["before epoch 1", "epoch 1", "epoch 2"], ([d["label"] for d in mine],
                                                                                         context)
        family = {info["pid"], *info["workers"]}
        assert len(info["workers"]) == 4, info          # 2 workers, forked anew each epoch
        for d in mine[1:]:
            assert d["sender_pid"] == info["pid"] and d["loop"]["steps"] == info["batches"], d["loop"]
            readers = {s["tgid"] or s["pid"] for s in series_of(d, device=loop.name)}
            assert readers and readers <= family and readers & set(info["workers"]), (r, d["label"], readers, info)
            assert {t["pid"] for t in d["tasks"]} <= family, (r, d["label"], d["tasks"])
            # its own shard, from the device (O_DIRECT), and nothing of the other rank's
            read = bytes_of([d], loop.name, "read")
            assert info["bytes"] <= read <= info["bytes"] + (64 << 10), (r, d["label"], read, info["bytes"])
    # every request in exactly one dump: the ranks' windows and the rest add up to what the cuts recorded
    recorded = sum(c["recorded"] for d in dumps if d.get("coverage") for c in d["coverage"]["devices"].values()
                   if loop.name in d["coverage"]["devices"])
    in_dumps = sum(s["count"] for d in dumps for s in series_of(d, device=loop.name)
                   if s["op"] in ("read", "write", "flush", "discard"))
    assert in_dumps == recorded, (in_dumps, recorded)

    r = run_iotrace(["report", "--by", "label", "--json", str(out)])
    assert r.returncode == 0, r.stderr
    verdicts = {w["label"]: w["verdict"] for w in map(json.loads, r.stdout.splitlines()) if "verdict" in w}
    for rank, info in ranks.items():
        for n in (1, 2):
            v = verdicts[f"rank {rank}: epoch {n}"]
            [d] = [d for d in dumps if d.get("owner", {}).get("rank") == rank and d["label"] == f"epoch {n}"]
            # the trainer is the rank; its loaders are its own 2 workers of the epoch (not the other rank, nor
            # the launcher's resource tracker), and their I/O wait is theirs alone
            assert v["trainer_pid"] == info["pid"] and v["loaders"] == 2 and v["steps"] == info["batches"], v
            waited = sum(t["io_wait_s"] for t in d["tasks"] if t["pid"] in info["workers"])
            assert v["loader_io_wait"] == pytest.approx(waited / 2 / v["wall_s"], abs=1e-4), (v, d["tasks"])
    # live and report: the same numbers for the same windows (the waits rows and the verdict lines)
    report = run_iotrace(["report", "--by", "label", str(out)]).stdout
    def waits(text: str) -> list[tuple[str, str]]:
        return OWNED.findall(text[text.index("waits per window"):])

    live = waits(stdout)
    assert len(live) == 2 * 2 * 3, context      # 2 ranks x 3 windows, a waits row and a verdict line each
    assert live == waits(report), report + context


def test_torch_save_without_fsync_over_3_epochs_is_credited_to_each_epochs_checkpoint(torch_python, ext4_mnt,
                                                                                      tmp_path):
    """torch.save of 16 MiB a epoch, no fsync: the kernel writes each checkpoint back when it will (dirty pages
    expire after 3 s here, so an epoch's checkpoint is written back during a later epoch or after the trainer
    exited, in iotrace's wait for it).  Each checkpoint's bytes are credited to the window that wrote them,
    "epoch N / checkpoint", whichever window the flusher ran in, and nothing is left unwritten at the end."""
    loop, mnt = ext4_mnt
    data, ckpt = mnt / "data", mnt / "ckpt"
    data.mkdir()
    for i in range(8):
        (data / f"{i:04d}.bin").write_bytes(os.urandom(64 << 10))
    out = tmp_path / "run.jsonl"
    env = {k: v for k, v in os.environ.items() if not k.startswith("SUDO_") and k != "IOTRACE_CONTROL"}
    expire = Path("/proc/sys/vm/dirty_expire_centisecs")
    old = expire.read_text()
    expire.write_text("300")
    try:
        rc, stdout, stderr = run_traced_group(
            ["-o", str(out), "--dev", loop.name, "--", str(torch_python), str(TRAINER), str(data), str(ckpt),
             "--epochs", "3", "--batch", str(BATCH), "--cold", "none", "--no-fsync", "--ckpt-mib", "16"],
            env, TIMEOUT_S)
    finally:
        expire.write_text(old)
    context = f"\nstdout:\n{stdout}\nstderr:\n{stderr}"
    assert rc == 0, context
    pid = int(re.search(r"^torch_train: pid (\d+)$", stdout, re.M).group(1))
    epoch_windows(out, 3, context)
    dumps = [json.loads(line) for line in out.read_text().splitlines()]
    final = dumps[-1]
    assert final["unwritten_at_exit"]["bytes"] == 0 and final["unwritten_at_exit"]["ended"] == "written", \
        final["unwritten_at_exit"]
    credited: dict[str, int] = {}
    for d in dumps:
        for s in series_of(d, device=loop.name, op="write"):
            if s.get("wb") and s["tgid"] == pid:
                for e in s["dirtied"]:
                    credited[e["label"]] = credited.get(e["label"], 0) + e["bytes"]
    for n in range(1, 4):
        pages = -(-(ckpt / f"ckpt-{n}.pt").stat().st_size // 4096) * 4096
        got = credited.get(f"epoch {n} / checkpoint", 0)
        # all its pages, less at most a maximal request for each request the kernel did not show iotrace
        assert pages - 2 * (1 << 20) <= got <= pages, (n, got, pages, credited, context)
    r = run_iotrace(["report", "--by", "label", str(out)])
    assert r.returncode == 0, r.stderr
    for n in range(1, 4):
        assert re.search(rf"^  epoch {n} / checkpoint / \S+: .*written back (during|in) ", r.stdout, re.M), r.stdout
