"""Per-sender windows (tracer.pipeline.senders): two ranks under one launcher, on crafted cuts (no root, no BPF).

The tree: launcher L, ranks A and B (its children), A's loaders a1, a2 and
B's loader b1; each cut gives every process one request per second of it,
so where each went, and how long each window is, is known beforehand.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from tracer.model.dump import Dump, PhaseStats, Series
from tracer.model.files import FileRow, Files
from tracer.model.histogram import Histogram
from tracer.model.sections import Coverage, DeviceCoverage, Owner, TaskRow, Tasks
from tracer.pipeline.senders import SenderWindows
from tracer.views.report import window_label, windows_by_label
from tracer.views.verdict import judge_dump

L, A, B, A1, A2, B1 = 100, 200, 300, 201, 202, 301
PARENT = {A: L, B: L, A1: A, A2: A, B1: B, L: 1}
T0 = datetime(2026, 1, 1, 8, 0, 0, tzinfo=UTC)


def series(pid: int, n: int) -> Series:
    ph = PhaseStats(Histogram.from_values([1000] * n), 1000.0 * n, 1000, 1000)
    return Series(pid, f"p{pid}", "loop0", "7:0", "read", n, 4096 * n, {"total": ph}, tgid=pid)


def cut(at: float, seconds: int, label: str | None = None, kind: str = "marker") -> Dump:
    pids = (L, A, B, A1, A2, B1)
    d = Dump(kind, T0 + timedelta(seconds=at), T0 + timedelta(seconds=at + seconds), "h", "6.18",
             [series(p, seconds) for p in pids], label=label, dropped={"lost": 1})
    d.tasks = Tasks([TaskRow(p, PARENT[p], f"p{p}", io_wait_s=0.5 * seconds) for p in pids])
    d.files = Files([FileRow("7:0", p, f"/f{p}", pid=p, disk_read_bytes=4096 * seconds) for p in pids])
    d.coverage = Coverage(True, {"loop0": DeviceCoverage(6 * seconds, 6 * seconds)})
    return d


def stage() -> SenderWindows:
    return SenderWindows(parent_of=PARENT.get)


def counts(d: Dump) -> dict[int, int]:
    return {s.pid: s.count for s in d.series}


def test_one_training_loop_cuts_every_window_as_before():
    w = stage()
    d = cut(0, 2, "epoch 1")
    assert w.route(d, "marker", Owner(A)) is d
    assert w.route(cut(2, 1), "final", None).owner is None and not w.cuts


def test_each_rank_s_window_holds_its_own_processes_since_its_last_marker_and_the_rest_is_kept():
    w = stage()
    a1 = w.route(cut(0, 2, "epoch 1"), "marker", Owner(A, 0))
    # rank 0's window: it and its loaders, over the 2 s cut; the launcher and rank 1 kept
    assert counts(a1) == {A: 2, A1: 2, A2: 2} and a1.owner == Owner(A, 0)
    assert {r.pid for r in a1.tasks.rows} == {A, A1, A2} and {r.pid for r in a1.files.rows} == {A, A1, A2}
    assert a1.window_s == 2 and a1.coverage is None and not a1.dropped
    b1 = w.route(cut(2, 3, "epoch 1"), "marker", Owner(B, 1))
    # rank 1's window spans both cuts (its first marker): 5 s of its processes
    assert counts(b1) == {B: 5, B1: 5} and b1.window_s == 5
    assert window_label(a1) == "rank 0: epoch 1" and window_label(b1) == "rank 1: epoch 1"
    a2 = w.route(cut(5, 1, "epoch 2"), "marker", Owner(A, 0))
    assert counts(a2) == {A: 4, A1: 4, A2: 4} and a2.window_s == 4      # since its own last marker
    final = w.route(cut(6, 1, None, "final"), "final", None)
    # the rest: the launcher throughout, what each rank did since its last marker, and the disk-wide figures
    assert counts(final) == {L: 7, A: 1, A1: 1, A2: 1, B: 2, B1: 2} and final.owner is None
    assert final.coverage.devices["loop0"].diskstats == 42 and final.dropped == {"lost": 4}
    assert not w.cuts
    # every request in exactly one dump: 6 processes x 7 s
    assert sum(s.count for d in (a1, b1, a2, final) for s in d.series) == 42


def test_a_rank_s_loaders_are_its_own_workers_not_the_other_rank_nor_the_launcher():
    w = stage()
    d = w.route(cut(0, 2, "epoch 1"), "marker", Owner(A, 0))
    from tracer.model.sections import SenderPid

    d.put(SenderPid(A))
    v = judge_dump(d)
    assert v.trainer_pid == A and v.loaders == 2 and abs(v.loader_io_wait - 0.5) < 1e-9


def test_report_by_label_keeps_the_ranks_windows_apart():
    w = stage()
    dumps = [w.route(cut(0, 2, "epoch 1"), "marker", Owner(A, 0)),
             w.route(cut(2, 2, "epoch 1"), "marker", Owner(B, 1)),
             w.route(cut(4, 1), "final", None)]
    names = [win.label for win in windows_by_label(dumps)]
    assert names == ["rank 0: epoch 1", "rank 1: epoch 1", None]


def test_kept_cuts_stay_few_however_many_markers():
    w = stage()
    for i in range(200):
        w.route(cut(i, 1, f"epoch {i}"), "marker", Owner(A if i % 2 else B))
        assert len(w.cuts) <= 3, i


def test_a_second_sender_without_a_rank_starts_per_sender_windows():
    w = stage()
    first = cut(0, 1, "A epoch 1")
    assert w.route(first, "marker", Owner(A)) is first      # one loop so far: as before
    b = w.route(cut(1, 1, "B epoch 1"), "marker", Owner(B))
    assert counts(b) == {B: 1, B1: 1} and window_label(b) == f"pid {B}: B epoch 1"
