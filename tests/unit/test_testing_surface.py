"""tracer.testing, the surface the scripts use, and the scripts' imports: no path hacks into the checkout."""

from __future__ import annotations

import re
from pathlib import Path

from tracer import testing

ROOT = Path(__file__).resolve().parents[2]


def test_every_public_name_is_documented():
    doc = testing.__doc__ or ""
    for name in testing.__all__:
        assert hasattr(testing, name), name
        assert re.search(rf"\b{re.escape(name)}\b", doc), f"tracer.testing.{name} is not in the module's docstring"


def test_bpf_stats_falls_back_to_the_sysctl_and_puts_it_back(tmp_path, monkeypatch):
    sysctl = tmp_path / "bpf_stats_enabled"
    sysctl.write_text("0\n")
    monkeypatch.setattr(testing, "STATS_SYSCTL", sysctl)
    monkeypatch.setattr(testing, "SYS_BPF", -1)     # no such syscall: BPF_ENABLE_STATS fails
    with testing.BPFStats() as stats:
        assert stats.fd < 0
        assert sysctl.read_text() == "1"
    assert sysctl.read_text() == "0"


def test_scripts_put_neither_the_checkout_nor_tests_on_sys_path():
    """The package is installed into the scripts' venv, and the reference lives under scripts/."""
    bad = []
    for path in sorted((ROOT / "scripts").rglob("*.py")):
        for n, line in enumerate(path.read_text().splitlines(), 1):
            if "sys.path.insert" in line and re.search(r"parent\.parent|\"tests\"|ROOT", line):
                bad.append(f"{path.relative_to(ROOT)}:{n}: {line.strip()}")
            if re.match(r"\s*(from|import) tests\b", line):
                bad.append(f"{path.relative_to(ROOT)}:{n}: {line.strip()}")
    assert not bad, "\n".join(bad)


def test_the_reference_is_importable_as_before():
    from reference import comparison, groundtruth

    assert Path(groundtruth.__file__).parent == ROOT / "scripts" / "reference"
    assert comparison.__name__ == "reference.comparison"
