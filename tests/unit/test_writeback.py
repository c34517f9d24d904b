"""Write-back rows on the Python side: the kernel's op bit (IOTRACE_OP_WB) becomes Series.wb, a row of its
own through the merges, "wb": true in a dump's JSON line, "write-back" in the
tables ("(wb)" with --hist).  No root, no BPF."""

from __future__ import annotations

import io
from dataclasses import replace

import numpy as np
import pytest

from tracer import contract
from tracer.codec import jsonl
from tracer.model.dump import fold_by_comm, merge_by_device_op, merge_dumps, merge_series
from tracer.pipeline.aggregate import Clock, build_dump
from tracer.sources.probe import RawInterval
from tracer.views import report, top
from unit.test_report_views import dump, series

CON = contract.load()
WB = CON.const("OP_WB")
WRITE = CON.ops.index("write")
LOOP0 = 7 << 20     # the kernel's dev_t of 7:0

SERIES_KEY = np.dtype([("pid", "u4"), ("dev", "u4"), ("op", "u4")])
SERIES_VAL = np.dtype([("count", "u8"), ("bytes", "u8"), ("sum_ns", "u8", 3), ("min_ns", "u8", 3),
                       ("max_ns", "u8", 3), ("phase_count", "u8", 3), ("cgroup", "u8"), ("tgid", "u4"),
                       ("pad", "u4"), ("comm", "S16")])
HIST_KEY = np.dtype([("pid", "u4"), ("dev", "u4"), ("bucket", "u2"), ("op", "u1"), ("phase", "u1")])


def raw(rows: list[tuple[int, int, int, int]]) -> RawInterval:
    """An interval of (pid, op code, requests, bytes) rows on loop0, each request 100 us in total."""
    keys = np.zeros(len(rows), SERIES_KEY)
    vals = np.zeros(len(rows), SERIES_VAL)
    hkeys = np.zeros(len(rows), HIST_KEY)
    total = CON.phases.index("total")
    for i, (pid, op, n, nbytes) in enumerate(rows):
        keys[i] = (pid, LOOP0, op)
        vals[i]["count"], vals[i]["bytes"], vals[i]["tgid"], vals[i]["cgroup"] = n, nbytes, pid, 42
        vals[i]["comm"] = b"python"
        vals[i]["phase_count"][total], vals[i]["sum_ns"][total] = n, n * 100_000
        vals[i]["min_ns"][total] = vals[i]["max_ns"][total] = 100_000
        hkeys[i] = (pid, LOOP0, 0, op, total)
    return RawInterval(start_ns=0, end_ns=1_000_000_000, series_keys=keys, series_vals=vals,
                       hist_keys=hkeys, hist_counts=np.array([n for _, _, n, _ in rows], np.uint64),
                       reasons={}, attach="raw_tp")


def test_the_write_back_bit_is_no_op_code_and_fits_the_histogram_key():
    assert WB & (WB - 1) == 0 and WB > max(range(len(CON.ops))) and WB < 256     # hist key's op is a u8
    assert "wb_unkept" in [r.removeprefix("note_") for r in CON.reasons]


def test_a_write_back_series_is_a_row_of_its_own_beside_the_direct_one():
    d = build_dump(raw([(100, WRITE, 4, 4 << 20), (100, WRITE | WB, 64, 64 << 20)]), Clock(), "final")
    rows = sorted(d.series, key=lambda s: s.wb)
    assert [(s.pid, s.op, s.wb, s.count, s.bytes) for s in rows] == [
        (100, "write", False, 4, 4 << 20), (100, "write", True, 64, 64 << 20)]
    # each its own histogram: the op bit is part of the histogram key
    assert [s.phases["total"].count for s in rows] == [4, 64]
    assert all(s.comm == "python" and s.cgroup_id == 42 for s in rows)


def test_json_says_wb_only_on_write_back_rows_and_reads_it_back():
    direct = series(7, "python", "loop0", "write", [100_000] * 2)
    wb = replace(series(7, "python", "loop0", "write", [200_000] * 3), wb=True)
    obj = jsonl.to_json(dump(None, 0, 1, [direct, wb]))
    assert [s.get("wb") for s in obj["series"]] == [None, True]
    back = jsonl.from_json(obj)
    assert [(s.wb, s.count) for s in back.series] == [(False, 2), (True, 3)]
    obj["series"][1]["wb"] = "yes"
    with pytest.raises(ValueError, match="wb"):
        jsonl.from_json(obj)


def test_merges_keep_write_back_apart_except_per_device():
    a = series(7, "python", "loop0", "write", [100_000] * 2)
    b = replace(series(7, "python", "loop0", "write", [200_000] * 3), wb=True)
    c = replace(series(8, "python", "loop0", "write", [300_000]), wb=True)
    assert sorted((s.pid, s.wb, s.count) for s in merge_series([a, b, a, b])) == [(7, False, 4), (7, True, 6)]
    assert sorted((s.pid, s.wb, s.count) for s in fold_by_comm([a, b, c])) == [(0, True, 4), (7, False, 2)]
    assert [(s.count, s.wb) for s in merge_by_device_op([a, b, c])] == [(6, False)]
    merged = merge_dumps([dump(None, 0, 1, [a, b]), dump(None, 1, 1, [b])])
    assert sorted((s.wb, s.count) for s in merged.series) == [(False, 2), (True, 6)]
    assert sorted(k[-1] for k in report.rows_of([a, b])) == [False, True]


def test_tables_mark_write_back_rows():
    """Plain words by default (the OP cell says "write-back", the name is kept whole); --hist's "(wb)"."""
    from tracer.views.words import JARGON

    wb = replace(series(7, "a-very-long-comm", "loop0", "write", [100_000]), wb=True)
    direct = series(7, "a-very-long-comm", "loop0", "write", [100_000])
    assert report.series_row(wb, 1.0)[1:4] == ["a-very-long-com", "loop0", "write-back"]
    assert report.series_row(direct, 1.0)[1:4] == ["a-very-long-com", "loop0", "write"]
    assert report.series_row(wb, 1.0, JARGON)[1:4] == ["a-very-lon (wb)", "loop0", "write"]
    assert report.row_text(wb) == "a-very-long-comm  loop0  write-back"
    d = dump(None, 0, 1, [wb, direct])
    cells = sorted(tuple(r.cells()[1:4:2]) for r in top.top_rows(d))
    assert cells == [("a-very-long-com", "write"), ("a-very-long-com", "write-back")]
    plain, hist = io.StringIO(), io.StringIO()
    report.render_table(d, plain)
    report.render_table(d, hist, hist=True)
    assert " write-back " in plain.getvalue() and "(wb)" not in plain.getvalue()
    assert "a-very-lon (wb)" in hist.getvalue() and "write-back" not in hist.getvalue()


def test_the_perf_event_path_checks_the_writeback_events_in_their_own_category(monkeypatch):
    from tracer.errors import UserError
    from tracer.sources import probe

    asked = []

    def fields(event, category="block"):
        asked.append((category, event))
        return None if event == "writeback_single_inode_start" else {"name", "ino", "dev", "sector", "bytes",
                                                                      "rwbs", "nr_sector"}

    monkeypatch.setattr(probe, "tracefs", lambda: probe.Path("/sys/kernel/tracing"))
    monkeypatch.setattr(probe, "tracepoint_fields", fields)
    with pytest.raises(UserError, match="tracepoint writeback:writeback_single_inode_start is missing"):
        probe.check_tracepoints()
    assert ("writeback", "writeback_dirty_folio") in asked and ("block", "block_rq_issue") in asked
