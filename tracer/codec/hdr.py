"""The standard compressed V2 HdrHistogram encoding, written and read with numpy.

This is the base64 "HISTF..." string that HdrHistogram tools exchange:

* ``encode(h)`` / ``encode_many(hs)``: a ``tracer.model.histogram.Histogram``
  as that string (``encode_many`` builds the varints of many at once);
* ``decode(text)``: the Histogram of such a string, from iotrace or any
  HdrHistogram implementation.

Our bucket index *is* HdrHistogram's counts index for lowest trackable value 1,
highest ``HDR_HIGHEST`` ns and ``SIGFIGS`` significant figures, so our
histograms encode without re-binning.  Histograms encoded with other
parameters are re-binned on decoding, which is lossy to our resolution.
"""

from __future__ import annotations

import base64
import binascii
import struct
import zlib
from collections.abc import Iterable

import numpy as np
from numpy.typing import NDArray

from tracer.model.histogram import (
    BUCKETS,
    HDR_HIGHEST,
    HDR_LOWEST,
    SIGFIGS,
    SUB_BITS,
    Histogram,
    bucket_index,
    hdr_bucket_count,
    hdr_half_count_magnitude,
)

_I64 = np.int64
_U64 = np.uint64


def encode(h: Histogram) -> str:
    """The standard compressed V2 HdrHistogram encoding of ``h``, base64 ("HISTF...")."""
    return _encode_many([h])[0]


def encode_many(histograms: Iterable[Histogram]) -> list[str]:
    """``[encode(h) for h in histograms]``, about twice as fast for a dump's worth of them."""
    return _encode_many(list(histograms))


def decode(text: str | bytes) -> Histogram:
    """Decode a base64 compressed V2 HdrHistogram (as from ``encode`` or any HdrHistogram).

    A histogram with our parameters (lowest 1, ``SIGFIGS`` significant
    figures) decodes exactly.  Any other parameters are re-binned: each
    populated HdrHistogram bucket is counted at its middle value in our
    scheme, which is lossy to the coarser of the two resolutions; values
    above our top land in the top bucket.  Malformed input raises ValueError.
    """
    return _decode(text)


# ---- the wire format
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
    single = len(hs) == 1  # encode(): spare it the bookkeeping of several
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
    half_mag = hdr_half_count_magnitude(sigfigs)
    unit_mag = lowest.bit_length() - 1
    counts_len = (hdr_bucket_count(highest, half_mag, unit_mag) + 1) << half_mag
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
    middle = np.where(huge, HDR_HIGHEST, middle)
    return Histogram.from_pairs(bucket_index(middle), counts)  # above the top: the top bucket
