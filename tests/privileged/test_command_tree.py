"""Everything a traced COMMAND starts ends with the tracer, however the tracer ends (issue 32): a command that
ignores SIGTERM, one with background children and a DataLoader-like tree of multiprocessing workers, each with
the tracer SIGKILLed; and the normal end of -d.

A test's processes are found by a tag: the command runs under `env TAG=...`, so every process it starts has it
in its environment whatever it does, and the tracer and its supervisor (a fork of it) have it on their command
line.  Whatever a test leaves is SIGKILLed at its end, so a failing test leaves nothing either."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
import uuid
from pathlib import Path

import pytest
from conftest import PYTHON, ROOT, reaped

from privileged.test_failing import start_tracer
from tracer.runtime import cmdtree

TAG = "IOTRACE_TREE_TEST"
GONE_WITHIN_S = 5.0


def _state(pid: str) -> str:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return "X"


def tagged(tag: str, argv: bool = True) -> dict[int, str]:
    """Live processes (not zombies) that carry `tag` in their environment (the command's) or, with `argv`,
    on their command line (the tracer's and its supervisor's): pid -> what they are."""
    needle = f"{TAG}={tag}".encode()
    found = {}
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            env = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
            args = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if (needle in env or (argv and needle in args)) and _state(pid) not in ("Z", "X"):
            found[int(pid)] = b" ".join(args).decode(errors="replace")[:120]
    return found


def wait_for(what, seconds: float):
    until = time.monotonic() + seconds
    while not (got := what()) and time.monotonic() < until:
        time.sleep(0.05)
    return got


@contextlib.contextmanager
def tagged_tree():
    """A fresh tag; at the end every process still carrying it is SIGKILLed (a failed test leaves none)."""
    tag = uuid.uuid4().hex
    try:
        yield tag
    finally:
        for pid in tagged(tag):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


def cgroups_usable() -> str | None:
    """Why the tracer cannot make its command a cgroup here (then the tree is what /proc shows), or None."""
    try:
        probe = Path(cmdtree.own_cgroup_dir()) / f"iotrace-test-{uuid.uuid4().hex[:8]}"
        probe.mkdir()
        probe.rmdir()
    except (cmdtree.NoCgroup, OSError) as exc:
        return str(exc)
    return None


def command_cgroup(tracer_pid: int) -> Path | None:
    """Where the tracer makes its command's cgroup (below its own, which is ours), None without cgroup v2."""
    try:
        return Path(cmdtree.own_cgroup_dir()) / f"{cmdtree.PREFIX}{tracer_pid}{cmdtree.SUFFIX}"
    except cmdtree.NoCgroup:
        return None


DATALOADER = """
import multiprocessing as mp, os, sys, time

def worker(path):
    # a DataLoader worker: reads its shard over and over until its parent tells it to stop (never here)
    while True:
        with open(path, "rb") as f:
            f.read()
        time.sleep(0.05)

if __name__ == "__main__":
    ctx = mp.get_context("fork")        # what torch's DataLoader uses on Linux
    workers = [ctx.Process(target=worker, args=(sys.argv[1],)) for _ in range(2)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
"""


@pytest.mark.parametrize("kind", ["ignores-sigterm", "background-children", "dataloader-workers"])
def test_a_sigkilled_tracer_leaves_nothing_of_its_command(tmp_path, kind):
    """kill -9 of the tracer: within 5 s nothing the command started is left, nor the command's cgroup."""
    if kind != "ignores-sigterm" and cgroups_usable():     # the command alone: its parent-death signal
        pytest.skip(f"the command's children end with a killed tracer only in a cgroup: {cgroups_usable()}")
    shard = tmp_path / "shard"
    shard.write_bytes(b"x" * 4096)
    script = tmp_path / "loader.py"
    script.write_text(DATALOADER)
    command, size = {
        "ignores-sigterm": (["sh", "-c", "trap '' TERM; sleep 33; sleep 33"], 2),
        "background-children": (["sh", "-c", "sleep 34 & sleep 34 & wait"], 3),
        "dataloader-workers": ([PYTHON, str(script), str(shard)], 3),
    }[kind]
    with tagged_tree() as tag:
        proc, child, _ = start_tracer(["--", "env", f"{TAG}={tag}", *command])
        with reaped(proc):
            tree = wait_for(lambda: len(t := tagged(tag, argv=False)) >= size and t, 10)
            assert tree and child in tree, tree
            cgroup = command_cgroup(proc.pid)
            proc.kill()
            proc.wait(10)
        wait_for(lambda: not tagged(tag), GONE_WITHIN_S)
        left = tagged(tag)
    assert not left, f"left running {GONE_WITHIN_S} s after the tracer's SIGKILL: {left}"
    if cgroup is not None:
        assert not cgroup.exists(), "the command's cgroup outlived the tracer"


def run_to_its_end(args: list[str], tmp_path: Path) -> tuple[int, str]:
    """iotrace ARGS run to its end: (exit status, stderr).  Its outputs go to files, not pipes: a pipe would
    be held open by whatever the command left running, and reading it to its end would wait for that."""
    out, err = tmp_path / "stdout", tmp_path / "stderr"
    with open(out, "w") as o, open(err, "w") as e:
        proc = subprocess.Popen([PYTHON, "-m", "tracer.cli", *args], cwd=ROOT, stdout=o, stderr=e)
        with reaped(proc):
            proc.wait(60)
    return proc.returncode, err.read_text()


def test_the_end_of_d_leaves_nothing_of_the_command(tmp_path):
    """-d 2: the whole tree gets SIGTERM, not the shell alone; nothing it started is left once the tracer
    has exited, and its cgroup is gone."""
    with tagged_tree() as tag:
        rc, err = run_to_its_end(["-d", "2", "--", "env", f"{TAG}={tag}", "sh", "-c", "sleep 30 & sleep 30"],
                                 tmp_path)
        left = tagged(tag)
    assert "Traceback" not in err, err
    assert rc == 128 + signal.SIGTERM, err       # the command's own status: SIGTERM ended it
    assert not left, f"left running after -d 2: {left}"


def test_a_child_left_behind_ignoring_sigterm_is_killed_after_the_grace(tmp_path):
    """The command exits at once and leaves a child that ignores SIGTERM: the run ends with the command's
    status, and the child is SIGKILLed (after the grace) before the tracer exits."""
    with tagged_tree() as tag:
        rc, err = run_to_its_end(["--", "env", f"{TAG}={tag}", "sh", "-c", "(trap '' TERM; sleep 35) & exit 3"],
                                 tmp_path)
        left = tagged(tag)
    assert rc == 3, err
    assert "Traceback" not in err, err
    assert not left, f"left running: {left}"


def test_the_commands_cgroup_is_removed_at_the_end(tmp_path):
    """The cgroup made for the command is there while it runs, and gone when the run ends."""
    seen = tmp_path / "cgroup"
    if cgroups_usable():
        pytest.skip(f"no cgroup for the command here: {cgroups_usable()}")
    rc, err = run_to_its_end(["--", "sh", "-c", f"cat /proc/self/cgroup > {seen}"], tmp_path)
    assert rc == 0, err
    assert "no cgroup of its own" not in err, err
    line = next(x for x in seen.read_text().splitlines() if x.startswith("0::"))
    name = line.rsplit("/", 1)[1]
    assert name.startswith(cmdtree.PREFIX) and name.endswith(cmdtree.SUFFIX), line
    assert not (Path(cmdtree.own_cgroup_dir()) / name).exists(), "the command's cgroup outlived the run"
