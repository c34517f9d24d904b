"""Latency histograms on the user side: bucket arithmetic, aggregation, HdrHistogram codec.

This module owns everything iotrace does with a latency distribution once the
kernel has bucketed it:

* the bucket scheme of bpf/iotrace.h, vectorised (``bucket_index``,
  ``bucket_lower``, ``bucket_upper``, ``bucket_value``), with every constant
  taken from ``tracer.contract``;
* ``Histogram``, a sparse, immutable set of (bucket, count) pairs with exact
  merging, nearest-rank percentiles, mean, min/max and biolatency-style bars;
* the standard compressed V2 HdrHistogram encoding (the base64 "HISTF..."
  string that HdrHistogram tools exchange), written and read with numpy.

The kernel's bucket index *is* HdrHistogram's counts index for lowest
trackable value 1, highest ``2**(max_msb+1) - 1`` ns and ``IOTRACE_HDR_SIGFIGS``
significant figures, so our buckets encode without re-binning.  Histograms
encoded with other parameters are re-binned on decoding, which is lossy to
our resolution.

Pure numpy: importable without root or bcc.  Latencies are integer
nanoseconds throughout.
"""

from __future__ import annotations

import base64
import binascii
import math
import struct
import zlib
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


def _hdr_half_count_magnitude(sigfigs: int) -> int:
    """log2 of HdrHistogram's sub-bucket half count for a number of significant figures."""
    # ceil(log2(2 * 10**sigfigs)), computed on integers so no float rounding can bite
    return max((2 * 10**sigfigs - 1).bit_length() - 1, 0)


def _hdr_bucket_count(highest: int, half_magnitude: int, unit_magnitude: int) -> int:
    """HdrHistogram's number of power-of-two buckets needed to reach ``highest``."""
    smallest_untrackable = 1 << (half_magnitude + 1 + unit_magnitude)
    count = 1
    while smallest_untrackable <= highest:
        smallest_untrackable <<= 1
        count += 1
    return count


# The whole point of the scheme is that the kernel's buckets are a standard
# HdrHistogram; refuse to run on a header that silently broke that.
if (_hdr_half_count_magnitude(SIGFIGS) != SUB_BITS
        or (_hdr_bucket_count(HDR_HIGHEST, SUB_BITS, 0) + 1) << SUB_BITS != BUCKETS):
    raise ImportError(
        f"bpf/iotrace.h: HIST_SUB_BITS={SUB_BITS}, HIST_MAX_MSB={MAX_MSB}, HIST_BUCKETS={BUCKETS} "
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
    ``from_pairs``, ``from_values``, ``from_hdr`` or ``merge``.
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

    # ---- HdrHistogram codec

    def to_hdr(self) -> str:
        """The standard compressed V2 HdrHistogram encoding, base64 ("HISTF...")."""
        return _encode_many([self])[0]

    @staticmethod
    def to_hdr_many(histograms: Iterable[Histogram]) -> list[str]:
        """``[h.to_hdr() for h in histograms]``, about twice as fast for a dump's worth of them."""
        return _encode_many(list(histograms))

    @classmethod
    def from_hdr(cls, text: str | bytes) -> Histogram:
        """Decode a base64 compressed V2 HdrHistogram (as from ``to_hdr`` or any HdrHistogram).

        A histogram with our parameters (lowest 1, ``SIGFIGS`` significant
        figures) decodes exactly.  Any other parameters are re-binned: each
        populated HdrHistogram bucket is counted at its middle value in our
        scheme, which is lossy to the coarser of the two resolutions; values
        above our top land in the top bucket.  Malformed input raises ValueError.
        """
        return _decode(text)


# --------------------------------------------------------------------------- HdrHistogram V2 codec
#
# Layout (all big-endian), as HdrHistogram's Java and C implementations write it:
#   base64( compressed cookie i32 | compressed length i32 | zlib( header | payload ) )
#   header = cookie i32, payload length i32, normalizing index offset i32,
#            significant figures i32, lowest trackable i64, highest trackable i64,
#            integer-to-double ratio f64
#   payload = counts[0 .. last non-zero] as ZigZag LEB128 varints of at most
#             9 bytes (the 9th carries 8 bits), a run of N zero counts as -N.
# The cookies' 0x10 bit flags that zero-run encoding; tools write base|0x10 and
# compare cookies with the 0xf0 bits masked off.

_ENCODING_COOKIE_BASE = 0x1C849303
_COMPRESSED_COOKIE_BASE = 0x1C849304
_ENCODING_COOKIE = _ENCODING_COOKIE_BASE | 0x10
_COMPRESSED_COOKIE = _COMPRESSED_COOKIE_BASE | 0x10
_OUTER = struct.Struct(">iI")
_HEADER = struct.Struct(">iiiiqqd")
_MAX_DECOMPRESSED = 64 << 20  # far beyond any real histogram; bounds a zlib bomb

# Tables for the varint byte matrix of _encode_many; row n is for a token of n+1 bytes.
_VARINT_STEPS = np.array([1 << (7 * k) for k in range(1, 9)], dtype=_U64)  # n+1 bytes from 2**(7n)
_BYTE_SHIFTS = np.array([7 * k for k in range(9)], dtype=_U64)
_KEEP = np.arange(9) <= np.arange(9)[:, None]
_MORE = np.where(np.arange(9) < np.arange(9)[:, None], 0x80, 0).astype(np.uint8)
_NO_ZEROS = _U64(2**64 - 1)


def _cookie_base(cookie: int) -> int:
    return cookie & ~0xF0


def _encode_many(hs: list[Histogram]) -> list[str]:
    """Encode histograms, with the varint stream of all of them built in one set of numpy calls.

    Only the zlib and base64 wrapping is done per histogram: numpy's per-call
    overhead, not the data, dominates for histograms of a few hundred buckets.
    """
    if not hs:
        return []
    single = len(hs) == 1  # to_hdr: spare it the bookkeeping of several
    if single:
        idx, counts = hs[0].idx, hs[0].counts
        first = np.zeros(min(idx.size, 1), np.intp)
    else:
        idx = np.concatenate([h.idx for h in hs])
        counts = np.concatenate([h.counts for h in hs])
        row_end = np.cumsum([h.idx.size for h in hs])  # end of histogram k's buckets in idx
        first = np.concatenate(([0], row_end[:-1]))
        first = first[first < idx.size]  # empty histograms have no first bucket
    if counts.size and counts.max() >= 1 << 63:
        raise ValueError("count too large for HdrHistogram's signed 64-bit counters")

    # ZigZagged token pairs (-zeros before the bucket, count), built directly:
    # zigzag(-k) = 2k-1 and zigzag(c) = 2c.  Where no zeros precede a bucket
    # the first token comes out as 2**64-1, which no real token can be.
    pairs = np.empty((idx.size, 2), _U64)
    runs = pairs[:, 0]  # the zero run before each bucket, plus one, then zigzagged
    np.subtract(idx[1:], idx[:-1], out=runs[1:], casting="unsafe")
    runs[first] = idx[first] + 1
    runs <<= _U64(1)
    runs -= _U64(3)
    np.left_shift(counts, _U64(1), out=pairs[:, 1])
    present = pairs != _NO_ZEROS
    z = pairs[present]

    # LEB128-64b9B: 7 bits a byte, low first, 0x80 = more follow.  Row t of
    # a (tokens x 9) matrix holds the 9 bytes token t would need at most, and
    # a per-length mask keeps its first n.  The uint8 cast keeps each shift's
    # low byte; its top bit needs no masking: on a continuation byte the flag
    # overwrites it, on a last byte of at most 8 it is bit 7n of a value below
    # 2**(7n), and a 9th byte keeps all 8 bits.
    n = np.searchsorted(_VARINT_STEPS, z, side="right")  # bytes needed - 1
    rows = (z[:, None] >> _BYTE_SHIFTS).astype(np.uint8)
    rows |= _MORE[n]
    stream = rows[_KEEP[n]].tobytes()
    if single:
        return [_wrap_payload(stream)]

    # byte offset of every histogram's payload in the stream
    token_end = np.concatenate(([0], np.cumsum(present.sum(axis=1))))[np.concatenate(([0], row_end))]
    byte_end = np.concatenate(([0], np.cumsum(n + 1)))[token_end].tolist()
    return [_wrap_payload(stream[a:b]) for a, b in zip(byte_end[:-1], byte_end[1:], strict=True)]


def _wrap_payload(payload: bytes) -> str:
    header = _HEADER.pack(_ENCODING_COOKIE, len(payload), 0, SIGFIGS, HDR_LOWEST, HDR_HIGHEST, 1.0)
    # A standard zlib stream; the smallest memLevel makes setting up the compressor, which is
    # most of the work for a few hundred bytes, ~3x cheaper, at no cost in size for inputs this small.
    z = zlib.compressobj(6, zlib.DEFLATED, 15, 1)
    compressed = z.compress(header + payload) + z.flush()
    return base64.b64encode(_OUTER.pack(_COMPRESSED_COOKIE, len(compressed)) + compressed).decode("ascii")


def _unvarints(data: bytes) -> NDArray[np.int64]:
    """Decode a stream of ZigZag LEB128-64b9B varints."""
    b = np.frombuffer(data, np.uint8)
    if not b.size:
        return np.empty(0, _I64)
    ends = np.flatnonzero(b < 0x80)
    starts = np.concatenate(([0], ends[:-1] + 1))
    if not ends.size or ends[-1] != b.size - 1 or (ends - starts >= 9).any():
        # a 9th varint byte with its top bit set (counts >= 2**55) looks like a
        # longer LEB128 run; so does a truncated payload: let the exact loop sort them out
        return _unvarints_slow(data)
    pos = np.arange(b.size) - np.repeat(starts, ends - starts + 1)
    z = np.bitwise_or.reduceat((b & 0x7F).astype(_U64) << (7 * pos).astype(_U64), starts)
    return (z >> _U64(1)).view(_I64) ^ -(z & _U64(1)).view(_I64)


def _unvarints_slow(data: bytes) -> NDArray[np.int64]:
    out = []
    i, n = 0, len(data)
    while i < n:
        z = 0
        for k in range(9):
            if i >= n:
                raise ValueError("HdrHistogram payload truncated inside a varint")
            byte = data[i]
            i += 1
            if k == 8:
                z |= byte << 56
                break
            z |= (byte & 0x7F) << (7 * k)
            if byte < 0x80:
                break
        out.append((z >> 1) ^ -(z & 1))
    return np.array(out, dtype=_I64)


def _decode(text: str | bytes) -> Histogram:
    try:
        raw = base64.b64decode(text.strip(), validate=True)
    except (binascii.Error, ValueError, TypeError) as e:
        raise ValueError(f"HdrHistogram text is not base64: {e}") from None
    if len(raw) < _OUTER.size:
        raise ValueError("HdrHistogram encoding truncated: shorter than its 8-byte header")
    cookie, length = _OUTER.unpack_from(raw)
    if _cookie_base(cookie) != _COMPRESSED_COOKIE_BASE:
        raise ValueError(f"not a compressed V2 HdrHistogram: cookie {cookie & 0xFFFFFFFF:#010x}")
    if length != len(raw) - _OUTER.size:
        raise ValueError(f"HdrHistogram encoding says {length} compressed bytes, "
                         f"has {len(raw) - _OUTER.size}")
    inflater = zlib.decompressobj()
    try:
        data = inflater.decompress(raw[_OUTER.size:], _MAX_DECOMPRESSED)
    except zlib.error as e:
        raise ValueError(f"HdrHistogram payload is not valid zlib data: {e}") from None
    if not inflater.eof:
        raise ValueError("HdrHistogram payload truncated or oversized (zlib stream incomplete)")
    if len(data) < _HEADER.size:
        raise ValueError("HdrHistogram payload truncated: shorter than its 40-byte header")
    cookie, plen, offset, sigfigs, lowest, highest, _ratio = _HEADER.unpack_from(data)
    # _ratio only scales values for display (DoubleHistogram); integer counts do not need it
    if _cookie_base(cookie) != _ENCODING_COOKIE_BASE:
        raise ValueError(f"not a V2 HdrHistogram payload: cookie {cookie & 0xFFFFFFFF:#010x}")
    if plen != len(data) - _HEADER.size:
        raise ValueError(f"HdrHistogram payload says {plen} bytes, has {len(data) - _HEADER.size}")
    if offset != 0:
        raise ValueError("HdrHistogram with a normalizing index offset (shifted histogram) unsupported")
    if not (0 <= sigfigs <= 5 and lowest >= 1 and highest >= 2 * lowest):
        raise ValueError(f"invalid HdrHistogram parameters: lowest {lowest}, highest {highest}, "
                         f"{sigfigs} significant figures")

    tokens = _unvarints(data[_HEADER.size:])
    half_mag = _hdr_half_count_magnitude(sigfigs)
    unit_mag = lowest.bit_length() - 1
    counts_len = (_hdr_bucket_count(highest, half_mag, unit_mag) + 1) << half_mag
    steps = np.where(tokens < 0, -tokens, 1)  # counts index advance per token
    # bound each step first (-(-2**63) stays negative), so that the sum cannot overflow
    if steps.size and not 0 < steps.min() <= steps.max() <= counts_len:
        raise ValueError(f"HdrHistogram payload holds more than its {counts_len} counts")
    end = np.cumsum(steps)
    if end.size and end[-1] > counts_len:
        raise ValueError(f"HdrHistogram payload holds more than its {counts_len} counts")
    at = end - steps
    filled = tokens > 0
    index, counts = at[filled], tokens[filled].view(_U64)
    if unit_mag == 0 and half_mag == SUB_BITS and (not index.size or index[-1] < BUCKETS):
        # our own layout: the counts index is our bucket, already sorted and unique
        return Histogram(index, counts)
    return _rebin(index, counts, half_mag, unit_mag)


def _rebin(index: NDArray[np.int64], counts: NDArray[np.uint64], half_mag: int, unit_mag: int) -> Histogram:
    """Count each HdrHistogram counts index (any parameters) at its middle value in our buckets.

    For our own parameters this is the identity: a bucket's middle lies in it.
    """
    bucket = np.maximum((index >> half_mag) - 1, 0)
    sub = np.where(index >> half_mag == 0, index, (index & ((1 << half_mag) - 1)) + (1 << half_mag))
    shift = bucket + unit_mag
    # sub < 2**(half_mag+1): values that might overflow int64 are far above our top anyway
    huge = shift + half_mag + 1 > 62
    shift = np.where(huge, 0, shift)
    middle = (sub << shift) + ((np.left_shift(1, shift, dtype=_I64)) >> 1)
    middle = np.where(huge, _TOP, middle)
    return Histogram.from_pairs(_index(np.minimum(middle, _TOP)), counts)
