"""The traced command's whole tree (tracer.runtime.cmdtree) on real processes, without BPF: ended whole, in its
cgroup or, where none can be made, as /proc shows it."""

from __future__ import annotations

import os
import signal
import time
import uuid
from pathlib import Path

import pytest

from tracer.runtime import child as childmod
from tracer.runtime import cmdtree

# a shell with a background child that ignores SIGTERM, and a foreground one that does not
TREE = "(trap '' TERM; exec sleep 36) & sleep 36; wait"


def _state(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return "X"


def live(pids) -> list[int]:
    return [p for p in pids if _state(p) not in ("Z", "X")]


class Held:
    """`sh -c TREE` spawned held as the tracer spawns a COMMAND (tracer.runtime.child): in its tree before
    it runs.  wait() reaps it; close() leaves nothing of it, whatever the test did."""

    def __init__(self, tree_of, script: str = TREE):
        self.pid, release = childmod.spawn_held(["sh", "-c", script])
        self.tree = tree_of(self.pid)
        childmod.release(release)
        self.seen: set[int] = set()

    def wait_for(self, count: int) -> list[int]:
        until = time.monotonic() + 10
        while len(pids := self.tree.pids()) < count and time.monotonic() < until:
            time.sleep(0.02)
        self.seen.update(pids)
        assert len(pids) == count, pids
        return pids

    def wait(self, timeout: float = 5) -> int:
        until = time.monotonic() + timeout
        while time.monotonic() < until:
            done, st = os.waitpid(self.pid, os.WNOHANG)
            if done:
                return childmod.exit_status(st)
            time.sleep(0.02)
        raise AssertionError(f"the shell {self.pid} did not exit")

    def close(self) -> None:
        for p in live(self.seen | set(self.tree.pids())):
            os.kill(p, signal.SIGKILL)
        self.tree.end(0)
        childmod.end(self.pid, grace=0)


def cgroup_base() -> str:
    """Our own cgroup v2, if a cgroup can be made in it (root on cgroup v2); else the test is skipped."""
    try:
        base = cmdtree.own_cgroup_dir()
        probe = Path(base) / f"iotrace-test-{uuid.uuid4().hex[:8]}"
        probe.mkdir()
        probe.rmdir()
    except (cmdtree.NoCgroup, OSError) as exc:
        pytest.skip(f"no cgroup can be made here: {exc}")
    return base


def test_without_a_cgroup_the_tree_is_what_proc_shows_and_ends_whole(tmp_path):
    """No cgroup can be made (here: its parent does not exist): a note for the start; end() still ends the
    shell and both children, the one that ignores SIGTERM by SIGKILL after the grace."""
    missing = str(tmp_path / "no-such-cgroup")
    sh = Held(lambda pid: cmdtree.CommandTree.open(pid, base=missing))
    try:
        assert sh.tree.cgroup is None
        assert sh.tree.note.startswith("the command gets no cgroup of its own (cannot make ") and \
            "No such file or directory" in sh.tree.note, sh.tree.note
        pids = sh.wait_for(3)
        sh.tree.end(0.5)
        assert live(pids) == [], "left running"
        assert sh.wait() == 128 + signal.SIGTERM
    finally:
        sh.close()


def test_the_fallback_ends_an_orphan_it_saw_before(tmp_path):
    """A child seen while its shell lived is still ended after the shell exits (it is under init now)."""
    missing = str(tmp_path / "no-such-cgroup")
    go = tmp_path / "go"
    os.mkfifo(go)
    sh = Held(lambda pid: cmdtree.CommandTree.open(pid, base=missing),
              f"(trap '' TERM; exec sleep 37) & read x < {go}; exit 0")
    try:
        pids = sh.wait_for(2)           # the shell and its orphan-to-be
        with open(go, "w"):
            pass                        # the shell reads end of file and exits
        assert sh.wait() == 0
        assert live(pids) == [p for p in pids if p != sh.pid]      # an orphan now, under init
        sh.tree.end(0.3)
        assert live(pids) == []
    finally:
        sh.close()


def test_in_its_cgroup_the_tree_ends_whole_and_the_cgroup_goes():
    base = cgroup_base()
    sh = Held(lambda pid: cmdtree.CommandTree.open(pid, base=base))
    cgroup = sh.tree.cgroup
    try:
        assert sh.tree.note is None and cgroup == os.path.join(base, f"iotrace-{os.getpid()}.cmd")
        pids = sh.wait_for(3)
        assert sorted(pids) == sorted(int(p) for p in Path(cgroup, "cgroup.procs").read_text().split())
        sh.tree.end(0.5)
        assert live(pids) == [], "left running"
        assert not os.path.exists(cgroup), "the cgroup outlived the tree"
        assert sh.wait() == 128 + signal.SIGTERM
        sh.tree.end(0.5)           # once: nothing more to do
    finally:
        sh.close()


def test_sigkill_reaches_what_the_command_forks_and_its_supervisor_is_reaped():
    """signal(SIGKILL) goes through cgroup.kill: the whole tree at once.  end() then reaps the supervisor."""
    base = cgroup_base()
    sh = Held(lambda pid: cmdtree.CommandTree.open(pid, base=base))
    supervisor = sh.tree._supervisor
    try:
        pids = sh.wait_for(3)
        assert _state(supervisor) in ("S", "R")
        sh.tree.signal(signal.SIGKILL)
        assert sh.wait() == 128 + signal.SIGKILL
        until = time.monotonic() + 5
        while live(pids) and time.monotonic() < until:
            time.sleep(0.02)
        assert live(pids) == []
        sh.tree.end(0.5)
        with pytest.raises(ChildProcessError):
            os.waitpid(supervisor, os.WNOHANG)      # reaped by end()
    finally:
        sh.close()


def test_the_cgroup_of_a_tracer_killed_with_its_supervisor_goes_at_the_next_start():
    """A dead tracer's cgroup (its supervisor killed too) is killed and removed; a live tracer's is left."""
    base = Path(cgroup_base()) / f"iotrace-test-{uuid.uuid4().hex[:8]}"
    base.mkdir()
    gone = os.fork()
    if gone == 0:
        os._exit(0)
    os.waitpid(gone, 0)             # a pid that is no process now: the dead tracer's
    stale, kept = base / f"iotrace-{gone}.cmd", base / f"iotrace-{os.getpid()}.cmd"
    stale.mkdir()
    kept.mkdir()
    left = Held(lambda pid: cmdtree.CommandTree(pid), "exec sleep 38")     # what the dead tracer left running
    try:
        (stale / "cgroup.procs").write_text(str(left.pid))
        assert cmdtree.remove_stale(str(base)) == [str(stale)]
        assert left.wait() == 128 + signal.SIGKILL
        assert not stale.exists() and kept.exists()
    finally:
        left.close()
        for d in (stale, kept, base):
            if d.exists():
                cmdtree.kill_cgroup(d)
                while cmdtree.populated(d):
                    time.sleep(0.02)
                d.rmdir()
