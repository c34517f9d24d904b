"""The kernel matrix's fio gate (scripts/kernels/run.py fio_problems): iotrace must record every
request the disk completed, and the disk's requests plus its merges must be fio's I/Os.  And its
kernels.list: a line per kernel, the package and the Debian releases its image is built from."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts" / "kernels"))
from run import HERE, fio_problems, kernel_entry, read_list, report  # noqa: E402


def run(fio=4096, recorded=4096, reads=4096, merges=0, **extra):
    stat = {"read": reads} if merges is None else {"read": reads, "read_merges": merges}
    return {"scheduler": "mq-deadline", "attach": "raw_tp", "fio_total_ios": fio, "iotrace_recorded": recorded,
            "diskstats": stat, **extra}


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
    res = {"kernel": "linux-image-6.1.0-50-cloud-amd64", "tests": tests, "fio": None, "timings": {},
           "problems": problems, "tests_asked": asked, "logs": "/nowhere"}
    assert report([res]) is ok
