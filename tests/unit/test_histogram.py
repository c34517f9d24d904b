"""Tests of tracer/model/histogram.py (bucket scheme, aggregation) and tracer/codec/hdr.py (HdrHistogram codec).

The `hdrh` package (a port of HdrHistogram) is the independent reference for
the bucket index and the wire format.  No root, no bcc.
"""

from __future__ import annotations

import base64
import itertools
import struct
import zlib
from fractions import Fraction
from functools import reduce

import numpy as np
import pytest
from hdrh.histogram import HdrHistogram
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from tracer import contract
from tracer.codec import hdr as hdrcodec
from tracer.model.histogram import (
    BUCKETS,
    Histogram,
    bucket_index,
    bucket_lower,
    bucket_upper,
    bucket_value,
)

C = contract.load()
TOP_VALUE = 2 ** (C.max_msb + 1) - 1
US, S = 1_000, 1_000_000_000
QS = (50, 90, 99, 99.9)


def hdr(lowest: int = 1, highest: int = TOP_VALUE, sigfigs: int = C.const("HDR_SIGFIGS")) -> HdrHistogram:
    return HdrHistogram(lowest, highest, sigfigs)


def hdr_counts(h: HdrHistogram) -> np.ndarray:
    return np.array(list(h.counts), dtype=np.uint64)


def nearest_rank(n: int, q: float) -> int:
    """1-based nearest rank, computed exactly (no float noise)."""
    return max(1, -((-Fraction(str(q)) * n) // 100))


def exact_percentile(sample: np.ndarray, q: float) -> int:
    return int(np.sort(sample)[nearest_rank(sample.size, q) - 1])


def our_bucket_at_rank(h: Histogram, rank: int) -> int:
    return int(h.idx[np.searchsorted(np.cumsum(h.counts), rank)])


# timing varies on loaded CI machines, and no test here is about speed
no_deadline = settings(deadline=None)

values_ns = st.integers(0, TOP_VALUE)
value_lists = st.lists(values_ns, min_size=1, max_size=300)
# a few large but realistic latencies, to keep the hdrh reference (pure Python) fast
small_lists = st.lists(st.integers(0, 10 * S), min_size=0, max_size=200)


@st.composite
def latency_samples(draw) -> np.ndarray:
    """Latencies between 1 us and 100 s in several shapes."""
    lo, hi = US, 100 * S
    shape = draw(st.sampled_from(["drawn", "log_uniform", "clusters", "single", "heavy_tail"]))
    if shape == "drawn":
        return np.array(draw(st.lists(st.integers(lo, hi), min_size=1, max_size=300)), dtype=np.int64)
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    n = draw(st.integers(1, 20_000))
    if shape == "log_uniform":
        x = np.exp(rng.uniform(np.log(lo), np.log(hi), n))
    elif shape == "clusters":
        centers = np.exp(rng.uniform(np.log(lo), np.log(hi), draw(st.integers(1, 5))))
        x = rng.choice(centers, n) * (1 + rng.normal(0, 0.01, n))
    elif shape == "single":
        x = np.full(n, draw(st.integers(lo, hi)))
    else:
        x = 50 * US * (1 + rng.pareto(draw(st.floats(0.3, 3.0)), n))
    return np.clip(x, lo, hi).astype(np.int64)


# --------------------------------------------------------------------------- bucket scheme

def test_constants_come_from_the_contract():
    assert BUCKETS == C.buckets == (C.max_msb - C.sub_bits + 2) << C.sub_bits
    assert bucket_index(TOP_VALUE) == BUCKETS - 1
    assert bucket_upper(BUCKETS - 1) == 2 ** (C.max_msb + 1)
    assert hdr().counts_len == BUCKETS


@no_deadline
@given(value_lists)
@example([0, 1, 2**C.sub_bits - 1, 2**C.sub_bits, 2 ** (C.sub_bits + 1) - 1, 2 ** (C.sub_bits + 1),
          TOP_VALUE])
@example([2**k + d for k in range(C.max_msb + 1) for d in (-1, 0, 1) if 0 <= 2**k + d <= TOP_VALUE])
def test_index_is_hdrhistogram_counts_index(values):
    ref = hdr()
    assert bucket_index(np.array(values)).tolist() == [ref._counts_index_for(v) for v in values]
    assert bucket_index(values[0]) == ref._counts_index_for(values[0])


def test_every_bucket_has_hdrhistogram_bounds():
    ref = hdr()
    i = np.arange(BUCKETS)
    lower, upper, value = bucket_lower(i), bucket_upper(i), bucket_value(i)
    assert lower.tolist() == [ref.get_value_from_index(k) for k in range(BUCKETS)]
    assert (upper - 1).tolist() == [ref.get_highest_equivalent_value(int(v)) for v in lower]
    assert value.tolist() == [ref._hdr_median_equiv_value(int(v)) for v in lower]
    # contiguous, increasing, each bound and the representative value map back to the bucket
    assert lower[0] == 0 and (lower[1:] == upper[:-1]).all() and (upper > lower).all()
    for probe in (lower, upper - 1, value):
        assert (bucket_index(probe) == i).all()


@no_deadline
@given(values_ns)
def test_value_lies_in_its_bucket(v):
    i = bucket_index(v)
    assert 0 <= i < BUCKETS
    assert bucket_lower(i) <= v < bucket_upper(i)
    assert isinstance(i, int) and isinstance(bucket_lower(i), int)
    # the representative is within half a bucket width, i.e. 1/256 of the value
    assert abs(bucket_value(i) - v) <= max(1, v) / 2 ** (C.sub_bits + 1)


@no_deadline
@given(st.lists(values_ns, min_size=2, max_size=300))
def test_index_is_monotonic(values):
    assert (np.diff(bucket_index(np.sort(np.array(values)))) >= 0).all()


@pytest.mark.parametrize("v", [TOP_VALUE, TOP_VALUE + 1, 2**63 - 1, 2**64 - 1, 2**70, float("inf")])
def test_top_bucket_takes_everything_above(v):
    assert bucket_index(v) == BUCKETS - 1


def test_dtypes_and_bad_values():
    assert bucket_index(np.array([5, 300], dtype=np.uint64)).tolist() == bucket_index([5, 300]).tolist()
    assert bucket_index(np.array([5, 100], dtype=np.int8)).tolist() == [5, 100]
    assert bucket_index(999.9) == bucket_index(999)
    for bad in (-1, [3, -2], float("nan"), ["x"]):
        with pytest.raises(ValueError):
            bucket_index(bad)
    for bad in (-1, BUCKETS, [0, BUCKETS + 5], [1.5]):
        with pytest.raises(ValueError):
            bucket_lower(bad)


# --------------------------------------------------------------------------- percentiles and stats

@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(latency_samples())
def test_percentiles_within_two_percent(sample):
    h = Histogram.from_values(sample)
    assert h.total == sample.size
    got = h.percentiles(QS)
    for q, p in zip(QS, got, strict=True):
        exact = exact_percentile(sample, q)
        assert abs(p - exact) <= 0.02 * exact, (q, p, exact)
        # stronger: the right rank was found, so the exact value is in the reported bucket
        assert bucket_index(int(p)) == bucket_index(exact), (q, p, exact)


def test_percentile_rank_rule():
    h = Histogram.from_values(np.arange(1, 1001))  # unit-width buckets up to 255
    assert h.percentiles([0, 0.1, 10, 25.5])[[0, 1, 2]].tolist() == [1, 1, 100]
    assert h.percentiles(25.5) == bucket_value(bucket_index(255))
    # ranks that are whole numbers stay whole despite float noise (90% of 110 -> 99.00000000000001)
    assert Histogram.from_values(np.arange(1, 111)).percentiles([90, 50]).tolist() == [99, 55]
    assert Histogram.from_values(np.arange(1, 15)).percentiles(50) == 7
    assert h.percentiles([99.9])[0] == bucket_value(bucket_index(999))
    assert h.percentiles([100])[0] == bucket_value(bucket_index(1000))
    assert h.percentiles([[50, 90]]).shape == (1, 2)
    for bad in (-1, 100.5, float("nan")):
        with pytest.raises(ValueError):
            h.percentiles([bad])


def test_empty_histogram():
    e = Histogram.empty()
    assert e.total == 0 and e == Histogram.from_values([]) == Histogram.from_pairs([], [])
    assert np.isnan(e.percentiles(QS)).all() and np.isnan(e.mean())
    assert e.min_value() is None and e.max_value() is None and e.log2_bars() == []
    assert hdrcodec.decode(hdrcodec.encode(e)) == e
    assert hdrcodec.encode(e) == hdr().encode().decode()  # byte-identical to HdrHistogram's own


@no_deadline
@given(st.lists(values_ns, min_size=1, max_size=300))
def test_min_max_mean(values):
    h = Histogram.from_values(values)
    lo, hi = min(values), max(values)
    assert h.min_value() == bucket_lower(bucket_index(lo)) <= lo
    assert h.max_value() == bucket_upper(bucket_index(hi)) - 1 >= hi
    expect = np.mean([bucket_value(bucket_index(v)) for v in values])
    assert h.mean() == pytest.approx(expect, rel=1e-12)
    assert h.mean() == pytest.approx(np.mean(values), rel=2 ** -(C.sub_bits + 1), abs=1)


def test_from_pairs_sums_duplicates_and_drops_zeros():
    h = Histogram.from_pairs([7, 3, 7, 4000, 9], np.array([1, 2, 5, 0, 0], dtype=np.uint64))
    assert h.idx.tolist() == [3, 7] and h.counts.tolist() == [2, 6]
    assert h.idx.dtype == np.int64 and h.counts.dtype == np.uint64
    with pytest.raises(ValueError):
        h.idx[0] = 1  # shared arrays are read-only
    for idx, counts in (([BUCKETS], [1]), ([-1], [1]), ([1, 2], [1]), ([1], [-1]), ([1], [0.5])):
        with pytest.raises(ValueError):
            Histogram.from_pairs(idx, counts)


# --------------------------------------------------------------------------- merging

@no_deadline
@given(value_lists, value_lists)
def test_merge_is_exact_and_commutative(a, b):
    ha, hb = Histogram.from_values(a), Histogram.from_values(b)
    both = Histogram.from_values(a + b)
    assert ha.merge(hb) == both == hb.merge(ha)
    assert ha.merge(hb).total == len(a) + len(b)
    assert ha.merge(Histogram.empty()) == ha


@no_deadline
@given(st.lists(st.lists(st.integers(0, 2**40), max_size=50), max_size=40),
       st.lists(st.integers(1, 2**40), min_size=1, max_size=40))
def test_merge_all_equals_sequential_merge(groups, weights):
    hs = [Histogram.from_pairs(bucket_index(np.array(g, dtype=np.int64)), np.full(len(g), w, np.uint64))
          for g, w in zip(groups, weights * len(groups), strict=False)]
    assert Histogram.merge_all(hs) == reduce(Histogram.merge, hs, Histogram.empty())
    assert Histogram.merge_all(iter(hs)).total == sum(h.total for h in hs)


def test_merge_keeps_big_counts_exact():
    big = 2**60 + 1  # a float64 accumulation would round this
    h = Histogram.merge_all([Histogram.from_pairs([5], [big])] * 3)
    assert h.counts.tolist() == [3 * big]


# --------------------------------------------------------------------------- bars

@no_deadline
@given(st.lists(values_ns, min_size=1, max_size=300))
@example([1000, 10**6])
@example([0, 0, 1, 3])
def test_log2_bars(values):
    h = Histogram.from_values(values)
    bars = h.log2_bars()
    assert sum(n for _, _, n in bars) == h.total
    for lo, hi, _ in bars:
        assert (lo, hi) == (0, 1) or (lo & (lo - 1) == 0 and hi == 2 * lo)
    assert all(a[1] == b[0] for a, b in itertools.pairwise(bars))
    assert bars[0][0] <= min(values) < bars[0][1]
    assert bars[-1][0] <= min(max(values), TOP_VALUE) < bars[-1][1]
    assert bars[0][2] > 0 and bars[-1][2] > 0
    for lo, hi, n in bars:
        assert n == sum(1 for v in values if lo <= min(v, TOP_VALUE) < hi)


def test_log2_bars_keep_empty_rows():
    bars = Histogram.from_values([1000, 10**6]).log2_bars()
    assert [(lo, n) for lo, _, n in bars] == [(512, 1)] + [(2**k, 0) for k in range(10, 19)] + [(2**19, 1)]


# --------------------------------------------------------------------------- HdrHistogram codec

@no_deadline
@given(st.dictionaries(st.integers(0, BUCKETS - 1), st.integers(0, 2**63 - 1), max_size=200))
# 2**63-1 needs the 9th varint byte with all 8 bits; 2**56 needs it without the top bit
@example({0: 1, 1: 1, 3: 1, BUCKETS - 1: 2**63 - 1, 100: 2**56, 101: 2**56 - 1})
def test_hdr_round_trip_is_exact(pairs):
    h = Histogram.from_pairs(list(pairs), np.array(list(pairs.values()), dtype=np.uint64))
    text = hdrcodec.encode(h)
    assert text.startswith("HISTF")
    assert hdrcodec.decode(text) == h
    assert hdrcodec.decode(text.encode() + b"\n") == h


@no_deadline
@given(st.lists(st.dictionaries(st.integers(0, BUCKETS - 1), st.integers(1, 2**62), max_size=30),
                max_size=20))
def test_to_hdr_many_equals_one_by_one(dicts):
    hs = [Histogram.from_pairs(list(d), np.array(list(d.values()), dtype=np.uint64)) for d in dicts]
    hs = [Histogram.empty(), *hs, Histogram.empty()]  # empty ones at the edges and, often, inside
    texts = hdrcodec.encode_many(iter(hs))
    assert texts == [hdrcodec.encode(h) for h in hs]
    assert [hdrcodec.decode(t) for t in texts] == hs
    assert hdrcodec.encode_many([]) == []


@settings(max_examples=50, deadline=None)
@given(small_lists)
def test_hdrh_decodes_our_encoding(values):
    ours = Histogram.from_values(values)
    theirs = HdrHistogram.decode(hdrcodec.encode(ours))
    counts = hdr_counts(theirs)
    assert np.flatnonzero(counts).tolist() == ours.idx.tolist()
    assert counts[ours.idx].tolist() == ours.counts.tolist()
    assert theirs.get_total_count() == ours.total == len(values)
    if not values:
        return
    assert theirs.get_mean_value() == pytest.approx(ours.mean(), rel=1e-12)
    assert theirs.get_max_value() == ours.max_value() and theirs.get_min_value() == ours.min_value()
    for q in QS:
        # hdrh rounds the rank and reports the bucket's top: check it names the bucket we hold that rank in
        i = our_bucket_at_rank(ours, theirs.get_target_count_at_percentile(q))
        assert bucket_lower(i) <= theirs.get_value_at_percentile(q) < bucket_upper(i)


@settings(max_examples=50, deadline=None)
@given(small_lists, st.integers(1, 1000))
def test_we_decode_hdrh_exactly(values, weight):
    theirs = hdr()
    for v in values:
        theirs.record_value(v, weight)
    encoded = theirs.encode()
    ours = hdrcodec.decode(encoded)
    expect = hdr_counts(theirs)
    assert ours.idx.tolist() == np.flatnonzero(expect).tolist()
    assert ours.counts.tolist() == expect[ours.idx].tolist()
    assert ours == Histogram.from_pairs(bucket_index(np.array(values, dtype=np.int64)),
                                        np.full(len(values), weight, np.uint64))
    # and we write the very same payload (zlib output may differ between versions, the content may not)
    assert _inflate(hdrcodec.encode(ours)) == _inflate(encoded)


FOREIGN = [(1000, 10**11, 2), (1, 2**40, 3), (1, 10**12, 1), (1, 2**45, 2), (2**16, 2**50, 4)]


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.sampled_from(FOREIGN), latency_samples())
def test_foreign_parameters_are_rebinned(params, sample):
    sample = sample[:2000]  # the pure-Python reference records one value at a time
    theirs = hdr(*params)
    for v in sample.tolist():
        theirs.record_value(v)
    ours = hdrcodec.decode(theirs.encode())
    assert ours.total == theirs.get_total_count() == sample.size
    counts = hdr_counts(theirs)
    cum = np.cumsum(counts)
    got = ours.percentiles(QS)
    for q, p in zip(QS, got, strict=True):
        # the foreign histogram's own view: the middle of its bucket holding that rank
        i = int(np.searchsorted(cum, nearest_rank(sample.size, q)))
        ref = theirs._hdr_median_equiv_value(theirs.get_value_from_index(i))
        assert abs(p - ref) <= 0.02 * ref, (params, q, p, ref)
    if params[0] == 1 and params[2] >= C.const("HDR_SIGFIGS"):
        # finer HdrHistogram buckets nest inside ours: re-binning loses nothing
        assert ours == Histogram.from_values(sample)


def test_foreign_values_above_our_top_are_clamped():
    theirs = hdr(1, 2**50, 2)
    for v in (5, 2**45, 2**49):
        theirs.record_value(v)
    ours = hdrcodec.decode(theirs.encode())
    assert ours.idx.tolist() == [5, BUCKETS - 1] and ours.counts.tolist() == [1, 2]


# --------------------------------------------------------------------------- bad input

def _inflate(text: str | bytes) -> bytes:
    return zlib.decompress(base64.b64decode(text)[8:])


def _wrap(inner: bytes, outer_cookie: int = 0x1C849314, length: int | None = None) -> str:
    z = zlib.compress(inner)
    outer = struct.pack(">iI", outer_cookie, len(z) if length is None else length)
    return base64.b64encode(outer + z).decode()


def _inner(payload: bytes, cookie: int = 0x1C849313, plen: int | None = None, offset: int = 0,
           sigfigs: int = 2, lowest: int = 1, highest: int = TOP_VALUE) -> bytes:
    n = len(payload) if plen is None else plen
    return struct.pack(">iiiiqqd", cookie, n, offset, sigfigs, lowest, highest, 1.0) + payload


def test_crafted_payload_decodes():
    # the helpers build valid encodings; also accept a single zero written as 0 (as Java does)
    java_style = _wrap(_inner(bytes([0x02, 0x00, 0x04])))
    assert hdrcodec.decode(java_style) == Histogram.from_pairs([0, 2], [1, 2])
    assert hdrcodec.decode(_wrap(_inner(bytes([0x03, 0x04])))) == Histogram.from_pairs([2], [2])


GOOD = hdrcodec.encode(Histogram.from_values([1, 5, 10**6, 10**9]))


@pytest.mark.parametrize("text", [
    "",
    "not base64 at all!",
    "HISTF",                                     # bad padding
    GOOD[:-8],                                   # truncated base64
    base64.b64encode(base64.b64decode(GOOD)[:-5]).decode(),            # truncated compressed bytes
    base64.b64encode(base64.b64decode(GOOD)[:6]).decode(),             # truncated outer header
    base64.b64encode(base64.b64decode(GOOD) + b"xx").decode(),         # trailing bytes
    _wrap(_inner(b"\x02"), outer_cookie=0x1C849302),                   # V1 outer cookie
    _wrap(_inner(b"\x02"), outer_cookie=0x12345678),                   # not a histogram
    _wrap(_inner(b"\x02"), length=3),                                  # wrong compressed length
    base64.b64encode(struct.pack(">iI", 0x1C849314, 4) + b"abcd").decode(),  # not zlib
    _wrap(_inner(b"\x02", cookie=0x1C849301)),                         # V0 payload cookie
    _wrap(_inner(b"\x02")[:30]),                                       # truncated payload header
    _wrap(_inner(b"\x02\x02", plen=3)),                                # payload shorter than said
    _wrap(_inner(b"\x02\x02", plen=1)),                                # payload longer than said
    _wrap(_inner(b"\x02\x80")),                                        # truncated varint
    _wrap(_inner(b"\x02", offset=4)),                                  # shifted histogram
    _wrap(_inner(b"\x02", sigfigs=9)),                                 # impossible parameters
    _wrap(_inner(b"\x02", lowest=0)),
    _wrap(_inner(bytes([0xFF, 0x7F, 0x02]))),                          # zero run past the counts array
    _wrap(_inner(b"\x02" * (BUCKETS + 1))),                            # more counts than buckets
])
def test_bad_input_raises_value_error(text):
    # our own message, not an incidental error from deep inside numpy or zlib
    with pytest.raises(ValueError, match="HdrHistogram"):
        hdrcodec.decode(text)
