#!/usr/bin/env python3
"""Time the per-dump histogram work: 1000 histograms of 100 populated buckets each (100k buckets).

What a dump does with them: merge (each histogram with a partner of the same
shape, as when combining two intervals, and all of them into one total), then
percentiles and the HdrHistogram encoding of every one of the 1000.  Decoding
is timed too, for information.  Prints milliseconds, best of --repeat.

    .venv/bin/python scripts/bench_histogram.py
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from tracer.codec import hdr as hdrcodec
from tracer.model.histogram import BUCKETS, Histogram

QS = (50, 90, 99, 99.9)


def build(n: int, populated: int, rng: np.random.Generator) -> list[Histogram]:
    """Realistic shapes: a contiguous-ish cluster of buckets around a random latency."""
    out = []
    for _ in range(n):
        centre = int(rng.integers(populated, BUCKETS - populated))
        idx = np.sort(rng.choice(np.arange(centre - populated, centre + populated), populated, replace=False))
        out.append(Histogram.from_pairs(idx, rng.integers(1, 10_000, populated)))
    return out


def best_ms(fn, repeat: int) -> float:
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return min(times) * 1e3


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--histograms", type=int, default=1000)
    ap.add_argument("--buckets", type=int, default=100, help="populated buckets per histogram")
    ap.add_argument("--repeat", type=int, default=5)
    args = ap.parse_args()

    rng = np.random.default_rng(42)
    hs = build(args.histograms, args.buckets, rng)
    partners = build(args.histograms, args.buckets, rng)
    encoded = [hdrcodec.encode(h) for h in hs]

    steps = {
        "merge pairs": lambda: [a.merge(b) for a, b in zip(hs, partners, strict=True)],
        "merge_all": lambda: Histogram.merge_all(hs),
        "percentiles": lambda: [h.percentiles(QS) for h in hs],
        "encode": lambda: [hdrcodec.encode(h) for h in hs],
    }
    ms = {name: best_ms(fn, args.repeat) for name, fn in steps.items()}
    many_ms = best_ms(lambda: hdrcodec.encode_many(hs), args.repeat)
    assert hdrcodec.encode_many(hs) == encoded
    decode_ms = best_ms(lambda: [hdrcodec.decode(t) for t in encoded], args.repeat)
    assert [hdrcodec.decode(t) for t in encoded] == hs

    populated = sum(h.idx.size for h in hs)
    print(f"{len(hs)} histograms, {populated} populated buckets, "
          f"{sum(map(len, encoded)) / 1024:.0f} KiB of HdrHistogram text")
    for name, t in ms.items():
        print(f"  {name:<12} {t:8.1f} ms")
    print(f"  {'total':<12} {sum(ms.values()):8.1f} ms   (merge + percentiles + encode)")
    print(f"  {'encode_many':<12} {many_ms:8.1f} ms   (instead of encode: total "
          f"{sum(ms.values()) - ms['encode'] + many_ms:.1f} ms)")
    print(f"  {'decode':<12} {decode_ms:8.1f} ms   (not part of a dump)")


if __name__ == "__main__":
    main()
