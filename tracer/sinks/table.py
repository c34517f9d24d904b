"""The terminal table: each window as it closes; at the end the whole run, and per label the waits and
the verdict (is the disk slowing training?), in trace and diskstats modes."""

from __future__ import annotations

from typing import TextIO

# Rows kept in the whole-run summary before rows of the same command are folded together.
MAX_RUN_ROWS = 2000


def add_arguments(p, mode: str) -> None:
    if mode == "trace":
        p.add_argument("--hist", action="store_true", help="add a log2 latency bar chart per row")


class TableSink:
    """Tables on `out`: one per window; at close, the whole run's when there was more than one window.

    The whole run is merged as it goes (a long run keeps one dump, not all
    of them); --diskstats windows take the whole run from `whole()`.
    """

    what = "stdout (the table)"     # names this output in a write error's line (tracer.runtime.loop.Sinks)

    def __init__(self, out: TextIO, hist: bool = False, whole=None, files: int = 10):
        self.out = out
        self.files = files      # rows of the files table at the end
        self.hist = hist
        self.whole = whole
        self.windows = 0
        self.total = None
        self.labels = None      # tracer.views.report.LabelWindows: marker dumps per label, for waits and verdicts

    def on_dump(self, window) -> None:
        self.windows += 1
        if window.disks is not None:        # a --diskstats window
            from tracer.views.diskstats import render

            render(window, self.out)
            self.out.flush()
            return
        from tracer.model import dump as dumpmod
        from tracer.views.report import LabelWindows, render_table

        # the final window of a run with marker windows before it, when it holds nothing (the instant between
        # the last marker and the exit): the whole run's table follows; an interval run's final is one of its
        # `count` reports, always shown
        marked = self.labels is not None and bool(self.labels.windows)
        if not (marked and window.kind == "final" and not window.series and not window.lost):
            render_table(window, self.out, hist=self.hist)
            self.out.flush()
        if self.labels is None:
            self.labels = LabelWindows()
        self.labels.add(window)
        self.total = window if self.total is None else dumpmod.merge_dumps([self.total, window], whole=True)
        # processes come and go on a long run: keep their sums, not a row per pid
        if len(self.total.series) > MAX_RUN_ROWS:
            self.total.series = dumpmod.fold_by_comm(self.total.series)
        if self.total.tasks is not None and len(self.total.tasks.rows) > MAX_RUN_ROWS:
            self.total.tasks = self.total.tasks.folded()
        if self.total.files is not None and len(self.total.files.rows) > MAX_RUN_ROWS:
            from tracer.model.files import Files, bounded

            self.total.files = Files(bounded(self.total.files.rows, MAX_RUN_ROWS // 2))

    def close(self, status: int) -> int:
        if self.windows > 1:
            if self.whole is not None:
                from tracer.views.diskstats import render

                render(self.whole(), self.out, title="diskstats run")
            elif self.total is not None:
                from tracer.views.report import render_table

                render_table(self.total, self.out, title="whole run")
                self.labels.render(self.out)       # per label: the waits and one verdict line each
        if self.total is not None and self.total.files is not None:
            from tracer.views.files import render_files

            render_files(self.total, self.out, rows=self.files)
        return status


def from_args(ns, ctx) -> TableSink | None:
    if ctx.mode not in ("trace", "diskstats") or getattr(ns, "json", False):
        return None
    from tracer.views.files import DEFAULT_ROWS

    rows = min(DEFAULT_ROWS, getattr(ns, "files", DEFAULT_ROWS))
    return TableSink(ctx.out, getattr(ns, "hist", False), ctx.whole, rows)
