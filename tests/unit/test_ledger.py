"""tracer.sources.ledger on fake counters and a fake in-flight table (no root, no BPF): reason deltas per
window, every user-space reason present, program skips under their short names, stale slots counted as
lost once each, and only where the heuristics say a request is lost rather than slow."""

from __future__ import annotations

import time
import types

import numpy as np
import pytest

from tracer.sources import ledger as ledgermod
from tracer.sources.ledger import LOST_MIN_AGE_NS, USER_DROPS, Ledger, count_new, reason_deltas, stale_slots

NAMES = ("completed", "drop_no_start", "drop_lost_completion")
SLOT = np.dtype([("dev", "u4"), ("op", "u4"), ("sector", "u8"), ("start_ns", "u8"), ("life", "u4"), ("ended", "u4")])
STALE_NS = 10 * LOST_MIN_AGE_NS


class FakeObject:
    """A BpfObject's face to the ledger: per-reason counters, skips per short name, the in-flight map."""

    def __init__(self):
        self.totals = [0] * len(NAMES)
        self.misses = {"block_rq_issue": 0, "block_rq_complete": 0, "not_in_the_table": 0}
        self.seen: dict[str, int] = {}
        self.tables = {"inflight": types.SimpleNamespace(max_entries=8, Leaf=SLOT),
                       "tags": types.SimpleNamespace(max_entries=1)}
        self.lib = None

    def __getitem__(self, name):
        return self.tables[name]

    def counters(self, table, n):
        assert table == "reasons" and n == len(NAMES)
        return list(self.totals)

    def skipped(self, short):      # as BpfObject.skipped: deltas per short name, None left out
        totals: dict[str, int] = {}
        for event, n in self.misses.items():
            name = short(event)
            if name is not None:
                totals[name] = totals.get(name, 0) + n
        out = {name: n - self.seen.get(name, 0) for name, n in totals.items()}
        self.seen = totals
        return out


def ledger(attach: str, slots: list[tuple[int, ...]] | None = None, busy: set[int] = frozenset()):
    """A Ledger over a FakeObject whose in-flight table holds `slots` [(index, dev, start_ns[, lives not
    ended: 1])] and whose devices in `busy` have something in flight."""
    obj = FakeObject()
    led = Ledger(obj, attach, NAMES, STALE_NS)
    table = {"slots": list(slots or [])}

    def taken():
        rows = table["slots"]
        sl = np.zeros(len(rows), SLOT)
        sl["dev"], sl["start_ns"] = [r[1] for r in rows], [r[2] for r in rows]
        sl["ended"] = 7
        sl["life"] = [7 + (r[3] if len(r) > 3 else 1) for r in rows]
        return np.array([r[0] for r in rows], np.int64), sl

    led.taken_slots = taken
    led.table, led.busy = table, set(busy)
    return obj, led


@pytest.fixture(autouse=True)
def disks(monkeypatch):
    """Two whole disks, 8 and 9; in flight as the ledger under test says."""
    current: list = [None]
    monkeypatch.setattr(ledgermod.devices, "whole_disks", lambda: {"a": 8, "b": 9})
    monkeypatch.setattr(ledgermod.devices, "in_flight", lambda dev: 1 if dev in current[0].busy else 0)
    return current


def test_reason_deltas_are_since_the_last_window_and_name_every_user_drop():
    out = reason_deltas(NAMES, np.array([10, 3, 2], np.uint64), np.array([4, 3, 0], np.uint64))
    assert out["completed"] == 6 and out["drop_no_start"] == 0
    assert out["drop_lost_completion"] == 2          # counted by the BPF side (raw path): kept
    assert {f"drop_{r}" for r in USER_DROPS} <= set(out)
    assert all(out[f"drop_{r}"] == 0 for r in USER_DROPS if r != "lost_completion")


def test_stale_slots_old_on_an_idle_device_or_past_stale():
    now = 100 * LOST_MIN_AGE_NS
    old, young, ancient = now - 2 * LOST_MIN_AGE_NS, now - LOST_MIN_AGE_NS // 2, now - 2 * STALE_NS
    lost = stale_slots([1, 2, 3, 4], [old, young, old, ancient], [8, 8, 9, 9], now, idle={8}, stale_ns=STALE_NS)
    assert lost == {(1, old), (4, ancient)}   # young: on its way; 3: its device is busy, and not stale


def test_count_new_counts_a_slot_once_and_again_when_a_new_request_takes_it():
    n, seen = count_new({(1, 50)}, {(1, 50)}, set())
    assert n == 1 and seen == {(1, 50)}
    n, seen = count_new({(1, 50)}, {(1, 50)}, seen)
    assert n == 0
    n, seen = count_new({(1, 70)}, {(1, 70)}, seen)       # the slot stale again, another request's
    assert n == 1 and seen == {(1, 70)}                     # the old one forgotten: no longer present
    n, seen = count_new(set(), set(), seen)
    assert n == 0 and seen == set()


def test_a_window_hands_over_deltas_skips_and_lost_completions(disks):
    now = time.monotonic_ns()
    obj, led = ledger("tracepoint", [(5, 8, now - 2 * LOST_MIN_AGE_NS)])
    disks[0] = led
    obj.totals = [7, 1, 0]
    obj.misses.update(block_rq_issue=2, block_rq_complete=4)
    first = led.dropped()
    assert (first["completed"], first["drop_no_start"]) == (7, 1)
    assert first["drop_lost_completion"] == 1              # the old slot on idle disk 8
    assert first["drop_skipped_issue"] == 2
    assert first["drop_skipped_complete"] == 0              # tracepoint path: found lost through the table
    assert "drop_skipped_not_in_the_table" not in first
    obj.totals = [9, 1, 0]
    obj.misses["block_rq_issue"] = 3
    second = led.dropped()
    assert (second["completed"], second["drop_no_start"], second["drop_skipped_issue"]) == (2, 0, 1)
    assert second["drop_lost_completion"] == 0             # still taken, already counted


def test_a_busy_device_keeps_its_old_slot_unless_stale(disks):
    now = time.monotonic_ns()
    _, led = ledger("tracepoint", [(1, 9, now - 2 * LOST_MIN_AGE_NS), (2, 9, now - 2 * STALE_NS)], busy={9})
    disks[0] = led
    assert led.lost_completions() == 1
    led.busy = set()
    assert led.lost_completions() == 1                      # slot 1, once its device is idle


def test_raw_path_counts_lost_slots_only_at_the_end_and_only_on_idle_disks(disks):
    now = time.monotonic_ns()
    obj, led = ledger("raw_tp", [(5, 0, now - 2 * LOST_MIN_AGE_NS), (9, 0, now)])
    disks[0] = led
    obj.misses["block_rq_complete"] = 3
    window = led.dropped()
    assert window["drop_lost_completion"] == 0 and window["drop_skipped_complete"] == 3
    led.busy = {9}
    assert led.dropped(final=True)["drop_lost_completion"] == 0    # a disk is busy: no count
    led.busy = set()
    assert led.dropped(final=True)["drop_lost_completion"] == 1    # the old slot, not the young one


def test_raw_path_counts_every_life_of_a_slot_that_never_ended(disks):
    """A slot whose last two lives never ended (a request object started again after a completion the kernel
    ran no program for, and that life's never came either) is two requests lost."""
    now = time.monotonic_ns()
    _, led = ledger("raw_tp", [(5, 0, now - 2 * LOST_MIN_AGE_NS, 2), (6, 0, now - 2 * LOST_MIN_AGE_NS)])
    disks[0] = led
    assert led.dropped(final=True)["drop_lost_completion"] == 3


def test_diskstats_windows_follow_each_other(monkeypatch):
    reads = iter([{"n": 1}, {"n": 2}, {"n": 3}])
    monkeypatch.setattr(ledgermod.devices, "read_diskstats", lambda: next(reads))
    _, led = ledger("raw_tp")
    led.open_window()
    assert led.diskstats_window() == ({"n": 1}, {"n": 2})
    assert led.diskstats_window() == ({"n": 2}, {"n": 3})

    def unreadable():
        raise OSError("no /proc")

    monkeypatch.setattr(ledgermod.devices, "read_diskstats", unreadable)
    assert led.diskstats_window() == ({"n": 3}, None)
