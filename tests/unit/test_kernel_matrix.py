"""The kernel matrix's fio gate (scripts/kernels/run.py fio_problems): iotrace must record every
request the disk completed, and the disk's requests plus its merges must be fio's I/Os.  And its
kernels.list: a line per kernel, the package and the Debian releases its image is built from."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts" / "kernels"))
from run import HERE, PROGRESS, TCG_THREAD, Guest, StallWatch, fio_problems, kernel_entry, new_result, read_list, report  # noqa: E402


def run(fio=4096, recorded=4096, reads=4096, merges=0, **extra):
    stat = {"read": reads} if merges is None else {"read": reads, "read_merges": merges}
    return {"scheduler": "mq-deadline", "attach": "raw_tp", "fio_total_ios": fio, "iotrace_recorded": recorded,
            "diskstats": stat, "iotrace_tasks_sources": {"io_wait": "sched:sched_switch+sched_wakeup"}, **extra}


@pytest.mark.parametrize("r, problem", [
    (run(), None),
    (run(recorded=4095, reads=4095, merges=1), None),          # a scheduler merged two reads: 4095 requests
    (run(recorded=4094, reads=4095, merges=1), "recorded 4094 of the disk's 4095"),
    (run(recorded=4095), "recorded 4095 of the disk's 4096"),
    (run(recorded=4095, reads=4095, merges=None), "4095 requests, ? merged"),   # old logs: merges unknown
    (run(recorded=4095, reads=4095, merges=0), "4095 requests, 0 merged, for fio's 4096"),
    (run(error="fio failed"), "fio failed"),
    ({"scheduler": "none", "attach": "tracepoint"}, "recorded None"),
    (run(scheduler_set="none [mq-deadline]"), None),
    # the perf-event path: completions the kernel skipped pass when each is counted and they stay within
    # 1%; an uncounted one, one more than 1%, or any on the raw path fails
    (run(attach="tracepoint", recorded=4080, iotrace_dropped={"lost_completion": 16}), None),
    (run(attach="tracepoint", recorded=4080, iotrace_dropped={"lost_completion": 15}), "recorded 4080"),
    (run(attach="tracepoint", recorded=4050, iotrace_dropped={"lost_completion": 46}), "recorded 4050"),
    (run(recorded=4080, iotrace_dropped={"lost_completion": 16}), "recorded 4080"),
    # Debian 11's loop devices offer no scheduler: an "mq-deadline" row that ran on none says so
    (run(scheduler_set="[none]", schedulers_offered="[none]"), "scheduler was [none], not mq-deadline"),
    # the per-process programs load with the block ones (iotrace's default): a kernel refusing them fails
    (run(iotrace_tasks_sources=None, iotrace_stderr="iotrace: per-process rows: the programs did not load: "
         "invalid access"), "(the per-process programs did not load): iotrace: per-process rows"),
    (run(iotrace_tasks_sources={"io_wait": "unavailable: no sched_wakeup"}), "unavailable: no sched_wakeup"),
    (run(iotrace_tasks_sources={"io_wait": "sched:sched_switch+sched_wakeup", "reads": "unavailable: 6.1"}), None),
])
def test_fio_gate(r, problem):
    out = fio_problems({"runs": [r]})
    if problem is None:
        assert out == []
    else:
        assert len(out) == 1 and problem in out[0], out


def test_kernels_list_lines(tmp_path):
    f = tmp_path / "kernels.list"
    f.write_text("# a comment\nlinux-image-a\n\nlinux-image-b  trixie   # its own release\n"
                 "linux-image-c bookworm bullseye\n")
    listed = read_list(f)
    assert listed == [["linux-image-a"], ["linux-image-b", "trixie"], ["linux-image-c", "bookworm", "bullseye"]]
    # --kernel with a listed package alone builds it from its listed releases; a quoted line as given
    assert kernel_entry("linux-image-c", listed) == ["linux-image-c", "bookworm", "bullseye"]
    assert kernel_entry("linux-image-d trixie", listed) == ["linux-image-d", "trixie"]
    assert kernel_entry("linux-image-e", listed) == ["linux-image-e"]


def test_the_matrix_lists_what_ci_gates():
    """Each line is a package and at most two release names, which build_image.sh takes as they are: Debian
    12's 6.1, 13's 6.12 and 11's 5.10 (its guest bookworm with bullseye's archive), the kernels CI gates."""
    listed = read_list(HERE / "kernels.list")
    assert all(e[0].startswith("linux-image-") and len(e) <= 3 and all(r.isalpha() for r in e[1:]) for e in listed)
    versions = [e[0].removeprefix("linux-image-").split("-")[0].split("+")[0] for e in listed]
    assert [v.rsplit(".", 1)[0] if v.count(".") > 1 else v for v in versions] == ["6.1", "6.12", "5.10"]
    assert listed[2][1:] == ["bookworm", "bullseye"]


@pytest.mark.parametrize("asked, tests, problems, ok", [
    (False, {}, [], True),          # --tests "": a measurement only (--nullblk), nothing missing
    (True, {}, [], False),          # tests asked for, none reported: a guest that never ran them
    (False, {}, ["no nullblk.json: the null_blk measurement did not finish"], False),
    (True, {"t": {"nodeid": "t", "outcome": "passed", "seconds": 1.0, "detail": ""}}, [], True),
    (True, {"t": {"nodeid": "t", "outcome": "failed", "seconds": 1.0, "detail": "x"}}, [], False),
])
def test_the_report_fails_a_kernel_only_for_what_was_asked(asked, tests, problems, ok, capsys):
    res = new_result("linux-image-6.1.0-50-cloud-amd64") | {"tests": tests, "problems": problems,
                                                            "tests_asked": asked, "logs": "/nowhere"}
    assert report([res]) is ok


# A wedged TCG guest's console, as Debian 12's 6.1 printed it in a CI run that hung for 3,000 s.
SOFT_LOCKUP = "[  124.500993] watchdog: BUG: soft lockup - CPU#0 stuck for 48s! [python3:195]"
RCU_STALL = "[   96.820975] rcu: INFO: rcu_preempt self-detected stall on CPU"
FIO_LINE = 'guest_fio: {"scheduler": "none", "attach": "raw_tp", "seconds": 59.9}'


@pytest.mark.parametrize("lines, now, hung", [
    ([], 599, None),                                              # quiet, but not for long
    ([], 600, "no progress line for 600 s"),                      # silence alone (5.10 printed nothing)
    ([(500, FIO_LINE)], 1099, None),                              # progress restarts the clock
    ([(500, FIO_LINE)], 1100, "no progress line for 600 s"),
    ([(100, RCU_STALL)], 219, None),
    ([(100, RCU_STALL)], 220, "stuck CPU"),                       # a stall report shortens the wait
    ([(100, SOFT_LOCKUP)], 220, "stuck CPU"),
    ([(100, SOFT_LOCKUP), (150, "[  152.5] watchdog: BUG: soft lockup - CPU#0 stuck for 75s!")], 220,
     "stuck CPU"),                                                # timed from the first report
    ([(100, RCU_STALL), (200, FIO_LINE)], 500, None),             # a guest that went on after a stall
    ([(100, "  guest | ordinary kernel chatter")], 300, None),
    ([(100, "tcg_budget: passed 0.0 s tests/unit/test_btf.py::x")], 699, None),
])
def test_stall_watch(lines, now, hung):
    """run.py's watcher calls a guest wedged after --stall-timeout (600) without a progress line, or
    --lockup-timeout (120) once its kernel reported a stuck CPU; progress clears both."""
    w = StallWatch(silence=600, after_lockup=120, now=0)
    for t, line in lines:
        w.feed(line, PROGRESS.search(line) is not None, t)
    why = w.hung(now)
    if hung is None:
        assert why is None
    else:
        assert why is not None and hung in why


# Debian 13's 6.12 under multi-threaded TCG, crashed by a tracepoint detach (CI's fio measurement).
OOPS = "[  167.586411] Oops: int3: 0000 [#1] PREEMPT SMP NOPTI"
PANIC = "[  167.590823] Kernel panic - not syncing: Fatal exception in interrupt"


@pytest.mark.parametrize("lines, crash", [
    ([FIO_LINE, OOPS, "[  167.586944] CPU: 0 UID: 0 PID: 18 Comm: rcu_preempt", PANIC], OOPS),   # the first line
    ([PANIC], PANIC),
    (["[    3.1] kernel BUG at mm/slub.c:441!"], "kernel BUG at"),
    (["[    3.1] BUG: unable to handle page fault for address: 0000000000000008"], "unable to handle"),
    ([SOFT_LOCKUP, RCU_STALL], None),                       # a wedge is not a crash: it is booted again
    ([FIO_LINE, 'guest_fio: {"note": "Oops: in a progress line"}'], None),   # the guest's own words
    (["tcg_budget: failed 1.0 s tests/privileged/test_x.py::test_oops_is_named"], None),
])
def test_stall_watch_names_a_crash(lines, crash):
    """A guest whose kernel crashed is reported with the crash's first console line."""
    w = StallWatch(silence=600, after_lockup=120, now=0)
    for line in lines:
        w.feed(line, PROGRESS.search(line) is not None, 1)
    if crash is None:
        assert w.crash is None
    else:
        assert w.crash is not None and crash in w.crash


def test_guests_run_single_threaded_tcg(tmp_path):
    """Multi-threaded TCG crashed and wedged guests when their kernel patched its code (run.py's
    TCG_THREAD): the guests run on one host thread unless asked otherwise."""
    def accel(*thread: str) -> str:
        cmd = Guest(tmp_path / "img", tmp_path / "o.qcow2", tmp_path / "t.img", tmp_path / "c.log", *thread).cmd
        return cmd[cmd.index("-accel") + 1]

    assert TCG_THREAD == "single"
    assert accel() == "tcg,thread=single"
    assert accel("multi") == "tcg,thread=multi"
