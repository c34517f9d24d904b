"""iotrace(8), docs/iotrace.8, is rendered from the argparse parsers `--help` prints (tracer.cli.manpage):
the committed page must be what they render now (`make man` writes it), must name every option of
every command, and must render with man(1) (or groff) without warnings."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from tracer.cli import manpage
from tracer.cli.common import COMMANDS

ROOT = Path(__file__).resolve().parent.parent.parent
PAGE = ROOT / "docs" / "iotrace.8"


def test_committed_page_is_what_the_parsers_render():
    assert PAGE.read_text() == manpage.render(), "docs/iotrace.8 is stale: run `make man` and commit it"


def test_rendering_does_not_follow_the_environment(monkeypatch):
    first = manpage.render()
    monkeypatch.setenv("IOTRACE_ATTACH", "tracepoint")
    monkeypatch.setenv("COLUMNS", "40")
    assert manpage.render() == first
    assert os.environ["IOTRACE_ATTACH"] == "tracepoint" and os.environ["COLUMNS"] == "40"   # put back


def test_every_command_and_option_is_in_the_page():
    page = manpage.render()
    found = manpage.parsers()
    assert [name for name, _ in found] == ["iotrace", *(f"iotrace {c}" for c in COMMANDS)]
    for name, p in found:
        if name != "iotrace":
            assert f".SS {name}\n" in page, name
        for action in p._actions:
            for opt in action.option_strings:
                assert f"\\fB{opt.replace('-', chr(92) + '-')}" in page or \
                    f", {opt.replace('-', chr(92) + '-')}" in page, f"{name}: {opt} missing from the page"
            if action.help and action.help != "==SUPPRESS==" and "%(" not in action.help:
                words = " ".join(action.help.split())[:40].replace("\\", "\\e")
                assert words in page.replace("\n", " "), f"{name}: help of {action.dest} missing"


def _render_text() -> tuple[str, str] | None:
    env = {**os.environ, "MANWIDTH": "100", "LC_ALL": "C.UTF-8"}
    if shutil.which("man"):
        r = subprocess.run(["man", "--warnings", "-l", str(PAGE)], capture_output=True, text=True, env=env,
                           timeout=60)
        assert r.returncode == 0, r.stderr
        return r.stdout, r.stderr
    if shutil.which("groff"):
        r = subprocess.run(["groff", "-man", "-Tutf8", "-ww", str(PAGE)], capture_output=True, text=True,
                           env=env, timeout=60)
        assert r.returncode == 0, r.stderr
        return r.stdout, r.stderr
    return None


def test_man_renders_the_page():
    got = _render_text()
    if got is None:
        pytest.skip("neither man nor groff is installed")
    text, warnings = got
    assert warnings.strip() == "", warnings
    assert "IOTRACE(8)" in text
    for c in COMMANDS:
        assert f"iotrace {c}" in text
    assert "--fail-on-alert" in text
