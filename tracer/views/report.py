"""Renderers: the terminal table, biolatency-style bars, windows side by side, and waits per window.

They take a Dump (plain data) and a stream, and compute nothing but what
they show.  Every name in a dump (comm, container, label, device, a drop's
reason: a saved file may hold anything) reaches the stream through
tracer.text.safe, at the line or cell that shows it.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, replace
from typing import TextIO

from tracer.model.dump import (
    PCT_KEYS,
    Dirtied,
    Dump,
    DumpMerger,
    Series,
    WritebackCredit,
    duration_of,
    merge_dumps,
    summarize,
    unexplained_loss,
)
from tracer.model.sections import TaskRow, Tasks, VerdictSection
from tracer.text import safe
from tracer.units import fmt_latency, fmt_ns, fmt_size, mib
from tracer.views.verdict import Verdict, judge_dump
from tracer.views.words import PLAIN, Words, submitted_words, words_for

BAR_WIDTH = 40


def columns(words: Words = PLAIN) -> tuple[tuple[str, str], ...]:
    """The table's (head, format) columns, in `words`' names (a plain OP cell may say "write-back")."""
    split = tuple((h, f">{max(7, len(h))}") for h in words.split_heads)
    return (("PID", ">7"), ("COMM", "<15"), ("DEVICE", "<9"), ("OP", "<7" if words.jargon else "<10"),
            ("COUNT", ">8"), ("IOPS", ">8"), ("MiB/s", ">8"), ("AVGSZ", ">6"), ("p50", ">7"), ("p90", ">7"),
            ("p99", ">7"), ("p99.9", ">7"), ("max", ">7"), *split)


def _row(cells: list[str], words: Words = PLAIN) -> str:
    return " ".join(f"{safe(c):{spec}}" for c, (_, spec) in zip(cells, columns(words), strict=True)).rstrip()


def lost_text(dropped: dict) -> str:
    """The non-zero drop counters, "reason=n, ..." (the reasons as a saved file had them, made safe)."""
    return ", ".join(f"{safe(k)}={v}" for k, v in dropped.items() if v)


def _pct(s: Series, phase: str, key: str) -> str:
    st = s.phases.get(phase)
    return fmt_latency(st.summary_us().get(key)) if st and st.count else "-"


def series_row(s: Series, seconds: float, words: Words = PLAIN) -> list[str]:
    rate = s.count / seconds if seconds > 0 else 0.0
    mbps = mib(s.bytes) / seconds if seconds > 0 else 0.0
    avg = fmt_size(s.bytes / s.count) if s.count and s.bytes else "-"
    total = [_pct(s, "total", k) for k in (*PCT_KEYS, "max")]
    split = [_pct(s, "queue", "p50"), _pct(s, "queue", "p99"), _pct(s, "device", "p50"), _pct(s, "device", "p99")]
    comm, op = words.comm_op(s.comm, s.op, s.wb)
    return [str(s.pid), comm, safe(s.device)[:9], op, str(s.count), f"{rate:.0f}",
            f"{mbps:.2f}", avg, *total, *split]


def _coverage_line(d: Dump, out: TextIO, words: Words = PLAIN) -> None:
    cov = d.coverage
    if cov is None or not cov.devices:
        return
    line = words.coverage([(name, c.recorded, c.diskstats) for name, c in cov.devices.items()], cov.filtered)
    if line is not None:
        out.write(line + "\n")
    missing = cov.unrecorded()
    # requests counted as dropped are missing for a known reason (the next line names it)
    if unexplained_loss(cov, d.dropped) and not cov.filtered and d.kind == "final":
        out.write("WARNING: the kernel completed requests iotrace neither saw nor counted as dropped: "
                  + ", ".join(f"{safe(n)} {k}" for n, k in missing.items()) + " (see README, 'Coverage')\n")


def _bio_line(d: Dump, out: TextIO, words: Words = PLAIN) -> None:
    bio = d.bio_devices.names if d.bio_devices is not None else ()
    if bio and any(s.device in bio for s in d.series):
        split = "Q:/D:" if words.jargon else "queue/device"
        out.write(f"bio-based: {', '.join(map(safe, bio))} timed per bio, queue to completion "
                  f"(total only, no {split} split)\n")


def _start_line(d: Dump, out: TextIO) -> None:
    start = d.start_event
    if start is not None and start.blind:
        out.write(f"WARNING: requests started on block:{safe(start.event or '?')}, which fires only for "
                  f"requests that pass an I/O scheduler: most of {', '.join(map(safe, start.blind))}'s (scheduler "
                  f"none) are not in these rows (see README, 'Kernels')\n")


def _before_attach_line(d: Dump, out: TextIO) -> None:
    late = d.before_attach
    if late is not None:
        by = f" {late.by_s:.1f} s" if late.by_s is not None else ""
        out.write(f"NOTE: this window began{by} before the tracer attached: only the part after is in it "
                  f"(the cold start may be missed)\n")


def dirtied_name(e: Dirtied, here: int | None = None) -> str:
    """The window a write-back's data was dirtied in, as shown (made safe): its label, else its number and
    start; "this window" when it is `here` (the dump's own WindowSeq)."""
    if here and e.window == here:
        return "this window"
    began = f", began {e.start:%H:%M:%S}" if e.start is not None else ""
    if e.label is not None:
        return safe(repr(e.label)) + (began and f" ({began[2:]})")
    return f"window {e.window}{began}" if e.window else "a window not known"


def _writeback_lines(d: Dump, out: TextIO) -> None:
    """A window's write-back rows, by the window that dirtied their data (Series.dirtied)."""
    rows = [s for s in d.series if s.wb and s.dirtied]
    if not rows:
        return
    here = d.window_seq.seq if d.window_seq is not None else None
    out.write("write-back: by the window that dirtied the data (its bytes are credited there; the latencies "
              "above are of the window the requests ran in)\n")
    for s in sorted(rows, key=lambda s: -s.bytes):
        parts = [f"{fmt_size(e.bytes)} of {dirtied_name(e, here)}" for e in s.dirtied]
        out.write(f"  {s.pid} {safe(s.comm)}: {'; '.join(parts)}\n")


def render_table(d: Dump, out: TextIO, hist: bool = False, title: str | None = None) -> None:
    words = words_for(hist)
    seconds = duration_of(d)
    label = window_label(d)
    head = safe(title or f"{d.kind}{' ' + repr(label) if label else ''}")
    # rates over the whole window, as iostat's are over its interval (the --csv row's iostat columns are
    # over this same window); a fio job's IOPS are over its own runtime, shorter when the window holds more
    out.write(f"\n{head}: {d.start:%H:%M:%S} - {d.end:%H:%M:%S} ({seconds:.1f}s), "
              f"{len(d.series)} series; {words.latency}; "
              f"IOPS, MiB/s over the window's {seconds:.1f}s\n")
    if not d.series:
        out.write("  no block I/O completed\n")
    else:
        summarize(d.series)
        # last, and only when some row ran in a container: a host's table stays as it was
        ctr = any(s.container for s in d.series)
        out.write(_row([name for name, _ in columns(words)], words) + ("  CONTAINER" if ctr else "") + "\n")
        for s in sorted(d.series, key=lambda s: (-s.count, s.pid, s.device, s.op)):
            out.write(_row(series_row(s, seconds, words), words) + (f"  {safe(s.container or '-')}" if ctr else "")
                      + "\n")
    _submitted_rows(d, out, seconds, words)
    _writeback_lines(d, out)
    _bio_line(d, out, words)
    _tasks_line(d, out)
    _coverage_line(d, out, words)
    _before_attach_line(d, out)
    _start_line(d, out)
    if any(d.dropped.values()):
        out.write(f"WARNING: events not recorded: {lost_text(d.dropped)} (see README, 'Dropped events')\n")
    if hist:
        for s in d.series:
            render_bars(s, out)


def _submitted_rows(d: Dump, out: TextIO, seconds: float, words: Words) -> None:
    """--bio's rows: the same processes' I/Os as they submitted them (Dump.submitted), a table of their own."""
    if not d.submitted:
        return
    summarize(d.submitted)
    sw = submitted_words(words)
    out.write(f"{sw.latency}\n")
    out.write(_row([name for name, _ in columns(sw)], sw) + "\n")
    for s in sorted(d.submitted, key=lambda s: (-s.count, s.pid, s.device, s.op)):
        out.write(_row(series_row(s, seconds, sw), sw) + "\n")


def render_bars(s: Series, out: TextIO, phase: str = "total") -> None:
    st = s.phases.get(phase)
    if not st or not st.count:
        return
    rows = st.hist.log2_bars()
    peak = max(c for _, _, c in rows) or 1
    out.write(f"\n{s.pid} {safe(s.comm)} {safe(s.device)} {safe(s.op)}: {phase} latency\n")
    out.write(f"{'range':>21} : {'count':<8} distribution\n")
    for lo, hi, c in rows:
        bar = "*" * round(BAR_WIDTH * c / peak)
        out.write(f"{fmt_ns(lo):>9} -> {fmt_ns(hi):<9} : {c:<8} |{bar:<{BAR_WIDTH}}|\n")


# ---- windows side by side: iotrace report --by label -------------------------

UNLABELLED = "(unlabelled)"
LATENCY_KEYS = (*PCT_KEYS, "max")
STAT_KEYS = ("count", "MiB", *LATENCY_KEYS)
WIDE_MAX = 120      # the auto layout puts windows side by side while that fits in this many columns
_LABEL_MAX = 30


def window_name(label: str | None) -> str:
    return UNLABELLED if label is None else label


def window_label(d: Dump) -> str | None:
    """A dump's label as its window is named: with several training loops marking one trace, prefixed by
    whose window it is ("rank 1: epoch 2", "pid 4242: epoch 2"; tracer.pipeline.senders), so that the
    ranks' windows of one label are told apart, live and in `report --by label` alike."""
    if d.label is None or d.owner is None:
        return d.label
    return f"{d.owner.name}: {d.label}"


def row_comm(comm: str) -> str:
    """The process name rows are matched on across windows and runs.

    Kernel workers are named by pool and number (kworker/u8:3), and which one
    does a job changes from moment to moment; their I/O (writeback, mostly) is
    one row, kworker/*, or it would never line up between two windows.
    """
    return "kworker/*" if comm.startswith("kworker/") else comm


def rows_of(series: Iterable[Series], per_pid: bool = False) -> dict[tuple, Series]:
    """Series merged into rows: one per (process name, device, op), or per (pid, device, op).

    By name by default because windows are compared: loader workers started
    anew each epoch, or any process of another run, have other pids.
    """
    out: dict[tuple, Series] = {}
    for s in series:
        if not per_pid:
            s = replace(s, comm=row_comm(s.comm))
        key = (s.pid if per_pid else s.comm, s.device, s.op, s.wb)
        out[key] = out[key].merge(s) if key in out else s
    return out


def row_text(s: Series, per_pid: bool = False) -> str:
    """A row's name as shown: [pid] comm  device  op (made safe; a write-back row's op says so)."""
    comm, op = PLAIN.comm_op(s.comm, s.op, s.wb, width=None)
    return f"{f'{s.pid} ' if per_pid else ''}{comm}  {safe(s.device)}  {op}"


def row_stats(s: Series | None, phase: str = "total") -> dict[str, float | None]:
    """count, MiB (2^20 bytes) and the phase's p50..max in microseconds (None: no such latency)."""
    if s is None:
        return {"count": 0, "MiB": 0.0, **dict.fromkeys(LATENCY_KEYS)}
    st = s.phases.get(phase)
    summary = st.summary_us() if st and st.count else {}
    return {"count": s.count, "MiB": mib(s.bytes), **{k: summary.get(k) for k in LATENCY_KEYS}}


def fmt_mb(mb: float) -> str:
    return f"{mb:.2f}" if mb < 1000 else f"{mb:.0f}"


def fmt_stat(key: str, v: float | None) -> str:
    if key == "count":
        return str(v)
    if key == "MiB":
        return fmt_mb(v or 0.0)
    return fmt_latency(v)


def loop_share(d: Dump) -> float | None:
    """The share of a window's wall time its training loop waited for batches ("loop"), or None."""
    return d.loop.wait_share if d.loop is not None else None


@dataclass
class Window:
    """The dumps of one label (or of none), merged."""

    label: str | None
    dumps: int          # how many were merged
    merged: Dump

    @property
    def name(self) -> str:
        """The label as shown (made safe): diff matches labels with window_name, not with this."""
        return safe(window_name(self.label))


def windows_by_label(dumps: Iterable[Dump]) -> list[Window]:
    """One window per label in the order they began (a window folded around nested ones comes after them in a
    file: tracer.model.slices); the unlabelled dumps (if any) last, as one.  A window is named by window_label:
    with several training loops, each one's dumps of a label are a window of their own.

    `dumps` may be a reader's generator: each dump is merged into its label's
    window as it comes (tracer.model.dump.DumpMerger) and not kept.
    """
    groups: dict[str | None, DumpMerger] = {}
    credit = WritebackCredit()
    for d in dumps:
        name = window_label(d)
        acc = groups.get(name)
        if acc is None:
            acc = groups[name] = DumpMerger()
        acc.add(d)
        credit.add(d)
    order = [k for k in groups if k is not None] + ([None] if None in groups else [])
    windows = [Window(k, groups[k].count, groups[k].result(kind=groups[k].kind or "final", label=k)) for k in order]
    windows.sort(key=lambda w: (w.label is None, w.merged.start))
    for w in windows:
        if judged(w.merged):    # so that --json carries it too
            w.merged.verdict = VerdictSection(judge_dump(w.merged).to_json())
        # the write-back of what this window dirtied, wherever it ran: a later window's rows say it
        written = credit.of(w.label)
        if written.credits:
            w.merged.written_back = written
    return windows


def render_by_label(dumps: Iterable[Dump], out: TextIO, layout: str = "auto", per_pid: bool = False,
                    title: str | None = None) -> None:
    """render_windows of windows_by_label(dumps)."""
    render_windows(windows_by_label(dumps), out, layout=layout, per_pid=per_pid, title=title)


def render_windows(windows: list[Window], out: TextIO, layout: str = "auto", per_pid: bool = False,
                   title: str | None = None) -> None:
    """Windows (dumps merged by label) side by side, per row: count, MiB and total latency.

    layout "wide": one column group per window (p50 p99 COUNT MiB), readable
    for two or three windows; "long": one block per row with one line per
    window (count, MiB, p50..max), readable for any number; "auto": wide while
    it fits in WIDE_MAX columns.  Unlabelled dumps (the stretch after the last
    marker, interval dumps) are one window, "(unlabelled)", shown last, and
    left out with a note when they hold no I/O.
    """
    empty_rest = [w for w in windows if w.label is None and not w.merged.series]
    shown = [w for w in windows if w not in empty_rest]
    out.write(f"\n{title or 'by label'}: {sum(w.dumps for w in windows)} dump(s) in {len(shown)} window(s)\n"
              f"rows: {'pid' if per_pid else 'process name'} + device + op; total latency; MiB = 2^20 bytes\n")
    lw = min(max([len("LABEL"), *(len(w.name) for w in windows)]), _LABEL_MAX)
    timed = any(loop_share(w.merged) is not None for w in shown)
    out.write(f"  {'LABEL':<{lw}} {'DUMPS':>5} {'SECONDS':>8}  {'FROM':<8}  {'TO':<8} {'ROWS':>5}"
              + (f" {'STEPS':>6} {'DATA WAIT':>9}" if timed else "") + "\n")
    for w in shown:
        m = w.merged
        share = loop_share(m)
        loop = "" if not timed else (f" {m.loop.steps:>6} {share:>8.1%}" if share is not None and m.loop
                                     else f" {'-':>6} {'-':>9}")
        out.write(f"  {w.name[:lw]:<{lw}} {w.dumps:>5} {duration_of(m):>8.1f}  {m.start:%H:%M:%S}  "
                  f"{m.end:%H:%M:%S} {len(rows_of(m.series, per_pid)):>5}{loop}\n")
    if timed:
        out.write("  STEPS, DATA WAIT: the training loop's batches in the window, and the share of its wall time "
                  "spent waiting for them\n")
    for w in empty_rest:
        out.write(f"  {UNLABELLED}: {w.dumps} dump(s) with no block I/O, not shown\n")
    for w in shown:
        if any(w.merged.dropped.values()):
            out.write(f"WARNING: {w.name}: events not recorded: {lost_text(w.merged.dropped)} "
                      f"(see README, 'Dropped events')\n")

    per_window = [rows_of(w.merged.series, per_pid) for w in shown]
    keys = list(dict.fromkeys(k for rows in per_window for k in rows))
    if not keys:
        out.write("  no block I/O completed\n")
        render_waits([(w.name, w.merged) for w in shown], out)
        return
    keys.sort(key=lambda k: (-sum(rows[k].count for rows in per_window if k in rows), tuple(map(str, k))))
    table = [[rows.get(k) for rows in per_window] for k in keys]
    if layout == "auto":
        layout = "wide" if _wide_width(len(shown), per_pid) <= WIDE_MAX else "long"
    if layout == "wide":
        _render_wide(shown, table, out, per_pid)
    else:
        _render_long(shown, table, out, per_pid)
    render_credits(windows, out)
    render_waits([(w.name, w.merged) for w in shown], out)


def render_credits(windows: list[Window], out: TextIO) -> None:
    """Per window, the write-back of the data it dirtied (WrittenBack): how much, by whom, and in which window
    and when it was written back.  The rows above keep write-back where it ran (with its latencies); this
    credits its bytes to the window that wrote them."""
    lines = []
    for w in windows:
        if w.merged.written_back is None:
            continue
        for c in w.merged.written_back.credits:
            where = window_name(c.written_in)
            when = f"{c.start[11:19]} - {c.end[11:19]}"
            during = ("in the same window" if c.written_in == w.label
                      else f"written back during {safe(where)}")
            lines.append(f"  {w.name} / {safe(c.comm)}: {fmt_size(c.bytes)} ({c.count} requests), {during} "
                         f"({when})\n")
    if not lines:
        return
    out.write("\nwrite-back credited to the window that dirtied the data (bytes only: its latencies are in the rows "
              "of the window it ran in, its write-back rows):\n")
    out.writelines(lines)


_KEY_COLUMNS = (("PID", ">7"), ("COMM", "<15"), ("DEVICE", "<9"), ("OP", "<10"))
_GROUP_COLUMNS = (("p50", "p50", ">7"), ("p99", "p99", ">7"), ("COUNT", "count", ">7"), ("MiB", "MiB", ">7"))
_GROUP_WIDTH = sum(int(spec[1:]) + 1 for _, _, spec in _GROUP_COLUMNS) - 1
_GROUP_GAP = "  "


def _key_columns(per_pid: bool) -> tuple[tuple[str, str], ...]:
    return _KEY_COLUMNS if per_pid else _KEY_COLUMNS[1:]


def _wide_width(n: int, per_pid: bool) -> int:
    keys = sum(int(spec[1:]) + 1 for _, spec in _key_columns(per_pid)) - 1
    return keys + n * (len(_GROUP_GAP) + _GROUP_WIDTH)


def _render_wide(windows: list[Window], table: list[list[Series | None]], out: TextIO, per_pid: bool) -> None:
    cols = _key_columns(per_pid)
    key_width = _wide_width(0, per_pid)
    out.write(" " * key_width + "".join(f"{_GROUP_GAP}{w.name[:_GROUP_WIDTH]:<{_GROUP_WIDTH}}" for w in windows)
              .rstrip() + "\n")
    group_head = " ".join(f"{name:{spec}}" for name, _, spec in _GROUP_COLUMNS)
    out.write(" ".join(f"{name:{spec}}" for name, spec in cols) + (_GROUP_GAP + group_head) * len(windows) + "\n")
    for cells in table:
        first = next(s for s in cells if s is not None)
        comm, op = PLAIN.comm_op(first.comm, first.op, first.wb)
        key = [str(first.pid), comm, safe(first.device)[:9], op][-len(cols):]
        line = " ".join(f"{c:{spec}}" for c, (_, spec) in zip(key, cols, strict=True))
        for s in cells:
            stats = row_stats(s)
            line += _GROUP_GAP + " ".join(f"{fmt_stat(k, stats[k]):{spec}}" for _, k, spec in _GROUP_COLUMNS)
        out.write(line.rstrip() + "\n")


def _render_long(windows: list[Window], table: list[list[Series | None]], out: TextIO, per_pid: bool) -> None:
    lw = min(max([12, *(len(w.name) for w in windows)]), _LABEL_MAX)
    head = "".join(f" {k:>8}" for k in ("COUNT", "MiB", *LATENCY_KEYS))
    out.write(f"\n{'ROW / LABEL':<{lw + 2}}{head}\n")
    for cells in table:
        first = next(s for s in cells if s is not None)
        out.write(row_text(first, per_pid) + "\n")
        for w, s in zip(windows, cells, strict=True):
            stats = row_stats(s)
            out.write(f"  {w.name[:lw]:<{lw}}" + "".join(f" {fmt_stat(k, stats[k]):>8}" for k in STAT_KEYS) + "\n")


# ---- waits per window and the verdict (tracer.views.verdict) -----------------------------

def judged(d: Dump) -> bool:
    """Whether a window has anything to judge: per-process rows or the loop's timing."""
    return d.tasks is not None or d.loop is not None


def _share(v: float | None) -> str:
    return "-" if v is None else f"{v:.1%}" if v < 10 else f"{v:.0%}"


def _secs(v: float) -> str:
    return f"{v:.2f}s" if v < 100 else f"{v:.0f}s"


_WAIT_COLUMNS = (("SECONDS", ">8"), ("DATA WAIT", ">9"), ("TRAINER IO", ">10"), ("LOADERS IO", ">10"),
                 ("READ", ">7"), ("HIT", ">6"), ("FSYNC", ">7"), ("THROTTLED", ">9"))


def wait_cells(v: Verdict) -> list[str]:
    """The waits table's cells of one window, after its label."""
    rows = v.processes > 0
    trainer = _share(v.trainer_io_wait if v.trainer_pid is not None else v.busiest_io_wait) if rows else "-"
    loaders = f"{_share(v.loader_io_wait)} x{v.loaders}" if v.loaders else "-"
    return [f"{v.wall_s:.1f}", _share(v.data_wait), trainer, loaders,
            fmt_size(v.read_bytes) if rows else "-", _share(v.cache_hit) if rows else "-",
            _secs(v.fsync_s) if rows else "-", _secs(v.throttled_s) if rows else "-"]


def render_waits(windows: list[tuple[str, Dump]], out: TextIO) -> None:
    """Per window (name, merged dump): data wait, I/O wait of the trainer and of its loaders, page-cache
    hits, fsync and throttled time; then one verdict line per window.  Nothing for windows that have
    neither per-process rows nor loop timing (a run with --no-tasks and no markers)."""
    judged_windows = [(safe(name), judge_dump(d)) for name, d in windows if judged(d)]
    if not judged_windows:
        return
    lw = min(max([len("LABEL"), *(len(n) for n, _ in judged_windows)]), _LABEL_MAX)
    out.write("\nwaits per window, as shares of its wall time:\n"
              "  DATA WAIT: the training loop waiting for batches; TRAINER IO: I/O wait of the trainer (the marker "
              "sender);\n  LOADERS IO: of its child processes, mean per loader (xN); I/O wait is summed over a "
              "process's threads,\n  so above 100% when several wait at once; READ: bytes read from files, HIT: "
              "the share the page cache served;\n  FSYNC, THROTTLED: time in fsync and in dirty-page throttling\n")
    out.write(f"  {'LABEL':<{lw}} " + " ".join(f"{n:{spec}}" for n, spec in _WAIT_COLUMNS) + "\n")
    for name, v in judged_windows:
        out.write(f"  {name[:lw]:<{lw}} " + " ".join(f"{c:{spec}}" for c, (_, spec) in
                                                      zip(wait_cells(v), _WAIT_COLUMNS, strict=True)) + "\n")
    out.write("verdict per window (the rule: README, 'Is the disk slowing training?'):\n")
    for name, v in judged_windows:
        out.write(f"  {name}: {safe(v.line)}\n")


def _tasks_line(d: Dump, out: TextIO) -> None:
    """One dump's per-process rows, summed up in a line (the verdict needs the whole window: see render_waits)."""
    if d.tasks is None:
        return
    v = judge_dump(d)
    if not v.processes:
        out.write("tasks: no traced process ran in this window\n")
        return
    who = (f"trainer {_share(v.trainer_io_wait)}" + (f", loaders {_share(v.loader_io_wait)} x{v.loaders}"
                                                     if v.loaders else "")
           if v.trainer_pid is not None else f"busiest of {v.processes} processes {_share(v.busiest_io_wait)}")
    hit = f" ({_share(v.cache_hit)} page-cache hits)" if v.cache_hit is not None else ""
    out.write(f"tasks: I/O wait {who} of {v.wall_s:.1f}s; files read {fmt_size(v.read_bytes)}{hit}; "
              f"fsync {_secs(v.fsync_s)}, throttled {_secs(v.throttled_s)}\n")


class LabelWindows:
    """A run's marker dumps merged per label as they come, for the end-of-run waits and verdicts.

    Bounded whatever the markers: at most MAX labels (later ones counted, not
    kept), and of each dump only what the verdict reads (its times, loop
    timing, sender and per-process rows: no series, files, drop counters or
    other sections, ~5 KB a label before).  A label's rows pass MAX_ROWS when
    its processes come and go (loaders started anew each epoch): the exited
    ones are then folded into one row per parent and name, so they still
    count as that parent's loaders, once per name (render says so).
    """

    MAX = 1000
    MAX_ROWS = 256

    def __init__(self) -> None:
        self.windows: dict[str, Dump] = {}
        self.skipped = 0
        self.folded: set[str] = set()      # labels whose exited rows were folded

    def add(self, d: Dump) -> None:
        name = window_label(d)      # as windows_by_label names it: the same windows, live and in report
        if name is None or not judged(d):
            return
        if name not in self.windows and len(self.windows) >= self.MAX:
            self.skipped += 1
            return
        light = Dump(kind=d.kind, label=name, start=d.start, end=d.end, host="", kernel="", series=[],
                     window_s=duration_of(d), tasks=d.tasks, tasks_sources=d.tasks_sources, loop=d.loop,
                     sender_pid=d.sender_pid, before_attach=d.before_attach)
        prev = self.windows.get(name)
        merged = merge_dumps([prev, light] if prev else [light], kind=d.kind, label=name)
        if merged.tasks is not None and len(merged.tasks.rows) > self.MAX_ROWS:
            merged.tasks = fold_exited(merged.tasks)
            self.folded.add(name)
        self.windows[name] = merged

    def render(self, out: TextIO) -> None:
        if not self.windows:
            return
        # in the order they began: a window folded around nested ones closes after them
        render_waits(sorted(self.windows.items(), key=lambda kv: kv[1].start), out)
        if self.folded:
            out.write(f"  ({len(self.folded)} window(s) had more than {self.MAX_ROWS} processes: their exited "
                      f"ones are summed per parent and name, each sum counted as one loader)\n")
        if self.skipped:
            out.write(f"  ({self.skipped} dump(s) of labels past the first {self.MAX} not shown)\n")


def fold_exited(tasks: Tasks) -> Tasks:
    """Exited processes' rows summed per (parent, name) under the group's lowest pid; live ones kept.

    Unlike Tasks.folded (pid 0, the parent forgotten), a group keeps its
    parent, so the verdict still finds it among the trainer's loaders.
    """
    live = [r for r in tasks.rows if not r.exited]
    groups: dict[tuple[int, str], TaskRow] = {}
    for r in sorted((r for r in tasks.rows if r.exited), key=lambda r: r.pid):
        acc = groups.get((r.ppid, r.comm))
        if acc is None:
            groups[(r.ppid, r.comm)] = replace(r)
        else:
            acc.add(r)
    return Tasks(sorted([*live, *groups.values()], key=lambda r: r.pid))
