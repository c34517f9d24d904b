"""--bio's rows on the Python side: the kernel's op bit (IOTRACE_OP_BIO) puts a row in Dump.submitted, apart
from the requests' series every count, rate and coverage is of; "submitted" in a dump's JSON line; merged
like the series; a table of its own.  No root, no BPF."""

from __future__ import annotations

import io

import pytest

from tracer.cli.trace import parse_trace_args
from tracer.codec import jsonl
from tracer.model.dump import merge_dumps
from tracer.pipeline.aggregate import Clock, build_dump
from tracer.views import report
from unit.test_report_views import dump, series
from unit.test_writeback import CON, WB, WRITE, raw

BIO = CON.const("OP_BIO")
READ = CON.ops.index("read")


def test_the_bio_bit_is_no_op_code_nor_the_write_back_mark_and_fits_the_histogram_key():
    assert BIO & (BIO - 1) == 0 and BIO > max(range(len(CON.ops))) and BIO | WB < 256 and BIO != WB
    assert "bio_walk" in [r.removeprefix("drop_") for r in CON.reasons]


def test_a_bio_row_goes_to_submitted_and_leaves_the_requests_alone():
    # 64 bios of 1 MiB split into 128 requests; and a flusher's bios of a dirtier, both marks at once
    d = build_dump(raw([(100, WRITE, 128, 64 << 20), (100, WRITE | BIO, 64, 64 << 20),
                        (100, WRITE | WB | BIO, 8, 8 << 20), (100, READ, 5, 5 << 12)]), Clock(), "final")
    assert [(s.op, s.wb, s.count) for s in d.series] == [("read", False, 5), ("write", False, 128)]
    assert [(s.op, s.wb, s.count, s.bytes) for s in d.submitted] == [("write", False, 64, 64 << 20),
                                                                        ("write", True, 8, 8 << 20)]
    assert all(s.comm == "python" and s.phases["total"].count == s.count for s in d.submitted)


def test_json_writes_submitted_only_when_there_are_rows_and_reads_it_back():
    plain = dump(None, 0, 1, [series(7, "fio", "loop0", "read", [100_000] * 2)])
    assert "submitted" not in jsonl.to_json(plain)
    plain.submitted = [series(7, "fio", "loop0", "read", [150_000] * 2)]
    obj = jsonl.to_json(plain)
    assert [(s["count"], s["latency_us"]["total"]["max"]) for s in obj["submitted"]] == [(2, 150.0)]
    back = jsonl.from_json(obj)
    assert [(s.pid, s.count, s.phases["total"].max_ns) for s in back.submitted] == [(7, 2, 150_000)]
    assert [s.count for s in back.series] == [2] and "submitted" not in back.unknown
    obj["submitted"] = {"not": "a list"}
    with pytest.raises(ValueError, match="submitted"):
        jsonl.from_json(obj)


def test_merges_add_submitted_rows_up_per_process():
    a, b = (dump(None, t, 1, [series(7, "fio", "loop0", "read", [100_000])]) for t in (0, 1))
    a.submitted = [series(7, "fio", "loop0", "read", [120_000] * 3)]
    b.submitted = [series(7, "fio", "loop0", "read", [130_000]), series(8, "dd", "loop0", "write", [1_000])]
    m = merge_dumps([a, b])
    assert sorted((s.pid, s.count) for s in m.submitted) == [(7, 4), (8, 1)]
    assert [s.count for s in m.series] == [2]


def test_the_table_shows_submitted_rows_under_their_own_heads():
    d = dump(None, 0, 1, [series(7, "fio", "loop0", "write", [100_000] * 4)])
    out = io.StringIO()
    report.render_table(d, out)
    assert "as submitted" not in out.getvalue()
    d.submitted = [series(7, "fio", "loop0", "write", [250_000] * 2)]
    for hist, heads in ((False, ("WAIT p50", "IN-RQ p99")), (True, ("W:p50", "R:p99"))):
        out = io.StringIO()
        report.render_table(d, out, hist=hist)
        text = out.getvalue()
        assert "as submitted (--bio)" in text and all(h in text for h in heads), text
        bio_row = text.splitlines()[text.splitlines().index(next(ln for ln in text.splitlines()
                                                                  if "as submitted" in ln)) + 2]
        assert bio_row.split()[:5] == ["7", "fio", "loop0", "write", "2"], text


@pytest.mark.parametrize("argv, want", [([], False), (["--bio"], True)])
def test_bio_is_a_trace_option(argv, want):
    assert parse_trace_args(argv).bio is want
