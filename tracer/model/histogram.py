"""Latency histograms on the user side: bucket arithmetic and aggregation.

This module owns everything iotrace does with a latency distribution once the
kernel has bucketed it:

* the bucket scheme of bpf/contract.toml, vectorised (``bucket_index``,
  ``bucket_lower``, ``bucket_upper``, ``bucket_value``), with every constant
  taken from ``tracer.contract``;
* ``Histogram``, a sparse, immutable set of (bucket, count) pairs with exact
  merging, nearest-rank percentiles, mean, min/max and biolatency-style bars.

The kernel's bucket index *is* HdrHistogram's counts index for lowest
trackable value 1, highest ``2**(max_msb+1) - 1`` ns and ``IOTRACE_HDR_SIGFIGS``
significant figures (checked at import, with ``hdr_half_count_magnitude`` and
``hdr_bucket_count``), so our buckets encode without re-binning.  The wire
format, the standard compressed V2 HdrHistogram encoding, is
``tracer.codec.hdr``'s.

Pure numpy: importable without root or bcc.  Latencies are integer
nanoseconds throughout.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import overload

import numpy as np
from numpy.typing import ArrayLike, NDArray

from tracer import contract

_C = contract.load()
SUB_BITS: int = _C.sub_bits
MAX_MSB: int = _C.max_msb
BUCKETS: int = _C.buckets
SIGFIGS: int = _C.const("HDR_SIGFIGS")

#: The HdrHistogram parameters our bucket index is the counts index of.
HDR_LOWEST: int = 1
HDR_HIGHEST: int = (1 << (MAX_MSB + 1)) - 1

_SUB_COUNT = 1 << SUB_BITS
_SUB_MASK = _SUB_COUNT - 1
_TOP = HDR_HIGHEST  # larger latencies are counted in the top bucket, as the kernel does


def hdr_half_count_magnitude(sigfigs: int) -> int:
    """log2 of HdrHistogram's sub-bucket half count for a number of significant figures."""
    # ceil(log2(2 * 10**sigfigs)), computed on integers so no float rounding can bite
    return max((2 * 10**sigfigs - 1).bit_length() - 1, 0)


def hdr_bucket_count(highest: int, half_magnitude: int, unit_magnitude: int) -> int:
    """HdrHistogram's number of power-of-two buckets needed to reach ``highest``."""
    smallest_untrackable = 1 << (half_magnitude + 1 + unit_magnitude)
    count = 1
    while smallest_untrackable <= highest:
        smallest_untrackable <<= 1
        count += 1
    return count


# The whole point of the scheme is that the kernel's buckets are a standard
# HdrHistogram; refuse to run on a header that silently broke that.
if (hdr_half_count_magnitude(SIGFIGS) != SUB_BITS
        or (hdr_bucket_count(HDR_HIGHEST, SUB_BITS, 0) + 1) << SUB_BITS != BUCKETS):
    raise ImportError(
        f"bpf/contract.toml: HIST_SUB_BITS={SUB_BITS}, HIST_MAX_MSB={MAX_MSB}, HIST_BUCKETS={BUCKETS} "
        f"and HDR_SIGFIGS={SIGFIGS} no longer describe one HdrHistogram layout")

_I64 = np.int64
_U64 = np.uint64


# --------------------------------------------------------------------------- bucket scheme

def _as_values(values_ns: ArrayLike) -> NDArray[np.int64]:
    """Latencies as int64, clamped to the top of the range; negative or NaN ones are an error."""
    arr = np.asarray(values_ns)
    kind = arr.dtype.kind
    if kind == "f" and np.isnan(arr).any():
        raise ValueError("latency is NaN")
    if kind not in "biuf" and arr.dtype != object:
        raise ValueError(f"latencies must be numbers, not {arr.dtype}")
    if kind != "u" and arr.size and (arr < 0).any():
        raise ValueError("latency is negative")
    # clamp before casting to int64, in a type the top fits in: uint64 and Python ints may not fit
    if kind == "u":
        return np.minimum(arr.astype(_U64), _U64(_TOP)).astype(_I64)
    if kind == "f":
        return np.trunc(np.minimum(arr, float(_TOP))).astype(_I64)
    if kind in "bi":
        return np.minimum(arr.astype(_I64), _TOP)
    return np.asarray(np.minimum(arr, _TOP)).astype(_I64)


def _as_indices(idx: ArrayLike) -> NDArray[np.int64]:
    arr = np.asarray(idx)
    if arr.dtype.kind not in "iu":
        if arr.size == 0:
            return arr.astype(_I64)
        raise ValueError(f"bucket indices must be integers, not {arr.dtype}")
    # one comparison catches both ends: negative indices wrap to huge unsigned ones
    if arr.size and (arr.astype(_U64) >= BUCKETS).any():
        raise ValueError(f"bucket index outside 0..{BUCKETS - 1}")
    return arr.astype(_I64, copy=False)


def _index(v: NDArray[np.int64]) -> NDArray[np.int64]:
    # frexp is exact here: v < 2**38 is exactly representable in a float64
    msb = np.frexp(v.astype(np.float64))[1].astype(_I64) - 1
    shift = np.maximum(msb - SUB_BITS, 0)
    above = ((msb - SUB_BITS + 1) << SUB_BITS) | ((v >> shift) & _SUB_MASK)
    return np.where(v < _SUB_COUNT, v, above)


def _tables() -> tuple[NDArray[np.int64], NDArray[np.int64], NDArray[np.int64], NDArray[np.int64]]:
    """Per bucket: lower bound, exclusive upper bound, representative value, log2 row."""
    i = np.arange(BUCKETS, dtype=_I64)
    octave = i >> SUB_BITS  # 0 for the unit-width buckets below 2**SUB_BITS
    step = np.maximum(octave - 1, 0)
    lower = np.where(octave == 0, i, (_SUB_COUNT + (i & _SUB_MASK)) << step)
    width = np.left_shift(1, step, dtype=_I64)
    row = np.frexp(lower.astype(np.float64))[1].astype(_I64) - 1  # floor(log2); -1 for 0
    tables = lower, lower + width, lower + (width >> 1), row
    for t in tables:
        t.flags.writeable = False
    return tables


# Bucket functions are table look-ups: 4096 entries are cheaper to index than to recompute.
_LOWER, _UPPER, _VALUE, _ROW = _tables()
_VALUE_F = _VALUE.astype(np.float64)  # exact: values are below 2**53
_VALUE_F.flags.writeable = False


def _out(arr: NDArray[np.int64], like: ArrayLike) -> NDArray[np.int64] | int:
    return int(arr) if np.ndim(like) == 0 else arr


@overload
def bucket_index(values_ns: int) -> int: ...
@overload
def bucket_index(values_ns: ArrayLike) -> NDArray[np.int64]: ...
def bucket_index(values_ns):
    """Bucket of each latency (ns); latencies above the top land in the top bucket."""
    return _out(_index(_as_values(values_ns)), values_ns)


@overload
def bucket_lower(idx: int) -> int: ...
@overload
def bucket_lower(idx: ArrayLike) -> NDArray[np.int64]: ...
def bucket_lower(idx):
    """Smallest latency (ns) counted in each bucket."""
    return _out(_LOWER[_as_indices(idx)], idx)


@overload
def bucket_upper(idx: int) -> int: ...
@overload
def bucket_upper(idx: ArrayLike) -> NDArray[np.int64]: ...
def bucket_upper(idx):
    """End (exclusive, ns) of each bucket's range; the top bucket also holds clamped latencies."""
    return _out(_UPPER[_as_indices(idx)], idx)


@overload
def bucket_value(idx: int) -> int: ...
@overload
def bucket_value(idx: ArrayLike) -> NDArray[np.int64]: ...
def bucket_value(idx):
    """The value (ns) a bucket stands for in percentiles and means: ``lower + width // 2``.

    This is the middle of the bucket's range, HdrHistogram's "median equivalent
    value", so our means agree with HdrHistogram's; it is exact for the unit-width
    buckets below ``2**(SUB_BITS+1)`` and within ``1/2**(SUB_BITS+1)`` of any latency
    of its bucket elsewhere.
    """
    return _out(_VALUE[_as_indices(idx)], idx)


# --------------------------------------------------------------------------- Histogram

def _frozen(arr: np.ndarray) -> np.ndarray:
    # histograms share arrays freely (merge of one, decode), so nobody may write to them
    arr.flags.writeable = False
    return arr


def _dense_to_sparse(dense: NDArray[np.uint64]) -> Histogram:
    idx = np.flatnonzero(dense)
    return Histogram(idx.astype(_I64, copy=False), dense[idx])


class Histogram:
    """A latency distribution over the contract's buckets, stored sparsely.

    ``idx`` holds the populated buckets, sorted and unique (int64), ``counts``
    their non-zero counts (uint64).  Sparse because a report may hold thousands
    of these while each has only a few dozen populated buckets.  Instances are
    immutable (their arrays are read-only); build them with ``empty``,
    ``from_pairs``, ``from_values``, ``merge`` or ``tracer.codec.hdr.decode``.
    """

    __slots__ = ("_total", "counts", "idx")
    __hash__ = None  # type: ignore[assignment]  # equality is by content, and arrays are unhashable

    idx: NDArray[np.int64]
    counts: NDArray[np.uint64]

    def __init__(self, idx: NDArray[np.int64], counts: NDArray[np.uint64]) -> None:
        """Wrap arrays that already satisfy the invariants; use ``from_pairs`` for anything else."""
        self.idx = _frozen(idx)
        self.counts = _frozen(counts)
        self._total: int | None = None

    # ---- constructors

    @classmethod
    def empty(cls) -> Histogram:
        return cls(np.empty(0, _I64), np.empty(0, _U64))

    @classmethod
    def from_pairs(cls, idx: ArrayLike, counts: ArrayLike) -> Histogram:
        """From bucket indices and counts in any order; repeated buckets are summed, zeros dropped."""
        i = _as_indices(idx).ravel()
        c = np.asarray(counts).ravel()
        if i.shape != c.shape:
            raise ValueError(f"{i.size} bucket indices but {c.size} counts")
        if c.size and c.dtype.kind not in "iu":
            raise ValueError(f"counts must be integers, not {c.dtype}")
        if c.size and c.dtype.kind == "i" and (c < 0).any():
            raise ValueError("negative count")
        dense = np.zeros(BUCKETS, _U64)
        np.add.at(dense, i, c.astype(_U64, copy=False))
        return _dense_to_sparse(dense)

    @classmethod
    def from_values(cls, values_ns: ArrayLike) -> Histogram:
        """From raw latencies in ns (floats are truncated; above-top ones go to the top bucket)."""
        i = _index(_as_values(values_ns).ravel())
        return _dense_to_sparse(np.bincount(i, minlength=BUCKETS).astype(_U64))

    # ---- aggregation

    @property
    def total(self) -> int:
        if self._total is None:     # immutable, so computed once: reports ask often
            self._total = int(self.counts.sum())
        return self._total

    def merge(self, other: Histogram) -> Histogram:
        """The histogram of both sets of samples (exact)."""
        return Histogram.merge_all((self, other))

    @staticmethod
    def merge_all(histograms: Iterable[Histogram]) -> Histogram:
        """The histogram of all samples of all ``histograms``, in one pass (exact)."""
        # Adding into one dense array costs one numpy call per histogram, where
        # pairwise sparse merges would re-sort at every step; it stays exact in
        # uint64 (a float bincount would round counts above 2**53).  Plain
        # fancy-index += is safe because each histogram's idx is unique.
        dense = np.zeros(BUCKETS, _U64)
        for h in histograms:
            dense[h.idx] += h.counts
        return _dense_to_sparse(dense)

    # ---- statistics

    def percentiles(self, qs: ArrayLike) -> NDArray[np.float64]:
        """Nearest-rank percentiles (ns) for ``qs`` in percent, shaped like ``qs``; NaN if empty.

        As HdrHistogram: the value at rank ``max(1, ceil(q/100 * total))`` in
        sorted order, reported as the ``bucket_value`` of the bucket holding
        that rank.  Empty histograms give NaN rather than 0, so that "no I/O"
        cannot be mistaken for "0 ns" in a report.
        """
        q = np.asarray(qs, dtype=np.float64)
        if q.size and not 0 <= q.min() <= q.max() <= 100:  # a NaN min or max fails too
            raise ValueError("percentiles must be between 0 and 100")
        if not self.idx.size or not q.size:
            return np.full(q.shape, np.nan)
        cum = np.cumsum(self.counts)
        # q*total/100 carries float noise (90% of 110 comes out as 99.00000000000001):
        # shrinking it by one part in 10**12 before rounding up keeps such ranks
        # exact.  Rank 0 (q=0) finds the first bucket, as rank 1 would.
        rank = np.ceil(q * (float(cum[-1]) * (1 - 1e-12) / 100)).astype(_U64)
        return _VALUE_F[self.idx[np.searchsorted(cum, rank)]]

    @staticmethod
    def percentiles_many(histograms: list[Histogram], qs: ArrayLike) -> NDArray[np.float64]:
        """``[h.percentiles(qs) for h in histograms]`` as one (n, len(qs)) array, in one set of numpy calls.

        A dump asks for the percentiles of thousands of small histograms; per
        call, numpy's overhead would dominate.
        """
        q = np.atleast_1d(np.asarray(qs, dtype=np.float64))
        if q.size and not 0 <= q.min() <= q.max() <= 100:
            raise ValueError("percentiles must be between 0 and 100")
        out = np.full((len(histograms), q.size), np.nan)
        sizes = np.array([h.idx.size for h in histograms], dtype=np.intp)
        rows = np.flatnonzero(sizes)
        if not rows.size or not q.size:
            return out
        idx = np.concatenate([histograms[r].idx for r in rows])
        cum = np.cumsum(np.concatenate([histograms[r].counts for r in rows]))
        end = np.cumsum(sizes[rows])                    # one past each histogram's last bucket
        start = end - sizes[rows]
        before = np.where(start > 0, cum[start - 1], 0)  # counts of the histograms before it
        total = cum[end - 1] - before
        # the same rank rule as percentiles(), offset into the shared cumulative sum
        rank = np.ceil(q[None, :] * (total.astype(np.float64)[:, None] * (1 - 1e-12) / 100)).astype(_U64)
        rank = np.maximum(rank, 1) + before[:, None]
        pos = np.searchsorted(cum, rank)
        out[rows] = _VALUE_F[idx[pos]]
        return out

    def min_value(self) -> int | None:
        """Lower bound (ns) of the lowest populated bucket; None if empty."""
        return int(_LOWER[self.idx[0]]) if self.idx.size else None

    def max_value(self) -> int | None:
        """Highest latency (ns, inclusive) of the highest populated bucket; None if empty.

        Like HdrHistogram's max, this is the bucket's highest equivalent value.
        """
        return int(_UPPER[self.idx[-1]]) - 1 if self.idx.size else None

    def mean(self) -> float:
        """Mean latency (ns) from the bucket values (as HdrHistogram's mean); NaN if empty."""
        if not self.idx.size:
            return math.nan
        weights = self.counts.astype(np.float64)
        return float(np.dot(_VALUE_F[self.idx], weights) / weights.sum())

    def log2_bars(self) -> list[tuple[int, int, int]]:
        """``(lo_ns, hi_ns, count)`` per power-of-two range [lo, hi), lowest to highest populated.

        Rows in between with no samples are included with count 0, as in
        biolatency's output.  Latency 0 has its own row (0, 1).  Every bucket
        lies inside one power-of-two range, so the rows are exact.
        """
        if not self.idx.size:
            return []
        row = _ROW[self.idx]  # row k holds [2**k, 2**(k+1)); row -1 is latency 0
        first = int(row[0])
        sums = np.zeros(int(row[-1]) - first + 1, _U64)
        np.add.at(sums, row - first, self.counts)
        return [((1 << k) if k >= 0 else 0, 1 << (k + 1), int(n))
                for k, n in zip(range(first, int(row[-1]) + 1), sums.tolist(), strict=True)]

    # ---- identity

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Histogram):
            return NotImplemented
        return np.array_equal(self.idx, other.idx) and np.array_equal(self.counts, other.counts)

    def __repr__(self) -> str:
        return f"Histogram(total={self.total}, buckets={self.idx.size})"
