"""What users of iostat, pidstat, biolatency, biotop and biolatpcts type: [interval [count]]
positionals, -p PID, -j (JSON lines on stdout), and -d given a disk."""

from __future__ import annotations

import json
import os
import shutil
import subprocess

import pytest
from conftest import PYTHON, ROOT, assert_count, reaped, run_iotrace
from test_core import IOLOAD, assert_one_line_error

from tracer.cli import trace as cli

bpf = pytest.mark.bpf


@pytest.mark.parametrize("argv, interval, count", [
    (["1", "10"], 1.0, 10),
    (["0.5"], 0.5, None),
    (["-i", "2"], 2.0, None),
    (["--dev", "loop0", "5", "3", "--hist"], 5.0, 3),
    ([], None, None),
])
def test_interval_count_positionals(argv, interval, count):
    a = cli.parse_trace_args(argv)
    assert (a.interval, a.count) == (interval, count)


def test_p_is_pid_and_j_is_json():
    a = cli.parse_trace_args(["-p", "12", "-p", "34", "-j"])
    assert a.pids == [12, 34] and a.json
    assert not cli.parse_trace_args(["--pid", "12"]).json


@pytest.mark.parametrize("argv, needles", [
    (["-i", "1", "2"], ("give the interval once",)),
    (["1", "0"], ("count", "1 or more")),
    (["reprot", "x.jsonl"], ("neither an interval", "report")),
    (["-d", "soon"], ("not a number of seconds", "a disk is --dev")),
    (["-d", "/dev/nosuchdisk9"], ("not a number of seconds", "a disk is --dev")),
])
def test_positional_errors_are_one_line(argv, needles):
    assert_one_line_error(run_iotrace(argv, timeout=30), *needles)


def test_d_naming_a_disk_points_to_dev():
    disk = sorted(os.listdir("/sys/class/block"))[0]
    for arg in (disk, f"/dev/{disk}"):
        assert_one_line_error(run_iotrace(["-d", arg], timeout=30), "is a disk", f"--dev {disk}", "duration")


def test_help_shows_the_bcc_and_sysstat_equivalents():
    r = run_iotrace(["--help"], timeout=30)
    assert r.returncode == 0
    for needle in ("[interval [count]]", "biolatency -D", "biolatency -Q", "biolatency -d sda",
                   "iotrace --dev sda", "biotop -p PID", "-j", "iostat -o JSON", "-p PID, --pid PID"):
        assert needle in r.stdout, needle


def test_diskstats_interval_count_and_json():
    # no root needed: two reports, each one JSON line on stdout and nothing else there
    r = run_iotrace(["--diskstats", "0.3", "2", "-j"], timeout=60)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert [json.loads(line)["window"] for line in lines] == ["interval", "final"], r.stdout
    assert all(json.loads(line)["kind"] == "diskstats" for line in lines)


@bpf
def test_interval_count_prints_one_interval_and_the_final_report(loop, tmp_path):
    out = tmp_path / "out.jsonl"
    r = run_iotrace(["1", "2", "--dev", loop.name, "-o", str(out)])
    assert r.returncode == 0, r.stderr
    assert [json.loads(line)["kind"] for line in out.read_text().splitlines()] == ["interval", "final"]
    assert r.stdout.count("\ninterval:") == 1 and r.stdout.count("\nfinal:") == 1, r.stdout


@bpf
def test_p_json_streams_only_that_process_into_jq(make_loop, tmp_path):
    loop, elsewhere = make_loop(), make_loop()
    go = tmp_path / "go"
    target = subprocess.Popen([PYTHON, IOLOAD, loop.path, "200", "--wait", str(go)], stdout=subprocess.PIPE, text=True)
    # as a user types it; jq (when installed) must take every line
    sink = "jq -c ." if shutil.which("jq") else "cat"
    pipeline = subprocess.Popen(["sh", "-c", f"{PYTHON} -m tracer.cli -p {target.pid} -j -d 60 | {sink}"], cwd=ROOT,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    with reaped(target, pipeline):
        line = pipeline.stderr.readline()
        assert "tracing block I/O of pid" in line, line + pipeline.stderr.read()
        other = subprocess.Popen([PYTHON, IOLOAD, elsewhere.path, "100"], stdout=subprocess.PIPE)
        assert other.wait(30) == 0
        go.touch()
        assert target.wait(30) == 0
        out, err = pipeline.communicate(timeout=60)     # ends by itself: its target exited
    assert pipeline.returncode == 0, err
    dumps = [json.loads(line) for line in out.splitlines()]    # stdout is JSON lines only
    assert [d["kind"] for d in dumps] == ["final"]
    assert {s["pid"] for s in dumps[0]["series"]} == {target.pid}
    [row] = [s for s in dumps[0]["series"] if s["device"] == loop.name]
    assert_count(row["count"], 200, dumps, device=loop.name)
    assert "PID" not in err and "final:" not in err        # no table anywhere


@bpf
def test_json_with_a_command_keeps_its_stdout_off_ours(loop):
    r = run_iotrace(["-j", "--dev", loop.name, "--", "echo", "hello from the command"])
    assert r.returncode == 0, r.stderr
    assert "hello from the command" in r.stderr
    assert [json.loads(line)["kind"] for line in r.stdout.splitlines()] == ["final"]
