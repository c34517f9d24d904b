"""iotrace diff: two runs, or two labelled windows, compared row by row.

A side is every dump of a file merged (exactly, through the histograms), or
the dumps of one label in it merged.  Rows are matched on process name,
device and op -- not on pid, which differs from one run to the next and
between loader workers restarted each epoch.  This module owns the side
syntax, the matching and the rendering of the changes; the numbers of a row
come from tracer.views.report, so that they read as in `iotrace report`.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import TextIO

from tracer import contract
from tracer.codec import jsonl
from tracer.errors import UserError
from tracer.model import dump as dumpmod
from tracer.model.dump import Dump, Series
from tracer.text import safe
from tracer.units import mib
from tracer.views.report import (
    LATENCY_KEYS,
    STAT_KEYS,
    UNLABELLED,
    fmt_latency,
    fmt_stat,
    lost_text,
    row_stats,
    row_text,
    rows_of,
    window_name,
)

PHASES = tuple(contract.load().shown_phases)

EPILOG = f"""\
sides:
  FILE.jsonl          every dump of the file, merged (a whole run)
  FILE.jsonl:LABEL    the dumps labelled LABEL in the file, merged; quote labels
                      with spaces. LABEL {UNLABELLED} picks the dumps without one
  --labels LA LB      shorthand: LA in the first file, LB in the second (or in
                      the same file, when only one is given)

examples:
  iotrace diff before.jsonl after.jsonl
  iotrace diff run.jsonl --labels "epoch 1" "epoch 2"
  iotrace diff "run.jsonl:epoch 1" "run.jsonl:epoch 2"      (the same)
  iotrace diff "a.jsonl:epoch 3" "b.jsonl:epoch 3" --phase device
  iotrace diff before.jsonl after.jsonl --json | jq '.rows[] | {{comm, p99: .change_pct.p99}}'

Each row is a process name, a device and an op, on both sides.  Rows are
matched on the name, not the pid: pids differ between runs, and loader
workers restarted each epoch get new ones.  Kernel writeback workers
(kworker/u8:3, ...) are one row, kworker/*.  Per row: A, B, the change B - A,
and the change in percent of A.  COUNT and MiB are the rows' requests,
whatever the --phase; MiB = 2^20 bytes.  Rows seen on one side only are
listed after the matched ones.
"""


@dataclass
class Side:
    """One side of the comparison: what the user named and its dumps merged."""

    tag: str            # "A" or "B"
    path: str
    label: str | None   # None: the whole file
    dumps: int          # how many were merged
    merged: Dump

    @property
    def spec(self) -> str:
        return self.path if self.label is None else f"{self.path}:{self.label}"


@dataclass
class Comparison:
    """Rows of A and B matched by (process name, device, op)."""

    matched: list[tuple[Series, Series]]
    only_a: list[Series]
    only_b: list[Series]


def split_side(text: str) -> tuple[str, str | None]:
    """FILE or FILE:LABEL -> (path, label or None).

    A name that exists is a file, whatever colons it holds.  Otherwise it is
    split at the first ':' that has an existing file before it: labels may
    hold colons ("ckpt:step 5"), and so may paths.
    """
    if os.path.exists(text) or ":" not in text:
        return text, None
    for i, ch in enumerate(text):
        if ch == ":" and os.path.isfile(text[:i]):
            if i == len(text) - 1:
                raise UserError(f"{text!r}: no label after ':' (write FILE:LABEL, or FILE for the whole file)")
            return text[:i], text[i + 1:]
    # no existing file before any ':': reading the likeliest file name reports it missing
    return text.split(":", 1)[0], None


def load_sides(specs: list[tuple[str, str, str | None]]) -> list[Side]:
    """The Sides of (tag, path, label or None) specs, each file read once, as a stream.

    Each dump is merged into the sides that take it as it is read (and not
    kept): memory is bounded by the merged rows, not by the files.
    """
    accs = [dumpmod.DumpMerger() for _ in specs]
    credits: dict[str, dumpmod.WritebackCredit] = {}
    for path in dict.fromkeys(path for _, path, _ in specs):
        mine = [(acc, label) for acc, (_, p, label) in zip(accs, specs, strict=True) if p == path]
        seen: dict[str | None, None] = {}
        n = 0
        credit = credits[path] = dumpmod.WritebackCredit()
        for d in jsonl.read(path):
            n += 1
            seen.setdefault(d.label)
            credit.add(d)
            for acc, label in mine:
                if label is None or window_name(d.label) == label:
                    acc.add(d)
        if not n:
            raise UserError(f"no dumps in {path}")
        for acc, label in mine:
            if not acc.count:
                labels = [x for x in seen if x is not None] + ([UNLABELLED] if None in seen else [])
                raise UserError(f"{path} has no dump labelled {label!r}; its labels: {', '.join(map(repr, labels))}")
    sides = [Side(tag, path, label, acc.count, acc.result(kind=acc.kind or "final", label=label))
             for acc, (tag, path, label) in zip(accs, specs, strict=True)]
    for side in sides:
        # a labelled side: the write-back of what it dirtied, wherever in the file it was written back
        if side.label is not None:
            written = credits[side.path].of(None if side.label == UNLABELLED else side.label)
            if written.credits:
                side.merged.written_back = written
    return sides


def credited(side: Side) -> dict[str, int]:
    """Bytes of write-back credited to a labelled side (the data it dirtied), per process name."""
    out: dict[str, int] = {}
    for c in side.merged.written_back.credits if side.merged.written_back is not None else ():
        out[c.comm] = out.get(c.comm, 0) + c.bytes
    return out


def compare(a: Dump, b: Dump) -> Comparison:
    ra, rb = rows_of(a.series), rows_of(b.series)

    def order(key: tuple, count: int) -> tuple:
        return (-count, tuple(map(str, key)))

    matched = sorted((k for k in ra if k in rb), key=lambda k: order(k, ra[k].count + rb[k].count))
    only_a = sorted((k for k in ra if k not in rb), key=lambda k: order(k, ra[k].count))
    only_b = sorted((k for k in rb if k not in ra), key=lambda k: order(k, rb[k].count))
    return Comparison([(ra[k], rb[k]) for k in matched], [ra[k] for k in only_a], [rb[k] for k in only_b])


def change(a: float | None, b: float | None) -> tuple[float | None, float | None]:
    """(B - A, percent of A); None where a side has no value, or A is 0 for the percent."""
    if a is None or b is None:
        return None, None
    return b - a, ((b - a) / a * 100 if a else None)


def fmt_change(key: str, d: float | None) -> str:
    if d is None:
        return "-"
    if key == "count":
        return f"{int(d):+d}"
    if key == "MiB":
        return f"{d:+.2f}"
    if d == 0:
        return "0"
    return ("+" if d > 0 else "-") + fmt_latency(abs(d))


def fmt_percent(p: float | None) -> str:
    return "-" if p is None else f"{p:+.1f}%"


_ROW_WIDTH = 36
_CELL = 9


def _line(first: str, cells: list[str]) -> str:
    return f"{safe(first)[:_ROW_WIDTH]:<{_ROW_WIDTH}}" + "".join(f" {c:>{_CELL}}" for c in cells)


def render_diff(a: Side, b: Side, out: TextIO, phase: str = "total") -> None:
    comp = compare(a.merged, b.merged)
    out.write(f"\ndiff: {phase} latency, B against A; rows matched on process name, device and op\n")
    for side in (a, b):
        m = side.merged
        out.write(f"  {side.tag}  {safe(side.spec)}: {side.dumps} dump(s), {dumpmod.duration_of(m):.1f}s, "
                  f"{m.start:%H:%M:%S} - {m.end:%H:%M:%S}, {len(rows_of(m.series))} row(s)\n")
        if any(m.dropped.values()):
            out.write(f"WARNING: {side.tag}: events not recorded: {lost_text(m.dropped)} "
                      f"(see README, 'Dropped events')\n")
    heads = ["COUNT", "MiB", *LATENCY_KEYS]
    if not (comp.matched or comp.only_a or comp.only_b):
        out.write("  no block I/O on either side\n")
        _render_credited(a, b, out)     # a side's data may have been written back in another window
        return
    if comp.matched:
        out.write("\n" + _line("ROW", heads) + "\n")
    for sa, sb in comp.matched:
        va, vb = row_stats(sa, phase), row_stats(sb, phase)
        changes = {k: change(va[k], vb[k]) for k in STAT_KEYS}
        out.write(row_text(sa) + "\n")
        out.write(_line("  A", [fmt_stat(k, va[k]) for k in STAT_KEYS]) + "\n")
        out.write(_line("  B", [fmt_stat(k, vb[k]) for k in STAT_KEYS]) + "\n")
        out.write(_line("  change", [fmt_change(k, changes[k][0]) for k in STAT_KEYS]) + "\n")
        out.write(_line("  change %", [fmt_percent(changes[k][1]) for k in STAT_KEYS]) + "\n")
    for side, rows, other in ((a, comp.only_a, b), (b, comp.only_b, a)):
        if rows:
            out.write("\n" + _line(f"only in {side.tag} (none in {other.tag})", heads) + "\n")
            for s in rows:
                stats = row_stats(s, phase)
                out.write(_line(row_text(s), [fmt_stat(k, stats[k]) for k in STAT_KEYS]) + "\n")
    _render_credited(a, b, out)


def _render_credited(a: Side, b: Side, out: TextIO) -> None:
    """The write-back each labelled side's data got, wherever it ran: bytes credited to the dirtying window."""
    ca, cb = credited(a), credited(b)
    if not ca and not cb:
        return
    out.write("\nwrite-back of the data each side dirtied, in MiB (credited to the window that wrote it, written "
              "back then or later;\nits latencies are in the write-back rows of the window it ran in)\n")
    out.write(_line("PROCESS", ["A", "B", "change"]) + "\n")
    for comm in sorted(set(ca) | set(cb), key=lambda c: (-(ca.get(c, 0) + cb.get(c, 0)), c)):
        ma, mb = mib(ca.get(comm, 0)), mib(cb.get(comm, 0))
        out.write(_line(f"  {comm}", [f"{ma:.2f}", f"{mb:.2f}", f"{mb - ma:+.2f}"]) + "\n")


def _row_key(s: Series) -> dict:
    return {"comm": s.comm, "device": s.device, "op": s.op, **({"wb": True} if s.wb else {})}


def diff_json(a: Side, b: Side, phase: str = "total") -> dict:
    """What render_diff shows, as data: latencies in microseconds, MiB = 2^20 bytes, None where a side has none."""
    comp = compare(a.merged, b.merged)
    sides = {}
    for side in (a, b):
        m = side.merged
        sides[side.tag] = {"spec": side.spec, "path": side.path, "label": side.label, "dumps": side.dumps,
                           "duration_s": round(dumpmod.duration_of(m), 6), "start": m.start.isoformat(),
                           "end": m.end.isoformat(), "dropped": {k: v for k, v in m.dropped.items() if v}}
    rows = []
    for sa, sb in comp.matched:
        va, vb = row_stats(sa, phase), row_stats(sb, phase)
        changes = {k: change(va[k], vb[k]) for k in STAT_KEYS}
        rows.append({**_row_key(sa), "a": va, "b": vb, "change": {k: d for k, (d, _) in changes.items()},
                     "change_pct": {k: pct for k, (_, pct) in changes.items()}})
    return {"kind": "iotrace-diff", "phase": phase, "a": sides["A"], "b": sides["B"], "rows": rows,
            "only_a": [{**_row_key(s), **row_stats(s, phase)} for s in comp.only_a],
            "only_b": [{**_row_key(s), **row_stats(s, phase)} for s in comp.only_b],
            # labelled sides: bytes of write-back of the data each dirtied, per process name
            "written_back": {"a": credited(a), "b": credited(b)}}
