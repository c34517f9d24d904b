"""iotrace plot: PNGs drawn from the dumps of real traced runs, checked as images."""

from __future__ import annotations

import struct
import subprocess
from pathlib import Path

import numpy as np
import pytest
from conftest import PYTHON, REQUIRE_BPF, ROOT, put_json, run_iotrace

from tracer.errors import UserError
from tracer.views import plot

try:        # in the dev extra, so `make setup` installs it; CI must not skip these quietly
    from PIL import Image  # a matplotlib dependency: checks the PNGs
except ImportError:
    if REQUIRE_BPF:
        raise
    pytest.skip("matplotlib is not installed (pip install -e '.[dev]')", allow_module_level=True)


PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


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
        return put_json(x, {"sender_pid": 100, "loop": {"data_wait_s": wait, "steps": 10, "wall_s": 10.0},
                            "tasks": [{"pid": 100, "ppid": 1, "io_wait_s": 0.0, "read_bytes": 0, "disk_read_bytes": 0},
                                      {"pid": 101, "ppid": 100, "io_wait_s": io_wait, "read_bytes": 100,
                                       "disk_read_bytes": disk}]})

    dumps = [d("epoch 1", 0, 4.0, 8.0, 100), d("epoch 2", 10, 0.1, 0.0, 0)]
    res = plot.render(dumps, str(tmp_path / "w.png"))
    assert res.panels[-1] == plot.TITLE_WAITS and len(res.panels) == 4
    check_png(tmp_path / "w.png", panels=4)
    waits = dict(plot._wait_windows(dumps))
    assert waits["epoch 1"].state == "I/O-bound" and waits["epoch 2"].state == "not I/O-bound"
    assert waits["epoch 1"].loader_io_wait == pytest.approx(0.8) and waits["epoch 1"].data_wait == pytest.approx(0.4)
    # without rows or loop timing: three panels, as before
    for x in dumps:
        x.sender_pid = x.loop = x.tasks = None
    assert plot.render(dumps, str(tmp_path / "p.png")).panels[-1] == plot.TITLE_LABELS
    # -o is never written through a link (tracer.osutil)
    (tmp_path / "target").write_text("keep\n")
    (tmp_path / "link.png").symlink_to(tmp_path / "target")
    with pytest.raises(UserError, match="symbolic link"):
        plot.render(dumps, str(tmp_path / "link.png"))
    assert (tmp_path / "target").read_text() == "keep\n"


def test_a_plot_that_cannot_be_written_leaves_the_old_chart_as_it_was(tmp_path):
    """A full disk (here: a file-size limit, EFBIG) used to leave a partial PNG over the old chart (issue 32);
    the PNG is now written beside it and renamed over it: the old chart stays whole, no temp file is left."""
    import resource
    import signal
    import sys

    old = tmp_path / "io.png"
    old.write_bytes(b"the old chart")

    def small_files() -> None:
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)       # writes past the limit fail with EFBIG instead
        resource.setrlimit(resource.RLIMIT_FSIZE, (4096, 4096))

    r = subprocess.run([sys.executable, "-m", "tracer.cli", "plot", str(ROOT / "tests/unit/data/main-df49ae4.jsonl"),
                        "-o", str(old)], cwd=ROOT, capture_output=True, text=True, timeout=120,
                       preexec_fn=small_files)
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr[-2000:]
    assert r.stderr.startswith(f"iotrace: cannot write {old}") and len(r.stderr.splitlines()) == 1, r.stderr
    assert old.read_bytes() == b"the old chart"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["io.png"]
