"""`iotrace bench`: a real run on its scratch loop device (BPF), its teardown on signals and
errors, its argument checks, and the example CI workflow in docs/ci-bench.yml.
"""

from __future__ import annotations

import os
import re
import shlex

import pytest
from conftest import ROOT

from tracer import cli
from tracer.cli import bench
from tracer.cli.common import COMMANDS
from tracer.model import benchresult as br

# ---- no root needed ----------------------------------------------------------

@pytest.fixture
def not_root(monkeypatch):
    # also a safety net: should an argument check below regress, bench stops at the root check
    # instead of running a real suite
    monkeypatch.setattr(os, "geteuid", lambda: 1000)


def test_bench_needs_root(not_root, capsys):
    assert cli.main(["bench", "--repeat", "1"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("iotrace: iotrace bench needs root") and "sudo" in err and len(err.splitlines()) == 1


@pytest.mark.parametrize(("argv", "expect"), [
    (["--suite", "nope"], "no such suite; known suites: quick-v1"),
    (["--suite", "quick", "--", "--rw=read"], "either --suite or your own workload"),
    (["--fio", "x.fio", "--", "--rw=read"], "either --fio JOBFILE or fio options"),
    (["--fio", "/nonexistent/job.fio"], "--fio /nonexistent/job.fio: No such file"),
    (["--dev", "loop0"], "--dev is for your own workload"),
    (["--repeat", "0"], "must be 1 or more"),
    (["--"], "nothing after '--'"),
    (["--", "fio"], "nothing after '--'"),
])
def test_bench_bad_arguments(not_root, capsys, argv, expect):
    assert cli.main(["bench", *argv]) == 2
    err = capsys.readouterr().err
    assert len(err.splitlines()) == 1 and err.startswith("iotrace: ") and expect in err, err


def test_suites_resolve_and_are_well_formed():
    assert bench.find_suite("quick") is bench.find_suite("quick-v1") is bench.SUITES[bench.DEFAULT_SUITE]
    for suite in bench.SUITES.values():
        names = [w.name for w in suite.workloads]
        assert len(set(names)) == len(names), names
        for w in suite.workloads:
            # the bench supplies the device and the output; a suite that set them would escape the scratch device
            assert not any(a.startswith(("--filename", "--output", "--directory")) for a in w.fio), w
            assert f"--name={w.name}" in w.fio and "--direct=1" in w.fio


def test_custom_suite_version_is_the_workload():
    a = bench.parse_args(["--", "--rw=read", "--bs=4k"])
    b = bench.parse_args(["--", "fio", "--rw=read", "--bs=4k"])
    c = bench.parse_args(["--", "--rw=read", "--bs=8k"])
    assert a.suite == "custom" and a.version == b.version != c.version
    assert a.workloads[0].fio[0] == "--name=fio-args"     # fio refuses options without a job


# ---- the example CI workflow -------------------------------------------------

WORKFLOW = ROOT / "docs" / "ci-bench.yml"


def _workflow() -> dict:
    yaml = pytest.importorskip("yaml", reason="PyYAML is not installed (Debian: python3-yaml)")
    return yaml.safe_load(WORKFLOW.read_text())


def _run_lines(doc: dict) -> list[str]:
    steps = doc["jobs"]["bench"]["steps"]
    return [ln.strip() for s in steps if "run" in s for ln in s["run"].replace("\\\n", " ").splitlines()]


def _iotrace_argv(line: str, env: dict[str, str]) -> list[str] | None:
    """The arguments of a workflow line that runs iotrace (under sudo or not), env variables expanded."""
    words = shlex.split(re.sub(r"\$\{?(\w+)\}?", lambda m: env.get(m.group(1), m.group(0)), line))
    if words[:1] == ["sudo"]:
        words = words[1:]
        while words and words[0].startswith("-"):      # sudo's own options
            words = words[1:]
    return words[1:] if words and os.path.basename(words[0]) == "iotrace" else None


def test_ci_workflow_parses_and_runs_on_a_privileged_self_hosted_runner():
    doc = _workflow()
    job = doc["jobs"]["bench"]
    assert {"self-hosted", "privileged"} <= set(job["runs-on"])
    assert doc.get("on", doc.get(True))       # YAML 1.1 reads a bare `on` key as true
    names = [s.get("name", s.get("uses", "")) for s in job["steps"]]
    assert any("baseline" in n.lower() for n in names)


def test_ci_workflow_commands_exist(tmp_path, capsys, monkeypatch):
    doc = _workflow()
    env = doc["jobs"]["bench"]["env"]
    lines = _run_lines(doc)
    runs = [argv for ln in lines if (argv := _iotrace_argv(ln, env))]
    assert sorted(argv[0] for argv in runs) == ["bench", "compare"], runs
    assert all(argv[0] in COMMANDS for argv in runs)
    targets = re.findall(r"^([\w-]+):", (ROOT / "Makefile").read_text(), re.M)
    made = [t for ln in lines for t in re.findall(r"^make (\w+)", ln)]
    assert made and all(t in targets for t in made), made
    # the exact command lines are accepted: bench's arguments parse, to the suite the baseline is named after
    [bench_argv] = [argv[1:] for argv in runs if argv[0] == "bench"]
    plan = bench.parse_args(bench_argv)
    assert f"{plan.suite}-{plan.version}" == env["SUITE"] and plan.repeat >= 3
    # and compare's, on files named as in the workflow, decides
    [compare_argv] = [argv[1:] for argv in runs if argv[0] == "compare"]
    monkeypatch.chdir(tmp_path)
    from unit.test_compare import p99s, result
    br.write(compare_argv[0], result(p99s(100, 101, 102)))
    br.write(compare_argv[1], result(p99s(150, 151, 152)))
    assert cli.main(["compare", *compare_argv]) == 1
    br.write(compare_argv[1], result(p99s(100, 102, 103)))
    assert cli.main(["compare", *compare_argv]) == 0
    assert "Traceback" not in capsys.readouterr().err
