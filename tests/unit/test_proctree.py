"""tracer.sources.proctree on fake /proc trees: the descendants found, and the walk that hands them to a filter."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from tracer.sources import proctree


class FakeProc:
    """A /proc with stat files only, and a filter that follows forks the way the BPF programs do."""

    def __init__(self, root: Path):
        self.root = root
        self.filter: set[int] = set()
        self.added: list[int] = []

    def spawn(self, pid: int, ppid: int, comm: str = "python", state: str = "S") -> None:
        d = self.root / str(pid)
        d.mkdir(exist_ok=True)
        (d / "stat").write_text(f"{pid} ({comm}) {state} {ppid} {pid} {pid} 0 -1 4194560 " + "0 " * 40 + "\n")

    def fork(self, pid: int, ppid: int, comm: str = "python") -> None:
        """A fork as the kernel does it: the child is in /proc, then the fork hook adds it if its parent is traced."""
        self.spawn(pid, ppid, comm)
        if ppid in self.filter:
            self.filter.add(pid)

    def exit(self, pid: int) -> None:
        shutil.rmtree(self.root / str(pid))
        self.filter.discard(pid)

    def add(self, pid: int) -> None:
        self.added.append(pid)
        self.filter.add(pid)


@pytest.fixture
def proc(tmp_path) -> FakeProc:
    p = FakeProc(tmp_path)
    p.spawn(1, 0, "init")
    return p


def stat_text(pid: int, comm: str, state: str, ppid: int, start: int) -> str:
    """A /proc/PID/stat line as the kernel writes it (proc(5)): 52 fields, starttime the 22nd."""
    fields = [state, str(ppid), str(pid), str(pid), "0", "-1", "4194560"] + ["0"] * 12 + [str(start)] + ["0"] * 30
    assert len(fields) == 50 and fields[19] == str(start)
    return f"{pid} ({comm}) {' '.join(fields)}\n"


def test_parse_stat_takes_comm_with_spaces_and_parentheses_and_the_start_time():
    st = proctree.parse_stat(stat_text(42, "a) (b c", "S", 7, 123456))
    assert st == proctree.ProcStat("a) (b c", "S", 7, 123456)
    assert proctree.parse_stat(stat_text(43, "", "Z", 1, 9)) == proctree.ProcStat("", "Z", 1, 9)
    for bad in ("42 no comm", "42 (short) S 7 42 42 0\n", "42 )x( S 7" + " 0" * 30, "42 (a) S seven" + " 0" * 30):
        with pytest.raises(ValueError):
            proctree.parse_stat(bad)


def test_every_reader_of_stat_uses_the_one_parser_on_a_fake_proc(tmp_path, monkeypatch):
    """The tree walk, the --diskstats sampler and the per-process tracer's parent lookup read one fake /proc."""
    from tracer.sources import diskstats, tasks

    calls = []
    real = proctree.parse_stat
    monkeypatch.setattr(proctree, "parse_stat", lambda text: calls.append(text) or real(text))
    for pid, ppid, comm in ((10, 1, "python (trainer)"), (11, 10, "pt_data_worker")):
        (tmp_path / str(pid)).mkdir()
        (tmp_path / str(pid) / "stat").write_text(stat_text(pid, comm, "S", ppid, 1000 + pid))
        (tmp_path / str(pid) / "io").write_text(f"read_bytes: {pid * 4096}\nwrite_bytes: 0\n")
    assert proctree.read_tree(str(tmp_path)) == {10: (1, "python (trainer)"), 11: (10, "pt_data_worker")}
    assert tasks._proc_ppid(11, str(tmp_path)) == 10 and tasks._proc_ppid(99, str(tmp_path)) == 0
    sampler = diskstats.ProcSampler([10], proc=str(tmp_path))
    assert set(sampler._last) == {(10, 1010), (11, 1011)}     # processes told apart by pid and start time
    assert len(calls) == 2 + 1 + 2


def test_descendants_of_several_roots_three_levels_deep(proc):
    for pid, ppid in ((10, 1), (11, 10), (12, 11), (13, 11), (20, 1), (21, 20), (30, 1)):
        proc.spawn(pid, ppid)
    tree = proctree.read_tree(str(proc.root))
    assert proctree.descendants([10], tree) == {11, 12, 13}
    assert proctree.descendants([10, 20], tree) == {11, 12, 13, 21}
    assert proctree.descendants([12], tree) == set()


def test_zombies_are_not_part_of_the_tree(proc):
    proc.spawn(10, 1)
    proc.spawn(11, 10, state="Z")
    proc.spawn(12, 10)
    assert proctree.descendants([10], proctree.read_tree(str(proc.root))) == {12}


def test_attach_adds_every_existing_descendant_and_names_them(proc):
    proc.spawn(10, 1, "python")
    proc.filter.add(10)
    proc.spawn(11, 10, "pt_data_worker")
    proc.spawn(12, 10, "pt_data_worker")
    proc.spawn(13, 12, "sh")
    found = proctree.attach_tree([10], proc.add, lambda: set(proc.filter), proc=str(proc.root))
    assert sorted(proc.added) == [11, 12, 13]
    assert found.settled and found.rounds == 2
    assert found.roots == {10: "python"}
    assert found.descendants == {11: "pt_data_worker", 12: "pt_data_worker", 13: "sh"}
    assert proctree.describe(found) == ("pid 10 (python) and 3 descendants: 11 pt_data_worker, "
                                        "12 pt_data_worker, 13 sh")


def test_a_fork_during_the_walk_is_caught_either_way(proc):
    """A child forked by a process just added is followed by the kernel; one forked by a process not yet
    added is in /proc for the next read: both end up traced, and so do their own children."""
    proc.spawn(10, 1)
    proc.filter.add(10)
    proc.spawn(11, 10)
    reads = []

    def traced() -> set[int]:
        reads.append(len(reads))
        if len(reads) == 1:
            proc.fork(12, 11)       # 11 is not in the filter yet: only /proc knows 12
        elif len(reads) == 2:
            proc.fork(13, 12)       # 12 is not in the filter yet either: 13 is found in /proc
            proc.fork(14, 11)       # 11 is in the filter now: the fork hook adds 14
        return set(proc.filter)

    found = proctree.attach_tree([10], proc.add, traced, proc=str(proc.root))
    assert found.settled
    assert proc.filter >= {10, 11, 12, 13, 14}
    assert 14 not in proc.added     # the kernel had it already
    assert set(found.descendants) == {11, 12, 13, 14}


def test_a_process_that_exits_during_the_walk_is_left_out(proc):
    proc.spawn(10, 1)
    proc.filter.add(10)
    proc.spawn(11, 10)
    proc.spawn(12, 10)

    def add(pid: int) -> None:
        proc.add(pid)
        if pid == 11:
            proc.exit(12)

    found = proctree.attach_tree([10], add, lambda: set(proc.filter), proc=str(proc.root))
    assert found.settled and set(found.descendants) == {11}


def test_a_tree_that_never_settles_is_said_to(proc):
    proc.spawn(10, 1)
    proc.spawn(100, 10)
    n = iter(range(101, 10_000))

    def add(pid: int) -> None:
        proc.spawn(next(n), 10)     # a new child with every add, forked where the filter does not follow

    found = proctree.attach_tree([10], add, set, proc=str(proc.root), max_rounds=5)
    assert not found.settled and found.rounds == 5


def test_no_children_is_the_roots_alone(proc):
    proc.spawn(10, 1, "fio")
    proc.spawn(11, 10, "fio")
    found = proctree.attach_tree([10], proc.add, lambda: set(proc.filter), proc=str(proc.root), follow=False)
    assert proc.added == [] and found.descendants == {} and found.roots == {10: "fio"}
    assert proctree.describe(found) == "pid 10 (fio)"


def test_describe_counts_the_rest_and_makes_names_safe(proc):
    proc.spawn(10, 1, "\x1b[2Jtrainer")
    for pid in range(11, 21):
        proc.spawn(pid, 10, "w\nfake row")
    text = proctree.describe(proctree.snapshot([10, 99], proc=str(proc.root)), shown=2)
    assert text == ("pid 10 (\\x1b[2Jtrainer) and 10 descendants: 11 w\\x0afake row, 12 w\\x0afake row, "
                    "... (8 more)")
    assert text.isprintable()
