"""A flood of markers through the real tracer: its memory stays bounded (issue 32, item 3).

A traced COMMAND sends 10,000 markers with distinct labels as fast as the
tracer confirms them (each one a dump, its table and a JSON line), and reads
the tracer's resident memory (its parent's /proc status) after the first
300 and at the end.  The live table keeps, per label, only the verdict's
inputs for the first 1000 labels (tracer.views.report.LabelWindows): past
the warm-up nothing per marker may stay.  Measured by its helper on this VM:
78.9 MB flat from marker 1,000 to 10,000.  This end-to-end bound passed on the
code before the fix too (its per-label store already stopped at 1000 labels, and
this sender has no loader processes): what the fix bounds, whole dumps kept per
label and a task row per process ever seen, is shown by tests/unit/test_floods.py;
this one keeps a regression that kept every dump (~50 MB here) from landing.
The run takes ~3 minutes.
"""

from __future__ import annotations

import os
import subprocess

import pytest
from conftest import PYTHON, ROOT, TIMEOUT_SCALE

pytestmark = [pytest.mark.bpf, pytest.mark.slow]

MARKERS = 10_000
WARM = 300
GROWTH_MB = 3.0     # past the warm-up: allocator noise, far below what 10,000 kept dumps hold

FLOOD = f"""\
import os, sys
from tracer import marker

def rss_mb(pid):
    for line in open(f"/proc/{{pid}}/status"):
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024

tracer = os.getppid()
with open(sys.argv[1], "w") as out:
    for i in range({MARKERS}):
        if not marker.mark(f"flood {{i}}", wait=10):
            sys.exit(f"marker {{i}} not confirmed")
        if i + 1 in ({WARM}, {MARKERS}):
            print(i + 1, rss_mb(tracer), file=out, flush=True)
"""


def test_ten_thousand_markers_leave_the_tracer_flat(tmp_path):
    script, samples = tmp_path / "flood.py", tmp_path / "rss.txt"
    script.write_text(FLOOD)
    env_run = tmp_path / "run"
    env_run.mkdir()
    env = {**os.environ, "IOTRACE_RUN_DIR": str(env_run)}
    # the tables go nowhere (10,000 of them); the dumps to a file, as a trainer's run would keep them
    argv = ["-o", str(tmp_path / "out.jsonl"), "--", PYTHON, str(script), str(samples)]
    p = subprocess.run([PYTHON, "-m", "tracer.cli", *argv],
                       cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                       timeout=900 * TIMEOUT_SCALE)
    assert p.returncode == 0, p.stderr[-3000:]
    got = dict(line.split() for line in samples.read_text().splitlines())
    warm, end = float(got[str(WARM)]), float(got[str(MARKERS)])
    assert end - warm <= GROWTH_MB, f"tracer RSS {warm:.1f} MB after {WARM} markers, {end:.1f} MB after {MARKERS}"
