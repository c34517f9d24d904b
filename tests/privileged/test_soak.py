"""The soak script, shortened for CI (30 s: the first ~10 s are the tracer warming up to its steady size)."""

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
