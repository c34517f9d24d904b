"""Numbers in the units people read: latencies in ns/us/ms/s, sizes in B/K/M/G.

Base layer: used by views, alerts and sinks alike.
"""

from __future__ import annotations


def fmt_latency(us: float | None) -> str:
    """Microseconds in the unit that reads best: 87us, 1.25ms, 2.10s."""
    if us is None:
        return "-"
    if us < 1:
        return f"{us * 1e3:.0f}ns"
    if us < 1000:
        return f"{us:.0f}us" if us >= 10 else f"{us:.1f}us"
    if us < 1e6:
        return f"{us / 1e3:.2f}ms" if us < 1e4 else f"{us / 1e3:.1f}ms"
    return f"{us / 1e6:.2f}s"


def fmt_size(n: float) -> str:
    for unit in ("B", "K", "M", "G"):
        if n < 1024 or unit == "G":
            return f"{n:.0f}{unit}" if unit == "B" or n >= 100 else f"{n:.1f}{unit}"
        n /= 1024
    return f"{n:.1f}G"


def fmt_ns(ns: float) -> str:
    return fmt_latency(ns / 1e3)
