"""test_cli_compat: the tests that load BPF programs (need root).

The rest, and the helpers both share, are in tests/unit/test_cli_compat.py.
"""

from __future__ import annotations

import json
import shutil
import subprocess

import pytest
from conftest import PYTHON, ROOT, assert_count, reaped, run_iotrace
from unit.test_core import IOLOAD

bpf = pytest.mark.bpf


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
