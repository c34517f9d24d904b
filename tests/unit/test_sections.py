"""The dump's typed sections (tracer.model.sections): one table, each section round-trips, merges, refuses bad
values; files written by main before the sections were typed read and write back unchanged."""

from __future__ import annotations

import io
import json
from dataclasses import fields
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from tracer.cli import report as reportcli
from tracer.codec import jsonl
from tracer.model.dump import Dump, merge_dumps
from tracer.model.files import FileRow
from tracer.model.sections import BY_KEY, SECTIONS, Section

DATA = Path(__file__).parent / "data"
T0 = datetime(2026, 5, 4, 10, 0, 0, tzinfo=UTC)

ROW = {"pid": 7, "ppid": 1, "comm": "python", "io_wait_s": 0.25, "io_waits": 3, "read_bytes": 8192, "reads": 2,
       "disk_read_bytes": 4096, "fsync_s": 0.125, "fsyncs": 1, "throttled_s": 0.0, "throttles": 0, "started": True,
       "exited": False}


def frow(**kw) -> dict:
    """A files row as a line holds it (its p50_us and p99_us computed from its hist)."""
    base = {"dev": "7:0", "ino": 12, "path": "/mnt/a", "pid": 7, "comm": "python", "cache_read_bytes": 8192,
            "disk_read_bytes": 4096, "written_bytes": 0, "requests": 1}
    base.update(kw)
    hist = {b: n for b, n in base.pop("hist", [[60, 1]])}
    return FileRow(**base, hist=hist).to_json()


# key: (a value as a line holds it, another, the two merged: None when a merged dump has none of it)
TABLE = {
    "attach": ("raw_tp", "tracepoint", "raw_tp+tracepoint"),
    "start_event": ({"event": "block_rq_insert", "blind": ["nvme0n1"]}, {"event": "block_rq_insert"},
                    {"event": "block_rq_insert", "blind": ["nvme0n1"]}),
    "coverage": ({"filtered": False, "devices": {"sda": {"recorded": 9, "diskstats": 10}}},
                 {"filtered": True, "devices": {"sda": {"recorded": 1, "diskstats": 1},
                                                "sdb": {"recorded": 2, "diskstats": 3}}},
                 {"filtered": True, "devices": {"sda": {"recorded": 10, "diskstats": 11},
                                                "sdb": {"recorded": 2, "diskstats": 3}}}),
    "bio_devices": (["dm-1"], ["dm-0", "dm-1"], ["dm-0", "dm-1"]),
    "tasks": ([ROW], [dict(ROW, comm="py2", io_wait_s=0.5, started=False, exited=True), dict(ROW, pid=3, ppid=7)],
              [dict(ROW, pid=3, ppid=7),
               dict(ROW, comm="py2", io_wait_s=0.75, io_waits=6, read_bytes=16384, reads=4, disk_read_bytes=8192,
                    fsync_s=0.25, fsyncs=2, exited=True)]),
    "files": ([frow()], [frow(written_bytes=100, requests=2, hist=[[60, 1], [70, 1]]),
                         frow(path="(other files)", dev="", ino=0, pid=0, comm="", files=3, cache_read_bytes=None)],
              [frow(written_bytes=100, requests=3, cache_read_bytes=16384, disk_read_bytes=8192,
                    hist=[[60, 2], [70, 1]]),
               frow(path="(other files)", dev="", ino=0, pid=0, comm="", files=3, cache_read_bytes=None)]),
    "unavailable": ({"start": "no block:block_io_start (Linux 6.5+): requests start at block:block_getrq"},
                    {"start": "no block:block_io_start (Linux 6.5+): requests start at block:block_getrq"},
                    {"start": "no block:block_io_start (Linux 6.5+): requests start at block:block_getrq"}),
    "tasks_sources": ({"reads": "filemap:mm_filemap_get_pages", "fsync": "unavailable: no ext4"},
                      {"reads": "syscalls:read (raw sys_enter/sys_exit)"}, None),     # two runs' sources: none
    "enclosing": ("epoch 1", "epoch 1", "epoch 1"),
    "loop": ({"data_wait_s": 0.5, "steps": 10, "wall_s": 2.0}, {"data_wait_s": 0.25, "steps": 6, "wall_s": 1.0},
             {"data_wait_s": 0.75, "steps": 16, "wall_s": 3.0}),
    "sender_pid": (100, 101, None),     # two senders: none is the merged window's
    "owner": ({"pid": 100, "rank": 0}, {"pid": 101, "rank": 1}, None),     # two ranks: no one owns the merge
    "before_attach": ({"by_s": 12.5}, {"by_s": None}, {"by_s": 12.5}),    # the longest known
    "bpf_programs": ({"block_rq_issue": {"runs": 4, "run_time_ns": 100, "missed": 0}},
                     {"block_rq_issue": {"runs": 1, "run_time_ns": 9, "missed": 0}}, None),
    "traced_pids": (3, 4, None),
    "unwritten_at_exit": ({"bytes": 33554432, "waited_s": 0.0, "ended": "not waited"},
                          {"bytes": 0, "waited_s": 4.25, "ended": "written"}, None),   # one run's end: not merged
    "alerts": ([{"rule": "p99>1ms", "metric": "total.p99", "device": "sda", "op": "read", "value": 1500.0,
                 "threshold": 1000.0, "unit": "us"}], [], None),
    "verdict": ({"state": "I/O-bound", "line": "I/O-bound: ..."}, {"state": "no verdict", "line": "..."}, None),
    "window_seq": (2, 3, None),     # a merge of windows is none of them
    "written_back": ([{"comm": "python", "written_in": "epoch 3", "count": 28, "bytes": 1 << 25,
                       "start": "2026-01-01T08:00:00+00:00", "end": "2026-01-01T08:00:01+00:00"}],
                     [{"comm": "python", "written_in": None, "count": 1, "bytes": 4096,
                       "start": "2026-01-01T08:00:00+00:00", "end": "2026-01-01T08:00:01+00:00"}], None),
}

# key: values a hand-edited line may hold that its section refuses (ValueError: that line's error)
BAD = {
    "attach": [3, None],
    "start_event": ["block_rq_insert", {"event": 1}, {"event": "x", "blind": "sda"}, {"event": "x", "blind": [1]}],
    "coverage": [[], {"devices": []}, {"devices": {"sda": {"recorded": -1}}}, {"devices": {"sda": 3}}],
    "bio_devices": ["dm-0", [1]],
    "tasks": [{}, ["junk"], [{"pid": "7"}], [{"pid": True}], [{"pid": 7, "io_wait_s": float("nan")}],
              [{"pid": 7, "read_bytes": -5}], [{"pid": 7, "comm": 3}], [{"comm": "no pid"}]],
    "files": [{}, [3], [{"ino": -1}], [{"path": 3}], [{"hist": [[1]]}], [{"cache_read_bytes": "x"}]],
    "tasks_sources": [[], {"reads": 3}, "filemap"],
    "unavailable": [[], {"start": 3}, "start"],
    "enclosing": [3, ["epoch 1"]],
    "loop": [{"data_wait_s": "?", "steps": 3, "wall_s": 10}, "loop?", {"steps": 2},
             {"data_wait_s": 1, "steps": 10**900, "wall_s": 1}, {"data_wait_s": 1, "steps": 1.5, "wall_s": 1}],
    "sender_pid": ["100", -1, True, None],
    "owner": [{"pid": -1}, {"pid": 5, "rank": 2**21}, {"pid": 5, "rank": "1"}, 7],
    "before_attach": [12.5, {"by_s": -1}, {"by_s": "12"}, {"by_s": float("inf")}, None],
    "bpf_programs": [[], "x"],
    "traced_pids": [-1, 1.5],
    "unwritten_at_exit": [{}, 3, {"bytes": -1, "waited_s": 0, "ended": "written"},
                          {"bytes": 1, "waited_s": -2, "ended": "bound"}, {"bytes": 1, "waited_s": 0, "ended": "soon"}],
    "alerts": [{}, [3]],
    "verdict": [[], "I/O-bound"],
    "window_seq": [-1, "2", 1.5, None],
    "written_back": [{}, [3], [{"comm": 3}], [{"comm": "python", "written_in": None, "count": -1, "bytes": 0,
                                             "start": "", "end": ""}]],
}


def bare(label: str | None = None, at: float = 0) -> Dump:
    return Dump("marker" if label else "interval", T0 + timedelta(seconds=at), T0 + timedelta(seconds=at + 1), "h",
                "6.18", [], label=label)


def test_the_table_covers_every_section_and_every_section_is_a_dump_attribute():
    assert set(TABLE) == set(BY_KEY) == set(BAD) and len(SECTIONS) == len(BY_KEY)
    attrs = {f.name for f in fields(Dump)}
    assert set(BY_KEY) <= attrs
    for cls in SECTIONS:
        assert issubclass(cls, Section) and BY_KEY[cls.key] is cls


@pytest.mark.parametrize("key", sorted(TABLE))
def test_each_section_round_trips(key):
    cls = BY_KEY[key]
    for value in TABLE[key][:2]:
        s = cls.from_json(value)
        assert s.to_json() == value
        assert cls.from_json(json.loads(json.dumps(s.to_json()))) == s
        # and through a whole line
        back = jsonl.from_json(json.loads(json.dumps(jsonl.to_json(bare().put(s)))))
        assert getattr(back, key) == s and back.unknown == {}


@pytest.mark.parametrize("key", sorted(TABLE))
def test_each_section_merges(key):
    cls = BY_KEY[key]
    a, b, want = TABLE[key]
    merged = merge_dumps([bare().put(cls.from_json(a)), bare(at=1).put(cls.from_json(b))])
    got = getattr(merged, key)
    assert (got.to_json() if got is not None else None) == want
    # a dump without it changes nothing
    alone = getattr(merge_dumps([bare().put(cls.from_json(a)), bare(at=1)]), key)
    assert alone is None if cls.merger() is None else alone == cls.from_json(a)


@pytest.mark.parametrize("key", sorted(BAD))
def test_each_section_refuses_bad_values_as_the_lines_error(key, tmp_path):
    from tracer.errors import UserError

    for value in BAD[key]:
        with pytest.raises(ValueError):
            BY_KEY[key].from_json(value)
        line = dict(jsonl.to_json(bare()), **{key: value})
        path = tmp_path / "bad.jsonl"
        path.write_text(json.dumps(line) + "\n")
        with pytest.raises(UserError, match=r"bad\.jsonl:1: not an iotrace dump"):
            list(jsonl.read(str(path)))


def test_a_null_loop_reads_as_none_and_a_null_enclosing_is_the_top_level():
    line = dict(jsonl.to_json(bare("epoch 1")), loop=None, enclosing=None)
    d = jsonl.from_json(line)
    assert d.loop is None and d.enclosing is not None and d.enclosing.label is None
    assert jsonl.to_json(d)["enclosing"] is None and "loop" not in jsonl.to_json(d)


def test_unknown_sections_are_kept_written_back_and_not_merged():
    """A newer iotrace's section: kept on its dump as it is, written back with it; a merge leaves it out."""
    line = dict(jsonl.to_json(bare()), writeback={"dirty_pages": 12, "by": ["kworker"]}, attach="raw_tp")
    d = jsonl.from_json(line)
    assert d.unknown == {"writeback": {"dirty_pages": 12, "by": ["kworker"]}} and d.attach.path == "raw_tp"
    assert jsonl.to_json(d) == line
    merged = merge_dumps([d, d])
    assert merged.unknown == {} and "writeback" not in jsonl.to_json(merged)


# ---- files written by main (df49ae4) before the sections were typed -------------------------------
#
# data/main-df49ae4.jsonl: a trace's dumps with every section as main's writer wrote them (an interval with
# tasks, coverage, start_event, bio_devices and alerts; marker dumps with enclosing, loop, sender_pid; a final
# one with bpf_programs, traced_pids); data/main-df49ae4-diskstats.jsonl a --diskstats window with alerts;
# data/main-df49ae4-report.jsonl what main's `iotrace report --by label --json` then `report --json` wrote for
# the first file (merged windows with verdicts, the whole run).

def lines(name: str) -> list[str]:
    return (DATA / name).read_text().splitlines()


@pytest.mark.parametrize("name", ["main-df49ae4.jsonl", "main-df49ae4-diskstats.jsonl"])
def test_mains_files_read_and_write_back_byte_for_byte(name):
    dumps = list(jsonl.read(str(DATA / name)))
    assert len(dumps) == len(lines(name))
    for d, line in zip(dumps, lines(name), strict=True):
        out = io.StringIO()
        jsonl.write(out, d)
        assert out.getvalue() == line + "\n"
        assert d.unknown == {}


# sections added after main's df49ae4 (its files have none: they read as absent)
NEWER = {"files", "tasks_sources", "before_attach", "unavailable", "unwritten_at_exit", "owner", "window_seq",
         "written_back"}


def test_mains_file_has_every_section():
    seen = {k for line in lines("main-df49ae4.jsonl") + lines("main-df49ae4-report.jsonl")
            for k in json.loads(line) if k in BY_KEY}
    assert seen == set(BY_KEY) - NEWER


def test_report_json_of_mains_file_is_mains():
    out = io.StringIO()
    assert reportcli.run([str(DATA / "main-df49ae4.jsonl"), "--by", "label", "--json"], out) == 0
    assert reportcli.run([str(DATA / "main-df49ae4.jsonl"), "--json"], out) == 0
    got = [json.loads(x) for x in out.getvalue().splitlines()]
    assert got == [json.loads(x) for x in lines("main-df49ae4-report.jsonl")]


def test_a_long_runs_total_keeps_a_task_row_per_name_of_the_processes_that_came_and_went():
    """The table's whole-run dump (tracer.sinks.table) folds exited processes' rows by comm past
    MAX_RUN_ROWS: a soak of 16,000 short-lived readers grew the tracer by ~0.35 MB a second without it."""
    from tracer.model.sections import TaskRow, Tasks
    from tracer.sinks import table

    sink = table.TableSink(io.StringIO())
    t0 = datetime(2026, 1, 3, tzinfo=UTC)
    pid = 100
    for w in range(6):
        rows = [TaskRow(pid=pid + i, comm="dd", read_bytes=4096, exited=True) for i in range(table.MAX_RUN_ROWS // 2)]
        rows.append(TaskRow(pid=1, comm="trainer", read_bytes=1))      # alive all along
        pid += len(rows)
        sink.on_dump(Dump("interval", t0 + timedelta(seconds=w), t0 + timedelta(seconds=w + 1), "h", "k", [],
                          tasks=Tasks(rows)))
        assert len(sink.total.tasks.rows) <= table.MAX_RUN_ROWS + 1
    got = {(r.pid, r.comm): r for r in sink.total.tasks.rows}
    assert got[(1, "trainer")].read_bytes == 6
    # every exited reader's bytes are still there, in its own row or in the folded one
    assert sum(r.read_bytes for r in sink.total.tasks.rows if r.comm == "dd") == 6 * table.MAX_RUN_ROWS // 2 * 4096
    assert (0, "dd") in got


def test_folded_rows_of_two_names_stay_apart_through_a_merge():
    from tracer.model.sections import TaskRow, Tasks

    t = Tasks([TaskRow(pid=5, comm="a", reads=1, exited=True), TaskRow(pid=6, comm="b", reads=2, exited=True),
               TaskRow(pid=7, comm="a", reads=4, exited=True), TaskRow(pid=8, comm="c", reads=8)]).folded()
    assert [(r.pid, r.comm, r.reads) for r in t.rows] == [(0, "a", 5), (0, "b", 2), (8, "c", 8)]
    acc = Tasks.merger()
    for rows in (t.rows, [TaskRow(pid=0, comm="b", reads=16, exited=True)]):
        acc.add_rows(rows)
    assert [(r.pid, r.comm, r.reads) for r in acc.result().rows] == [(0, "a", 5), (0, "b", 18), (8, "c", 8)]
