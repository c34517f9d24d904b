"""iotrace plot: saved dumps as charts in one PNG (matplotlib, the optional extra `iotrace[plot]`).

Panels, top to bottom:

1. latency over time: p50 and p99 per device and op (all processes merged),
   one point per dump at its end, log scale; MiB/s of each on a second axis;
2. a latency heatmap: time x latency band, colour = requests, from the
   dumps' HdrHistograms re-binned into ROWS_PER_OCTAVE bands per power of two;
3. per label (dumps closed by markers: "epoch 1", ...): p50 and p99 bars and
   MiB, only when the dumps carry labels;
4. wait shares per label: the training loop's data wait, the I/O wait of the
   trainer and of its loaders, and the share of bytes read from disk, with
   each label's verdict (tracer.views.verdict) under it, only when labelled dumps
   carry per-process rows ("tasks") or the loop's timing.

render() returns what it drew (PlotResult); the panel titles also go into
the PNG's Description text, so the file says what it shows.
"""

from __future__ import annotations

import contextlib
import io
import math
import os
from dataclasses import dataclass, field

import numpy as np

from tracer import contract
from tracer.errors import UserError
from tracer.osutil import open_output, quiet_close, replace_as_user
from tracer.text import safe
from tracer.units import mib

WIDTH_IN = 12.0
PANEL_HEIGHT_IN = 3.6
DPI = 100
ROWS_PER_OCTAVE = 4
OPS = tuple(contract.load().ops)
PHASES = tuple(contract.load().shown_phases)
TITLE_TIME = "latency over time: p50 (dashed) and p99 (solid) per device and op; MiB/s (thin, right axis)"
TITLE_HEAT = "latency heatmap: requests per latency band and dump"
TITLE_LABELS = "per label: p50 and p99 (bars), MiB (line, right axis)"
TITLE_WAITS = "per label: % of the time waiting (data: the loop; I/O: trainer, loaders), % of bytes from disk"


@dataclass
class PlotResult:
    path: str
    panels: list[str]           # the titles, top to bottom
    width: int                  # pixels
    height: int
    dumps: int
    groups: list[tuple[str, str]] = field(default_factory=list)   # (device, op) drawn


def require_matplotlib():
    """matplotlib's Figure and the Agg canvas, or a one-line UserError saying how to install it."""
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.colors import LogNorm
        from matplotlib.figure import Figure
    except ImportError:
        raise UserError("plot needs matplotlib: pip install 'iotrace[plot]' (in iotrace's venv), "
                        "or apt-get install python3-matplotlib") from None
    return Figure, FigureCanvasAgg, LogNorm


@dataclass
class _Window:
    """One dump, reduced to what the charts show: merged (device, op) rows of the chosen phase."""

    start: float                # seconds since the first dump's start
    end: float
    seconds: float
    label: str | None
    rows: dict[tuple[str, str], object]      # (device, op) -> dump.Series, all processes merged


@dataclass
class _Read:
    """One pass over the dumps: each reduced to its _Window as it is read (the dumps are not kept)."""

    windows: list[_Window]
    t0: object                  # the first dump's start (datetime)
    dumps: int
    seen: set[tuple[str, str]]  # every (device, op) of the dumps, whatever the filters
    waits: list                 # _wait_windows of the labelled dumps


def _read(dumps, device: str | None, op: str | None) -> _Read:
    from tracer.model.dump import duration_of, merge_by_device_op

    raw = []        # (start, end, seconds, label, rows) per dump, times as datetimes until t0 is known
    seen: set[tuple[str, str]] = set()
    labelled = _WaitWindows()
    for d in dumps:
        seen.update((s.device, s.op) for s in d.series)
        rows = {(s.device, s.op): s for s in merge_by_device_op(d.series)
                if (device is None or s.device == device) and (op is None or s.op == op)}
        raw.append((d.start, d.end, duration_of(d), d.label, rows))
        labelled.add(d)
    if not raw:
        return _Read([], None, 0, seen, [])
    raw.sort(key=lambda r: r[1])
    t0 = min(r[0] for r in raw)
    windows = [_Window((start - t0).total_seconds(), (end - t0).total_seconds(), seconds, label, rows)
               for start, end, seconds, label, rows in raw]
    return _Read(windows, t0, len(raw), seen, labelled.result())


def _windows(dumps, device: str | None, op: str | None) -> tuple[list[_Window], object]:
    r = _read(dumps, device, op)
    return r.windows, r.t0


def _edges(windows: list[_Window]) -> np.ndarray:
    """A column per dump, from the previous dump's end (the first one's start) to its end."""
    return np.maximum.accumulate(np.array([windows[0].start] + [w.end for w in windows]))


def shown(text: object) -> str:
    """A name (device, op, label, file) as a chart shows it: made safe (tracer.text), and a "$" kept a
    dollar sign (matplotlib reads $...$ as mathtext, and fails on an unbalanced one)."""
    return safe(text).replace("$", r"\$")


def _pct(s, phase: str, key: str) -> float:
    st = s.phases.get(phase) if s is not None else None
    if st is None or not st.count:
        return math.nan
    return st.summary_us()[key] / 1e3        # ms


def _time_panel(ax, windows: list[_Window], groups: list[tuple[str, str]], phase: str) -> None:
    x = [w.end for w in windows]
    right = ax.twinx()
    colours = [f"C{i % 10}" for i in range(len(groups))]
    for g, c in zip(groups, colours, strict=True):
        rows = [w.rows.get(g) for w in windows]
        p99 = [_pct(s, phase, "p99") for s in rows]
        p50 = [_pct(s, phase, "p50") for s in rows]
        ax.plot(x, p99, "o-", color=c, label=f"{shown(g[0])} {shown(g[1])} p99", markersize=4)
        ax.plot(x, p50, ".--", color=c, label=f"{shown(g[0])} {shown(g[1])} p50")
        mbps = [mib(s.bytes) / w.seconds if s is not None and w.seconds > 0 else 0.0 for s, w in zip(rows, windows,
                                                                                                      strict=True)]
        right.stairs(mbps, _edges(windows), color=c, linewidth=0.8, alpha=0.5)    # each dump's rate over its window
    ax.set_yscale("log")
    ax.set_ylabel(f"{phase} latency (ms)")
    right.set_ylabel("MiB/s")
    right.set_ylim(bottom=0)
    ax.grid(True, which="major", alpha=0.3)
    ax.legend(fontsize="small", loc="upper left", ncol=max(1, min(4, len(groups))))
    ax.set_title(TITLE_TIME, fontsize="medium")


def _heat_matrix(windows: list[_Window], phase: str) -> tuple[np.ndarray, np.ndarray]:
    """(counts[band, window], band edges in ms); bands of 1/ROWS_PER_OCTAVE of a power of two of ns."""
    from tracer.model.histogram import Histogram, bucket_value

    hists = [Histogram.merge_all(s.phases[phase].hist for s in w.rows.values() if phase in s.phases)
             for w in windows]
    bands = [np.floor(np.log2(np.maximum(bucket_value(h.idx), 1)) * ROWS_PER_OCTAVE).astype(int) for h in hists]
    used = [b for b in bands if b.size]
    lo = min(int(b.min()) for b in used) if used else 0
    hi = max(int(b.max()) for b in used) if used else ROWS_PER_OCTAVE
    counts = np.zeros((hi - lo + 1, len(windows)))
    for col, (b, h) in enumerate(zip(bands, hists, strict=True)):
        np.add.at(counts[:, col], b - lo, h.counts.astype(np.float64))
    edges_ns = np.exp2(np.arange(lo, hi + 2) / ROWS_PER_OCTAVE)
    return counts, edges_ns / 1e6


def _heat_panel(fig, ax, windows: list[_Window], phase: str, log_norm) -> None:
    counts, edges_ms = _heat_matrix(windows, phase)
    x = _edges(windows)
    shown = np.ma.masked_equal(counts, 0)
    mesh = ax.pcolormesh(x, edges_ms, shown, cmap="viridis", shading="flat",
                         norm=log_norm(vmin=1, vmax=max(1.0, float(counts.max()))))
    ax.set_yscale("log")
    ax.set_ylabel(f"{phase} latency (ms)")
    fig.colorbar(mesh, ax=ax, label="requests", pad=0.01)
    ax.set_title(TITLE_HEAT, fontsize="medium")


def _label_panel(ax, windows: list[_Window], phase: str) -> list[str]:
    merged: dict[str, list] = {}        # label -> its rows, labels in first-seen order
    for w in windows:
        if w.label is not None:
            merged.setdefault(w.label, []).extend(w.rows.values())
    order = list(merged)
    p50, p99, mb = [], [], []
    for label in order:
        # every (device, op) shown, merged: the panel answers "how did this epoch fare"
        st = None
        for s in merged[label]:
            if phase in s.phases:
                st = s.phases[phase] if st is None else st.merge(s.phases[phase])
        summary = st.summary_us() if st is not None and st.count else {}
        p50.append(summary.get("p50", 0.0) / 1e3)
        p99.append(summary.get("p99", 0.0) / 1e3)
        mb.append(mib(sum(s.bytes for s in merged[label])))
    x = np.arange(len(order))
    ax.bar(x - 0.2, p50, width=0.4, label="p50", color="C0")
    ax.bar(x + 0.2, p99, width=0.4, label="p99", color="C3")
    ax.set_xticks(x, [shown(label) for label in order], rotation=30 if len(order) > 6 else 0,
                  ha="right" if len(order) > 6 else "center", fontsize="small")
    ax.set_ylabel(f"{phase} latency (ms)")
    right = ax.twinx()
    right.plot(x, mb, "ko-", label="MiB", markersize=4)
    right.set_ylabel("MiB")
    right.set_ylim(bottom=0)
    ax.legend(fontsize="small", loc="upper left")
    ax.set_title(TITLE_LABELS, fontsize="medium")
    return order


class _WaitWindows:
    """The labelled dumps merged per label as they come, without their series (the verdict needs none)."""

    def __init__(self) -> None:
        from tracer.model.dump import DumpMerger

        self.new = DumpMerger
        self.labels: dict[str, object] = {}

    def add(self, d) -> None:
        from dataclasses import replace

        if d.label is None:
            return
        acc = self.labels.get(d.label)
        if acc is None:
            acc = self.labels[d.label] = self.new()
        acc.add(replace(d, series=[]))

    def result(self) -> list:
        """(label, tracer.views.verdict.Verdict) of each label whose dumps carry tasks rows or loop timing."""
        from tracer.views.report import judged
        from tracer.views.verdict import judge_dump

        merged = [(label, acc.result(kind=acc.kind, label=label)) for label, acc in self.labels.items()]
        merged.sort(key=lambda lm: lm[1].start)     # in the order they began, as report --by label lists them
        return [(label, judge_dump(m)) for label, m in merged if judged(m)]


def _wait_windows(dumps) -> list:
    """(label, tracer.views.verdict.Verdict) of each label whose dumps carry tasks rows or loop timing."""
    acc = _WaitWindows()
    for d in dumps:
        acc.add(d)
    return acc.result()


def _waits_panel(ax, waits: list) -> None:
    bars = (("data wait", "C0", lambda v: v.data_wait), ("trainer I/O wait", "C3", lambda v: v.trainer_io_wait
                                                        if v.trainer_pid is not None else v.busiest_io_wait),
            ("loaders I/O wait (mean)", "C1", lambda v: v.loader_io_wait), ("from disk", "C7", lambda v: v.from_disk))
    x = np.arange(len(waits))
    width = 0.8 / len(bars)
    for i, (name, colour, get) in enumerate(bars):
        vals = [100 * (get(v) or 0.0) for _, v in waits]
        ax.bar(x - 0.4 + width * (i + 0.5), vals, width=width, label=name, color=colour)
    names = [f"{shown(label)}\n{v.state}" for label, v in waits]
    ax.set_xticks(x, names, rotation=30 if len(waits) > 6 else 0, ha="right" if len(waits) > 6 else "center",
                  fontsize="small")
    ax.set_ylabel("% of the window (I/O wait: threads summed)")
    ax.set_ylim(bottom=0)
    ax.legend(fontsize="small", loc="upper right")
    ax.set_title(TITLE_WAITS, fontsize="medium")


def render(dumps, path: str, device: str | None = None, op: str | None = None, phase: str = "total",
           source: str = "") -> PlotResult:
    """Draw the panels for `dumps` (tracer.model.dump.Dump) into the PNG at `path`."""
    figure, canvas, log_norm = require_matplotlib()
    read = _read(dumps, device, op)      # `dumps` may be a reader's generator: one pass
    if not read.dumps:
        raise UserError(f"no dumps in {source or 'the input'}")
    windows, t0 = read.windows, read.t0
    groups = sorted({g for w in windows for g, s in w.rows.items() if phase in s.phases})
    if not groups:
        seen = sorted(read.seen)
        what = " ".join(x for x in (device, op) if x) or "any device"
        raise UserError(f"no {phase} latency for {what} in {source or 'the dumps'}; there: "
                        f"{', '.join(f'{d} {o}' for d, o in seen) or 'no I/O at all'}")
    labelled = any(w.label is not None for w in windows)
    waits = read.waits if labelled else []
    n = 2 + labelled + bool(waits)
    fig = figure(figsize=(WIDTH_IN, PANEL_HEIGHT_IN * n), dpi=DPI, layout="constrained")
    canvas(fig)
    axes = fig.subplots(n, 1)
    _time_panel(axes[0], windows, groups, phase)
    _heat_panel(fig, axes[1], windows, phase, log_norm)
    for ax in axes[:2]:
        ax.set_xlabel(f"seconds since {t0:%Y-%m-%d %H:%M:%S}")
        ax.set_xlim(windows[0].start, max(w.end for w in windows))
    panels = [TITLE_TIME, TITLE_HEAT]
    if labelled:
        _label_panel(axes[2], windows, phase)
        panels.append(TITLE_LABELS)
    if waits:
        _waits_panel(axes[3], waits)
        panels.append(TITLE_WAITS)
    scope = ", ".join(x for x in (device, op) if x) or "every device and op"
    fig.suptitle(f"iotrace: {shown(source or 'dumps')} ({read.dumps} dumps; {shown(scope)}; {phase} phase)",
                 fontsize="large")
    png = io.BytesIO()
    fig.savefig(png, format="png", metadata={"Title": f"iotrace plot of {safe(source)}", "Software": "iotrace",
                                             "Description": "panels: " + " | ".join(panels)})
    _write_atomically(path, png.getbuffer())
    return PlotResult(path, panels, round(WIDTH_IN * DPI), round(PANEL_HEIGHT_IN * n * DPI), read.dumps, groups)


def _write_atomically(path: str, data) -> None:
    """`data` in a new file beside `path`, then renamed over it: a write that fails (a full disk) leaves the
    old chart as it was, and no temp file.  As the sudo user, never through a link (tracer.osutil)."""
    tmp = f"{path}.tmp{os.getpid()}"
    f = open_output(tmp, "xb")
    try:
        try:
            with f:
                f.write(data)
        except OSError:
            quiet_close(f)
            raise
        replace_as_user(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
