"""Two PyTorch trainers under one launcher, for tests/privileged/test_torch.py's ranks test:

    iotrace -o run.jsonl -- .venv-torch/bin/python tests/torch_spawn.py DATA_DIR OUT_DIR [--epochs N]

torch.multiprocessing.spawn starts 2 ranks; rank R (tracer.marker.set_rank(R))
trains on its own shard of the files in DATA_DIR (every second file, from
the R-th), each sample one O_DIRECT read of a whole file (torch_attach's
DirectFiles), so every epoch reads its shard from the device; a DataLoader
with 2 workers (forked anew each epoch), wrapped in
tracer.integrations.torch.timed; the epochs are tracer.marker.epochs'
windows.  Each rank writes OUT_DIR/rank-R.json:
{"pid", "files", "bytes", "batches", "workers": the pids of its loaders, every epoch's}.
Not collected by pytest (no test_ prefix).
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import sys
from pathlib import Path

import torch
import torch.multiprocessing as mp
from torch.utils.data import DataLoader
from torch_attach import DirectFiles  # tests/: the script's own directory

from tracer import marker
from tracer.integrations.torch import timed

RANKS, WORKERS, BATCH = 2, 2, 4


def note_worker(path: Path, _worker_id: int) -> None:
    with open(path, "a") as f:      # one short line: appends of the workers do not interleave
        f.write(f"{os.getpid()}\n")


def rank_main(rank: int, data: str, out: str, epochs: int) -> None:
    marker.set_rank(rank)
    shard = DirectFiles(data)
    shard.paths = shard.paths[rank::RANKS]
    paths = shard.paths
    torch.manual_seed(rank)
    model = torch.nn.Linear(4096, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    loader = DataLoader(shard, batch_size=BATCH, num_workers=WORKERS,
                        worker_init_fn=functools.partial(note_worker, Path(out, f"workers-{rank}")))
    for _epoch in marker.epochs(epochs):
        for x, y in timed(loader):
            loss = torch.nn.functional.mse_loss(model(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
    workers = sorted(int(w) for w in Path(out, f"workers-{rank}").read_text().split())
    result = {"pid": os.getpid(), "files": len(paths), "bytes": sum(os.path.getsize(p) for p in paths),
              "batches": len(loader), "workers": workers}
    Path(out, f"rank-{rank}.json").write_text(json.dumps(result))


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("data")
    p.add_argument("out")
    p.add_argument("--epochs", type=int, default=2)
    a = p.parse_args()
    mp.spawn(rank_main, args=(a.data, a.out, a.epochs), nprocs=RANKS)
    return 0


if __name__ == "__main__":
    sys.exit(main())
