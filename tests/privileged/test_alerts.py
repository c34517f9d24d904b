"""test_alerts: the tests that load BPF programs (need root).

The rest, and the helpers both share, are in tests/unit/test_alerts.py.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from conftest import PYTHON, read_dumps, run_iotrace, series_of

from tracer.sinks.alerts import ALERT_EXIT

TESTS = Path(__file__).resolve().parent.parent


@pytest.mark.bpf
def test_real_run_fires_warns_records_and_fails(loop, tmp_path):
    out = tmp_path / "run.jsonl"
    read = [PYTHON, str(TESTS / "ioload.py"), loop.path, "300"]
    r = run_iotrace(["-o", str(out), "--dev", loop.name, "--alert", f"{loop.name}:read:p50>1ns",
                     "--alert", "p99>100s", "--fail-on-alert", "--", *read])
    assert r.returncode == ALERT_EXIT, r.stderr
    dumps = read_dumps(out)
    assert dumps and all("alerts" in d for d in dumps)
    with_io = [d for d in dumps if series_of(d, device=loop.name, op="read")]
    assert with_io
    for d in dumps:
        got = d["alerts"]
        if d in with_io:        # every latency is above 1 ns, none is above 100 s
            [s] = series_of(d, device=loop.name, op="read")
            assert [(a["rule"], a["device"], a["value"]) for a in got] == [
                (f"{loop.name}:read:p50>1ns", loop.name, s["latency_us"]["total"]["p50"])]
        else:
            assert got == []
    warnings = [x for x in r.stderr.splitlines() if x.startswith("iotrace: alert: ")]
    assert len(warnings) == len(with_io) and all(loop.name in w and "p50" in w for w in warnings), r.stderr
    assert f"exit {ALERT_EXIT}" in r.stderr

    # the same without --fail-on-alert: warned, recorded, exit 0; and a command's own failure wins
    r = run_iotrace(["--dev", loop.name, "--alert", "p50>1ns", "--", *read])
    assert r.returncode == 0 and "iotrace: alert: " in r.stderr, r.stderr
    r = run_iotrace(["--dev", loop.name, "--alert", "p50>1ns", "--fail-on-alert", "--", sys.executable, "-c",
                     f"import subprocess, sys; subprocess.run({read!r}); sys.exit(7)"])
    assert r.returncode == 7, r.stderr
