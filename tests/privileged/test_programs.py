"""Every program the loader attaches, on each path and with the bio programs, reports its skipped events.

A program missing from contract.toml's events would run with its
recursion misses unreported: the loaded object is checked against the table.
"""

from __future__ import annotations

import pytest

from tracer.sources import probe as probemod
from tracer.sources.devices import device_filter
from tracer.sources.probe import Probe, ProbeOptions

pytestmark = pytest.mark.bpf


@pytest.mark.parametrize("attach", probemod.ATTACH_MODES)
def test_every_attached_program_is_in_the_table_and_its_skips_are_reported(attach, loop):
    p = Probe(ProbeOptions(devs=device_filter([loop.path]), attach=attach, files=True))
    try:
        attached = set(p.prog_stats())
        raw = p.drain(final=True)
    finally:
        p.close()
    assert attached <= set(probemod.PROGRAMS), attached - set(probemod.PROGRAMS)
    # the start event the kernel has, and every event of this path that is not bio-only
    wanted = {e.name for e in probemod.EVENTS if attach in e.paths and e.when == "always"} | {p.start_event}
    wanted.add(p.dirty_event)       # the page-dirtied event this kernel has (writeback_dirty_page before 5.17)
    wanted |= set(p.present)        # the optional ones this kernel has (mm_filemap_get_pages: 6.12+)
    assert attached == wanted
    for event in attached:
        short = probemod.PROGRAMS[event]
        if short == "complete" and attach == "tracepoint":
            continue        # found lost through the in-flight table instead (lost_completion)
        assert f"drop_skipped_{short}" in raw.reasons, (event, sorted(raw.reasons))


@pytest.mark.parametrize("attach", probemod.ATTACH_MODES)
def test_write_back_attribution_off_attaches_none_of_its_programs(attach, loop):
    """writeback=False (IOTRACE_NO_WRITEBACK, priced by scripts/bench_cost.py): the three write-back events
    have no program, everything else is attached as usual."""
    wb = {e.name for e in probemod.EVENTS if e.category == "writeback"}
    p = Probe(ProbeOptions(devs=device_filter([loop.path]), attach=attach, writeback=False))
    try:
        attached = set(p.prog_stats())
    finally:
        p.close()
    assert wb and not attached & wb, attached & wb
    assert {"block_rq_issue", "block_rq_complete", p.start_event} <= attached
