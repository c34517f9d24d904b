"""The standard compressed V2 HdrHistogram encoding, through the ``hdrhistogram`` package (``hdrh``).

This is the base64 "HISTF..." string that HdrHistogram tools exchange:

* ``encode(h)`` / ``encode_many(hs)``: a ``tracer.model.histogram.Histogram``
  as that string, written by ``hdrh.histogram.HdrHistogram.encode``;
* ``decode(text)``: the Histogram of such a string, from iotrace or any
  HdrHistogram implementation, read by ``HdrHistogram.decode``.

Our bucket index *is* HdrHistogram's counts index for lowest trackable value 1,
highest ``HDR_HIGHEST`` ns and ``SIGFIGS`` significant figures, so our
histograms are copied into an ``HdrHistogram``'s counts array as they are.
Histograms encoded with other parameters are re-binned on decoding, which is
lossy to our resolution.

``hdrh`` trusts its input (it inflates without a bound, reads parameters as
given); dumps are untrusted files, so the outer framing and the payload header
are checked here first, and every error comes out as one ValueError.
"""

from __future__ import annotations

import base64
import binascii
import struct
import zlib
from collections.abc import Iterable

import numpy as np
from hdrh.histogram import HdrHistogram
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


def encode(h: Histogram) -> str:
    """The standard compressed V2 HdrHistogram encoding of ``h``, base64 ("HISTF...")."""
    return _Encoder().encode(h)


def encode_many(histograms: Iterable[Histogram]) -> list[str]:
    """``[encode(h) for h in histograms]``, with one HdrHistogram reused for all of them."""
    enc = _Encoder()
    return [enc.encode(h) for h in histograms]


def decode(text: str | bytes) -> Histogram:
    """Decode a base64 compressed V2 HdrHistogram (as from ``encode`` or any HdrHistogram).

    A histogram with our parameters (lowest 1, ``SIGFIGS`` significant
    figures) decodes exactly.  Any other parameters are re-binned: each
    populated HdrHistogram bucket is counted at its middle value in our
    scheme, which is lossy to the coarser of the two resolutions; values
    above our top land in the top bucket.  Malformed input raises ValueError.
    """
    text, tokens = _checked(text)
    if tokens.size and tokens.max() >= _HDRH_COUNT_LIMIT:
        return _from_tokens(tokens)
    try:
        theirs = HdrHistogram.decode(text)
    except Exception as e:  # hdrh raises its own classes, zlib.error, ValueError, IndexError...
        raise ValueError(f"HdrHistogram payload rejected by hdrh: {type(e).__name__}: {e}") from None
    if theirs.counts_len > _MAX_COUNTS:
        raise ValueError(f"HdrHistogram parameters need {theirs.counts_len} counts")
    counts = np.ctypeslib.as_array(theirs.counts)
    index = np.flatnonzero(counts).astype(_I64)
    filled = counts[index].copy()  # off hdrh's buffer, which goes with ``theirs``
    if (theirs.unit_magnitude == 0 and theirs.sub_bucket_half_count_magnitude == SUB_BITS
            and (not index.size or index[-1] < BUCKETS)):
        return Histogram(index, filled)  # our own layout: the counts index is our bucket
    return _rebin(index, filled, theirs.sub_bucket_half_count_magnitude, theirs.unit_magnitude)


class _Encoder:
    """One HdrHistogram with our parameters whose counts array is written through a numpy view.

    Allocating the 4096 counters and setting up the encoder is most of hdrh's
    per-histogram cost; a dump encodes thousands, so they share one, and only
    the buckets just written are zeroed again.
    """

    def __init__(self) -> None:
        self._hdr = HdrHistogram(HDR_LOWEST, HDR_HIGHEST, SIGFIGS)
        self._counts = np.ctypeslib.as_array(self._hdr.counts)

    def encode(self, h: Histogram) -> str:
        if h.counts.size and h.counts.max() >= 1 << 63:
            raise ValueError("count too large for HdrHistogram's signed 64-bit counters")
        hdr = self._hdr
        self._counts[h.idx] = h.counts
        try:
            if h.idx.size:
                # encode() writes counts up to the index of max_value; min/total go with it
                hdr.set_internal_tacking_values(int(h.idx[0]), int(h.idx[-1]), h.total)
            else:
                hdr.min_value, hdr.max_value, hdr.total_count = 0, 0, 0
            return hdr.encode().decode("ascii")
        finally:
            self._counts[h.idx] = 0


# ---- checks of untrusted input before hdrh sees it
#
# Layout (all big-endian), as HdrHistogram's Java and C implementations write it:
#   base64( compressed cookie i32 | compressed length i32 | zlib( header | payload ) )
#   header = cookie i32, payload length i32, normalizing index offset i32,
#            significant figures i32, lowest trackable i64, highest trackable i64,
#            integer-to-double ratio f64
# The cookies' 0xf0 bits carry a word size / encoding flag; tools compare them masked off.

_ENCODING_COOKIE_BASE = 0x1C849303
_COMPRESSED_COOKIE_BASE = 0x1C849304
_OUTER = struct.Struct(">iI")
_HEADER = struct.Struct(">iiiiqqd")
_MAX_DECOMPRESSED = 64 << 20  # far beyond any real histogram; bounds a zlib bomb hdrh would inflate
_MAX_COUNTS = 1 << 23         # 64 MiB of counters: sigfigs 5 up to 2**63 needs ~6M


def _cookie_base(cookie: int) -> int:
    return cookie & ~0xF0


def _checked(text: str | bytes) -> tuple[bytes, NDArray[np.int64]]:
    """The base64 text, stripped, and its varint tokens, once they describe a histogram hdrh can hold."""
    try:
        stripped = text.strip()
        raw = base64.b64decode(stripped, validate=True)
    except (binascii.Error, ValueError, TypeError, AttributeError) as e:
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
    if not inflater.eof or inflater.unused_data:
        raise ValueError("HdrHistogram payload truncated or oversized (zlib stream incomplete)")
    if len(data) < _HEADER.size:
        raise ValueError("HdrHistogram payload truncated: shorter than its 40-byte header")
    cookie, plen, offset, sigfigs, lowest, highest, _ratio = _HEADER.unpack_from(data)
    if _cookie_base(cookie) != _ENCODING_COOKIE_BASE or (cookie & 0xF0) >> 4 not in (0, 1, 9):
        raise ValueError(f"not a V2 HdrHistogram payload: cookie {cookie & 0xFFFFFFFF:#010x}")
    if plen != len(data) - _HEADER.size:
        raise ValueError(f"HdrHistogram payload says {plen} bytes, has {len(data) - _HEADER.size}")
    if offset != 0:
        raise ValueError("HdrHistogram with a normalizing index offset (shifted histogram) unsupported")
    if not (1 <= sigfigs <= 5 and lowest >= 1 and highest >= 2 * lowest):
        raise ValueError(f"invalid HdrHistogram parameters: lowest {lowest}, highest {highest}, "
                         f"{sigfigs} significant figures")
    half_mag = hdr_half_count_magnitude(sigfigs)
    counts_len = (hdr_bucket_count(highest, half_mag, lowest.bit_length() - 1) + 1) << half_mag
    if counts_len > _MAX_COUNTS:
        raise ValueError(f"HdrHistogram parameters need {counts_len} counts")
    if half_mag != SUB_BITS or lowest != 1:
        counts_len = -counts_len  # only our own layout may take the token path of decode()
    tokens = _check_tokens(data[_HEADER.size:], abs(counts_len))
    if counts_len < 0:
        tokens = tokens[:0]
    return (stripped if isinstance(stripped, bytes) else stripped.encode("ascii")), tokens


def _check_tokens(payload: bytes, counts_len: int) -> NDArray[np.int64]:
    """Refuse a varint stream that is truncated or runs past the counts array.

    hdrh's decoder stops quietly at either, which would turn a damaged dump
    into a silently smaller histogram.
    """
    b = np.frombuffer(payload, np.uint8)
    if not b.size:
        return np.empty(0, _I64)
    ends = np.flatnonzero(b < 0x80)
    starts = np.concatenate(([0], ends[:-1] + 1))
    if not ends.size or ends[-1] != b.size - 1 or (ends - starts >= 9).any():
        # a 9th byte with its top bit set (counts >= 2**55) ends a token too: walk such streams exactly
        tokens = _tokens_slow(payload)
    else:
        pos = np.arange(b.size) - np.repeat(starts, ends - starts + 1)
        z = np.bitwise_or.reduceat((b & 0x7F).astype(np.uint64) << (7 * pos).astype(np.uint64), starts)
        tokens = (z >> np.uint64(1)).view(_I64) ^ -(z & np.uint64(1)).view(_I64)
    steps = np.where(tokens < 0, -tokens, 1)  # counts index advance per token
    # bound each step first (-(-2**63) stays negative), so that the sum cannot overflow
    if not 0 < steps.min() <= steps.max() <= counts_len or int(steps.sum()) > counts_len:
        raise ValueError(f"HdrHistogram payload holds more than its {counts_len} counts")
    return tokens


# hdrh 0.10.8 decodes counts of 2**62 and more wrongly (2**63-1 comes back as 2**62-1),
# though it encodes them right; such counts of our own layout are read from the checked tokens.
_HDRH_COUNT_LIMIT = 1 << 62


def _from_tokens(tokens: NDArray[np.int64]) -> Histogram:
    steps = np.where(tokens < 0, -tokens, 1)
    at = np.cumsum(steps) - steps
    filled = tokens > 0
    if at[filled].size and at[filled][-1] >= BUCKETS:
        raise ValueError(f"HdrHistogram payload counts past our {BUCKETS} buckets")
    return Histogram(at[filled], tokens[filled].view(np.uint64))


def _tokens_slow(data: bytes) -> NDArray[np.int64]:
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


def to_hdrh(h: Histogram) -> HdrHistogram:
    """A new ``hdrh`` HdrHistogram holding ``h``'s counts (our parameters), for hdrh's log writer."""
    theirs = HdrHistogram(HDR_LOWEST, HDR_HIGHEST, SIGFIGS)
    np.ctypeslib.as_array(theirs.counts)[h.idx] = h.counts
    if h.idx.size:
        theirs.set_internal_tacking_values(int(h.idx[0]), int(h.idx[-1]), h.total)
    return theirs
