"""A small PyTorch training run for tests/test_torch.py, meant to run traced:

    iotrace -o run.jsonl -- .venv-torch/bin/python tests/torch_train.py DATA_DIR CKPT_DIR [--epochs N]

A Dataset of the files in DATA_DIR (each one sample: its first 4 KiB as
floats), read by a DataLoader with 2 worker processes, wrapped in
tracer.integrations.torch.timed; each epoch is tracer.marker.epochs' window,
starts by dropping the page cache (so that it reads the files from the
device; needs root; with --cold none no epoch does, and the caller evicts
the data set before the run, so only the first epoch reads it from the
device) and ends with save_checkpoint(), the nested window
"epoch N / checkpoint" (fsynced there unless --no-fsync).  Prints "torch_train: pid PID", then a
summary.
Not collected by pytest (no test_ prefix).
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

import torch
from torch.utils.data import DataLoader, Dataset

from tracer import marker
from tracer.integrations.torch import save_checkpoint, timed

FEATURES = 4096


class Files(Dataset):
    def __init__(self, directory: str):
        self.paths = sorted(Path(directory).iterdir())

    def __len__(self) -> int:
        return len(self.paths)

    def __getitem__(self, i: int):
        data = self.paths[i].read_bytes()       # the whole file: its pages are read from the device
        x = torch.frombuffer(bytearray(data[:FEATURES]), dtype=torch.uint8).float() / 255
        return x, x.mean().unsqueeze(0)


def drop_caches() -> None:
    os.sync()
    Path("/proc/sys/vm/drop_caches").write_text("3\n")


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("data")
    p.add_argument("ckpt")
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--join-cgroup", metavar="PROCS", help="once imported, move into the cgroup whose cgroup.procs "
                   "this is (the test's slowed disk: torch's own files are read at full speed before)")
    p.add_argument("--cold", choices=("every", "none"), default="every",
                   help="drop the page cache before every epoch, or never (the caller evicted the data set)")
    p.add_argument("--no-fsync", action="store_true",
                   help="torch.save without fsync: the kernel writes the checkpoint back when it will")
    p.add_argument("--ckpt-mib", type=int, default=0, help="MiB of padding in each checkpoint (a bigger model)")
    a = p.parse_args()
    print(f"torch_train: pid {os.getpid()}", flush=True)
    if a.join_cgroup:
        Path(a.join_cgroup).write_text(f"{os.getpid()}\n")
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(FEATURES, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    loader = timed(DataLoader(Files(a.data), batch_size=a.batch, num_workers=2))
    losses = []
    for epoch in marker.epochs(a.epochs):
        if a.cold == "every":
            drop_caches()
        total = 0.0
        for x, y in loader:
            opt.zero_grad()
            loss = torch.nn.functional.mse_loss(model(x), y)
            loss.backward()
            opt.step()
            total += loss.item()
        losses.append(total / len(loader))
        state = {"model": model.state_dict(), "opt": opt.state_dict()}
        if a.ckpt_mib:
            state["padding"] = torch.full((a.ckpt_mib << 20,), epoch + 1, dtype=torch.uint8)
        save_checkpoint(state, os.path.join(a.ckpt, f"ckpt-{epoch + 1}.pt"), fsync=not a.no_fsync)
    print(f"torch_train: {a.epochs} epochs of {len(loader)} batches, loss {losses[0]:.4f} -> {losses[-1]:.4f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
