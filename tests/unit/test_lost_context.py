"""scripts/lost_context.py's reading of the tracefs instance and its matching of the BPF records to its events:
what decides which completions a program missed and on which task."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts"))
from lost_context import Completion, by_task, missed, parse  # noqa: E402

LINES = [
    "# tracer: nop",
    "           <idle>-0       [001] d.h2. 30434.100000: block_rq_issue: 7,1 R 4096 () 8 + 8 [fio]",
    "      ksoftirqd/0-14      [000] ..s.. 30435.312000: block_rq_complete: 7,1 R () 124904 + 8 be,0,4 [0]",
    "   tokio-rt-worker-92     [000] ..s1. 30435.312400: block_rq_complete: 7,1 R () 124912 + 8 be,0,4 [0]",
    " kworker/u8:3-1234  [001] .Ns1. 30435.400001: block_rq_complete: 7,1 R () 124912 + 8 be,0,4 [0]",
]


def test_only_completion_lines_are_read_with_their_task_and_time():
    got = [c for c in map(parse, LINES) if c]
    assert [(c.comm, c.pid, c.cpu, c.flags, c.sector) for c in got] == [
        ("ksoftirqd/0", 14, 0, "..s..", 124904), ("tokio-rt-worker", 92, 0, "..s1.", 124912),
        ("kworker/u8:3", 1234, 1, ".Ns1.", 124912)]
    assert got[1].ns == 30435_312_400_000
    assert by_task(got) == {"ksoftirqd": 1, "tokio-rt-worker": 1, "kworker": 1}


def ev(sector: int, ns: int, comm: str = "ksoftirqd/0") -> Completion:
    return Completion(comm, 14, 0, "..s..", ns, sector)


def test_a_record_stands_for_one_event_of_its_sector_near_in_time():
    events = [ev(8, 1_000_000_000), ev(8, 2_000_000_000, "tokio-rt-worker"), ev(16, 1_500_000_000)]
    # sector 8 seen once, at the first event's time (within the window): the second is the missed one
    assert missed(events, [(8, 1_000_300_000), (16, 1_500_000_100)]) == [events[1]]
    # one record cannot stand for both events of a sector
    assert missed(events, [(8, 1_500_000_000), (16, 1_500_000_000)], within=600_000_000) == [events[1]]
    # a record of another sector, or too far in time, stands for nothing
    assert missed(events, [(24, 1_000_000_000), (16, 1_600_000_000)]) == sorted(events, key=lambda e: e.ns)
    # a record a stall away stands for the event left without one, not for a nearer one's
    stalled = [ev(8, 1_000_000_000), ev(8, 1_010_000_000, "tokio-rt-worker"), ev(16, 1_500_000_000)]
    assert missed(stalled, [(8, 1_009_800_000), (16, 1_503_000_000)]) == [stalled[0]]
    assert missed(stalled, [(8, 1_009_800_000), (8, 1_030_000_000), (16, 1_500_000_000)]) == []
    assert missed(events, [(8, 1_000_000_000), (8, 2_000_000_000), (16, 1_500_000_000)]) == []
