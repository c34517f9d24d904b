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
from tracer.model.dump import Dirtied, Series, fold_by_comm, merge_by_device_op, merge_dumps, merge_series
from tracer.model.sections import WindowSeq
from tracer.pipeline.aggregate import Clock, WindowNames, build_dump, full_window
from tracer.sources.probe import RawInterval
from tracer.views import report, top
from unit.test_report_views import T0, dump, series

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
    assert ("writeback", "writeback_single_inode_start") in asked and ("block", "block_rq_issue") in asked
    assert probe.dirty_event() == "writeback_dirty_folio" and ("writeback", "writeback_dirty_folio") in asked


@pytest.mark.parametrize(("kernel_has", "chosen"), [
    ({"writeback_dirty_folio", "writeback_dirty_page"}, "writeback_dirty_folio"),
    ({"writeback_dirty_page"}, "writeback_dirty_page"),     # before Linux 5.17 (Debian 11's 5.10)
    (set(), None),
])
def test_the_perf_event_path_takes_the_page_dirtied_event_this_kernel_has(monkeypatch, kernel_has, chosen):
    from tracer.errors import UserError
    from tracer.sources import probe

    def fields(event, category="block"):
        if event.startswith("writeback_dirty_") and event not in kernel_has:
            return None
        return {"name", "ino", "dev", "sector", "bytes", "rwbs", "nr_sector", "nr_to_write", "wrote"}

    monkeypatch.setattr(probe, "tracefs", lambda: probe.Path("/sys/kernel/tracing"))
    monkeypatch.setattr(probe, "tracepoint_fields", fields)
    monkeypatch.setattr(probe, "choose_start_event", lambda: "block_io_start")
    monkeypatch.setattr(probe.bpfobject, "has_cmpxchg", lambda: True)
    monkeypatch.setattr(probe.bpfobject, "has_ancestor_cgroup", lambda: True)
    if chosen is None:
        with pytest.raises(UserError, match="tracepoint writeback:writeback_dirty_folio is missing"):
            probe.check_perf_events(bio=False)
        return
    assert probe.dirty_event() == chosen and probe.check_perf_events(bio=False) == "block_io_start"
    flags = probe.compile_flags(probe.ProbeOptions(), None, False, "block_io_start", [0, 1])
    assert ("-DIOTRACE_DIRTY_PAGE" in flags) == (chosen == "writeback_dirty_page")


# ---- write-back in the window that dirtied it -------------------------------------------------------

SHIFT, BITS, CODE = CON.const("OP_WINDOW_SHIFT"), CON.const("OP_WINDOW_BITS"), CON.const("OP_CODE_MASK")


def windowed(window: int, rows: list[tuple[int, int, int, int, int]]) -> RawInterval:
    """Window `window` with (pid, op code, dirtying window, requests, bytes) rows on loop0, as the kernel splits
    write-back by its dirtying window in the series key's op but not in the histogram's (a u8).  A row's requests
    take (window + 1) * 100 us each: rows of one series differ in min, max and sum."""
    keys = np.zeros(len(rows), SERIES_KEY)
    vals = np.zeros(len(rows), SERIES_VAL)
    total = CON.phases.index("total")
    hist: dict[tuple, int] = {}
    for i, (pid, op, win, n, nbytes) in enumerate(rows):
        keys[i] = (pid, LOOP0, op | (win << SHIFT))
        ns = (win + 1) * 100_000
        vals[i]["count"], vals[i]["bytes"], vals[i]["tgid"], vals[i]["cgroup"] = n, nbytes, pid, 42
        vals[i]["comm"] = b"python"
        vals[i]["phase_count"][total], vals[i]["sum_ns"][total] = n, n * ns
        vals[i]["min_ns"][total] = vals[i]["max_ns"][total] = ns
        hist[(pid, op & CODE)] = hist.get((pid, op & CODE), 0) + n
    hkeys = np.zeros(len(hist), HIST_KEY)
    for i, (pid, op) in enumerate(hist):
        hkeys[i] = (pid, LOOP0, 0, op, total)
    return RawInterval(start_ns=0, end_ns=1_000_000_000, series_keys=keys, series_vals=vals, hist_keys=hkeys,
                       hist_counts=np.array(list(hist.values()), np.uint64), reasons={}, attach="raw_tp",
                       window=window)


def test_the_dirtying_window_sits_above_the_op_code_and_its_mark():
    assert SHIFT == 8 and CODE == 0xFF and WB & CODE == WB and SHIFT + BITS == 32   # the series key's op is a u32
    assert max(range(len(CON.ops))) | WB <= CODE


def test_write_back_of_several_windows_is_one_row_with_its_bytes_split_by_the_window_that_dirtied_them():
    names = WindowNames()
    t1 = Clock().wall(0)
    names.add(2, "epoch 1", t1)
    d = build_dump(windowed(4, [(100, WRITE | WB, 2, 28, 32 << 20), (100, WRITE | WB, 4, 5, 5 << 20),
                                (100, WRITE, 0, 3, 3 << 20)]), Clock(), "marker", label="epoch 2", windows=names)
    assert d.window_seq.seq == 4
    wb = [s for s in d.series if s.wb]
    direct = [s for s in d.series if not s.wb]
    assert len(wb) == 1 and len(direct) == 1 and direct[0].dirtied == ()
    row = wb[0]
    assert (row.op, row.count, row.bytes) == ("write", 33, 37 << 20)
    # latency: the window's own, all of it in one row (one histogram), min / max / sum over both parts
    total = row.phases["total"]
    assert (total.count, total.min_ns, total.max_ns, total.sum_ns) == (33, 300_000, 500_000,
                                                                      28 * 300_000 + 5 * 500_000)
    assert [(e.window, e.label, e.count, e.bytes) for e in row.dirtied] == [
        (2, "epoch 1", 28, 32 << 20), (4, "epoch 2", 5, 5 << 20)]
    assert row.dirtied[0].start == t1


def test_a_window_no_longer_known_is_named_by_its_number():
    d = build_dump(windowed(9, [(1, WRITE | WB, 3, 1, 4096)]), Clock(), "interval", windows=WindowNames())
    assert [(e.window, e.label, e.start) for e in d.series[0].dirtied] == [(3, None, None)]
    assert report.dirtied_name(d.series[0].dirtied[0]) == "window 3"
    names = WindowNames()
    names.MAX = 2
    for seq in (1, 2, 3):
        names.add(seq, f"w{seq}", Clock().wall(0))
    assert names.get(1) == (None, None) and names.get(3)[0] == "w3"


def test_the_window_number_is_told_back_from_its_low_bits_across_the_wrap():
    assert full_window(5, 3, BITS) == 3 and full_window(5, 5, BITS) == 5
    top = (1 << BITS) - 1
    assert full_window((1 << BITS) + 1, top, BITS) == top            # dirtied just before the wrap
    assert full_window((1 << BITS) + 1, 1, BITS) == (1 << BITS) + 1   # the current one, past it
    assert full_window(7, 0, BITS) == 0 and full_window(0, 6, BITS) == 6


def wb_row(dirtied: list[Dirtied], comm: str = "python") -> Series:
    s = replace(series(7, comm, "loop0", "write", [200_000] * sum(e.count for e in dirtied)), wb=True,
                dirtied=tuple(dirtied))
    return replace(s, bytes=sum(e.bytes for e in dirtied))


E1 = Dirtied(2, "epoch 1", T0, 28, 32 << 20)
E2 = Dirtied(4, "epoch 2", T0, 5, 5 << 20)


def test_dirtied_entries_go_through_the_json_line_and_an_older_line_has_none():
    d = dump("epoch 2", 1, 1, [wb_row([E1, E2])])
    d.window_seq = WindowSeq(4)
    obj = jsonl.to_json(d)
    assert obj["window_seq"] == 4
    assert obj["series"][0]["dirtied"][0] == {"window_seq": 2, "label": "epoch 1", "start": T0.isoformat(),
                                              "count": 28, "bytes": 32 << 20}
    back = jsonl.from_json(obj)
    assert back.series[0].dirtied == (E1, E2) and back.window_seq == WindowSeq(4)
    old = jsonl.to_json(dump(None, 0, 1, [replace(wb_row([E1]), dirtied=())]))
    assert "dirtied" not in old["series"][0] and jsonl.from_json(old).series[0].dirtied == ()
    for bad in ([{"window_seq": -1, "label": None, "count": 1, "bytes": 1}], [{"label": "x"}], "epoch 1",
                [{"window_seq": 1, "label": 3, "count": 1, "bytes": 1}]):
        obj["series"][0]["dirtied"] = bad
        with pytest.raises((ValueError, KeyError, TypeError)):
            jsonl.from_json(obj)


def test_merges_add_dirtied_entries_up_per_window():
    merged = merge_series([wb_row([E1]), wb_row([E1, E2])])
    assert [(e.window, e.count, e.bytes) for e in merged[0].dirtied] == [(2, 56, 64 << 20), (4, 5, 5 << 20)]
    whole = merge_dumps([dump("epoch 2", 1, 1, [wb_row([E1])]), dump("epoch 3", 2, 1, [wb_row([E2])])])
    assert [e.window for e in whole.series[0].dirtied] == [2, 4]


def test_the_table_says_whose_window_the_write_back_was():
    d = dump("epoch 2", 1, 1, [wb_row([E1, E2])])
    d.window_seq = WindowSeq(4)
    out = io.StringIO()
    report.render_table(d, out)
    line = [ln for ln in out.getvalue().splitlines() if ln.startswith("  7 python:")]
    assert line == [f"  7 python: 32.0MiB of 'epoch 1' (began {T0:%H:%M:%S}); 5.0MiB of this window"], \
        out.getvalue()


def test_report_by_label_credits_the_bytes_to_the_window_that_dirtied_them():
    e1 = dump("epoch 1", 0, 1, [series(7, "python", "loop0", "read", [100_000] * 4)])
    e2 = dump("epoch 2", 1, 1, [])
    e3 = dump("epoch 3", 2, 1, [wb_row([E1, replace(E2, window=6, label="epoch 3")])])
    windows = report.windows_by_label(iter([e1, e2, e3]))
    by = {w.label: w for w in windows}
    assert by["epoch 2"].merged.written_back is None
    (c,) = by["epoch 1"].merged.written_back.credits
    assert (c.comm, c.written_in, c.count, c.bytes) == ("python", "epoch 3", 28, 32 << 20)
    # the rows keep the write-back where it ran: epoch 3's table has it, with its latencies
    assert [s.wb for s in by["epoch 3"].merged.series] == [True] and not any(s.wb for s in by["epoch 1"].merged.series)
    out = io.StringIO()
    report.render_windows(windows, out)
    text = out.getvalue()
    assert "  epoch 1 / python: 32.0MiB (28 requests), written back during epoch 3 (08:00:02 - 08:00:03)" in text
    assert "  epoch 3 / python: 5.0MiB (5 requests), in the same window" in text
    # and --json carries it on the merged window
    assert jsonl.to_json(by["epoch 1"].merged)["written_back"][0]["written_in"] == "epoch 3"


def test_diff_compares_the_write_back_each_labelled_side_dirtied(tmp_path):
    from tracer.views import diff

    path = tmp_path / "run.jsonl"
    with open(path, "w") as f:
        for d in (dump("epoch 1", 0, 1, []), dump("epoch 2", 1, 1, []), dump("epoch 3", 2, 1, [wb_row([E1])])):
            jsonl.write(f, d)
    a, b = diff.load_sides([("A", str(path), "epoch 1"), ("B", str(path), "epoch 2")])
    assert diff.credited(a) == {"python": 32 << 20} and diff.credited(b) == {}
    out = io.StringIO()
    diff.render_diff(a, b, out)
    assert [ln for ln in out.getvalue().splitlines() if ln.startswith("  python ")] == [
        f"{'  python':<36} {'32.00':>9} {'0.00':>9} {'-32.00':>9}"]
    assert diff.diff_json(a, b)["written_back"] == {"a": {"python": 32 << 20}, "b": {}}
