"""The files table: a dump's "files" rows (tracer.model.files), top by bytes moved (read from disk +
written), with p50/p99 of their requests.  Paths, comms and containers are untrusted text: shown through
tracer.text.safe."""

from __future__ import annotations

from typing import TextIO

from tracer.model.files import OTHER, FileRow, rank
from tracer.text import safe
from tracer.units import fmt_size

DEFAULT_ROWS = 10       # the short table at the end of a traced run


def _us(v: float | None) -> str:
    if v is None:
        return "-"
    return f"{v / 1000:.1f}ms" if v >= 1000 else f"{v:.0f}us"


def _size(n: int | None) -> str:
    return "n/a" if n is None else fmt_size(n)


def _fit(s: str, width: int) -> str:
    return s if len(s) <= width else "…" + s[-(width - 1):]


def render_files(d, out: TextIO, rows: int = DEFAULT_ROWS, title: str = "files") -> None:
    """The dump's top `rows` file rows (its other files summed in one last line); nothing without rows."""
    if d.files is None or not d.files.rows:
        return
    files = [r for r in d.files.rows if r.path != OTHER]
    files.sort(key=lambda r: tuple(-x for x in rank(r)))
    shown, rest = files[:rows], files[rows:]
    others = [r for r in d.files.rows if r.path == OTHER]
    if rest or others:
        other = FileRow("", 0, OTHER, files=0)
        for r in rest + others:
            other.add(r)
            other.files += r.files
        other.path = f"({other.files} other file{'s' if other.files != 1 else ''})"
        shown.append(other)
    out.write(f"\n{title}: top {min(rows, len(files))} of {len(files) + sum(r.files for r in others)} "
              f"by bytes read from disk + written\n")
    out.write(f"{'FILE':<44} {'PID':>7} {'COMM':<15} {'CACHE':>9} {'DISK READ':>9} {'WRITTEN':>9} "
              f"{'REQS':>6} {'P50':>8} {'P99':>8}\n")
    for r in shown:
        who = safe(r.comm) + (f" [{safe(r.container)}]" if r.container else "")
        out.write(f"{_fit(safe(r.path) or f'{r.dev} inode {r.ino}', 44):<44} {r.pid or '':>7} {_fit(who, 15):<15} "
                  f"{_size(r.cache_read_bytes):>9} {fmt_size(r.disk_read_bytes):>9} "
                  f"{fmt_size(r.written_bytes):>9} {r.requests:>6} {_us(r.p_us(0.5)):>8} {_us(r.p_us(0.99)):>8}\n")
    if any(r.cache_read_bytes is None for r in shown if r.path != OTHER and not r.path.startswith("(")):
        out.write("CACHE n/a: this kernel has no filemap:mm_filemap_get_pages (Linux 6.12+) or the perf-event "
                  "path was used\n")
