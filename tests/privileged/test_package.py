"""iotrace as a user installs it: `pip install .` and the built wheel, each into a fresh venv, not editable.

The BPF sources must travel as package data (tracer/bpf/ in site-packages):
run from outside the checkout, the installed command finds and compiles them.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import ROOT

pytestmark = [pytest.mark.bpf, pytest.mark.slow]


def fresh_venv(where: Path) -> Path:
    # bcc is Debian's: the venv sees the system's site-packages, as scripts/setup.sh makes it
    subprocess.run(["/usr/bin/python3", "-m", "venv", "--system-site-packages", str(where)], check=True)
    return where / "bin"


def pip(bin_dir: Path, *args: str) -> None:
    r = subprocess.run([str(bin_dir / "pip"), "install", "-q", "--disable-pip-version-check", *args],
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout + r.stderr


def check_installed(bin_dir: Path, cwd: Path) -> None:
    """--help, the BPF sources' place, and a real one-second trace, run away from the checkout."""
    r = subprocess.run([str(bin_dir / "iotrace"), "--help"], cwd=cwd, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and "usage: sudo iotrace" in r.stdout, r.stderr
    where = subprocess.run([str(bin_dir / "python"), "-c", "from tracer import contract; print(contract.bpf_dir())"],
                           cwd=cwd, capture_output=True, text=True, timeout=60).stdout.strip()
    assert "site-packages/tracer/bpf" in where and not where.startswith(str(ROOT)), where
    r = subprocess.run([str(bin_dir / "iotrace"), "-d", "1", "-j"], cwd=cwd, capture_output=True, text=True,
                       timeout=180)
    assert r.returncode == 0, r.stderr
    [dump] = [json.loads(line) for line in r.stdout.splitlines()]
    assert dump["kind"] == "final" and "series" in dump


def tracked_tree(dest: Path) -> Path:
    """The checkout's tracked files, copied: a build in the checkout itself would leave build/ there, whose
    stale files a later build packages again."""
    names = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, check=True, capture_output=True).stdout
    for name in filter(None, names.decode().split("\0")):
        src = ROOT / name
        if src.is_file():
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest / name)
    return dest


def test_pip_install_dot_and_the_wheel_work_outside_the_checkout(tmp_path):
    assert sys.platform == "linux"
    src = tracked_tree(tmp_path / "src")
    plain = fresh_venv(tmp_path / "plain")
    pip(plain, str(src))
    check_installed(plain, tmp_path)

    dist = tmp_path / "dist"
    r = subprocess.run([str(plain / "pip"), "wheel", "-q", "--no-deps", "-w", str(dist), str(src)],
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr
    [wheel] = dist.glob("iotrace-*.whl")
    wheeled = fresh_venv(tmp_path / "wheeled")
    pip(wheeled, str(wheel))
    check_installed(wheeled, tmp_path)
