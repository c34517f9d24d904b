"""Kernels without block:block_io_start (before 6.5) start requests on block:block_rq_insert, which fires only
for requests that pass an I/O scheduler.  Forced onto it here ($IOTRACE_START_EVENT), iotrace must say so at
start and in every dump for a disk whose scheduler is none, and count exactly on one with mq-deadline."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from conftest import assert_count, fio_cmd, run_iotrace, series_of

pytestmark = pytest.mark.bpf

REQUESTS = 2048


def fio_reads(loop) -> list[str]:
    return fio_cmd(loop.path, rw="randread", size=f"{REQUESTS * 4}k", ioengine="libaio", iodepth=16,
                   randrepeat=0, norandommap=1)


def traced(loop, attach: str, start_event: str | None):
    env = dict(os.environ)
    env.pop("IOTRACE_START_EVENT", None)
    if start_event:
        env["IOTRACE_START_EVENT"] = start_event
    r = run_iotrace(["-j", "--dev", loop.name, "--attach", attach, "--", *fio_reads(loop)], env=env)
    assert r.returncode == 0, r.stderr
    dumps = [json.loads(line) for line in r.stdout.splitlines() if line.startswith("{")]
    reads = sum(s["count"] for s in series_of(dumps[-1], device=loop.name, op="read"))
    return r.stderr, dumps, reads


@pytest.mark.parametrize("attach", ["raw_tp", "tracepoint"])
def test_a_start_event_that_misses_requests_says_so_and_a_scheduler_fixes_it(loop, attach):
    sched = Path(f"/sys/block/{loop.name}/queue/scheduler")
    sched.write_text("none\n")     # a loop device keeps its queue's settings from an earlier attach
    try:
        check_none_then_deadline(loop, attach, sched)
    finally:
        sched.write_text("none\n")


def check_none_then_deadline(loop, attach: str, sched: Path) -> None:
    err, dumps, reads = traced(loop, attach, "block_rq_insert")
    warning = [line for line in err.splitlines() if "started on block:block_rq_insert" in line]
    assert len(warning) == 1 and loop.name in warning[0] and "scheduler none" in warning[0], err
    assert all(d["start_event"] == {"event": "block_rq_insert", "blind": [loop.name]} for d in dumps), dumps
    assert reads < REQUESTS // 2, reads      # the loss is real: most requests never had a start

    sched.write_text("mq-deadline\n")       # every request is inserted: block_rq_insert sees them all
    err, dumps, reads = traced(loop, attach, "block_rq_insert")
    assert "fires only for requests" not in err, err
    assert all(d["start_event"] == {"event": "block_rq_insert"} for d in dumps)
    assert_count(reads, REQUESTS, dumps, device=loop.name)


def test_block_io_start_is_said_in_every_dump_and_warns_of_nothing(loop):
    Path(f"/sys/block/{loop.name}/queue/scheduler").write_text("none\n")
    err, dumps, reads = traced(loop, "raw_tp", None)
    assert "fires only for requests" not in err
    assert all(d["start_event"] == {"event": "block_io_start"} for d in dumps)
    assert_count(reads, REQUESTS, dumps, device=loop.name)


def test_a_start_event_that_is_not_one_is_one_line(loop):
    r = run_iotrace(["-d", "1", "--dev", loop.name], env={**os.environ, "IOTRACE_START_EVENT": "block_rq_issue"})
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
    assert "IOTRACE_START_EVENT takes block_io_start or block_rq_insert" in r.stderr
