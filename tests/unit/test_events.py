"""contract.toml's events is the one list of the block-layer programs' events: each attach path's
source has a program for exactly the events the table gives it, and Python derives the rest."""

from __future__ import annotations

import re

import pytest

from tracer import contract
from tracer.sources import probe

RAW = re.compile(r"^RAW_TRACEPOINT_PROBE\((\w+)\)", re.M)
PERF = re.compile(r"^TRACEPOINT_PROBE\((\w+), (\w+)\)", re.M)
START = {"IOTRACE_START_EVENT": "start", "IOTRACE_START_CATEGORY": "start"}


def programs_in(path: str) -> tuple[set[str], set[tuple[str, str]]]:
    """(events with a program, (category, event) pairs) of one path's source; the start placeholder as 'start'."""
    text = (contract.bpf_dir() / probe.SOURCES[path]).read_text()
    if path == "raw_tp":
        names = {START.get(n, n) for n in RAW.findall(text)}
        return names, set()
    pairs = {(START.get(c, c), START.get(n, n)) for c, n in PERF.findall(text)}
    return {n for _, n in pairs}, pairs


def table_events(path: str) -> set[str]:
    return {"start" if e.when == "start" else e.name for e in probe.EVENTS if path in e.paths}


@pytest.mark.parametrize("path", probe.ATTACH_MODES)
def test_each_path_has_a_program_for_exactly_its_table_events(path):
    names, pairs = programs_in(path)
    assert names == table_events(path)
    for category, name in pairs:       # the perf-event programs name the table's category
        if category != "start":
            assert next(e.category for e in probe.EVENTS if e.name == name) == category


def test_every_event_reports_its_skips_under_a_short_name():
    assert set(probe.PROGRAMS) == {e.name for e in probe.EVENTS}
    assert {f"skipped_{e.short}" for e in probe.EVENTS} <= set(probe.USER_DROPS)


def test_derived_lists():
    # the newest is preferred; block_getrq (a bio) before block_rq_insert (scheduled requests only)
    assert probe.START_EVENTS == ("block_io_start", "block_getrq", "block_rq_insert")
    assert [probe.starts_at_bio(e) for e in probe.START_EVENTS] == [False, True, False]
    assert "block_rq_issue" in probe.RAW_EVENTS and "block_bio_queue" not in probe.RAW_EVENTS
    assert probe.RAW_BIO_EVENTS == ("block_bio_queue", "block_bio_complete")
    assert "block_bio_frontmerge" in probe.REQUIRED_FIELDS and "block_bio_frontmerge" not in probe.RAW_EVENTS
    # every raw event has its argument types for the BTF check
    raw = contract.load().kernel.raw_tps
    assert all(e.name in raw for e in probe.EVENTS if "raw_tp" in e.paths)


@pytest.mark.parametrize("entry", [
    '{ name = "block_rq_issue", category = "block", short = "issue", paths = ["raw_tp"], when = "sometimes", '
    'fields = ["dev"] }',                                                            # an unknown "when"
    '{ name = "block_rq_issue", category = "block", short = "issue", paths = ["raw_tp"] }',   # too few keys
    '{ name = "block_rq_issue", category = "block", short = "issue", paths = "raw_tp", when = "always", '
    'fields = ["dev"] }',                                                            # paths not a list
    '["block_rq_issue", "block", "issue", ["raw_tp"], "always", ["dev"]]',         # not a table
])
def test_a_bad_event_is_named(entry):
    text = f'[iotrace]\nprefix = "IOTRACE_"\nevents = [\n  {entry},\n]\n'
    with pytest.raises(ValueError, match="bad event"):
        contract.parse(text)


def test_an_event_parses():
    [e] = contract.parse('[iotrace]\nprefix = "IOTRACE_"\nevents = [{ name = "x_y", category = "block", short = "xy", '
                         'paths = ["raw_tp", "tracepoint"], when = "bio", fields = [] }]\n').events
    assert e == contract.Event("x_y", "block", "xy", ("raw_tp", "tracepoint"), "bio", ())
