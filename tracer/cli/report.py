"""`iotrace report FILE.jsonl...`: saved dumps rendered again, merged or side by side by label (no root)."""

from __future__ import annotations

import argparse
import select
import signal
import sys
from typing import TextIO

from tracer.codec import jsonl
from tracer.errors import UserError
from tracer.model import dump as dumpmod
from tracer.options import Parser, at_least
from tracer.osutil import open_output
from tracer.runtime.signals import Signals
from tracer.sinks import hlog
from tracer.sinks.table import MAX_RUN_ROWS
from tracer.views.diskstats import render_dump
from tracer.views.report import render_windows, windows_by_label

REPORT_EPILOG = """\
examples:
  iotrace report run.jsonl                  the whole run: every dump merged
  iotrace report run.jsonl --by label       epochs side by side: count, MiB, p50, p99 per label
  iotrace report --follow run.jsonl         each dump as the tracer appends it (tail -f), until Ctrl-C
  iotrace report run.jsonl --by file        the top files by bytes read from disk + written
  iotrace report run.jsonl --json | jq .    the merged dump as one JSON line (--by label: one per window)

With --by label, dumps that share a label are merged into one window, shown
in the order the labels first appear; rows are process name + device + op
(kworker/* gathers the kernel's writeback workers), so a row lines up across
windows even when the process behind it was restarted.  Dumps without a label
(the final stretch after the last marker, interval dumps) are one window,
"(unlabelled)", shown last, or left out with a note when they saw no I/O.

A file whose last line is cut short (the tracer is still writing it, or was
killed mid-write) is read up to it, with a warning; a bad line anywhere else
is an error naming it.
"""


def run(argv: list[str], out: TextIO = sys.stdout) -> int:
    p = Parser(prog="iotrace report", formatter_class=argparse.RawDescriptionHelpFormatter,
                description="Render saved iotrace dumps as one table, merging every "
                "dump of every file through their HdrHistograms.", epilog=REPORT_EPILOG)
    p.add_argument("files", nargs="+", metavar="FILE.jsonl")
    p.add_argument("--hist", action="store_true", help="add a log2 latency bar chart per row")
    p.add_argument("--by", choices=("none", "label", "file"), default="none",
                   help="label: one window per dump label (epoch 1, epoch 2, ...), side by side; file: the "
                        "whole run's files, top by bytes moved (read from disk + written)")
    p.add_argument("--files", type=at_least(0), default=20, metavar="N", dest="top_files",
                   help="with --by file: rows shown (default 20)")
    p.add_argument("--layout", choices=("auto", "wide", "long"), default="auto",
                   help="with --by label: wide = a column group per label, long = a line per label; "
                        "auto = wide while it fits in 120 columns")
    p.add_argument("--per-pid", action="store_true",
                   help="with --by label: a row per pid instead of per process name")
    p.add_argument("-f", "--follow", action="store_true",
                   help="render each dump as it is appended to FILE (tail -f), until Ctrl-C")
    p.add_argument("-j", "--json", action="store_true",
                   help="JSON lines instead of tables, in the dump format: the merged dump, one per window "
                        "with --by label, each dump with --follow")
    p.add_argument("--hlog", metavar="FILE",
                   help="also write the dumps read as an HdrHistogram interval log: one interval per dump, "
                        "series and phase, tagged pid:comm:device:op:phase")
    ns = p.parse_args(argv)
    if ns.by == "label" and ns.hist:
        raise UserError("--hist goes with the merged table, not with --by label")
    if ns.follow:
        if ns.hlog:
            raise UserError("--hlog writes the dumps of a finished run, not with --follow")
        if len(ns.files) > 1 or ns.by == "label":
            raise UserError("--follow takes one file, and renders each dump (no --by label)")
        return _follow(ns.files[0], out, ns.hist, ns.json)
    # the files are read as a stream and each dump merged as it comes: memory is bounded by the merged
    # rows shown, not by the files
    dumps = (d for path in ns.files for d in jsonl.read(path))
    if ns.hlog:
        with open_output(ns.hlog, "w") as f:
            return _report(ns, hlog.tee(dumps, hlog.HlogWriter(f)), out)
    return _report(ns, dumps, out)


def _report(ns: argparse.Namespace, dumps, out: TextIO) -> int:
    if ns.by == "label":
        windows = windows_by_label(dumps)
        if not windows:
            raise UserError(f"no dumps in {', '.join(ns.files)}")
        if ns.json:
            for w in windows:
                jsonl.write(out, w.merged)
            return 0
        render_windows(windows, out, layout=ns.layout, per_pid=ns.per_pid,
                       title=f"by label, from {', '.join(ns.files)}")
        return 0
    # bounded as the live whole-run table is: past MAX_RUN_ROWS series, rows fold per command (said below)
    acc = dumpmod.DumpMerger(max_rows=MAX_RUN_ROWS, whole=True)
    for d in dumps:
        acc.add(d)
    if not acc.count:
        raise UserError(f"no dumps in {', '.join(ns.files)}")
    merged = acc.result()
    if acc.folded:
        print(f"iotrace report: more than {MAX_RUN_ROWS} series ({acc.folded} when folded): the rows of each "
              "command are merged into one (pid 0)", file=sys.stderr)
    if ns.json:
        jsonl.write(out, merged)
        return 0
    if ns.by == "file":
        from tracer.views.files import render_files

        if merged.files is None:
            raise UserError(f"no file rows in {', '.join(ns.files)} (traced before iotrace had them, or with "
                            "--attach tracepoint)")
        render_files(merged, out, rows=max(ns.top_files, 0), title=f"files of {acc.count} dump(s)")
        return 0
    render_dump(merged, out, hist=ns.hist, title=f"{acc.count} dump(s) from {', '.join(ns.files)}")
    return 0


def _follow(path: str, out: TextIO, hist: bool, as_json: bool) -> int:
    """Each dump of `path` as it is appended, until SIGINT or SIGTERM (exit 0)."""
    sig = Signals()

    def stop(wait: float) -> bool:
        select.select([sig.r], [], [], 0 if sig.pending else wait)
        return any(s != signal.SIGUSR1 for s in sig.take())

    try:
        for d in jsonl.read(path, follow=stop):
            if as_json:
                jsonl.write(out, d)
            else:
                render_dump(d, out, hist=hist)
                out.flush()
    finally:
        sig.restore()
    return 0

