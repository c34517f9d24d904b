"""Hostile input (issue 19, item 3): datagrams on the control socket and lines of saved files.

A bad datagram, or a bad optional field of one, is counted and ignored, never fatal; a saved line
with a bad value is that line's error (one line naming the file and line, exit 2), never a traceback.
"""

from __future__ import annotations

import json
import socket

import pytest

from tracer import cli, marker
from tracer.codec import jsonl
from tracer.model.dump import merge_dumps
from tracer.model.sections import Loop, merge_loops
from tracer.runtime.control import ControlSocket
from unit.test_jsonl import KIND_CASES

HUGE = int("9" * 900)


def evil_datagram(**loop) -> bytes:
    fields = {"data_wait_s": 1, "steps": 1, "wall_s": 1, **loop}
    return json.dumps({"v": 1, "label": "x", "loop": fields}).encode()


# ---- the wire ----------------------------------------------------------------

@pytest.mark.parametrize("loop", [
    {"steps": HUGE}, {"data_wait_s": HUGE}, {"wall_s": HUGE}, {"steps": 2**53 + 1}, {"wall_s": 1e300},
    {"data_wait_s": -0.5}, {"steps": "5"}, {"steps": True}, {"steps": None}, {"wall_s": [1]},
])
def test_a_loop_out_of_range_is_left_out_and_the_marker_kept(loop):
    msg = marker.decode_message(evil_datagram(**loop))
    assert msg["label"] == "x" and msg["loop"] is None and msg["ignored"], msg
    assert marker.check_loop({"data_wait_s": 1, "steps": 1, "wall_s": 1, **loop})


@pytest.mark.parametrize("raw", [b"NaN", b"Infinity", b"-Infinity", b"1e400"])
def test_non_finite_seconds_on_the_wire_are_left_out(raw):
    data = b'{"v":1,"label":"x","loop":{"data_wait_s":' + raw + b',"steps":1,"wall_s":1}}'
    msg = marker.decode_message(data)
    assert msg["loop"] is None and msg["ignored"]


@pytest.mark.parametrize("data", [b'{"v":true,"label":"x"}', b'{"v":1.0,"label":"x"}', b"[" * 1000,
                                  b'{"v":1,"label":' + b"9" * 900 + b"}", b'{"v":' + b"9" * 900 + b',"label":"x"}'])
def test_datagrams_that_are_no_marker_are_value_errors(data):
    with pytest.raises(ValueError):
        marker.decode_message(data)


def test_merge_loops_of_the_evil_loop_does_not_overflow():
    with pytest.raises(ValueError, match="loop.steps"):     # the reader refuses it: it is never merged
        Loop.from_json({"data_wait_s": 1, "steps": HUGE, "wall_s": 1})
    assert merge_loops([Loop.from_json({"data_wait_s": 1, "steps": 3, "wall_s": 2})]).to_json() == {
        "data_wait_s": 1.0, "steps": 3, "wall_s": 2.0}


@pytest.fixture
def control(tmp_path):
    c = ControlSocket.open(directory=str(tmp_path))
    try:
        yield c
    finally:
        c.close()


def test_the_control_socket_counts_and_ignores_bad_datagrams(control, capsys):
    s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    try:
        for data in (evil_datagram(steps=HUGE), b"\xff\xfe", b"[" * 1000, b'{"v":1}', marker.encode("ok"),
                     b"x" * (marker.MAX_DATAGRAM + 1)):
            s.sendto(data, control.path)
    finally:
        s.close()
    got = control.receive()
    assert [m.label for m in got] == ["x", "ok"]
    assert got[0].loop is None                  # the marker is kept, its bad loop left out
    assert control.bad == 4 and control.bad_fields == 1 and control.received == 2
    err = capsys.readouterr().err
    assert len(err.splitlines()) == 3 and "Traceback" not in err, err


# ---- saved files -------------------------------------------------------------

def good_line(kind: str = "marker") -> dict:
    return jsonl.to_json(KIND_CASES[kind]())


def set_path(obj, path: tuple, value):
    for key in path[:-1]:
        obj = obj[key]
    obj[path[-1]] = value


def report_of(tmp_path, lines: list, capsys) -> tuple[int, str, str]:
    path = tmp_path / "run.jsonl"
    path.write_text("".join((ln if isinstance(ln, str) else json.dumps(ln)) + "\n" for ln in lines))
    code = cli.main(["report", str(path)])
    out, err = capsys.readouterr()
    return code, out, err


MARKER_CASES = [
    (("series",), "abc"),
    (("series",), [5]),
    (("series",), None),
    (("series", 0, "hdr", "total"), 5),
    (("series", 0, "hdr"), "abc"),
    (("series", 0, "latency_us"), [1]),
    (("series", 0, "latency_us", "total"), 5),
    (("series", 0, "latency_us", "total", "mean"), "abc"),
    (("series", 0, "count"), HUGE),
    (("series", 0, "count"), -1),
    (("series", 0, "count"), 1.5),
    (("series", 0, "bytes"), "4096"),
    (("series", 0, "pid"), HUGE),
    (("series", 0, "comm"), 5),
    (("series", 0, "device"), None),
    (("dropped",), {"no_start": HUGE}),
    (("dropped",), {"no_start": "x"}),
    (("dropped",), [1]),
    (("events",), {"x": None}),
    (("label",), 5),
    (("start",), 5),
    (("start",), "yesterday"),
    (("host",), ["h"]),
    (("loop",), {"data_wait_s": 1, "steps": HUGE, "wall_s": 1}),
    (("loop",), "abc"),
    (("sender_pid",), "1"),
    (("enclosing",), 7),
    (("tasks",), "abc"),
    (("tasks",), [{"pid": 1, "io_wait_s": "x"}]),
    (("tasks",), [{"pid": "1"}]),
    (("coverage",), {"devices": {"loop0": {"recorded": "x"}}}),
    (("coverage",), [1]),
    (("bio_devices",), [5]),
]


@pytest.mark.parametrize(("path", "value"), MARKER_CASES, ids=[f"{'.'.join(map(str, p))}={str(v)[:12]}"
                                                               for p, v in MARKER_CASES])
def test_a_bad_value_in_a_saved_dump_is_that_lines_error(tmp_path, capsys, path, value):
    obj = good_line()
    set_path(obj, path, value)
    code, out, err = report_of(tmp_path, [good_line(), obj], capsys)
    assert code == 2, out + err
    assert len(err.splitlines()) == 1 and "Traceback" not in err, err
    assert "run.jsonl:2: not an iotrace dump" in err, err


@pytest.mark.parametrize("number", ["NaN", "Infinity", "-Infinity", "1e400", "9" * 900])
@pytest.mark.parametrize("key", ['"count"', '"mean"', '"duration_s"', '"bytes"'])
def test_non_finite_and_huge_numbers_in_a_saved_dump_are_that_lines_error(tmp_path, capsys, key, number):
    text = json.dumps(good_line())
    at = text.index(key + ": ") + len(key) + 2
    end = min(i for i in (text.find(",", at), text.find("}", at)) if i > 0)
    code, out, err = report_of(tmp_path, [text[:at] + number + text[end:]], capsys)
    assert code == 2 and len(err.splitlines()) == 1 and "run.jsonl:1:" in err, (key, number, err)


@pytest.mark.parametrize(("path", "value"), [
    (("devices",), "abc"), (("devices",), [5]), (("devices", 0, "reads"), HUGE), (("devices", 0, "%util"), "x"),
    (("devices", 0, "read_kB"), -1), (("processes",), {"a": 1}), (("processes", 0, "pid"), None),
    (("duration_s",), "2"), (("unreadable_processes",), 1.5), (("window",), 3),
])
def test_a_bad_value_in_a_saved_diskstats_window_is_that_lines_error(tmp_path, capsys, path, value):
    obj = good_line("diskstats")
    set_path(obj, path, value)
    code, out, err = report_of(tmp_path, [obj], capsys)
    assert code == 2 and len(err.splitlines()) == 1 and "run.jsonl:1: not an iotrace dump" in err, err


def test_json_nested_too_deep_is_that_lines_error(tmp_path, capsys):
    code, out, err = report_of(tmp_path, [good_line(), "[" * 100000 + "]" * 100000], capsys)
    assert code == 2 and len(err.splitlines()) == 1 and "run.jsonl:2:" in err, err


def test_a_naive_time_merges_with_aware_ones(tmp_path, capsys):
    obj = good_line()
    obj["start"], obj["end"] = obj["start"][:19], obj["end"][:19]        # no UTC offset
    code, out, err = report_of(tmp_path, [good_line(), obj], capsys)
    assert code == 0, err


def test_the_good_lines_still_read_and_merge(tmp_path):
    path = tmp_path / "ok.jsonl"
    path.write_text("".join(json.dumps(good_line(k)) + "\n" for k in ("interval", "final", "marker")))
    dumps = list(jsonl.read(str(path)))
    assert len(dumps) == 3 and merge_dumps(dumps).series


def test_a_window_beyond_the_bounds_still_sends_a_valid_loop(monkeypatch):
    w = marker._Window("long")
    w.steps, w.data_wait_s = 2**60, 1e12
    monkeypatch.setattr(w, "opened", w.opened - 1e12)
    loop = w.loop()
    assert marker.check_loop(loop) is None
    marker.decode_message(marker.encode("long", None, loop))
