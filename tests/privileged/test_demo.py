"""`make demo` (scripts/demo.py) end to end: about a screen of output, the story in it, nothing left behind."""

from __future__ import annotations

import subprocess

import pytest
from conftest import PYTHON, ROOT

bpf = pytest.mark.bpf


@bpf
def test_the_demo_tells_its_story_in_about_a_screen():
    r = subprocess.run([PYTHON, str(ROOT / "scripts" / "demo.py")], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    lines = (r.stdout + r.stderr).splitlines()
    assert len(lines) <= 70, "\n".join(lines)      # 246 lines before it showed only the end of the run
    text = "\n".join(lines)
    for n in (1, 2, 3):
        assert f"  epoch {n}: " in text and f"  epoch {n} / checkpoint: " in text, text     # a verdict each
    assert "  epoch 1: I/O-bound" in text, text
    assert "(wb)" not in text and "Q:p50" not in text and "coverage:" not in text, text
    assert "demo: cleaned up" in text, text
