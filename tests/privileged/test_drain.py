"""The collector drains every histogram cell of each generation exactly once (real maps, planted counts)."""

from __future__ import annotations

import ctypes as ct

import numpy as np
import pytest

from tracer import contract
from tracer.sources.devices import device_filter
from tracer.sources.probe import Probe, ProbeOptions

bpf = pytest.mark.bpf
PID = 424242        # no such process: only the planted cells carry it


@pytest.fixture
def probe(loop):
    p = Probe(ProbeOptions(devs=device_filter([loop.path])))
    try:
        yield p
    finally:
        p.close()


def plant(probe, idx: int, bucket: int, count: int) -> None:
    cells = probe.bpf["cells"]
    c = cells.Leaf()
    c.key.pid, c.key.dev, c.key.bucket = PID, 7 << 20, bucket
    c.key.phase = contract.load().phases.index("total")
    c.count = count
    cells[ct.c_int(idx)] = c


def planted(raw) -> dict[int, int]:
    mine = raw.hist_keys["pid"] == PID
    return {int(b): int(n) for b, n in zip(raw.hist_keys["bucket"][mine], raw.hist_counts[mine], strict=True)}


@bpf
def test_first_and_last_cell_of_each_generation(probe):
    """The array holds both generations; a drain reads its generation's part, edges included, and zeroes it."""
    per = probe.bpf["cells"].max_entries // 2
    edges = {0: (0, per - 1), 1: (per, 2 * per - 1)}
    for gen, (first, last) in edges.items():
        plant(probe, first, 10 + gen, 3)
        plant(probe, last, 20 + gen, 5)
    assert planted(probe.drain()) == {10: 3, 20: 5}         # generation 0 was being written
    assert planted(probe.drain()) == {11: 3, 21: 5}         # then generation 1
    assert planted(probe.drain()) == {}                     # each drained once, and zeroed
    counts = np.array([probe.bpf["cells"][ct.c_int(i)].count for gen in edges for i in edges[gen]])
    assert not counts.any()
