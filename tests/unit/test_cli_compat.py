"""What users of iostat, pidstat, biolatency, biotop and biolatpcts type: [interval [count]]
positionals, -p PID, -j (JSON lines on stdout), and -d given a disk."""

from __future__ import annotations

import json
import os

import pytest
from conftest import run_iotrace

from tracer.cli import trace as cli
from unit.test_core import assert_one_line_error


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
