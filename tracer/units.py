"""Numbers in the units people read: latencies in ns/us/ms/s, sizes and rates in binary units.

One convention for every size and rate iotrace shows (the tables, report --by
label, diff, top, plot, --csv): KiB, MiB, GiB = 2^10, 2^20, 2^30 bytes, as
iostat's kB/s (KiB) and fio's MiB/s are; each header says MiB, never MB.
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


MIB = 1 << 20


def mib(n_bytes: float) -> float:
    """Bytes in MiB (2^20 bytes)."""
    return n_bytes / MIB


def fmt_size(n: float) -> str:
    """Bytes in the binary unit that reads best: 512B, 4.0KiB, 142MiB, 1.5GiB."""
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f}{unit}" if unit == "B" or n >= 100 else f"{n:.1f}{unit}"
        n /= 1024
    return f"{n:.1f}GiB"


def fmt_ns(ns: float) -> str:
    return fmt_latency(ns / 1e3)
