"""iotrace plot: PNGs drawn from the dumps of real traced runs, checked as images."""

from __future__ import annotations

import struct
import subprocess
from pathlib import Path

import numpy as np
import pytest
from conftest import PYTHON, REQUIRE_BPF, ROOT, assert_count, read_dumps, run_iotrace

from tracer.codec import jsonl
from tracer.views import plot

try:        # in the dev extra, so `make setup` installs it; CI must not skip these quietly
    from PIL import Image  # a matplotlib dependency: checks the PNGs
except ImportError:
    if REQUIRE_BPF:
        raise
    pytest.skip("matplotlib is not installed (pip install -e '.[dev]')", allow_module_level=True)

TESTS = Path(__file__).resolve().parent
bpf = pytest.mark.bpf
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"

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


def check_png(path: Path, panels: int) -> dict:
    """The PNG's header, size and text; every panel's stripe of the image has something drawn in it."""
    data = path.read_bytes()
    assert data[:8] == PNG_MAGIC and data[12:16] == b"IHDR"
    width, height = struct.unpack(">II", data[16:24])
    assert (width, height) == (round(plot.WIDTH_IN * plot.DPI), round(plot.PANEL_HEIGHT_IN * plot.DPI * panels))
    im = Image.open(path)
    grey = np.asarray(im.convert("L"), dtype=np.float64)
    assert grey.shape == (height, width)
    for stripe in np.array_split(grey, panels, axis=0):
        assert stripe.std() > 20, "a blank panel"
        assert (stripe < 200).mean() > 0.01, "hardly anything drawn"
    return dict(im.info)


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
    run = traced_run(loop, tmp_path, EPOCHS)
    dumps = read_dumps(run)
    assert [d["label"] for d in dumps] == ["epoch 1", "epoch 2", "epoch 3", None]
    png = tmp_path / "epochs.png"
    r = run_plot(run, png, "--op", "read")
    assert r.returncode == 0, r.stderr
    info = check_png(png, panels=3)
    assert info["Description"] == f"panels: {plot.TITLE_TIME} | {plot.TITLE_HEAT} | {plot.TITLE_LABELS}"
    res = plot.render(list(jsonl.read(str(run))), str(tmp_path / "x.png"), op="read")
    assert res.panels[-1] == plot.TITLE_LABELS and res.height == 3 * round(plot.PANEL_HEIGHT_IN * plot.DPI)


def test_missing_matplotlib_is_one_line(tmp_path):
    run = tmp_path / "empty.jsonl"
    run.write_text("")
    code = ("import sys; sys.modules['matplotlib'] = None\n"
            "from tracer.cli import main\n"
            f"sys.exit(main(['plot', {str(run)!r}, '-o', {str(tmp_path / 'x.png')!r}]))\n")
    r = subprocess.run([PYTHON, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
    assert r.stderr.count("\n") == 1 and "pip install 'iotrace[plot]'" in r.stderr


def test_plot_bad_input_is_one_line(tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text("{}\n")
    for argv, needle in ((["plot", str(bad), "-o", str(tmp_path / "x.png")], "not an iotrace dump"),
                         (["plot", str(tmp_path / "missing.jsonl"), "-o", "x.png"], "cannot read"),
                         (["plot", str(bad)], "-o"),
                         (["plot", str(bad), "-o", "x.png", "--op", "sideways"], "--op")):
        r = run_iotrace(argv, timeout=60)
        assert r.returncode == 2 and r.stderr.count("\n") == 1 and needle in r.stderr, (argv, r.stderr)


def test_wait_shares_per_label_panel(tmp_path):
    """Labelled dumps with per-process rows and the loop's timing get the waits panel; its bars are the
    verdict's shares."""
    from datetime import UTC, datetime, timedelta

    from tracer.model.dump import Dump, PhaseStats, Series
    from tracer.model.histogram import Histogram

    t0 = datetime(2026, 1, 1, tzinfo=UTC)
    vals = np.array([1_000_000] * 10, dtype=np.int64)
    st = PhaseStats(Histogram.from_values(vals), float(vals.sum()), int(vals.min()), int(vals.max()))

    def d(label, at, wait, io_wait, disk):
        x = Dump("marker", t0 + timedelta(seconds=at), t0 + timedelta(seconds=at + 10), "h", "k",
                 [Series(101, "python", "loop0", "7:0", "read", 10, 40960, {"total": st}, tgid=101)], label=label)
        x.extra.update({"sender_pid": 100, "loop": {"data_wait_s": wait, "steps": 10, "wall_s": 10.0},
                        "tasks": [{"pid": 100, "ppid": 1, "io_wait_s": 0.0, "read_bytes": 0, "disk_read_bytes": 0},
                                  {"pid": 101, "ppid": 100, "io_wait_s": io_wait, "read_bytes": 100,
                                   "disk_read_bytes": disk}]})
        return x

    dumps = [d("epoch 1", 0, 4.0, 8.0, 100), d("epoch 2", 10, 0.1, 0.0, 0)]
    res = plot.render(dumps, str(tmp_path / "w.png"))
    assert res.panels[-1] == plot.TITLE_WAITS and len(res.panels) == 4
    check_png(tmp_path / "w.png", panels=4)
    waits = dict(plot._wait_windows(dumps))
    assert waits["epoch 1"].state == "I/O-bound" and waits["epoch 2"].state == "not I/O-bound"
    assert waits["epoch 1"].loader_io_wait == pytest.approx(0.8) and waits["epoch 1"].data_wait == pytest.approx(0.4)
    # without rows or loop timing: three panels, as before
    for x in dumps:
        x.extra.clear()
    assert plot.render(dumps, str(tmp_path / "p.png")).panels[-1] == plot.TITLE_LABELS
