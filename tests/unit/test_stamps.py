"""--stamps without BPF: which stamps a run takes (probe.choose_stamps), a disk's stamp from sysfs, the
kernel table's stamps scope, and the dump's start_event.stamps through the codec."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from tracer import contract
from tracer.codec import jsonl
from tracer.errors import UserError
from tracer.model.dump import Dump
from tracer.model.sections import StartEvent
from tracer.sources import devices, kernel, probe

T0 = datetime(2026, 12, 1, tzinfo=UTC)
RAW = kernel.Layout({"RQ_HEAD_LEN": 64}, "block_io_start", True)
STAMPED = {"RQ_HEAD_LEN": 64, "RQ_STAMPED_HEAD_LEN": 120}


@pytest.fixture
def disks(monkeypatch):
    """Two loop disks in use and a bio-based zram; loop1 keeps no stamps (iostats 0)."""
    monkeypatch.setattr(devices, "whole_disks", lambda: {"loop0": 7 << 20, "loop1": 7 << 20 | 1, "zram0": 252 << 20})
    monkeypatch.setattr(devices, "size_sectors", lambda name: 1024)
    monkeypatch.setattr(devices, "bio_based", lambda name: name.startswith("zram"))


def stamped(layout):
    return kernel.Layout({**layout.values, **STAMPED}, layout.start_event, layout.group_dead)


def refused(layout):
    raise kernel.LayoutError("enum __RQF_STATS not found")


@pytest.mark.parametrize("asked, layout, devs, keeps, how, note", [
    ("own", RAW, [], "all", stamped, ""),
    ("kernel", RAW, [7 << 20], "all", stamped, ""),
    # every disk in use without --dev: loop1 keeps none, so own stamps; the bio-based zram is not asked
    ("kernel", RAW, [], "loop0", stamped, "the kernel keeps no start stamp for loop1"),
    ("kernel", RAW, [7 << 20], "loop0", stamped, ""),
    ("kernel", None, [], "all", stamped, "need the raw tracepoints"),
    ("kernel", kernel.Layout({}, "block_getrq", True), [], "all", stamped, "need block:block_io_start"),
    ("kernel", RAW, [], "all", refused, "lacks what kernel stamps read (enum __RQF_STATS not found)"),
])
def test_choose_stamps(disks, asked, layout, devs, keeps, how, note):
    got, why = probe.choose_stamps(asked, layout, devs, stamped=how,
                                   keeps=lambda name: keeps == "all" or name == keeps)
    kernel_taken = got is not None and got.stamped
    assert kernel_taken == (asked == "kernel" and not note)
    assert (note in why) if note else why == ""
    if note:
        assert "own stamps are used" in why
    flags = probe.compile_flags(probe.ProbeOptions(stamps=asked), got, False, "block_io_start", [0]) if got else ()
    assert ("-DIOTRACE_KERNEL_STAMPS" in flags) == kernel_taken


def test_choose_stamps_refuses_a_word_it_does_not_know():
    with pytest.raises(UserError, match="--stamps takes own or kernel, not 'mine'"):
        probe.choose_stamps("mine", RAW, [])


def test_a_disk_keeps_start_stamps_while_it_keeps_io_statistics(tmp_path):
    for name, iostats in (("nvme0n1", "1\n"), ("sda", "0\n")):
        (tmp_path / name / "queue").mkdir(parents=True)
        (tmp_path / name / "queue" / "iostats").write_text(iostats)
    assert devices.keeps_start_stamp("nvme0n1", str(tmp_path))
    assert not devices.keeps_start_stamp("sda", str(tmp_path))
    assert not devices.keeps_start_stamp("gone", str(tmp_path))


def test_the_stamps_scope_is_apart_from_the_block_programs_reads():
    c = contract.load()
    # a kernel without them (6.1: rq_flags are #defines, no __RQF_STATS) keeps the raw path
    assert {"RQ_START_NS", "RQ_IO_START_NS", "RQ_FLAGS"} <= c.kernel_stamps.members.keys()
    assert {"RQF_STATS", "RQF_IO_STAT"} <= c.kernel_stamps.enums.keys() and "RQF_STATS" not in c.kernel.enums
    assert not c.kernel.members.keys() & c.kernel_stamps.members.keys()
    assert "RQ_STAMPED_HEAD_LEN" in c.kernel_stamps.heads
    assert "NOTE_OWN_START" in [r.upper() for r in c.reasons]


def test_the_dump_says_kernel_stamps_and_only_them():
    d = Dump(kind="final", label=None, start=T0, end=T0, host="h", kernel="6.18", series=[], dropped={}, events={})
    d.start_event = StartEvent("block_io_start", (), "kernel")
    line = jsonl.to_json(d)
    assert jsonl.from_json(line).start_event.to_json() == {"event": "block_io_start", "stamps": "kernel"}
    d.start_event = StartEvent("block_io_start")
    assert jsonl.from_json(jsonl.to_json(d)).start_event.to_json() == {"event": "block_io_start"}
