"""tracer.sources.drain.MapDrain on fake maps (no root, no BPF): the generation flip, the batch drains' walk
through the reused buffers (a hash handed out a few elements per syscall), the cells of one generation
read and zeroed, the overflow hash's per-CPU counts summed after the cells', and a series' values from its
cells on some CPUs and the overflow hash on others folded into one row."""

from __future__ import annotations

import ctypes as ct
import errno
import types

import numpy as np

from tracer.sources import drain as drainmod
from tracer.sources.drain import MapDrain

NCPU = 2
PHASES = 3
HKEY = np.dtype([("pid", "u4"), ("dev", "u4"), ("bucket", "u2"), ("op", "u1"), ("phase", "u1")])
CELL = np.dtype([("key", HKEY), ("count", "u4")])
SKEY = np.dtype([("pid", "u4"), ("dev", "u4"), ("op", "u4")])
SVAL = np.dtype([("count", "u8"), ("bytes", "u8"), ("sum_ns", "u8", PHASES), ("min_ns", "u8", PHASES),
                 ("max_ns", "u8", PHASES), ("phase_count", "u8", PHASES), ("last_ns", "u8"), ("cgroup", "u8"),
                 ("tgid", "u4"), ("pad", "u4"), ("comm", "S16")])
SCELL = np.dtype([("key", SKEY), ("pad", "u4"), ("val", SVAL)])
SERIES_CELLS = drainmod.contract.load().const("SERIES_CELLS")     # per CPU and generation
BATCH = 3       # elements a fake hash hands out per syscall, fewer than asked: the walk must go on


class FakeHash:
    """A per-CPU hash: keys (n,) and values (n, NCPU), handed out and deleted BATCH at a time."""

    def __init__(self, name: str, fd: int, key: np.dtype, val: np.dtype, max_entries: int):
        self.name, self.map_fd, self.Key, self.sLeaf, self.max_entries = name, fd, key, val, max_entries
        self.keys, self.vals = np.zeros(0, key), np.zeros((0, NCPU), val)


class FakeArray:
    def __init__(self, name: str, fd: int, leaf: np.dtype, max_entries: int):
        self.name, self.map_fd, self.Leaf, self.max_entries = name, fd, leaf, max_entries
        self.vals = np.zeros(max_entries, leaf)


class FakeLib:
    """libbcc's batch calls over the fake maps, writing through the pointers as the kernel would."""

    def __init__(self, maps: dict[int, object]):
        self.maps, self.calls = maps, 0

    def bpf_lookup_and_delete_batch(self, fd, in_batch, out_batch, keys, vals, count):
        self.calls += 1
        m, n = self.maps[fd], count._obj
        take = min(n.value, BATCH, len(m.keys))
        k, v = np.ascontiguousarray(m.keys[:take]), np.ascontiguousarray(m.vals[:take])
        ct.memmove(keys.value, k.ctypes.data, k.nbytes)
        ct.memmove(vals.value, v.ctypes.data, v.nbytes)
        m.keys, m.vals = m.keys[take:], m.vals[take:]
        n.value = take
        if not len(m.keys):
            ct.set_errno(errno.ENOENT)
            return -1
        return 0

    def bpf_lookup_batch(self, fd, in_batch, out_batch, keys, vals, count):
        m, n = self.maps[fd], count._obj
        start = in_batch._obj.value + 1 if in_batch is not None else 0
        take = min(n.value, m.max_entries - start)
        idx = np.arange(start, start + take, dtype=np.uint32)
        v = np.ascontiguousarray(m.vals[start:start + take])
        ct.memmove(keys.value, idx.ctypes.data, idx.nbytes)
        ct.memmove(vals.value, v.ctypes.data, v.nbytes)
        n.value = take
        ct.set_errno(errno.ENOENT)
        return -1 if start + take == m.max_entries else 0

    def bpf_update_batch(self, fd, keys, vals, count):
        m, n = self.maps[fd], count._obj.value
        idx = np.frombuffer(ct.string_at(keys.value, 4 * n), np.uint32)
        m.vals[idx] = np.frombuffer(ct.string_at(vals.value, m.vals.dtype.itemsize * n), m.vals.dtype)
        return 0


class FakeCell(dict):
    """An array map written as bcc's are (ctypes index and value): {index: value} as ints."""

    def __setitem__(self, key, value):
        super().__setitem__(key.value, value.value)


class FakeObject:
    """A BpfObject's face to the drain: maps by name, libbcc, the config map."""

    def __init__(self, cells_per_gen: int = 4, entries: int = 16):
        self.tables = {"series0": FakeHash("series0", 1, SKEY, SVAL, entries),
                       "series1": FakeHash("series1", 2, SKEY, SVAL, entries),
                       "hist0": FakeHash("hist0", 3, HKEY, np.dtype(np.uint64), entries),
                       "hist1": FakeHash("hist1", 4, HKEY, np.dtype(np.uint64), entries),
                       "cells": FakeArray("cells", 5, CELL, 2 * cells_per_gen),
                       "series_cells": FakeArray("series_cells", 6, SCELL, 2 * NCPU * SERIES_CELLS)}
        self.lib = FakeLib({t.map_fd: t for t in self.tables.values()})
        self.config = types.SimpleNamespace(gen=0)
        self.tables["wb_window"] = FakeCell()

    def __getitem__(self, name):
        return self.tables[name]

    def update_config(self, table, **values):
        assert table == "config"
        vars(self.config).update(values)


def series(obj: FakeObject, gen: int, n: int) -> None:
    h = obj[f"series{gen}"]
    h.keys = np.zeros(n, SKEY)
    h.keys["pid"] = np.arange(n) + 100
    h.vals = np.zeros((n, NCPU), SVAL)
    h.vals["count"] = 1
    h.vals["last_ns"] = [[1, 2]] * n
    h.vals["comm"] = [[b"cpu0", b"cpu1"]] * n


def test_flip_alternates_the_generation_and_waits_the_grace(monkeypatch):
    slept = []
    monkeypatch.setattr(drainmod.time, "sleep", slept.append)
    obj = FakeObject()
    d = MapDrain(obj, NCPU)
    assert d.gen == 0
    old, end = d.flip()
    assert (old, d.gen, obj.config.gen) == (0, 1, 1) and end > 0
    assert d.flip()[0] == 1 and (d.gen, obj.config.gen) == (0, 0)
    assert slept == [drainmod.GENERATION_GRACE_S] * 2
    # what is read at the window's edge is read after the programs moved on and before the grace period
    seen = []
    d.flip(lambda: seen.append((obj.config.gen, len(slept))))
    assert seen == [(1, 2)] and len(slept) == 3


def test_each_flip_moves_the_write_back_programs_to_the_next_window(monkeypatch):
    monkeypatch.setattr(drainmod.time, "sleep", lambda s: None)
    obj = FakeObject()
    d = MapDrain(obj, NCPU)
    window = obj["wb_window"]
    assert d.window == 1 and window == {0: 1}
    for want in (2, 3):
        d.flip()
        assert d.window == want and window == {0: want}
    # the programs see the low IOTRACE_OP_WINDOW_BITS of it
    d.window = drainmod.WINDOW_MASK
    d.flip()
    assert d.window == drainmod.WINDOW_MASK + 1 and window == {0: 0}


def test_a_hash_handed_out_a_few_at_a_time_is_drained_whole_into_the_reused_buffers():
    obj = FakeObject(entries=16)
    d = MapDrain(obj, NCPU)
    series(obj, 1, 7)
    buffers = d._buffers["series"]
    out = d.drain(1)
    assert obj.lib.calls >= 7 // BATCH + 1     # series and hist walked in batches
    assert sorted(out.series_keys["pid"].tolist()) == list(range(100, 107))
    assert out.series_vals["count"].tolist() == [NCPU] * 7         # folded over the CPUs
    assert set(out.series_vals["comm"].tolist()) == {b"cpu1"}      # the CPU with the latest request
    assert not len(obj["series1"].keys) and d._buffers["series"] is buffers
    assert not len(d.drain(1).series_keys)                          # drained once
    assert out.series_keys.base is None                             # a copy: the buffer is reused


def test_one_generation_of_cells_is_read_and_zeroed_then_the_overflow_counts_follow():
    per = 4
    obj = FakeObject(cells_per_gen=per)
    cells = obj["cells"].vals
    cells["key"]["bucket"] = np.arange(2 * per)
    cells["count"][[0, per - 1]] = [3, 5]            # generation 0's first and last cell
    cells["count"][per] = 7                          # generation 1's first
    h = obj["hist0"]
    h.keys = np.zeros(2, HKEY)
    h.keys["bucket"] = [40, 41]
    h.vals = np.array([[1, 2], [0, 4]], np.uint64)
    d = MapDrain(obj, NCPU)
    out = d.drain(0)
    assert out.hist_keys.dtype == d.hist_key
    assert out.hist_keys["bucket"].tolist() == [0, per - 1, 40, 41]
    assert out.hist_counts.tolist() == [3, 5, 3, 4] and out.hist_counts.dtype == np.uint64
    assert cells["count"].tolist() == [0] * per + [7] + [0] * (per - 1)    # generation 1 left alone
    assert d.drain(1).hist_counts.tolist() == [7] and not cells["count"].any()


def test_merge_hist_sums_only_the_overflow_hash_per_cpu():
    ck = np.zeros(1, HKEY)
    hk = np.zeros(1, HKEY)
    keys, counts = drainmod.merge_hist(ck, np.array([2], np.uint64), hk, np.array([[1, 1]], np.uint64), HKEY)
    assert len(keys) == 2 and counts.tolist() == [2, 2]


def test_a_series_in_cells_on_one_cpu_and_in_the_hash_on_another_is_one_row():
    """Series 100 sits in a cell on CPU 1 and in the hash for CPU 0 (its cell there was taken); 101 only in
    CPU 0's cells; 102 only in the hash.  Generation 1's cells stay; the drained ones are zeroed."""
    obj = FakeObject()
    cells = obj["series_cells"].vals
    cpu0, cpu1, gen1 = 3, SERIES_CELLS + 7, 2 * SERIES_CELLS      # generation 0's CPU 0 and CPU 1, then gen 1
    for idx, pid, count, last, comm in ((cpu1, 100, 4, 50, b"late"), (cpu0, 101, 2, 10, b"b"), (gen1, 100, 9, 1, b"x")):
        cells[idx]["key"]["pid"] = pid
        cells[idx]["val"]["count"] = count
        cells[idx]["val"]["bytes"] = count * 4096
        cells[idx]["val"]["last_ns"] = last
        cells[idx]["val"]["min_ns"] = [0, 0, 7 * count]
        cells[idx]["val"]["max_ns"] = [0, 0, 9 * count]
        cells[idx]["val"]["comm"] = comm
    h = obj["series0"]
    h.keys = np.zeros(2, SKEY)
    h.keys["pid"] = [100, 102]
    h.vals = np.zeros((2, NCPU), SVAL)
    h.vals["count"] = [[3, 0], [0, 1]]
    h.vals["last_ns"] = [[20, 0], [0, 5]]
    h.vals["min_ns"] = [[[0, 0, 5], [0, 0, 0]], [[0, 0, 0], [0, 0, 6]]]
    h.vals["comm"] = [[b"early", b""], [b"", b"c"]]
    d = MapDrain(obj, NCPU)
    out = d.drain(0)
    rows = {int(k["pid"]): v for k, v in zip(out.series_keys, out.series_vals, strict=True)}
    assert sorted(rows) == [100, 101, 102]
    assert [int(rows[p]["count"]) for p in (100, 101, 102)] == [7, 2, 1]
    assert int(rows[100]["bytes"]) == 4 * 4096
    assert rows[100]["comm"] == b"late"                        # the latest request's CPU: the cell's
    assert rows[100]["min_ns"].tolist() == [0, 0, 5] and rows[100]["max_ns"].tolist() == [0, 0, 36]
    assert rows[102]["comm"] == b"c" and rows[102]["min_ns"].tolist() == [0, 0, 6]
    assert not cells["val"]["count"][:gen1].any() and cells["val"]["count"][gen1] == 9
    assert not len(d.drain(0).series_keys)
