"""End-to-end tests of the core: real BPF, real loop devices, real fio."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
from conftest import PYTHON, ROOT, run_iotrace

IOLOAD = str(Path(__file__).resolve().parent.parent / "ioload.py")


def start_tracer(args: list[str]) -> subprocess.Popen:
    """Start iotrace in the background and return once its programs are attached."""
    proc = subprocess.Popen([PYTHON, "-m", "tracer.cli", *args], cwd=ROOT, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    line = proc.stderr.readline()
    if "tracing block I/O" not in line:
        proc.kill()
        out, err = proc.communicate()
        pytest.fail(f"iotrace did not start: {line}{err}")
    return proc


def finish(proc: subprocess.Popen, timeout: float = 60) -> tuple[str, str]:
    out, err = proc.communicate(timeout=timeout)
    assert proc.returncode == 0, err
    return out, err


# ---- errors: one line, non-zero, no traceback --------------------------------

def assert_one_line_error(r: subprocess.CompletedProcess, *needles: str) -> None:
    assert r.returncode != 0
    assert "Traceback" not in r.stderr
    lines = [x for x in r.stderr.splitlines() if x.strip()]
    assert len(lines) == 1 and lines[0].startswith("iotrace: "), r.stderr
    for n in needles:
        assert n in lines[0], lines[0]


def test_error_bad_arguments():
    assert_one_line_error(run_iotrace(["-i", "0"]), "more than 0")
    assert_one_line_error(run_iotrace(["--bogus"]), "--help")
    assert_one_line_error(run_iotrace(["--"]), "nothing after")
    assert_one_line_error(run_iotrace(["--pid", "1", "--", "true"]), "not both")


def test_error_report_bad_input(tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"hello": 1}\n')
    assert_one_line_error(run_iotrace(["report", str(bad)]), "bad.jsonl:1", "not an iotrace dump")
    assert_one_line_error(run_iotrace(["report", str(tmp_path / "missing.jsonl")]), "cannot read")
    binary = tmp_path / "bin.jsonl"
    binary.write_bytes(b"\xff\xfe\x00garbage")
    assert_one_line_error(run_iotrace(["report", str(binary)]), "not an iotrace dump")


def test_help_teaches():
    r = run_iotrace(["--help"])
    assert r.returncode == 0
    for needle in ("--pid", "-- COMMAND", "Q2D", "D2C", "report", "examples"):
        assert needle in r.stdout
