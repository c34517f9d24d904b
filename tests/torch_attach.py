"""A PyTorch trainer that runs before any tracer, for tests/privileged/test_attach.py's attach test:

    .venv-torch/bin/python tests/torch_attach.py DATA_DIR CTRL --epochs N --step-s S

A DataLoader with 2 persistent workers over the files in DATA_DIR, each
sample one O_DIRECT read of a whole file (256 KiB); the epochs are
tracer.marker.epochs' windows (the first marker finds no tracer: a warning,
once).  After its first batch it writes CTRL/ready ({"pid", "workers"}), and
from then on it takes S seconds per batch until CTRL/stop exists and the
current epoch ends.  Not collected by pytest (no test_ prefix).
"""

from __future__ import annotations

import argparse
import json
import mmap
import os
import sys
import time
from pathlib import Path

import torch
from torch.utils.data import DataLoader, Dataset

from tracer import marker
from tracer.integrations.torch import timed


class DirectFiles(Dataset):
    def __init__(self, directory: str):
        self.paths = sorted(str(p) for p in Path(directory).iterdir())

    def __len__(self) -> int:
        return len(self.paths)

    def __getitem__(self, i: int):
        size = os.path.getsize(self.paths[i])
        buf = mmap.mmap(-1, size)       # page-aligned, as O_DIRECT wants
        fd = os.open(self.paths[i], os.O_RDONLY | os.O_DIRECT)
        try:
            if os.preadv(fd, [buf], 0) != size:
                raise OSError(f"short read of {self.paths[i]}")
        finally:
            os.close(fd)
        x = torch.frombuffer(bytearray(buf[:4096]), dtype=torch.uint8).float() / 255
        return x, x.mean().unsqueeze(0)


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("data")
    p.add_argument("ctrl")
    p.add_argument("--epochs", type=int, default=20)
    p.add_argument("--step-s", type=float, default=0.05)
    a = p.parse_args()
    ctrl = Path(a.ctrl)
    loader = DataLoader(DirectFiles(a.data), batch_size=4, shuffle=True, num_workers=2, persistent_workers=True)
    model = torch.nn.Linear(4096, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    ready = False
    for _epoch in marker.epochs(a.epochs):
        for x, y in timed(loader):
            loss = torch.nn.functional.mse_loss(model(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            if not ready:
                workers = [w.pid for w in loader._iterator._workers]   # noqa: SLF001 - their pids, for the test
                (ctrl / "ready.tmp").write_text(json.dumps({"pid": os.getpid(), "workers": workers}))
                os.rename(ctrl / "ready.tmp", ctrl / "ready")
                ready = True
            time.sleep(a.step_s)
        if (ctrl / "stop").exists():
            break
    return 0


if __name__ == "__main__":
    sys.exit(main())
