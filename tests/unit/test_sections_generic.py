"""Every section of SECTIONS pinned as its JSON reads, writes and merges, and as its bad values are refused: the
exact text a line holds after a read and a write (key order included), the exact error naming the bad key, the
exact merged section.  Written before the sections' readers were made generic (tracer.model.fieldwise), so that
the generic code is held to what the hand-written readers did."""

from __future__ import annotations

import json
import re
from datetime import UTC, datetime, timedelta

import pytest

from tracer.model.dump import Dump, merge_dumps
from tracer.model.sections import BY_KEY, SECTIONS

SAME = object()     # the value writes back as it was read

WHOLE = "not a whole number from 0 to 2**63-1"
NUMBER = "not a finite number >= 0"
ROW = {"pid": 7, "ppid": 1, "comm": "python", "io_wait_s": 0.25, "io_waits": 3, "read_bytes": 8192, "reads": 2,
       "disk_read_bytes": 4096, "fsync_s": 0.125, "fsyncs": 1, "throttled_s": 0.0, "throttles": 0, "started": True,
       "exited": False}
ZERO_ROW = {"pid": 7, "ppid": 0, "comm": "", "io_wait_s": 0.0, "io_waits": 0, "read_bytes": 0, "reads": 0,
            "disk_read_bytes": 0, "fsync_s": 0.0, "fsyncs": 0, "throttled_s": 0.0, "throttles": 0, "started": False,
            "exited": False}
PAGED_ROW = dict(list(ROW.items())[:7] + [("read_pages", 2), ("missed_pages", 1)] + list(ROW.items())[7:])
FROW = {"dev": "7:0", "ino": 12, "path": "/mnt/a", "pid": 7, "comm": "python", "container": "", "cgroup_id": 0,
        "cache_read_bytes": None, "disk_read_bytes": 4096, "written_bytes": 0, "requests": 1, "direct_bytes": 0,
        "files": 1, "p50_us": 73.7, "p99_us": 73.7, "hist": [[60, 1]]}
CREDIT = {"comm": "python", "written_in": "epoch 3", "count": 28, "bytes": 1 << 25,
          "start": "2026-01-01T08:00:00+00:00", "end": "2026-01-01T08:00:01+00:00"}

# key: [(a value as a line holds it, what it writes back as: SAME, or the value the defaults fill in)]
READS = {
    "attach": [("raw_tp", SAME), ("", SAME)],
    "start_event": [({"event": "block_rq_insert", "blind": ["nvme0n1", "sda"]}, SAME),
                    ({"event": "block_rq_insert"}, SAME), ({"event": "x", "blind": []}, {"event": "x"}),
                    ({}, {"event": ""}), ({"blind": ["sda"], "event": "e"}, {"event": "e", "blind": ["sda"]})],
    "coverage": [({"filtered": False, "devices": {"sdb": {"recorded": 9, "diskstats": 10},
                                                  "sda": {"recorded": 0, "diskstats": 1}}}, SAME),
                 ({"devices": {"sda": {}}}, {"filtered": False, "devices": {"sda": {"recorded": 0, "diskstats": 0}}}),
                 ({"filtered": 1}, {"filtered": True, "devices": {}}),
                 ({"devices": {"sda": {"diskstats": 2, "recorded": 1}}, "filtered": True},
                  {"filtered": True, "devices": {"sda": {"recorded": 1, "diskstats": 2}}})],
    "bio_devices": [(["dm-1", "dm-0"], SAME), ([], SAME)],
    "tasks": [([ROW, dict(ROW, pid=8)], SAME), ([], SAME), ([{"pid": 7}], [ZERO_ROW]), ([PAGED_ROW], SAME),
              ([dict(ROW, read_pages=0, missed_pages=0)], [ROW]),
              ([dict(ROW, io_wait_s=1)], [dict(ROW, io_wait_s=1.0)]),
              ([dict(ROW, started=1, exited=[])], [dict(ROW, started=True, exited=False)])],
    "files": [([FROW], SAME), ([], SAME)],
    "unavailable": [({"start": "no block:block_io_start", "files": "no mm_filemap_get_pages"}, SAME), ({}, SAME)],
    "tasks_sources": [({"reads": "filemap:mm_filemap_get_pages", "fsync": "unavailable: no ext4"}, SAME)],
    "enclosing": [("epoch 1", SAME), (None, SAME)],
    "loop": [({"data_wait_s": 0.5, "steps": 10, "wall_s": 2.0}, SAME),
             ({"data_wait_s": 1, "steps": 10.0, "wall_s": 2}, {"data_wait_s": 1.0, "steps": 10, "wall_s": 2.0})],
    "sender_pid": [(100, SAME), (0, SAME)],
    "owner": [({"pid": 100, "rank": 0}, SAME), ({"pid": 100, "rank": None}, SAME),
              ({"pid": 5}, {"pid": 5, "rank": None}),
              ({"rank": 1, "pid": 5}, {"pid": 5, "rank": 1})],
    "before_attach": [({"by_s": 12.5}, SAME), ({"by_s": None}, SAME), ({}, {"by_s": None}),
                      ({"by_s": 3}, {"by_s": 3.0})],
    "bpf_programs": [({"block_rq_issue": {"runs": 4, "run_time_ns": 100, "missed": 0}, "x": [1, "y"]}, SAME),
                     ({}, SAME)],
    "traced_pids": [(3, SAME)],
    "unwritten_at_exit": [({"bytes": 33554432, "waited_s": 0.0, "ended": "not waited"}, SAME),
                          ({"ended": "bound", "waited_s": 1.23456, "bytes": 0},
                           {"bytes": 0, "waited_s": 1.235, "ended": "bound"}),
                          ({"bytes": 1, "waited_s": 2, "ended": "written"},
                           {"bytes": 1, "waited_s": 2.0, "ended": "written"})],
    "alerts": [([{"rule": "p99>1ms", "value": 1500.0, "nested": {"a": [1]}}, {}], SAME), ([], SAME)],
    "verdict": [({"state": "I/O-bound", "line": "I/O-bound: ...", "n": [1, None]}, SAME)],
    "window_seq": [(2, SAME)],
    "written_back": [([CREDIT, dict(CREDIT, written_in=None, count=0)], SAME), ([], SAME),
                     ([dict(reversed(list(CREDIT.items())))], [CREDIT])],
}

# key: [(a bad value, the error that names it)]
REFUSES = {
    "attach": [(3, "attach is 3, not a string"), (None, "attach is None, not a string")],
    "start_event": [("x", "start_event is 'x', not an object"),
                    ({"event": 1}, "start_event.event is 1, not a string"),
                    ({"event": "x", "blind": "sda"}, "start_event.blind is 'sda', not a list"),
                    ({"event": "x", "blind": [1]}, "start_event.blind is 1, not a string")],
    "coverage": [([], "coverage is [], not an object"), ({"devices": []}, "coverage.devices is [], not an object"),
                 ({"devices": {"sda": 3}}, "coverage.devices.sda is 3, not an object"),
                 ({"devices": {"sda": {"recorded": -1}}}, f"coverage.devices.sda.recorded is -1, {WHOLE}"),
                 ({"devices": {"sda": {"diskstats": "2"}}}, f"coverage.devices.sda.diskstats is '2', {WHOLE}")],
    "bio_devices": [("dm-0", "bio_devices is 'dm-0', not a list"), ([1], "bio_devices is 1, not a string")],
    "tasks": [({}, "tasks is {}, not a list"), (["junk"], "a tasks row is 'junk', not an object"),
              ([{"pid": "7"}], f"tasks pid is '7', {WHOLE}"), ([{"pid": True}], f"tasks pid is True, {WHOLE}"),
              ([{"comm": "x"}], f"tasks pid is None, {WHOLE}"),
              ([{"pid": 7, "ppid": None}], f"tasks ppid is None, {WHOLE}"),
              ([{"pid": 7, "comm": 3}], "tasks comm is 3, not a string"),
              ([{"pid": 7, "io_wait_s": float("nan")}], f"tasks io_wait_s is nan, {NUMBER}"),
              ([{"pid": 7, "read_bytes": -5}], f"tasks read_bytes is -5, {WHOLE}"),
              ([{"pid": 7, "read_pages": 1.5}], f"tasks read_pages is 1.5, {WHOLE}")],
    "files": [({}, "files is {}, not a list"), ([3], "a files row is 3, not an object"),
              ([{"path": 3}], "files path is 3, not a string"), ([{"ino": -1}], f"files ino is -1, {WHOLE}")],
    "unavailable": [([], "unavailable is [], not an object"), ({"start": 3}, "unavailable start is 3, not a string")],
    "tasks_sources": [("x", "tasks_sources is 'x', not an object"),
                      ({"reads": None}, "tasks_sources reads is None, not a string")],
    "enclosing": [(3, "enclosing is 3, not a string"), (["e"], "enclosing is ['e'], not a string")],
    "loop": [("loop?", "loop is not an object"), ({"steps": 2}, "loop.data_wait_s is not a number from 0 to"),
             ({"data_wait_s": 1, "steps": 1.5, "wall_s": 1}, "loop.steps is not a whole number")],
    "sender_pid": [("100", f"sender_pid is '100', {WHOLE}"), (-1, f"sender_pid is -1, {WHOLE}"),
                   (None, f"sender_pid is None, {WHOLE}")],
    "owner": [(7, "owner is 7, not an object"), ({"pid": -1}, f"owner.pid is -1, {WHOLE}"),
              ({}, f"owner.pid is None, {WHOLE}"), ({"pid": 5, "rank": "1"}, f"owner.rank is '1', {WHOLE}"),
              ({"pid": 5, "rank": 2**21}, "owner.rank is 2097152, more than 1048576")],
    "before_attach": [(12.5, "before_attach is 12.5, not an object"), (None, "before_attach is None, not an object"),
                      ({"by_s": "12"}, f"before_attach.by_s is '12', {NUMBER}"),
                      ({"by_s": float("inf")}, f"before_attach.by_s is inf, {NUMBER}")],
    "bpf_programs": [([], "bpf_programs is [], not an object")],
    "traced_pids": [(1.5, f"traced_pids is 1.5, {WHOLE}")],
    "unwritten_at_exit": [(3, "unwritten_at_exit is 3, not an object"),
                          ({"bytes": -1, "waited_s": 0, "ended": "written"}, f"unwritten_at_exit.bytes is -1, {WHOLE}"),
                          ({"bytes": 1, "waited_s": -2, "ended": "bound"},
                           f"unwritten_at_exit.waited_s is -2, {NUMBER}"),
                          ({"bytes": 1, "waited_s": 0, "ended": "soon"},
                           "unwritten_at_exit.ended is 'soon', not one of written, bound, deadline, signal, "
                           "not waited"),
                          ({"bytes": 1, "waited_s": 0}, "unwritten_at_exit.ended is None, not a string")],
    "alerts": [({}, "alerts is {}, not a list"), ([3], "an alert is 3, not an object")],
    "verdict": [("I/O-bound", "verdict is 'I/O-bound', not an object")],
    "window_seq": [("2", f"window_seq is '2', {WHOLE}")],
    "written_back": [({}, "written_back is {}, not a list"), ([CREDIT, 3], "written_back[1] is 3, not an object"),
                     ([dict(CREDIT, comm=3)], "written_back.comm is 3, not a string"),
                     ([dict(CREDIT, written_in=3)], "written_back.written_in is 3, not a string"),
                     ([dict(CREDIT, count=-1)], f"written_back.count is -1, {WHOLE}"),
                     ([dict(CREDIT, end=None)], "written_back.end is None, not a string")],
}

# key: [(the values of dumps merged in order, the merged section's JSON: None when the merge has none)]
MERGES = {
    "attach": [(["tracepoint", "raw_tp", "tracepoint"], "raw_tp+tracepoint"), (["", "raw_tp"], "+raw_tp"),
               ([""], "")],
    "start_event": [([{"event": "b"}, {"event": "a", "blind": ["sdb", "sda"]}, {"event": "b", "blind": ["sda"]}],
                     {"event": "a+b", "blind": ["sda", "sdb"]}), ([{"event": ""}], {"event": ""})],
    "coverage": [([{"filtered": False, "devices": {"sdb": {"recorded": 1, "diskstats": 2}}},
                   {"filtered": True, "devices": {"sda": {"recorded": 3, "diskstats": 3},
                                                  "sdb": {"recorded": 4, "diskstats": 5}}}],
                  {"filtered": True, "devices": {"sdb": {"recorded": 5, "diskstats": 7},
                                                 "sda": {"recorded": 3, "diskstats": 3}}}),
                 ([{"devices": {}}], {"filtered": False, "devices": {}})],
    "bio_devices": [([["dm-1"], ["dm-0", "dm-1"]], ["dm-0", "dm-1"]), ([[], []], None)],
    "tasks": [([[dict(ROW, pid=9)], [ROW], []], [ROW, dict(ROW, pid=9)]), ([[], []], [])],
    "files": [([[FROW], []], [FROW])],
    "unavailable": [([{"a": "x"}, {"a": "x"}], {"a": "x"}), ([{"a": "x"}, {"a": "y"}], None),
                    ([{"a": "x", "b": "y"}, {"b": "y", "a": "x"}], None)],
    "tasks_sources": [([{"a": "x"}, {"a": "x"}], {"a": "x"}), ([{"a": "x"}, {"a": "x"}, {"a": "y"}], None)],
    "enclosing": [(["e", "e"], "e"), (["e", None], None), ([None, None], None)],
    "loop": [([{"data_wait_s": 0.1, "steps": 1, "wall_s": 0.2}, {"data_wait_s": 0.2, "steps": 2, "wall_s": 0.1}],
              {"data_wait_s": 0.1 + 0.2, "steps": 3, "wall_s": 0.2 + 0.1})],
    "sender_pid": [([5, 5, 5], 5), ([5, 6, 5], None)],
    "owner": [([{"pid": 5, "rank": 1}, {"pid": 5, "rank": 1}], {"pid": 5, "rank": 1}),
              ([{"pid": 5, "rank": 1}, {"pid": 5}], None)],
    "before_attach": [([{"by_s": None}, {"by_s": 2.5}, {"by_s": 1}], {"by_s": 2.5}), ([{}, {}], {"by_s": None})],
    "bpf_programs": [([{"a": 1}], None)],
    "traced_pids": [([3], None)],
    "unwritten_at_exit": [([{"bytes": 1, "waited_s": 0, "ended": "written"}], None)],
    "alerts": [([[]], None)],
    "verdict": [([{}], None)],
    "window_seq": [([1], None)],
    "written_back": [([[CREDIT]], None)],
}

T0 = datetime(2026, 5, 4, 10, 0, 0, tzinfo=UTC)


def text_of(v) -> str:
    return json.dumps(v)     # what a line holds: the order of keys is part of it


def test_the_tables_cover_every_section():
    assert len(SECTIONS) == len(BY_KEY)
    assert set(READS) == set(REFUSES) == set(MERGES) == set(BY_KEY)


@pytest.mark.parametrize("key", sorted(READS))
def test_each_value_writes_back_as_it_did(key):
    cls = BY_KEY[key]
    for value, want in READS[key]:
        want = value if want is SAME else want
        s = cls.from_json(json.loads(text_of(value)))
        assert text_of(s.to_json()) == text_of(want)
        assert text_of(cls.from_json(s.to_json()).to_json()) == text_of(want)     # and reads back alike


@pytest.mark.parametrize("key", sorted(REFUSES))
def test_each_bad_value_is_refused_naming_its_key(key):
    for value, message in REFUSES[key]:
        with pytest.raises(ValueError, match="^" + re.escape(message)):
            BY_KEY[key].from_json(value)


@pytest.mark.parametrize("key", sorted(MERGES))
def test_each_merge_gives_what_it_did(key):
    cls = BY_KEY[key]
    for values, want in MERGES[key]:
        dumps = [Dump("interval", T0 + timedelta(seconds=i), T0 + timedelta(seconds=i + 1), "h", "6.18", [])
                 .put(cls.from_json(v)) for i, v in enumerate(values)]
        got = getattr(merge_dumps(dumps), key)
        assert text_of(None if got is None else got.to_json()) == text_of(want)
