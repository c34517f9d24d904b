"""The offline matcher of reference.groundtruth on real event sequences (no root needed)."""

from __future__ import annotations

from collections import Counter
from dataclasses import replace

import numpy as np
import pytest
from reference import comparison
from reference import groundtruth as gt

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


def as_getrq(events: list[gt.Event]) -> list[gt.Event]:
    """The same requests started on block_getrq (kernels before 6.5): it names the bio, whose fields give
    nr_sector but no bytes."""
    return [replace(e, name="block_getrq", f={k: v for k, v in e.f.items() if k != "bytes"})
            if e.name == "block_io_start" else e for e in events]


def truth(events: list[gt.Event]) -> gt.Truth:
    """The matcher's result, checked to be the same when the requests start on block_getrq."""
    t = gt.Truth.from_events(events)
    g = gt.Truth.from_events(as_getrq(events), start_event="block_getrq")
    assert (g.requests, g.in_flight, g.notes) == (t.requests, t.in_flight, t.notes)
    return t


def test_truth_zero_byte_flush_has_only_total():
    # FWS start, the flush machinery's own FF request, then the 0-byte completion of the original
    t = truth([start(100, 0, 0, "FWS"), issue(110, 0, 0, "FF"), complete(500, 2**64 - 1, 0, "FF"),
                              complete(507, 0, 0, "WS")])
    [r] = t.requests
    assert (r.op, r.bytes, r.issue_ns, r.total_ns) == ("flush", 0, None, 407)
    assert t.notes["internal_flush"] == 1 and not t.in_flight


def test_truth_preflush_write_and_its_tail():
    t = truth([start(100, 98328, 1024, "FWFSM"), issue(110, 0, 0, "FF"),
                              complete(300, 2**64 - 1, 0, "FF"), issue(310, 98328, 1024, "WSM"),
                              complete(350, 98328, 2, "WSM"), issue(360, 0, 0, "FF"),
                              complete(600, 2**64 - 1, 0, "FF"), complete(602, 98328, 0, "WSM")])
    [r] = t.requests
    assert (r.op, r.bytes, r.queue_ns, r.device_ns, r.total_ns) == ("write", 1024, 210, 40, 250)
    assert t.notes["flush_tail"] == 1


def test_truth_back_merge_partial_and_front_merge():
    t = truth([
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
    t = truth([start(100, 8, 4096, "R"), start(101, 16, 4096, "R"),
                              ev(102, "block_rq_merge", sector=16, nr_sector=8, bytes=4096, rwbs="R"),
                              issue(103, 8, 8192, "R"), complete(150, 8, 16, "R")])
    [r] = t.requests
    assert (r.sector, r.bytes, r.start_ns) == (8, 8192, 100) and t.notes["merged"] == 1


def test_truth_two_requests_at_one_sector_are_issued_in_turn():
    # two processes read the same block at once: each issue belongs to a different request
    t = truth([start(100, 5088, 4096, "R", pid=1), issue(102, 5088, 4096, "R"),
                              start(146, 5088, 4096, "R", pid=2), issue(148, 5088, 4096, "R"),
                              complete(223, 5088, 8, "R"), complete(239, 5088, 8, "R")])
    by_pid = {r.tgid: r for r in t.requests}
    assert (by_pid[1].queue_ns, by_pid[2].queue_ns) == (2, 2)
    assert all(r.issue_ns is not None for r in t.requests)


def test_truth_percentiles_are_nearest_rank():
    vals = np.arange(1, 1001)
    assert [gt.nearest_rank(vals, q) for q in (50, 90, 99, 99.9)] == [500, 900, 990, 999]
    assert gt.nearest_rank(np.array([7]), 99.9) == 7


# ---- joining the BPF stamps onto ftrace's events (no root) ----

def stamps(*rows) -> np.ndarray:
    """Stamper records: (event name, sector, ts, end[, request address[, bio[, next bio]]]) on CPU 0 of 7:0."""
    out = np.zeros(len(rows), dtype=[("ts", "<u8"), ("end", "<u8"), ("sector", "<u8"), ("rq", "<u8"),
                                     ("bio", "<u8"), ("bio_next", "<u8"), ("dev", "<u4"), ("cpu", "<u2"),
                                     ("event", "u1"), ("side", "u1")])
    for i, (name, sector, ts, end, *ids) in enumerate(rows):
        rq, bio, bio_next = (*ids, 0, 0, 0)[:3]
        event = 0 if name in gt.START_EVENTS else gt.stamped().index(name)     # enum stamp_event
        out[i] = (ts, end, sector, rq, bio, bio_next, 7 << 20, 0, event, 0)
    return out


def test_stamps_join_in_order_even_for_close_twins_at_one_sector():
    # two reads of one block 700 ns apart on one CPU; each BPF stamp follows its ftrace event
    # by 500 ns (one tracepoint call's callbacks finish before the next call's begin)
    events = [start(1000, 8, 4096, "R", pid=1), start(1700, 8, 4096, "R", pid=2),
              issue(3000, 8, 4096, "R"), issue(3700, 8, 4096, "R"),
              complete(9000, 8, 8, "R"), complete(9900, 8, 8, "R")]
    before = stamps(("block_io_start", 8, 1500, 1600), ("block_io_start", 8, 2200, 2300),
                    ("block_rq_issue", 8, 3500, 3600), ("block_rq_issue", 8, 4200, 4300),
                    ("block_rq_complete", 8, 9500, 9600), ("block_rq_complete", 8, 10400, 10500))
    after = before.copy()
    after["ts"] += 400
    joined, notes = gt.attach_stamps(events, before, after)
    assert [e.stamp.ts for e in joined] == [1600, 2300, 3600, 4300, 9600, 10500]
    assert all(e.stamp.slack == 0 for e in joined) and not notes["stamp_unmatched_before"]
    t = gt.Truth.from_events(joined)
    by_pid = {r.tgid: r for r in t.requests}
    assert by_pid[1].phase_bounds("queue") == (2000,) * 3            # 3600 - 1600
    assert by_pid[2].phase_bounds("total") == (10500 - 2300,) * 3


def twins():
    """Two processes read one block at once; the one started second is issued and completed first: the
    events, and the raw stamps with each request's address (0xa, 0xb)."""
    events = [start(1000, 8, 4096, "R", pid=1), start(1700, 8, 4096, "R", pid=2),
              issue(3000, 8, 4096, "R"), issue(3700, 8, 4096, "R"),
              complete(9000, 8, 8, "R"), complete(20000, 8, 8, "R")]
    before = stamps(("block_io_start", 8, 1500, 1600, 0xa), ("block_io_start", 8, 2200, 2300, 0xb),
                    ("block_rq_issue", 8, 3500, 3600, 0xb), ("block_rq_issue", 8, 4200, 4300, 0xa),
                    ("block_rq_complete", 8, 9500, 9600, 0xb), ("block_rq_complete", 8, 20500, 20600, 0xa))
    return events, before


def test_request_addresses_tell_twins_at_one_sector_apart():
    # two processes read one block at once; the one started second is issued and completed first.
    # ftrace's fields alone match first in, first out (and swap them); the raw stamps' request
    # addresses (0xa, 0xb) give each completion its own request
    events, before = twins()
    joined, notes = gt.attach_stamps(events, before, None)
    t = gt.Truth.from_events(joined)
    by_pid = {r.tgid: r for r in t.requests}
    assert by_pid[1].phase_bounds("total") == (20600 - 1600,) * 3
    assert by_pid[2].phase_bounds("total") == (9600 - 2300,) * 3
    assert by_pid[2].phase_bounds("queue") == (3600 - 2300,) * 3
    assert t.notes["same_sector_by_request"] >= 2 and not t.notes["same_sector_overlap"]
    # without the addresses the same events are matched in order: pid 1 takes the first completion
    t = gt.Truth.from_events(gt.attach_stamps(events, before[["ts", "end", "sector", "dev", "cpu", "event",
                                                                "side"]], None)[0])
    assert {r.tgid: r for r in t.requests}[1].phase_bounds("total") == (9600 - 1600,) * 3


def test_a_block_getrq_start_is_found_by_its_bio_at_issue():
    # block_getrq (before 6.5) names the bio: the raw stamper records the start's bio (0x1, 0x2), and at
    # issue the request's first bio and the one after it (as after a front merge), by which each issue
    # finds its own start; the one started second is issued and completed first
    events = as_getrq([start(1000, 8, 4096, "R", pid=1), start(1700, 8, 4096, "R", pid=2),
                       issue(3000, 8, 4096, "R"), issue(3700, 8, 4096, "R"),
                       complete(9000, 8, 8, "R"), complete(20000, 8, 8, "R")])
    before = stamps(("block_getrq", 8, 1500, 1600, 0, 0x1), ("block_getrq", 8, 2200, 2300, 0, 0x2),
                    ("block_rq_issue", 8, 3500, 3600, 0xb, 0x2), ("block_rq_issue", 8, 4200, 4300, 0xa, 0x9, 0x1),
                    ("block_rq_complete", 8, 9500, 9600, 0xb), ("block_rq_complete", 8, 20500, 20600, 0xa))
    joined, notes = gt.attach_stamps(events, before, None, "block_getrq")
    assert all(e.stamp.ts is not None for e in joined) and not notes["stamp_unmatched_before"]
    t = gt.Truth.from_events(joined, start_event="block_getrq")
    by_pid = {r.tgid: r for r in t.requests}
    assert (by_pid[1].bytes, by_pid[1].op) == (4096, "read")
    assert by_pid[2].phase_bounds("queue") == (3600 - 2300,) * 3
    assert by_pid[2].phase_bounds("total") == (9600 - 2300,) * 3
    assert by_pid[1].phase_bounds("queue") == (4300 - 1600,) * 3
    assert by_pid[1].phase_bounds("total") == (20600 - 1600,) * 3
    assert t.notes["same_sector_by_request"] == 3 and not t.notes["same_sector_overlap"]
    # the start event is named, not guessed: taken for block_io_start's, the start stamps join nothing
    unnamed, notes = gt.attach_stamps(events, before, None)
    assert notes["stamp_unmatched_before"] == 2 and unnamed[0].stamp is None


def test_without_its_bio_a_block_getrq_start_is_paired_in_order_and_its_completion_by_request():
    # no bios in the stamps: twins at one sector are paired with their issues in order, and each issue's
    # request address then gives its completion to the right one: the device time is the request's own
    events = as_getrq([start(1000, 8, 4096, "R", pid=1), start(1700, 8, 4096, "R", pid=2),
                       issue(3000, 8, 4096, "R"), issue(3700, 8, 4096, "R"),
                       complete(9000, 8, 8, "R"), complete(20000, 8, 8, "R")])
    before = stamps(("block_getrq", 8, 1500, 1600), ("block_getrq", 8, 2200, 2300),
                    ("block_rq_issue", 8, 3500, 3600, 0xb), ("block_rq_issue", 8, 4200, 4300, 0xa),
                    ("block_rq_complete", 8, 9500, 9600, 0xa), ("block_rq_complete", 8, 20500, 20600, 0xb))
    t = gt.Truth.from_events(gt.attach_stamps(events, before, None, "block_getrq")[0], start_event="block_getrq")
    by_pid = {r.tgid: r for r in t.requests}
    assert by_pid[1].phase_bounds("queue") == (3600 - 1600,) * 3           # first started, first issued (0xb)
    assert by_pid[1].phase_bounds("device") == (20600 - 3600,) * 3         # 0xb's completion
    assert by_pid[2].phase_bounds("device") == (9600 - 4300,) * 3          # 0xa's
    assert t.notes["same_sector_overlap"] and t.notes["same_sector_by_request"]


def test_a_missing_stamp_marks_the_event_unseen_and_its_request_out_of_reach():
    events = [start(1000, 8, 4096, "R"), issue(2000, 8, 4096, "R"), complete(5000, 8, 8, "R"),
              start(6000, 16, 4096, "R"), issue(7000, 16, 4096, "R"), complete(9000, 16, 8, "R")]
    before = stamps(("block_io_start", 8, 1100, 1200), ("block_rq_issue", 8, 2100, 2200),
                    ("block_io_start", 16, 6100, 6200), ("block_rq_issue", 16, 7100, 7200),
                    ("block_rq_complete", 16, 9100, 9200))    # the first completion ran no BPF program
    joined, notes = gt.attach_stamps(events, before, None)
    assert notes["bpf_unseen_block_rq_complete"] == 1
    t = gt.Truth.from_events(joined)
    seen = {r.sector: r.bpf_seen for r in t.requests}
    assert seen == {8: False, 16: True}


def test_a_start_only_the_after_copy_stamped_is_bounded_by_its_window():
    # raw tracepoints guard each program alone: the before-copy skipped (its run preempted) while
    # iotrace's and the after-copy ran; iotrace's stamp lies between ftrace's event and the after-copy
    events = [start(1000, 8, 4096, "R"), issue(2000, 8, 4096, "R"), complete(5000, 8, 8, "R")]
    before = stamps(("block_rq_issue", 8, 2100, 2200), ("block_rq_complete", 8, 5100, 5200))
    after = stamps(("block_io_start", 8, 1900, 0), ("block_rq_issue", 8, 2300, 0),
                   ("block_rq_complete", 8, 5300, 0))
    joined, notes = gt.attach_stamps(events, before, after)
    assert notes["bpf_unseen_block_io_start"] == 1 and joined[0].stamp.window == (1000, 1900)
    (r,) = gt.Truth.from_events(joined).requests
    assert not r.bpf_seen and r.bpf_maybe
    assert r.phase_bounds("total") == (5200 - 1000, 5200 - 1900, 5200 - 1000)
    assert r.phase_bounds("device") == (3000,) * 3
    # without the after-copy nothing bounds it: out of reach
    (r,) = gt.Truth.from_events(gt.attach_stamps(events, before, None)[0]).requests
    assert not r.bpf_seen and not r.bpf_maybe


def _req(sector: int, seen: bool) -> gt.Request:
    st = gt.Stamp(100 + sector) if seen else gt.Stamp(None, window=(sector, 100 + sector))
    return gt.Request(1, 1, "fio", 7 << 20, "read", "R", sector, 4096, sector, sector + 10, sector + 50,
                      (st, gt.Stamp(sector + 110), gt.Stamp(sector + 150)))


@pytest.mark.parametrize("iotrace_count, compared, missed, short", [
    (3, 3, 2, None),          # iotrace has none of the two: they are left out, explained
    (5, 5, 0, None),          # it has both: compared, each within its window
    (4, 5, 1, (1, 8192)),     # one of them: compared with the series allowed one short
])
def test_requests_the_reference_missed_go_where_iotraces_count_puts_them(iotrace_count, compared, missed, short):
    kept = [_req(8 * n, seen=n < 3) for n in range(5)]
    key = (1, "7:0", "read", False)
    excluded = Counter()
    out, shorts = comparison._resolve_unseen(kept, {key: type("S", (), {"count": iotrace_count})()}, excluded)
    assert len(out) == compared and excluded[comparison.UNSEEN_MISSED] == missed
    assert shorts.get(key) == short
    t = comparison.aggregate(out)[key]
    assert comparison._counted("count", t.count, iotrace_count, (short or (0, 0))[0]).ok
    assert not comparison._counted("count", t.count, iotrace_count - 1, (short or (0, 0))[0]).ok


def test_a_wide_bracket_widens_only_its_own_request():
    events, before, after = [], [], []
    for n in range(20):
        sec, t0 = 8 * n, 100_000 * n
        events += [start(t0, sec, 4096, "R"), issue(t0 + 2000, sec, 4096, "R"), complete(t0 + 50_000, sec, 8, "R")]
        for name, ts in (("block_io_start", t0 + 100), ("block_rq_issue", t0 + 2100),
                         ("block_rq_complete", t0 + 50_100)):
            before.append((name, sec, ts, ts + 50))
            # request 7's issue: something ran for 20 us between the two stamper copies
            after.append((name, sec, ts + 50 + (20_000 if (n, name) == (7, "block_rq_issue") else 300), 0))
    joined, notes = gt.attach_stamps(events, stamps(*before), stamps(*after))
    assert notes["stamp_disturbed"] == 1
    t = gt.Truth.from_events(joined)
    r7 = next(r for r in t.requests if r.sector == 56)
    assert r7.phase_bounds("queue") == (2000, 2000, 2000 + 20_000)
    assert r7.phase_bounds("device") == (48_000, 48_000 - 20_000, 48_000)
    assert all(r.phase_bounds("queue") == (2000,) * 3 for r in t.requests if r.sector != 56)


def test_within_accepts_the_bounds_and_the_jitter_and_nothing_more():
    assert gt.within(10_000, 10_000, 10_000, 10_150)[0]                      # 1.5%
    assert not gt.within(10_000, 10_000, 10_000, 10_400)[0]                  # 4%, another bucket
    assert gt.within(2_000, 2_000, 2_000, 2_200, noise=250)[0]               # the stamps' jitter
    assert not gt.within(2_000, 2_000, 2_000, 2_300, noise=250)[0]
    assert gt.within(20_000, 20_000, 40_000, 39_000)[0]                      # a disturbed sample's range
    assert not gt.within(20_000, 20_000, 40_000, 45_000)[0]


def wb_event(ts, name, pid, ino, bdi="7:0"):
    return gt.Event(ts, 0, ts, name, pid, pid, {"name": bdi, "ino": ino})


def test_truth_a_flushers_request_names_the_last_dirtier_of_the_inode_it_writes_back():
    flusher, a, b = 50, 200, 300
    events = [wb_event(1, "writeback_dirty_folio", a, 12), wb_event(2, "writeback_dirty_folio", b, 13),
              wb_event(3, "writeback_dirty_folio", a, 13),                 # a dirtied 13 last
              wb_event(10, "writeback_single_inode_start", flusher, 12),
              start(11, 0, 4096, "W", pid=flusher), issue(12, 0, 4096, "W"), complete(20, 0, 8, "W"),
              wb_event(21, "writeback_single_inode", flusher, 12),
              start(22, 8, 4096, "W", pid=flusher), issue(23, 8, 4096, "W"), complete(30, 8, 8, "W"),
              wb_event(31, "writeback_single_inode_start", flusher, 13),
              start(32, 16, 4096, "W", pid=flusher), issue(33, 16, 4096, "W"), complete(40, 16, 8, "W"),
              wb_event(41, "writeback_single_inode", flusher, 13),
              # the dirtier writing its own inode back (a file system's fsync): its own request
              wb_event(50, "writeback_single_inode_start", a, 12),
              start(51, 24, 4096, "W", pid=a), issue(52, 24, 4096, "W"), complete(60, 24, 8, "W"),
              wb_event(61, "writeback_single_inode", a, 12)]
    t = gt.Truth.from_events(events, [7 << 20])
    assert [(r.tid, r.dirtier) for r in t.requests] == [(flusher, (a, a, "")), (flusher, None), (flusher, (a, a, "")),
                                                        (a, None)]


def test_the_reference_must_start_requests_where_iotrace_did():
    t = gt.Truth.from_events(as_getrq([start(100, 8, 4096, "R")]), start_event="block_getrq")
    assert t.start_event == "block_getrq" and len(t.in_flight) == 1
    gt.check_start_event(t, [{"start_event": {"event": "block_getrq"}}, {}])
    with pytest.raises(gt.TruthError, match="iotrace started requests on block_io_start, the reference on block_getrq"):
        gt.check_start_event(t, [{"start_event": {"event": "block_io_start"}}])


def _series(count_ok: bool, status: str = "compared") -> comparison.SeriesResult:
    checks = [comparison.Check("count", 10, 10 if count_ok else 9, count_ok),
              comparison.Check("bytes", 40960, 40960 if count_ok else 36864, count_ok),
              comparison.Check("total.p99", 100.0, 300.0, False)]      # a latency miss is not accounting
    return comparison.SeriesResult((1, "7:0", "read", False), "fio", "loop0", status, checks)


@pytest.mark.parametrize("series, moved", [
    ([_series(True), _series(True)], True),           # every traced request counted: the skip was someone else's
    ([_series(True), _series(False)], False),         # a series short of requests: the skip may be that one
    ([_series(True), _series(True, "only-truth")], False),
])
def test_a_counted_skip_is_explained_only_when_every_traced_request_is_counted(series, moved):
    dropped = {"skipped_complete": 1, "lost_completion": 2, "no_start": 1}
    excluded = Counter()
    comparison._explain_skips_outside_scope(series, dropped, excluded)
    if moved:
        # the skip and the lost completion its stale slot caused; the rest stays a drop
        assert dropped == {"skipped_complete": 0, "lost_completion": 1, "no_start": 1}
        assert sum(excluded.values()) == 2
    else:
        assert dropped == {"skipped_complete": 1, "lost_completion": 2, "no_start": 1}
        assert not excluded


def test_twins_paired_only_by_order_fail_the_comparison_and_say_why():
    # the same twins as above: told apart by the stamps' request addresses, the comparison may pass; paired by
    # order (no addresses: a stamper on the perf-event path), their latencies may be swapped on either side
    events, before = twins()

    def compared(stamped) -> comparison.Comparison:
        t = gt.Truth.from_events(gt.attach_stamps(events, stamped, None)[0])
        return comparison.Comparison([], Counter(), [], {}, {}, t.notes, comparison.Scope(0, 1 << 62))

    by_request = compared(before)
    assert by_request.ok and not by_request.twins and not by_request.problems()
    by_order = compared(before[["ts", "end", "sector", "dev", "cpu", "event", "side"]])
    assert not by_order.ok and by_order.twins
    assert [p for p in by_order.accounting_problems() if "ranges of their own" in p]
