"""The soak script, shortened for CI (30 s: its first quarter is the tracer warming up to its steady size), and
each of its floods (churn, dumps, markers, scrapes) judged on its own resident memory at its start and end."""

from __future__ import annotations

import json
import subprocess

import pytest
from conftest import PYTHON, ROOT

pytestmark = [pytest.mark.bpf, pytest.mark.slow]


def test_short_soak_stays_flat(tmp_path):
    out = tmp_path / "soak.json"
    r = subprocess.run([PYTHON, str(ROOT / "scripts" / "soak.py"), "--seconds", "30", "--json", str(out)],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    v = json.loads(out.read_text())
    assert v["ok"] and v["processes"] > 500                  # processes really came and went
    assert v["rss_max_mb"] < 150 and v["growth_second_half_mb"] < 5
    assert v["pid_filter_at_end"] <= 10                      # each child left the filter at its exit
    assert not any(v["lost_for_room"].values())
    floods = {f["name"]: f for f in v["floods"]}
    assert list(floods) == ["warm-up", "churn", "dumps", "markers", "scrapes"], v["floods"]
    assert set(floods["scrapes"]["end_mb"]) == {"tracer", "server"}        # serve's /metrics process watched too
    for f in v["floods"][1:]:
        assert f["ok"] and all(f["end_mb"][k] - f["start_mb"][k] <= 5 for k in f["end_mb"]), f
    assert v["markers_sent"] > 0
    # each flood's line says its resident memory at its start and end
    assert sum("resident tracer" in line for line in r.stdout.splitlines()) == 5, r.stdout
