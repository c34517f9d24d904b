"""test_plot: the tests that load BPF programs (need root).

The rest, and the helpers both share, are in tests/unit/test_plot.py.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import numpy as np
import pytest
from conftest import PYTHON, ROOT, assert_count, read_dumps, run_iotrace
from unit.test_plot import (
    check_png,
)

from tracer.codec import jsonl
from tracer.views import plot

TESTS = Path(__file__).resolve().parent.parent


bpf = pytest.mark.bpf


BURSTS = """\
import sys, time
sys.path.insert(0, {tests!r})
from ioload import read_blocks
for i in range(8):                      # ~2 s of bursts: several -i 0.5 dumps
    read_blocks(sys.argv[1], 100, i * 100)
    time.sleep(0.25)
"""


EPOCHS = """\
import sys
sys.path.insert(0, {tests!r})
from ioload import read_blocks
from tracer import marker
at = 0
for i, n in enumerate([150, 300, 80], 1):
    read_blocks(sys.argv[1], n, at)
    at += n
    if not marker.mark(f"epoch {{i}}", wait=10):
        sys.exit("marker not confirmed")
read_blocks(sys.argv[1], 40, at)
"""


def traced_run(loop, tmp_path: Path, script: str, *args: str) -> Path:
    out = tmp_path / "run.jsonl"
    code = tmp_path / "load.py"
    code.write_text(script.format(tests=str(TESTS)))
    r = run_iotrace([*args, "-o", str(out), "--dev", loop.name, "--", PYTHON, str(code), loop.path])
    assert r.returncode == 0, r.stderr
    return out


def run_plot(run: Path, png: Path, *extra: str) -> subprocess.CompletedProcess:
    return subprocess.run([PYTHON, "-m", "tracer.cli", "plot", str(run), "-o", str(png), *extra], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)


@bpf
def test_plot_of_an_interval_run(loop, tmp_path):
    run = traced_run(loop, tmp_path, BURSTS, "-i", "0.5")
    dumps = read_dumps(run)
    assert len(dumps) >= 3 and not any(d["label"] for d in dumps)
    png = tmp_path / "io.png"
    r = run_plot(run, png)
    assert r.returncode == 0 and "Traceback" not in r.stderr, r.stderr
    assert f"wrote {png}" in r.stdout and "per label" not in r.stdout
    info = check_png(png, panels=2)
    assert info["Description"] == f"panels: {plot.TITLE_TIME} | {plot.TITLE_HEAT}"   # no labels: no epoch panel

    # what was drawn: the heatmap holds every request of the run, the time panel one point per dump
    loaded = list(jsonl.read(str(run)))
    res = plot.render(loaded, str(tmp_path / "again.png"), device=loop.name)
    assert res.panels == [plot.TITLE_TIME, plot.TITLE_HEAT] and res.groups == [(loop.name, "read")]
    windows, _ = plot._windows(loaded, loop.name, None)
    counts, edges_ms = plot._heat_matrix(windows, "total")
    traced = sum(s["latency_us"]["total"]["count"] for d in dumps for s in d["series"] if s["device"] == loop.name)
    assert counts.sum() == traced
    assert_count(traced, 800, dumps, device=loop.name)
    assert counts.shape[1] == len(dumps) and np.all(np.diff(edges_ms) > 0)
    # a request's band holds its latency: each dump's p50 lies in a band with requests
    for col, d in enumerate(sorted(dumps, key=lambda d: d["end"])):
        for s in d["series"]:
            p50_ms = s["latency_us"]["total"]["p50"] / 1e3
            band = np.searchsorted(edges_ms, p50_ms, side="right") - 1
            assert counts[max(band - 1, 0):band + 2, col].sum() > 0

    r = run_plot(run, tmp_path / "none.png", "--device", "loop999")
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and "no total latency for loop999" in r.stderr, r.stderr


@bpf
def test_plot_of_a_run_with_markers_has_the_epoch_panel(loop, tmp_path):
    # markers alone (the per-process rows, on by default, add the waits panel: the test below)
    run = traced_run(loop, tmp_path, EPOCHS, "--no-tasks")
    dumps = read_dumps(run)
    assert [d["label"] for d in dumps] == ["epoch 1", "epoch 2", "epoch 3", None]
    png = tmp_path / "epochs.png"
    r = run_plot(run, png, "--op", "read")
    assert r.returncode == 0, r.stderr
    info = check_png(png, panels=3)
    assert info["Description"] == f"panels: {plot.TITLE_TIME} | {plot.TITLE_HEAT} | {plot.TITLE_LABELS}"
    res = plot.render(list(jsonl.read(str(run))), str(tmp_path / "x.png"), op="read")
    assert res.panels[-1] == plot.TITLE_LABELS and res.height == 3 * round(plot.PANEL_HEIGHT_IN * plot.DPI)


def test_plot_of_a_run_with_markers_and_the_default_rows_has_the_waits_panel(loop, tmp_path):
    run = traced_run(loop, tmp_path, EPOCHS)        # no flag: every dump has its per-process rows
    assert all(isinstance(d.get("tasks"), list) for d in read_dumps(run))
    res = plot.render(list(jsonl.read(str(run))), str(tmp_path / "w.png"), op="read")
    assert res.panels == [plot.TITLE_TIME, plot.TITLE_HEAT, plot.TITLE_LABELS, plot.TITLE_WAITS]
    check_png(tmp_path / "w.png", panels=4)
