"""The offline matcher of tracer.groundtruth on real event sequences (no root needed)."""

from __future__ import annotations

import numpy as np

from tracer import groundtruth as gt

# ---- the reference's matching, on event sequences seen on a loop device (no root) ----

def ev(ts: int, name: str, pid: int = 100, **f) -> gt.Event:
    f.setdefault("dev", 7 << 20)
    return gt.Event(ts, 0, ts, name, pid, pid, f)


def start(ts, sector, nbytes, rwbs, pid=100):
    return ev(ts, "block_io_start", pid, sector=sector, nr_sector=nbytes // 512, bytes=nbytes, rwbs=rwbs, comm="p")


def issue(ts, sector, nbytes, rwbs):
    return ev(ts, "block_rq_issue", 1, sector=sector, nr_sector=nbytes // 512, bytes=nbytes, rwbs=rwbs)


def complete(ts, sector, nr_sector, rwbs):
    return ev(ts, "block_rq_complete", 2, sector=sector, nr_sector=nr_sector, rwbs=rwbs)


def test_truth_zero_byte_flush_has_only_total():
    # FWS start, the flush machinery's own FF request, then the 0-byte completion of the original
    t = gt.Truth.from_events([start(100, 0, 0, "FWS"), issue(110, 0, 0, "FF"), complete(500, 2**64 - 1, 0, "FF"),
                              complete(507, 0, 0, "WS")])
    [r] = t.requests
    assert (r.op, r.bytes, r.issue_ns, r.total_ns) == ("flush", 0, None, 407)
    assert t.notes["internal_flush"] == 1 and not t.in_flight


def test_truth_preflush_write_and_its_tail():
    t = gt.Truth.from_events([start(100, 98328, 1024, "FWFSM"), issue(110, 0, 0, "FF"),
                              complete(300, 2**64 - 1, 0, "FF"), issue(310, 98328, 1024, "WSM"),
                              complete(350, 98328, 2, "WSM"), issue(360, 0, 0, "FF"),
                              complete(600, 2**64 - 1, 0, "FF"), complete(602, 98328, 0, "WSM")])
    [r] = t.requests
    assert (r.op, r.bytes, r.queue_ns, r.device_ns, r.total_ns) == ("write", 1024, 210, 40, 250)
    assert t.notes["flush_tail"] == 1


def test_truth_back_merge_partial_and_front_merge():
    t = gt.Truth.from_events([
        start(100, 1000, 4096, "W"),                         # back merges grow it to 16 KiB by its issue
        start(105, 2000, 4096, "W"),
        ev(106, "block_bio_frontmerge", sector=1992, nr_sector=8, rwbs="W"),   # now starts at 1992
        issue(120, 1000, 16384, "W"), issue(121, 1992, 8192, "W"),
        complete(200, 1000, 16, "W"), complete(250, 1016, 16, "W"),          # partial, then the rest
        complete(260, 1992, 16, "W")])
    a, b = sorted(t.requests, key=lambda r: r.sector)
    assert (a.sector, a.bytes, a.total_ns, a.device_ns) == (1000, 16384, 150, 130)
    assert (b.sector, b.bytes, b.queue_ns) == (2000, 8192, 16)
    assert t.notes["partial"] == 1 and t.notes["front_merge"] == 1


def test_truth_merged_request_is_not_accounted():
    t = gt.Truth.from_events([start(100, 8, 4096, "R"), start(101, 16, 4096, "R"),
                              ev(102, "block_rq_merge", sector=16, nr_sector=8, bytes=4096, rwbs="R"),
                              issue(103, 8, 8192, "R"), complete(150, 8, 16, "R")])
    [r] = t.requests
    assert (r.sector, r.bytes, r.start_ns) == (8, 8192, 100) and t.notes["merged"] == 1


def test_truth_two_requests_at_one_sector_are_issued_in_turn():
    # two processes read the same block at once: each issue belongs to a different request
    t = gt.Truth.from_events([start(100, 5088, 4096, "R", pid=1), issue(102, 5088, 4096, "R"),
                              start(146, 5088, 4096, "R", pid=2), issue(148, 5088, 4096, "R"),
                              complete(223, 5088, 8, "R"), complete(239, 5088, 8, "R")])
    by_pid = {r.tgid: r for r in t.requests}
    assert (by_pid[1].queue_ns, by_pid[2].queue_ns) == (2, 2)
    assert all(r.issue_ns is not None for r in t.requests)


def test_truth_percentiles_are_nearest_rank():
    vals = np.arange(1, 1001)
    assert [gt.nearest_rank(vals, q) for q in (50, 90, 99, 99.9)] == [500, 900, 990, 999]
    assert gt.nearest_rank(np.array([7]), 99.9) == 7
