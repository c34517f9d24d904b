"""tracer.views.verdict: the I/O-bound rule, table-tested on crafted windows (no root, no BPF)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from tracer.model import dump as dumpmod
from tracer.model.sections import BeforeAttach, Loop, SenderPid, TaskRow, Tasks, TasksSources
from tracer.views import verdict
from tracer.views.verdict import IO_BOUND, NOT_IO_BOUND, UNKNOWN, family, judge, judge_dump

MiB = 1 << 20
TRAINER, W1, W2, SHELL = 100, 101, 102, 50


def row(pid, ppid, io_wait_s=0.0, read=0, disk=0, fsync_s=0.0, throttled_s=0.0, **kw):
    return TaskRow(pid=pid, ppid=ppid, comm=kw.get("comm", f"p{pid}"), io_wait_s=io_wait_s,
                   read_bytes=read, disk_read_bytes=disk, fsync_s=fsync_s, throttled_s=throttled_s)


def trainer_and_workers(worker_wait, read=64 * MiB, disk=0, trainer_wait=0.05, **kw):
    """A trainer (a child of iotrace, pid 1 here) with two loader workers that read `read` bytes between them."""
    return [row(TRAINER, 1, trainer_wait, **kw), row(W1, TRAINER, worker_wait, read // 2, disk // 2),
            row(W2, TRAINER, worker_wait, read // 2, disk // 2)]


def loop(wait, wall=10.0, steps=100):
    return Loop(wait, steps, wall)


CASES = [
    # (name, wall_s, loop, tasks, trainer_pid, state, words in the line)
    ("cold epoch: waited, loaders in I/O wait, bytes from disk", 10.0, loop(3.1),
     trainer_and_workers(8.5, disk=63 * MiB), TRAINER, IO_BOUND,
     ["waited 31% of the epoch for data", "2 loaders 85% on average", "98% of bytes from disk"]),
    ("warm epoch: hardly waited", 10.0, loop(0.2), trainer_and_workers(0.01, disk=0), TRAINER, NOT_IO_BOUND,
     ["waited 2% of the epoch", "100% of bytes from page cache"]),
    ("cold but prefetched: the disk was slow, the loop did not wait", 10.0, loop(0.3),
     trainer_and_workers(9.0, disk=64 * MiB), TRAINER, NOT_IO_BOUND, ["waited 3% of the epoch"]),
    ("long waits, no I/O wait, cache hits: the loaders' CPU", 10.0, loop(4.0), trainer_and_workers(0.02),
     TRAINER, NOT_IO_BOUND, ["waited 40%", "hardly in I/O wait", "loader CPU?"]),
    ("long waits, some I/O wait, mostly from disk", 10.0, loop(2.0), trainer_and_workers(0.8, disk=60 * MiB),
     TRAINER, IO_BOUND, ["8% on average", "94% of bytes from disk"]),
    ("long waits, the same I/O wait, from cache", 10.0, loop(2.0), trainer_and_workers(0.8, disk=MiB),
     TRAINER, NOT_IO_BOUND, ["loader CPU?", "98% of bytes from page cache"]),
    ("no loop timing, loaders mostly in I/O wait", 10.0, None, trainer_and_workers(7.0, disk=64 * MiB),
     TRAINER, IO_BOUND, ["no loop timing", "70% on average"]),
    ("no loop timing, little I/O wait", 10.0, None, trainer_and_workers(1.0, disk=64 * MiB), TRAINER,
     NOT_IO_BOUND, ["no loop timing"]),
    ("no rows, long waits: cannot tell why", 10.0, loop(4.0), None, None, UNKNOWN, ["--no-tasks"]),
    ("no rows, short waits: the loop did not wait", 10.0, loop(0.1), None, None, NOT_IO_BOUND, ["waited 1%"]),
    ("empty rows list, long waits", 10.0, loop(4.0), [], None, UNKNOWN, ["--no-tasks"]),
    ("neither loop nor rows", 10.0, None, None, None, UNKNOWN, ["no loop timing and no per-process rows"]),
    ("zero wall time", 0.0, loop(1.0), trainer_and_workers(1.0), TRAINER, UNKNOWN, ["empty epoch"]),
    ("a loop with no steps is no timing", 10.0, loop(5.0, steps=0), trainer_and_workers(0.1), TRAINER,
     NOT_IO_BOUND, ["no loop timing"]),
    ("tf.data: reader threads of the trainer itself, summed past 100%", 10.0, loop(5.0),
     [row(TRAINER, 1, 15.0, 64 * MiB, 64 * MiB)], TRAINER, IO_BOUND, ["trainer 150%", "100% of bytes from disk"]),
    ("a checkpoint window: fsync stalls, no loop", 2.0, None, [row(TRAINER, 1, 1.6, fsync_s=1.5)], TRAINER,
     IO_BOUND, ["trainer 80%", "checkpoint stalls: fsync 1.50 s", "no file reads"]),
]


@pytest.mark.parametrize("name,wall,lp,tasks,trainer,state,words", CASES, ids=[c[0] for c in CASES])
def test_rule(name, wall, lp, tasks, trainer, state, words):
    v = judge(wall, lp, tasks, trainer, noun="epoch")
    assert v.state == state, v.line
    assert v.line.startswith(f"{state}: "), v.line
    for w in words:
        assert w in v.line, (w, v.line)
    assert "\n" not in v.line


def test_thresholds_are_inclusive_and_one_step_below_is_not():
    rows = trainer_and_workers(verdict.IO_WAIT_MIN * 10.0, disk=0)
    at = judge(10.0, loop(verdict.DATA_WAIT_MIN * 10.0), rows, TRAINER)
    below = judge(10.0, loop(verdict.DATA_WAIT_MIN * 10.0 - 0.01), rows, TRAINER)
    assert (at.state, below.state) == (IO_BOUND, NOT_IO_BOUND)
    io_below = judge(10.0, loop(5.0), trainer_and_workers(verdict.IO_WAIT_MIN * 10.0 - 0.01, disk=0), TRAINER)
    assert io_below.state == NOT_IO_BOUND, io_below.line


def test_numbers_behind_the_line():
    v = judge(10.0, loop(3.0, wall=12.0), trainer_and_workers(5.0, read=100, disk=25, trainer_wait=1.0,
                                                            throttled_s=0.5), TRAINER)
    assert v.data_wait == pytest.approx(0.25)
    assert (v.trainer_pid, v.loaders) == (TRAINER, 2)
    assert v.trainer_io_wait == pytest.approx(0.1) and v.loader_io_wait == pytest.approx(0.5)
    assert (v.read_bytes, v.disk_read_bytes) == (100, 24)       # 25 split in two whole halves
    assert v.from_disk == pytest.approx(0.24) and v.cache_hit == pytest.approx(0.76)
    assert v.throttled_s == 0.5
    js = v.to_json()
    assert js["state"] == v.state and js["cache_hit"] == pytest.approx(0.76) and js["loaders"] == 2


def test_who_is_the_trainer():
    # iotrace -- sh -c 'python train.py': the shell is the root, python (the marker sender) the trainer
    rows = [row(SHELL, 1), row(TRAINER, SHELL), row(W1, TRAINER), row(W2, TRAINER), row(103, W1)]
    trainer, loaders = family(rows, TRAINER)
    assert trainer.pid == TRAINER and sorted(r.pid for r in loaders) == [W1, W2, 103]
    trainer, loaders = family(rows)          # no sender known: the root of the tree
    assert trainer.pid == SHELL and len(loaders) == 4
    trainer, loaders = family(rows, 999)     # a sender without a row: the root again
    assert trainer.pid == SHELL
    # two unrelated trees (a system-wide run) and no sender: nobody is the trainer
    assert family([row(1, 0), row(2, 0)]) == (None, [])


def test_no_trainer_known_the_busiest_process_speaks():
    v = judge(10.0, loop(3.0), [row(1, 0, 0.1), row(2, 0, 6.0, 10, 10), row(3, 0)], None)
    assert v.trainer_pid is None and v.busiest_io_wait == pytest.approx(0.6)
    assert v.state == IO_BOUND and "busiest of 3 processes 60%" in v.line


def test_disk_bytes_beyond_reads_are_capped_and_mmap_reads_count_as_disk():
    assert judge(10.0, None, [row(1, 0, 0.0, 100, 400)]).from_disk == 1.0   # readahead read more
    assert judge(10.0, None, [row(1, 0, 0.0, 0, 400)]).from_disk == 1.0     # no read(): mmap
    assert judge(10.0, None, [row(1, 0, 0.0, 0, 0)]).from_disk is None


def test_bad_rows_and_loops_are_the_readers_error_and_a_bad_wall_time_no_verdict():
    # what a hand-edited file may hold never reaches the rule: the sections' from_json refuse it
    # (tracer.model.sections; a bad line is one line's error in tracer.codec.jsonl)
    for bad in ({"pid": TRAINER, "ppid": 1, "io_wait_s": "x"}, {"pid": TRAINER, "read_bytes": -5}, "junk",
                {"pid": "7"}, {"pid": True}, {"pid": W1, "io_wait_s": float("nan")}):
        with pytest.raises(ValueError):
            Tasks.from_json([bad])
    for bad in ({"data_wait_s": "?", "steps": 3, "wall_s": 10}, "loop?"):
        with pytest.raises(ValueError):
            Loop.from_json(bad)
    rows = [row(TRAINER, 1), row(W1, TRAINER, 0.0, 10, 5)]
    assert judge(float("nan"), None, rows).state == UNKNOWN


def _dump(label, seconds, tasks=None, lp=None, sender=None):
    t0 = datetime(2025, 1, 1, tzinfo=UTC)
    d = dumpmod.Dump(kind="marker", label=label, start=t0, end=t0 + timedelta(seconds=seconds), host="h",
                     kernel="k", series=[])
    if tasks is not None:
        d.tasks = Tasks(tasks)
    if lp is not None:
        d.loop = lp
    if sender is not None:
        d.sender_pid = SenderPid(sender)
    return d


def test_judge_dump_reads_the_window_and_names_epochs():
    # a shell runs the trainer: its pid comes with the markers, and survives the merge of the label's dumps
    rows = [row(SHELL, 1), row(TRAINER, SHELL, 0.1), row(W1, TRAINER, 4.0, 32 * MiB, 32 * MiB)]
    parts = [_dump("epoch 1", 4.0, rows, None, TRAINER),
             _dump("epoch 1", 1.0, [row(TRAINER, SHELL)], loop(2.0, wall=5.0), TRAINER)]
    merged = dumpmod.merge_dumps(parts, kind="marker", label="epoch 1")
    assert merged.sender_pid == SenderPid(TRAINER)
    v = judge_dump(merged)
    assert v.trainer_pid == TRAINER and v.loaders == 1 and v.wall_s == 5.0
    assert v.state == IO_BOUND and "of the epoch for data" in v.line and "its loader 80%" in v.line
    assert verdict.noun_of("epoch 3 / checkpoint") == "window" and verdict.noun_of("run 2 / epoch 3") == "epoch"
    assert verdict.noun_of(None) == "window"


def test_page_cache_hits_count_pages_when_the_rows_have_them_else_bytes():
    # rows from the page cache's events: hits are of the pages read (readahead's misses against them)
    rows = [TaskRow(pid=TRAINER, ppid=1, read_bytes=64 * MiB, read_pages=16384, missed_pages=4096,
                    disk_read_bytes=16 * MiB)]
    v = judge(10.0, loop(0.5), rows, TRAINER)
    assert v.cache_hit == 0.75 and v.from_disk == 0.25
    assert "75% of bytes from page cache (page-cache hits 75% of pages read)" in v.line
    assert v.to_json()["read_pages"] == 16384 and v.to_json()["cache_hit"] == 0.75
    # readahead may add more than was read in a window: never below 0%
    rows[0].missed_pages = 20000
    assert judge(10.0, loop(0.5), rows, TRAINER).cache_hit == 0.0
    # rows timed at the syscalls (--tasks) count no pages: hits are 1 - bytes from disk, and the JSON is as before
    v = judge(10.0, loop(0.5), [row(TRAINER, 1, read=64 * MiB, disk=16 * MiB)], TRAINER)
    assert v.cache_hit == 0.75 and "read_pages" not in v.to_json()
    assert "(page-cache hits" not in v.line


def test_rows_that_could_not_count_reads_make_no_disk_share_of_disk_bytes_alone():
    # a kernel before 6.12 (Debian 12's 6.1) has no page-cache read event: the rows' read_bytes are 0 by
    # default, not because nothing was read; the disk's bytes alone must not become "100% from disk"
    waiting = trainer_and_workers(0.8, read=0, disk=64 * MiB)      # loaders in I/O wait 8% of the window
    counted = judge(10.0, loop(3.0), waiting, TRAINER)
    assert counted.from_disk == 1.0 and counted.state == IO_BOUND  # taken as mmap reads: "most from disk"
    v = judge(10.0, loop(3.0), waiting, TRAINER, reads_counted=False)
    assert v.from_disk is None and v.cache_hit is None
    # 8% I/O wait is not enough without knowing most bytes came from disk (IO_WAIT_DISK_MIN needs that)
    assert v.state == NOT_IO_BOUND and "file reads not counted on this kernel (--tasks counts them)" in v.line
    assert v.to_json()["reads_counted"] is False and "reads_counted" not in counted.to_json()
    # from a dump: its tasks_sources say whether reads had a source
    d = _dump("epoch 1", 10.0, waiting, loop(3.0), TRAINER)
    assert judge_dump(d).state == IO_BOUND
    d.tasks_sources = TasksSources.of({"io_wait": "sched:sched_switch+sched_wakeup",
                                       "reads": "unavailable: raw tracepoint mm_filemap_get_pages"})
    assert judge_dump(d).state == NOT_IO_BOUND and not judge_dump(d).reads_counted


# ---- a window that began before the tracer attached (issue 29, item 2) ------------------------------

LATE = BeforeAttach(12.5)


@pytest.mark.parametrize("name,lp,tasks,state", [
    # the rows say "hardly in I/O wait", but they saw only the part after the attach: no verdict
    ("rule 4, rows of the traced part only", loop(4.0), trainer_and_workers(0.02), UNKNOWN),
    ("rule 6, no loop timing, little I/O wait seen", None, trainer_and_workers(1.0, disk=64 * MiB), UNKNOWN),
    # the loop's own clock covers the whole window: it hardly waited, whatever came before the attach
    ("rule 2, the loop did not wait", loop(0.2), trainer_and_workers(0.01), NOT_IO_BOUND),
    # what was traced already shows it
    ("rule 3, I/O-bound in the traced part", loop(3.1), trainer_and_workers(8.5, disk=63 * MiB), IO_BOUND),
])
def test_a_window_begun_before_the_attach_says_so_and_is_not_called_not_io_bound_on_a_part(name, lp, tasks,
                                                                                         state):
    whole = judge(10.0, lp, tasks, TRAINER, noun="epoch")
    late = judge(10.0, lp, tasks, TRAINER, noun="epoch", before_attach=LATE)
    assert "attached" not in whole.line and "before_attach" not in whole.to_json()
    assert late.state == state, late.line
    assert late.line.startswith(f"{state}: ") and "attached 12.5 s after the epoch began; the cold start may be " \
                                                  "missed" in late.line, late.line
    assert late.to_json()["before_attach"] is True and late.to_json()["before_attach_s"] == 12.5
    if state == UNKNOWN:        # what the rule said of the traced part is still there, named as such
        assert whole.state == NOT_IO_BOUND and f"(what was traced: {whole.line.split(': ', 1)[1]})" in late.line


def test_how_long_before_the_attach_may_be_unknown_and_judge_dump_reads_the_section():
    d = _dump("epoch 3", 10.0, trainer_and_workers(0.02), loop(4.0), TRAINER)
    assert judge_dump(d).state == NOT_IO_BOUND
    d.before_attach = BeforeAttach(None)
    v = judge_dump(d)
    assert v.state == UNKNOWN and "attached after the epoch began; the cold start may be missed" in v.line
    assert v.to_json()["before_attach_s"] is None
