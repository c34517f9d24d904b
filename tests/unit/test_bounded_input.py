"""Input files are read in bounded memory (issue 32, item 4): a line longer than jsonl.MAX_LINE (16 MiB)
in what report, diff or plot read, or a bench result longer than 16 MiB for compare, is one line on
stderr and exit 2.  `iotrace report /dev/zero` grew to 23 GB, and under a 1.5 GB limit ended in a
MemoryError traceback; each case here runs as a process under that limit (ulimit -v)."""

from __future__ import annotations

import json
import resource
import subprocess
import sys

import pytest
from conftest import ROOT

from tracer.codec import jsonl

LIMIT = 1536 << 20      # bytes of address space, as `ulimit -v 1572864`


def _limited() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (LIMIT, LIMIT))


def iotrace_limited(args: list[str]) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "tracer.cli", *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=120, preexec_fn=_limited)


@pytest.fixture(scope="module")
def long_line(tmp_path_factory):
    """A file whose second line is a JSON string a little over MAX_LINE long."""
    p = tmp_path_factory.mktemp("long") / "long.jsonl"
    with open(p, "w") as f:
        f.write("\n")
        f.write('{"schema": 1, "kind": "final", "x": "' + "a" * (jsonl.MAX_LINE + 10) + '"}\n')
    return p


@pytest.mark.parametrize("args", [
    ["report", "/dev/zero"],
    ["report", "{long}"],
    ["report", "--by", "label", "{long}"],
    ["diff", "/dev/zero", "{long}"],
    ["compare", "/dev/zero", "/dev/zero"],
])
def test_an_endless_line_is_one_error_line_and_exit_2(args, long_line):
    r = iotrace_limited([a.replace("{long}", str(long_line)) for a in args])
    assert r.returncode == 2, r.stderr[-2000:]
    assert "Traceback" not in r.stderr and "MemoryError" not in r.stderr, r.stderr[-2000:]
    assert len(r.stderr.splitlines()) == 1 and r.stderr.startswith("iotrace: "), r.stderr[-2000:]
    assert "16 MiB" in r.stderr


def test_a_line_just_under_the_limit_is_still_read(tmp_path, capsys):
    """The bound is on one line, not on the file: lines up to it parse as before (this one is no dump)."""
    p = tmp_path / "ok.jsonl"
    p.write_text('{"schema": 1, "kind": "nope", "x": "' + "a" * (jsonl.MAX_LINE - 100) + '"}\n')
    with pytest.raises(Exception) as exc:
        list(jsonl.read(str(p)))
    assert "unknown kind" in str(exc.value)


# ---- nothing the invoking user's environment chooses is compiled as root (item 5) ----------------

def test_iotrace_bpf_dir_is_refused_under_sudo(tmp_path):
    """Under sudo (SUDO_UID set), $IOTRACE_BPF_DIR would have root compile the user's BPF source: one line,
    exit 2, before anything is read from that directory (its contract.toml here would be a parse error)."""
    import os

    (tmp_path / "contract.toml").write_text("[iotrace\n")
    env = {**os.environ, "IOTRACE_BPF_DIR": str(tmp_path), "SUDO_UID": "65534", "SUDO_GID": "65534"}
    r = subprocess.run([sys.executable, "-m", "tracer.cli", "-d", "1"], cwd=ROOT, capture_output=True, text=True,
                       timeout=60, env=env)
    assert r.returncode == 2, r.stderr[-2000:]
    assert r.stderr.splitlines() == [r.stderr.strip()] and "IOTRACE_BPF_DIR is not honoured under sudo" in r.stderr


@pytest.mark.parametrize("contract_text, says", [("[iotrace\n", "contract.toml: Expected ']'"),
                                                 (None, "cannot read")])
def test_a_bpf_dir_whose_contract_is_broken_or_missing_is_one_line(tmp_path, contract_text, says):
    """$IOTRACE_BPF_DIR (outside sudo) at a tree whose contract.toml is malformed or absent: one line naming
    the file, exit 2, no traceback."""
    import os
    import shutil

    from tracer import contract

    for src in contract.bpf_dir().iterdir():
        if src.name != contract.CONTRACT_FILE:
            shutil.copy(src, tmp_path / src.name)
    if contract_text is not None:
        (tmp_path / contract.CONTRACT_FILE).write_text(contract_text)
    env = {k: v for k, v in os.environ.items() if k not in ("SUDO_UID", "SUDO_GID")}
    r = subprocess.run([sys.executable, "-m", "tracer.cli", "-d", "1"], cwd=ROOT, capture_output=True, text=True,
                       timeout=60, env={**env, "IOTRACE_BPF_DIR": str(tmp_path)})
    assert r.returncode == 2, r.stderr[-2000:]
    assert r.stderr.splitlines() == [r.stderr.strip()] and says in r.stderr and str(tmp_path) in r.stderr


def test_bcc_kernel_source_is_refused_under_sudo(tmp_path, monkeypatch):
    """bcc reads $BCC_KERNEL_SOURCE itself: under sudo root would compile against headers the user chose."""
    from tracer.errors import UserError
    from tracer.sources import bpfobject

    (tmp_path / "include").mkdir()
    monkeypatch.setenv("BCC_KERNEL_SOURCE", str(tmp_path))
    monkeypatch.delenv("SUDO_UID", raising=False)
    assert bpfobject.kernel_headers() == tmp_path
    monkeypatch.setenv("SUDO_UID", "65534")
    with pytest.raises(UserError, match="BCC_KERNEL_SOURCE is not honoured under sudo"):
        bpfobject.kernel_headers()


@pytest.mark.parametrize("cmd", [["-d", "1"], ["serve", "--listen", "127.0.0.1:0"]], ids=["trace", "serve"])
def test_iotrace_cgroup_root_is_refused_under_sudo(tmp_path, cmd):
    """Under sudo, $IOTRACE_CGROUP_ROOT would have root walk a tree the invoking user chose and name what it
    found in the dumps: one line, exit 2, before the tracer starts (no BPF is loaded: the run would say so)."""
    import os

    (tmp_path / "cgroup.controllers").write_text("io\n")
    env = {**os.environ, "IOTRACE_CGROUP_ROOT": str(tmp_path), "SUDO_UID": "65534", "SUDO_GID": "65534"}
    r = subprocess.run([sys.executable, "-m", "tracer.cli", *cmd], cwd=ROOT, capture_output=True, text=True,
                       timeout=60, env=env)
    assert r.returncode == 2, r.stderr[-2000:]
    assert r.stderr.splitlines() == [r.stderr.strip()], r.stderr
    assert "IOTRACE_CGROUP_ROOT is not honoured under sudo" in r.stderr


def test_iotrace_cgroup_root_resolver_refuses_under_sudo(tmp_path, monkeypatch):
    """The resolver itself asks too (a dump built outside the CLI); without sudo the path is honoured."""
    from tracer.contract import RefusedEnvironment
    from tracer.sources import cgroups

    (tmp_path / "cgroup.controllers").write_text("io\n")
    monkeypatch.setenv(cgroups.ENV_ROOT, str(tmp_path))
    monkeypatch.delenv("SUDO_UID", raising=False)
    assert cgroups.CgroupResolver().root == str(tmp_path)
    monkeypatch.setenv("SUDO_UID", "65534")
    with pytest.raises(RefusedEnvironment, match="IOTRACE_CGROUP_ROOT is not honoured under sudo"):
        cgroups.CgroupResolver()


def test_iotrace_bpf_dir_is_honoured_without_sudo(tmp_path, monkeypatch):
    from tracer import contract

    monkeypatch.delenv("SUDO_UID", raising=False)
    monkeypatch.setenv("IOTRACE_BPF_DIR", str(tmp_path))
    assert contract.bpf_dir() == tmp_path


# ---- report --follow of a file truncated under it (item 6) --------------------------------------

def test_follow_notices_a_truncated_file_and_reads_it_again(tmp_path, capsys):
    """A file truncated and written anew while followed used to show nothing more (the read position
    lay past its end); now that is said on stderr and the new content is read from its start."""
    lines = (ROOT / "tests/unit/data/main-df49ae4.jsonl").read_text().splitlines(keepends=True)[:3]
    p = tmp_path / "run.jsonl"
    p.write_text("".join(lines))
    calls = []

    def follow(wait: float) -> bool:
        calls.append(wait)
        if len(calls) == 1:
            p.write_text(lines[1])      # shorter than what was read: a new run's first dump
        return len(calls) > 3

    got = [d.label for d in jsonl.read(str(p), follow=follow)]
    want = [jsonl.from_json(json.loads(x)).label for x in lines]
    assert got == [*want, want[1]]
    assert f"{p} was truncated; reading it again from the start" in capsys.readouterr().err
