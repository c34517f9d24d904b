"""Renderers: the terminal table and biolatency-style bars.

They take a Dump (plain data) and a stream, and compute nothing but what
they show.
"""

from __future__ import annotations

from typing import TextIO

from .dump import PCT_KEYS, Dump, Series, duration_of

BAR_WIDTH = 40


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


COLUMNS = (("PID", ">7"), ("COMM", "<15"), ("DEVICE", "<9"), ("OP", "<7"), ("COUNT", ">8"), ("IOPS", ">8"),
           ("MB/s", ">8"), ("AVGSZ", ">6"), ("p50", ">7"), ("p90", ">7"), ("p99", ">7"), ("p99.9", ">7"),
           ("max", ">7"), ("Q:p50", ">7"), ("Q:p99", ">7"), ("D:p50", ">7"), ("D:p99", ">7"))


def _row(cells: list[str]) -> str:
    return " ".join(f"{c:{spec}}" for c, (_, spec) in zip(cells, COLUMNS, strict=True)).rstrip()


def _pct(s: Series, phase: str, key: str) -> str:
    st = s.phases.get(phase)
    return fmt_latency(st.summary_us().get(key)) if st and st.count else "-"


def series_row(s: Series, seconds: float) -> list[str]:
    rate = s.count / seconds if seconds > 0 else 0.0
    mbps = s.bytes / seconds / 1e6 if seconds > 0 else 0.0
    avg = fmt_size(s.bytes / s.count) if s.count and s.bytes else "-"
    total = [_pct(s, "total", k) for k in (*PCT_KEYS, "max")]
    split = [_pct(s, "queue", "p50"), _pct(s, "queue", "p99"), _pct(s, "device", "p50"), _pct(s, "device", "p99")]
    return [str(s.pid), s.comm[:15], s.device[:9], s.op, str(s.count), f"{rate:.0f}", f"{mbps:.2f}", avg,
            *total, *split]


def render_table(d: Dump, out: TextIO, hist: bool = False, title: str | None = None) -> None:
    seconds = duration_of(d)
    head = title or f"{d.kind}{' ' + repr(d.label) if d.label else ''}"
    out.write(f"\n{head}: {d.start:%H:%M:%S} - {d.end:%H:%M:%S} ({seconds:.1f}s), "
              f"{len(d.series)} series; total latency (p50..max), Q = queue (~Q2D), D = device (D2C)\n")
    if not d.series:
        out.write("  no block I/O completed\n")
    else:
        out.write(_row([name for name, _ in COLUMNS]) + "\n")
        for s in sorted(d.series, key=lambda s: (-s.count, s.pid, s.device, s.op)):
            out.write(_row(series_row(s, seconds)) + "\n")
    lost = {k: v for k, v in d.dropped.items() if v}
    if lost:
        out.write("WARNING: events not recorded: " + ", ".join(f"{k}={v}" for k, v in lost.items())
                  + " (see README, 'Dropped events')\n")
    if hist:
        for s in d.series:
            render_bars(s, out)


def render_bars(s: Series, out: TextIO, phase: str = "total") -> None:
    st = s.phases.get(phase)
    if not st or not st.count:
        return
    rows = st.hist.log2_bars()
    peak = max(c for _, _, c in rows) or 1
    out.write(f"\n{s.pid} {s.comm} {s.device} {s.op}: {phase} latency\n")
    out.write(f"{'range':>21} : {'count':<8} distribution\n")
    for lo, hi, c in rows:
        bar = "*" * round(BAR_WIDTH * c / peak)
        out.write(f"{fmt_ns(lo):>9} -> {fmt_ns(hi):<9} : {c:<8} |{bar:<{BAR_WIDTH}}|\n")
