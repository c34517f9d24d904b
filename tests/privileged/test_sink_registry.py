"""A sink is one module plus one line in SINKS, in every live mode: its option parses and it gets the windows
in trace, --diskstats, serve and top alike (tests/with_sink.py registers the sink "tally")."""

from __future__ import annotations

import json
import shutil
import signal
import subprocess
import time

import pytest
from conftest import PYTHON, ROOT, reaped

pytestmark = pytest.mark.bpf
WITH_SINK = str(ROOT / "tests" / "with_sink.py")


def tally(path) -> dict:
    return json.loads(path.read_text())


def test_trace_mode(loop, tmp_path):
    out = tmp_path / "t.json"
    r = subprocess.run([PYTHON, WITH_SINK, "0.3", "2", "--dev", loop.name, "--tally", str(out)], cwd=ROOT,
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert tally(out) == {"mode": "trace", "kinds": ["interval", "final"]}


def test_diskstats_mode(tmp_path):
    out = tmp_path / "d.json"
    r = subprocess.run([PYTHON, WITH_SINK, "--diskstats", "0.2", "2", "--tally", str(out)], cwd=ROOT,
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    t = tally(out)
    assert t["mode"] == "diskstats" and len(t["kinds"]) == 2, t


def test_serve_mode(loop, tmp_path):
    from unit.test_serve import free_port

    out = tmp_path / "s.json"
    p = subprocess.Popen([PYTHON, WITH_SINK, "serve", "--listen", f"127.0.0.1:{free_port()}", "-i", "0.3",
                          "--dev", loop.name, "--tally", str(out)], cwd=ROOT, stderr=subprocess.PIPE, text=True)
    with reaped(p):
        time.sleep(8)       # the programs load, then a few drains
        p.send_signal(signal.SIGTERM)
        _, err = p.communicate(timeout=60)
    assert p.returncode == 0, err
    t = tally(out)
    assert t["mode"] == "serve" and len(t["kinds"]) >= 2, t


def test_top_mode(loop, tmp_path):
    if shutil.which("script") is None:
        pytest.skip("no script(1) for a terminal")
    out = tmp_path / "p.json"
    cmd = f"{PYTHON} {WITH_SINK} top 0.3 2 --dev {loop.name} --tally {out}"
    # script(1) gives top the terminal it wants
    r = subprocess.run(["script", "-qec", cmd, "/dev/null"], cwd=ROOT, capture_output=True, text=True,
                       timeout=120, env={"TERM": "xterm", "PATH": "/usr/bin:/bin", "COLUMNS": "150", "LINES": "40"},
                       stdin=subprocess.DEVNULL)
    assert r.returncode == 0, r.stdout + r.stderr
    t = tally(out)
    assert t["mode"] == "top" and len(t["kinds"]) == 2, t
