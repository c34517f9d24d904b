"""The dump model's arithmetic that reports, bench and the tests share."""

from __future__ import annotations

from tracer.model.dump import merge_coverage, unexplained_loss, unrecorded
from tracer.model.sections import Coverage

COV = Coverage.from_json({"filtered": False, "devices": {"sda": {"recorded": 90, "diskstats": 100},
                                                         "sdb": {"recorded": 50, "diskstats": 50},
                                                         "sdc": {"recorded": 12, "diskstats": 10}}})


def test_unrecorded_names_the_devices_short_of_diskstats():
    assert unrecorded(COV) == {"sda": 10}           # sdc recorded more (a window's edge): not a loss
    assert unrecorded(COV, "sda") == {"sda": 10}
    assert unrecorded(COV, "sdb") == {} == unrecorded(None) == unrecorded(COV, "nvme0n1")


def test_loss_not_explained_by_drops():
    assert unexplained_loss(COV, {}) == 10
    assert unexplained_loss(COV, {"no_start": 4, "hist_full": 0}) == 6
    assert unexplained_loss(COV, 10) == 0 == unexplained_loss(COV, {"no_start": 25})
    assert unexplained_loss(COV, 3, device="sdb") == 0
    assert unexplained_loss(None, 0) == 0


def test_loss_over_windows_is_counted_on_their_sums():
    a = Coverage.from_json({"filtered": False, "devices": {"sda": {"recorded": 10, "diskstats": 8}}})
    b = Coverage.from_json({"filtered": False, "devices": {"sda": {"recorded": 5, "diskstats": 9}}})
    # per window b lost 4, but a's edge recorded 2 that b's diskstats counted: 2 over the two
    assert unrecorded(merge_coverage([a, b])) == {"sda": 2}
