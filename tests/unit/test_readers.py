"""Readers of saved dumps: a file cut in its last line, `report --follow`, and the --json of
report and diff (no root, no BPF).  Expected numbers come from the planted latencies."""

from __future__ import annotations

import json
import signal
import subprocess
import threading
import time

import pytest
from conftest import PYTHON, ROOT, reaped, run_iotrace

from tracer.codec import jsonl
from unit.test_report_views import (
    E1_MAIN,
    E1_WORKER,
    E2_A,
    E2_B,
    MS,
    REST,
    close,
    dump,
    expected,
    ok,
    run,  # noqa: F401 - the fixture
    series,
    write,
)

READS = [1 * MS] * 30 + [4 * MS] * 10


def whole_and_cut(tmp_path):
    """The same three dumps twice: alone, and followed by a fourth cut short mid-line (no newline)."""
    dumps = [dump(f"epoch {i}", 10 * i, 10, [series(100 + i, "python", "loop0", "read", READS[i::3])])
             for i in range(3)]
    whole = write(tmp_path / "whole.jsonl", dumps)
    fourth = json.dumps(jsonl.to_json(dump("epoch 3", 30, 10, [series(9, "python", "loop0", "read", READS)])))
    cut = tmp_path / "cut.jsonl"
    cut.write_text(whole.read_text() + fourth[:len(fourth) // 2])
    return whole, cut


def test_report_uses_the_whole_dumps_of_a_file_cut_in_its_last_line(tmp_path):
    whole, cut = whole_and_cut(tmp_path)
    r = run_iotrace(["report", str(cut)])
    assert r.returncode == 0, r.stderr
    warnings = r.stderr.splitlines()
    assert len(warnings) == 1 and "cut.jsonl:4" in warnings[0] and "incomplete" in warnings[0], r.stderr
    # the same table as from the three whole dumps alone
    assert r.stdout.replace(str(cut), "F") == ok(["report", str(whole)]).replace(str(whole), "F")
    [merged] = [json.loads(line) for line in run_iotrace(["report", "--json", str(cut)]).stdout.splitlines()]
    assert sorted(s["pid"] for s in merged["series"]) == [100, 101, 102]      # not pid 9, the cut dump's
    assert sum(s["count"] for s in merged["series"]) == len(READS)


def test_diff_and_plot_read_a_cut_file_too(tmp_path):
    whole, cut = whole_and_cut(tmp_path)
    r = run_iotrace(["diff", str(cut), str(whole), "--json"])
    assert r.returncode == 0 and r.stderr.count("incomplete") == 1, r.stderr
    d = json.loads(r.stdout)
    [row] = d["rows"]
    assert row["a"]["count"] == row["b"]["count"] == len(READS) and row["change"]["count"] == 0
    # plot reads through the same reader
    assert len(list(jsonl.read(str(cut)))) == 3


def test_a_bad_line_before_the_last_is_an_error_with_its_number(tmp_path):
    whole, _ = whole_and_cut(tmp_path)
    lines = whole.read_text().splitlines(keepends=True)
    bad = tmp_path / "bad.jsonl"
    bad.write_text(lines[0] + lines[1][:40] + "\n" + lines[2])
    r = run_iotrace(["report", str(bad)])
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and "bad.jsonl:2: not an iotrace dump" in r.stderr
    # a complete last line that is bad is an error too, not a cut one
    bad.write_text(lines[0] + lines[1][:40] + "\n")
    r = run_iotrace(["report", str(bad)])
    assert r.returncode == 2 and "bad.jsonl:2: not an iotrace dump" in r.stderr, r.stderr


def test_report_json_is_the_merged_dump_and_by_label_one_per_window(run):  # noqa: F811
    [merged] = [json.loads(line) for line in ok(["report", "--json", str(run)]).splitlines()]
    assert merged["schema"] == 1
    python = [s for s in merged["series"] if s["comm"] == "python" and s["op"] == "read"]
    assert sum(s["count"] for s in python) == len(E1_MAIN + E1_WORKER + E2_A + E2_B)
    [main] = [s for s in python if s["pid"] == 100 and s["op"] == "read"]
    want = expected(E1_MAIN)
    assert close(main["latency_us"]["total"]["p99"], want["p99"]) and main["count"] == want["count"]
    windows = [json.loads(line) for line in ok(["report", "--json", "--by", "label", str(run)]).splitlines()]
    assert [w["label"] for w in windows] == ["epoch 1", "checkpoint 1", "epoch 2", None]
    assert sum(s["count"] for s in windows[2]["series"] if s["op"] == "read") == len(E2_A + E2_B)
    assert [s["count"] for s in windows[3]["series"]] == [len(REST)]


def test_diff_json_matches_the_planted_latencies(tmp_path):
    a_read, b_read = [1 * MS] * 40, [2 * MS] * 20
    a = write(tmp_path / "a.jsonl", [dump(None, 0, 5, [series(1, "python", "loop0", "read", a_read),
                                                       series(2, "java", "sda", "write", [MS] * 3)])])
    b = write(tmp_path / "b.jsonl", [dump(None, 0, 5, [series(7, "python", "loop0", "read", b_read)])])
    d = json.loads(ok(["diff", str(a), str(b), "--json", "--phase", "total"]))
    assert (d["kind"], d["phase"], d["a"]["spec"], d["b"]["dumps"]) == ("iotrace-diff", "total", str(a), 1)
    [row] = d["rows"]
    assert (row["comm"], row["device"], row["op"]) == ("python", "loop0", "read")
    for k in ("p50", "p99", "max"):
        assert close(row["a"][k], expected(a_read)[k]) and close(row["b"][k], expected(b_read)[k])
        assert close(row["change"][k], expected(b_read)[k] - expected(a_read)[k])
        assert row["change_pct"][k] == pytest.approx(100.0, abs=1.0)
    assert row["change"]["count"] == -20 and row["change_pct"]["count"] == -50.0
    assert [(r["comm"], r["count"]) for r in d["only_a"]] == [("java", 3)] and d["only_b"] == []


def _read_until(proc: subprocess.Popen, needle: str) -> str:
    """stdout lines until one holds `needle` (the process is killed after 30 s if none does)."""
    watchdog = threading.Timer(30, proc.kill)
    watchdog.start()
    try:
        seen = ""
        while needle not in seen:
            line = proc.stdout.readline()
            if not line:
                pytest.fail(f"report --follow ended before {needle!r}: {seen}{proc.stderr.read()}")
            seen += line
        return seen
    finally:
        watchdog.cancel()


def test_report_follow_renders_each_dump_as_it_is_appended(tmp_path):
    path = write(tmp_path / "live.jsonl", [dump("epoch 1", 0, 10, [series(1, "python", "loop0", "read", READS)])])
    proc = subprocess.Popen([PYTHON, "-m", "tracer.cli", "report", "--follow", str(path)], cwd=ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    with reaped(proc):
        assert "'epoch 1'" in _read_until(proc, "python")
        line = json.dumps(jsonl.to_json(dump("epoch 2", 10, 10, [series(2, "fio", "loop1", "write", READS)])))
        with open(path, "a") as f:      # written in two parts, as a tracer's write may land
            f.write(line[:100])
            f.flush()
            time.sleep(0.6)             # the follower polls meanwhile and must wait for the rest
            f.write(line[100:] + "\n")
        shown = _read_until(proc, "loop1")
        assert "'epoch 2'" in shown and " fio " in shown
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=30)
    assert proc.returncode == 0 and not err, err      # no warning: the line was whole when read


def test_follow_takes_one_file(run):  # noqa: F811
    r = run_iotrace(["report", "--follow", str(run), str(run)])
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and "--follow takes one file" in r.stderr
