"""The drain of the request tracer's maps: what the BPF programs recorded in one generation, read out and
cleared, as plain numpy arrays.

Owns the reading side of the maps the programs record into (bpf/core.bpf.h):
the per-CPU hashes series0/series1 and hist0/hist1 (emptied with batch
look-up-and-delete), the per-CPU cell arrays `series_cells` and `cells` in
front of them (both generations, half each: read in one batch, the
populated cells zeroed), the
generation flip in the config map that tells the programs which half to
write, the window sequence that goes with it (wb_window: a dirtier is stamped
with the window it dirtied in, bpf/writeback.bpf.h), and the numpy buffers
the reads go into (made once: fresh ones every interval would ratchet
malloc's heap up).  Per-CPU series values are folded
here into one row per series (fold_series).

It knows nothing of drop reasons, lost requests or diskstats (those are the
loss ledger's, tracer.sources.ledger) nor of percentiles (tracer.pipeline).
"""

from __future__ import annotations

import ctypes as ct
import errno
import os
import time
from dataclasses import dataclass

import numpy as np

from tracer import contract
from tracer.sources.bpfobject import BpfObject

# the bits of a window's sequence number a dirtier (and a write-back request's op) carries
WINDOW_MASK = (1 << contract.load().const("OP_WINDOW_BITS")) - 1

# Programs that began on the old generation finish within microseconds
# (BPF programs do not sleep); this margin is generous.
GENERATION_GRACE_S = 0.005


def batch_drain(table, keys: np.ndarray, vals: np.ndarray, lib) -> tuple[np.ndarray, np.ndarray]:
    """Look up and delete every element of a per-CPU hash in a few syscalls.

    `keys` (cap,) and `vals` (cap, ncpu) are reused buffers; copies of the
    drained part are returned.
    """
    cap, ncpu = vals.shape
    key_dtype, val_dtype = keys.dtype, vals.dtype
    count = ct.c_uint32(0)
    token = ct.c_uint32(0)
    total = 0
    while total < cap:
        count.value = cap - total
        res = lib.bpf_lookup_and_delete_batch(
            table.map_fd,
            ct.byref(token) if total else None,
            ct.byref(token),
            ct.c_void_p(keys.ctypes.data + total * key_dtype.itemsize),
            ct.c_void_p(vals.ctypes.data + total * ncpu * val_dtype.itemsize),
            ct.byref(count),
        )
        err = ct.get_errno()
        total += count.value
        if res != 0:
            if err == errno.ENOENT:
                break   # walked the whole map
            raise OSError(err, f"draining BPF map {table.name!r}: {os.strerror(err)}")
        if count.value == 0:
            break
    return keys[:total].copy(), vals[:total].copy()


def read_array(table, keys: np.ndarray, vals: np.ndarray, lib, start: int = 0) -> np.ndarray:
    """Elements `start`.. of a BPF array map, as many as `vals` holds, in one syscall, into the reused `vals`
    buffer; `keys` gets their indices."""
    # the kernel's batch token for an array is the last index read: the walk resumes after it
    count, token, last = ct.c_uint32(len(vals)), ct.c_uint32(0), ct.c_uint32(start - 1)
    res = lib.bpf_lookup_batch(table.map_fd, ct.byref(last) if start else None, ct.byref(token),
                               ct.c_void_p(keys.ctypes.data), ct.c_void_p(vals.ctypes.data), ct.byref(count))
    err = ct.get_errno()
    if res != 0 and err != errno.ENOENT:
        raise OSError(err, f"reading BPF map {table.name!r}: {os.strerror(err)}")
    return vals[:count.value]


def take_populated(table, start: int, idx: np.ndarray, cells: np.ndarray, count: str,
                   lib) -> tuple[np.ndarray, np.ndarray]:
    """Read a cell array from index `start` into the reused buffers, zero the cells whose `count` field
    (a dotted path into the cell) is non-zero, return (those cells, their indices)."""
    cells = read_array(table, idx, cells, lib, start)
    field = cells
    for name in count.split("."):
        field = field[name]
    rows = np.flatnonzero(field)
    if len(rows):
        zeros = np.zeros(len(rows), dtype=cells.dtype)
        keys = np.ascontiguousarray(idx[rows])
        n = ct.c_uint32(len(rows))
        if lib.bpf_update_batch(table.map_fd, ct.c_void_p(keys.ctypes.data), ct.c_void_p(zeros.ctypes.data),
                                ct.byref(n)) != 0:
            err = ct.get_errno()
            raise OSError(err, f"clearing BPF map {table.name!r}: {os.strerror(err)}")
    return cells[rows], idx[rows]


def drain_cells(table, start: int, idx: np.ndarray, cells: np.ndarray, lib) -> tuple[np.ndarray, np.ndarray]:
    """Read every CPU's histogram cells of one generation (from index `start`), zero the populated ones,
    return (keys, counts).

    A key may come back once per CPU; the aggregator sums repeats.  `idx`
    and `cells` (cap,) are reused buffers.
    """
    picked, _ = take_populated(table, start, idx, cells, "count", lib)
    return picked["key"], picked["count"].astype(np.uint64)


def drain_series_cells(table, start: int, idx: np.ndarray, cells: np.ndarray, per_cpu: int,
                       lib) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Read every CPU's series cells of one generation (from index `start`, `per_cpu` a CPU), zero the
    populated ones, return (keys, values, the CPU of each)."""
    picked, at = take_populated(table, start, idx, cells, "val.count", lib)
    return picked["key"], picked["val"], (at.astype(np.int64) - start) // per_cpu


def merge_series(cell_keys: np.ndarray, cell_vals: np.ndarray, cell_cpus: np.ndarray, cpus: int,
                 hash_keys: np.ndarray, hash_vals: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """One generation's series: each key once, with its per-CPU values from the cells (column = the CPU,
    `cpus` columns) and from the overflow hash (the columns after), unfolded: a series is in a cell on one
    CPU and in the hash on another when its cell there was taken."""
    key_dtype, val_dtype = hash_keys.dtype, hash_vals.dtype
    both = np.concatenate([cell_keys.astype(key_dtype), hash_keys])
    keys, where = np.unique(both, return_inverse=True)
    vals = np.zeros((len(keys), cpus + hash_vals.shape[1]), val_dtype)
    vals[where[:len(cell_keys)], cell_cpus] = cell_vals.astype(val_dtype)
    vals[where[len(cell_keys):], cpus:] = hash_vals
    return keys, vals


def fold_series(vals: np.ndarray) -> np.ndarray:
    """Fold per-CPU series values (n, ncpu) into one value per series."""
    out = np.zeros(len(vals), dtype=vals.dtype)
    if not len(vals):
        return out
    for name in ("count", "bytes", "sum_ns", "phase_count"):
        out[name] = vals[name].sum(axis=1)
    out["max_ns"] = vals["max_ns"].max(axis=1)
    mins = vals["min_ns"].astype(np.float64)
    mins[mins == 0] = np.inf   # 0 means "this CPU saw none"
    folded = mins.min(axis=1)
    folded[np.isinf(folded)] = 0
    out["min_ns"] = folded.astype(np.uint64)
    # identity of the submitter: from the CPU that completed this series' latest request (a process's
    # name changes at exec: each CPU keeps the name of its own latest request)
    seen = np.argmax(np.where(vals["count"] > 0, vals["last_ns"], 0), axis=1)
    rows = np.arange(len(vals))
    for name in ("cgroup", "tgid", "comm"):
        out[name] = vals[name][rows, seen]
    return out


def merge_hist(cell_keys: np.ndarray, cell_counts: np.ndarray, hist_keys: np.ndarray, hist_vals: np.ndarray,
               key_dtype: np.dtype) -> tuple[np.ndarray, np.ndarray]:
    """The histogram rows of one generation: the cells' (one count each) then the overflow hash's (per-CPU
    counts, summed), keyed alike."""
    return (np.concatenate([cell_keys.astype(key_dtype), hist_keys]),
            np.concatenate([cell_counts, hist_vals.sum(axis=1)]))


@dataclass
class Drained:
    """One generation's maps, read out: what RawInterval carries of them."""

    series_keys: np.ndarray  # structured: pid, dev, op
    series_vals: np.ndarray  # structured, per-CPU values already folded
    hist_keys: np.ndarray    # structured: pid, dev, bucket, op, phase
    hist_counts: np.ndarray  # uint64, per-CPU summed


class MapDrain:
    """The recording maps of a loaded BpfObject, drained one generation at a time.

    `flip()` moves the programs onto the other generation; `drain(gen)` then
    reads and clears the one left behind.  Sizes and layouts come from the
    maps themselves (bcc's Key/Leaf types and max_entries).
    """

    def __init__(self, bpf: BpfObject, ncpu: int, config: str = "config"):
        self.bpf, self.ncpu, self.config = bpf, ncpu, config
        self.gen = 0            # the generation the programs write
        # the window being recorded, 1 the first: a dirtier is stamped with it, and a later write-back's op
        # carries it (IOTRACE_OP_WINDOW_SHIFT); tracer.pipeline.aggregate names the window back
        self.window = 1
        self._write_window()
        hist, series, cells, scells = bpf["hist0"], bpf["series0"], bpf["cells"], bpf["series_cells"]
        self.hist_key = np.dtype(hist.Key)
        self.hist_cell = np.dtype(cells.Leaf)
        self.cells_per_gen = cells.max_entries // 2   # the array holds both generations
        self.series_key = np.dtype(series.Key)
        self.series_val = np.dtype(series.sLeaf)
        self.series_cells_per_gen = scells.max_entries // 2     # IOTRACE_CPUS parts of IOTRACE_SERIES_CELLS
        self.series_cells_per_cpu = contract.load().const("SERIES_CELLS")
        # drain buffers, made once: fresh ones every interval would ratchet malloc's heap up
        self._buffers = {
            "series": (np.zeros(series.max_entries, self.series_key),
                       np.zeros((series.max_entries, ncpu), self.series_val)),
            "cells": (np.zeros(self.cells_per_gen, np.uint32), np.zeros(self.cells_per_gen, self.hist_cell)),
            "series_cells": (np.zeros(self.series_cells_per_gen, np.uint32),
                             np.zeros(self.series_cells_per_gen, np.dtype(scells.Leaf))),
            "hist": (np.zeros(hist.max_entries, self.hist_key),
                     np.zeros((hist.max_entries, ncpu), np.uint64)),
        }

    def _write_window(self) -> None:
        t = self.bpf["wb_window"]
        t[ct.c_int(0)] = ct.c_uint32(self.window & WINDOW_MASK)

    def flip(self, at_flip=None) -> tuple[int, int]:
        """Send the programs to the other generation, and the write-back programs to the next window; (the old
        generation, CLOCK_MONOTONIC ns of the flip), once the programs that began on the old one have finished
        (GENERATION_GRACE_S).  The window moves on right after the generation: a page dirtied between the
        two is stamped with the window that closes (its write-back is credited there).  `at_flip()`, if
        given, is called right after the flip, before that wait: what is read there is read at the window's
        edge."""
        old = self.gen
        self.gen ^= 1
        self.bpf.update_config(self.config, gen=self.gen)
        self.window += 1
        self._write_window()
        end = time.monotonic_ns()
        if at_flip is not None:
            at_flip()
        time.sleep(GENERATION_GRACE_S)
        return old, end

    def drain(self, gen: int) -> Drained:
        """Read and clear generation `gen`'s series, cells and histogram overflow."""
        lib = self.bpf.lib
        per_cpu = self.series_cells_per_cpu
        ckeys, cvals, ccpus = drain_series_cells(self.bpf["series_cells"], gen * self.series_cells_per_gen,
                                                 *self._buffers["series_cells"], per_cpu, lib)
        hkeys, hvals = batch_drain(self.bpf[f"series{gen}"], *self._buffers["series"], lib)
        skeys, svals = merge_series(ckeys, cvals, ccpus, self.series_cells_per_gen // per_cpu, hkeys, hvals)
        ckeys, ccounts = drain_cells(self.bpf["cells"], gen * self.cells_per_gen, *self._buffers["cells"], lib)
        hkeys, hvals = batch_drain(self.bpf[f"hist{gen}"], *self._buffers["hist"], lib)
        hist_keys, hist_counts = merge_hist(ckeys, ccounts, hkeys, hvals, self.hist_key)
        return Drained(series_keys=skeys, series_vals=fold_series(svals), hist_keys=hist_keys,
                       hist_counts=hist_counts)
