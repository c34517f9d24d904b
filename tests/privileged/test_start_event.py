"""Kernels without block:block_io_start (before 6.5) start requests on block:block_getrq, which fires for every
request made from a bio: forced onto it here ($IOTRACE_START_EVENT), every request is counted, with either
scheduler, on both attach paths.  block_rq_insert, the other older start, fires only for requests that pass an
I/O scheduler: forced onto it, iotrace must say so at start and in every dump for a disk whose scheduler is
none, and count exactly on one with mq-deadline."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from conftest import assert_count, fio_cmd, run_iotrace, series_of

from tracer.sources import probe

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


@pytest.mark.skipif(probe.tracepoint_fields("block_io_start") is None, reason="no block_io_start: Linux before 6.5")
def test_block_io_start_is_said_in_every_dump_and_warns_of_nothing(loop):
    Path(f"/sys/block/{loop.name}/queue/scheduler").write_text("none\n")
    err, dumps, reads = traced(loop, "raw_tp", None)
    assert "fires only for requests" not in err
    assert all(d["start_event"] == {"event": "block_io_start"} for d in dumps)
    assert_count(reads, REQUESTS, dumps, device=loop.name)


@pytest.mark.parametrize("attach", ["raw_tp", "tracepoint"])
@pytest.mark.parametrize("scheduler", ["none", "mq-deadline"])
def test_block_getrq_starts_every_request(loop, attach, scheduler):
    sched = Path(f"/sys/block/{loop.name}/queue/scheduler")
    sched.write_text(f"{scheduler}\n")
    try:
        err, dumps, reads = traced(loop, attach, "block_getrq")
    finally:
        sched.write_text("none\n")
    assert "fires only for requests" not in err, err
    assert all(d["start_event"] == {"event": "block_getrq"} for d in dumps), dumps
    assert_count(reads, REQUESTS, dumps, device=loop.name)
    rows = series_of(dumps[-1], device=loop.name, op="read")
    assert {s["comm"] for s in rows} == {"fio"} and sum(s["bytes"] for s in rows) == reads * 4096
    # every request's queue phase was seen: it started before its issue
    assert sum(s["latency_us"]["queue"]["count"] for s in rows) == reads


@pytest.mark.parametrize("start_event", [None, "block_getrq"])
def test_a_process_is_named_as_it_is_after_exec(loop, start_event):
    """bash reads the disk itself, then execs dd at once: dd's requests carry dd's name, not the name the
    thread had a moment before (the programs cache a thread's comm for a second, and an exec ends that)."""
    env = {k: v for k, v in os.environ.items() if k != "IOTRACE_START_EVENT"}
    if start_event:
        env["IOTRACE_START_EVENT"] = start_event
    script = (f"read -r -N 65536 x < {loop.path}; "
              f"exec dd if={loop.path} of=/dev/null bs=4k count=256 skip=4096 iflag=direct status=none")
    # no readahead: bash's reads are all done before its exec (an asynchronous one could complete last,
    # and a series carries the name of its latest request)
    ra = Path(f"/sys/block/{loop.name}/queue/read_ahead_kb")
    before = ra.read_text()
    ra.write_text("0\n")
    try:
        r = run_iotrace(["-j", "--dev", loop.name, "--", "bash", "-c", script], env=env)
    finally:
        ra.write_text(before)
    assert r.returncode == 0, r.stderr
    final = json.loads([line for line in r.stdout.splitlines() if line.startswith("{")][-1])
    rows = series_of(final, device=loop.name, op="read")
    assert len(rows) == 1 and rows[0]["comm"] == "dd", (rows, final["attach"])      # one process: bash, then dd
    assert rows[0]["count"] >= 256


def test_a_start_event_that_is_not_one_is_one_line(loop):
    r = run_iotrace(["-d", "1", "--dev", loop.name], env={**os.environ, "IOTRACE_START_EVENT": "block_rq_issue"})
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
    assert "IOTRACE_START_EVENT takes block_io_start or block_getrq or block_rq_insert" in r.stderr
