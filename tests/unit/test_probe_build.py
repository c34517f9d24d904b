"""tracer.sources.probe's pieces Probe.__init__ assembles, without root: the compiler flags, the size checks,
the program text with its start event."""

from __future__ import annotations

import os
import types

import pytest

from tracer import contract
from tracer.errors import UserError
from tracer.sources import bpfobject, probe
from tracer.sources.probe import ProbeOptions


@pytest.fixture(autouse=True)
def a_kernel_of_5_12_or_later(monkeypatch):
    """The verifier probes answer yes (they load a program: without root they would answer no)."""
    monkeypatch.setattr(bpfobject, "has_cmpxchg", lambda: True)
    monkeypatch.setattr(bpfobject, "has_ancestor_cgroup", lambda: True)


def test_a_kernel_without_cmpxchg_or_the_ancestor_helper_gets_their_fallbacks(monkeypatch):
    monkeypatch.setattr(probe, "tracepoint_fields", lambda ev, cat="block": None)
    monkeypatch.setattr(bpfobject, "has_cmpxchg", lambda: False)
    flags = probe.compile_flags(ProbeOptions(), None, False, "block_io_start", [0])
    assert "-DIOTRACE_NO_CMPXCHG" in flags and "-DIOTRACE_NO_ANCESTOR_CGROUP" not in flags
    monkeypatch.setattr(bpfobject, "has_ancestor_cgroup", lambda: False)
    assert "-DIOTRACE_NO_ANCESTOR_CGROUP" in probe.compile_flags(ProbeOptions(), None, False, "block_io_start", [0])


def test_perf_event_flags_follow_the_kernel_the_start_event_and_the_sizes(monkeypatch):
    monkeypatch.setattr(probe, "tracepoint_fields", lambda ev, cat="block": {"group_dead"})
    flags = probe.compile_flags(ProbeOptions(inflight_slots=4096, hist_cells=None), None, True, "block_getrq",
                                [0, 1, 3])
    # the page size on both paths: write-back's owed bytes count pages (bpf/writeback.bpf.h)
    shift = f"-DIOTRACE_PAGE_SHIFT={(os.sysconf('SC_PAGE_SIZE') - 1).bit_length()}"
    assert flags == (f"-I{contract.bpf_dir()}", "-DIOTRACE_BIO_LEVEL", "-DIOTRACE_HAVE_GROUP_DEAD", shift,
                     "-DIOTRACE_START_BIO", "-DIOTRACE_CPUS=4", "-DIOTRACE_INFLIGHT_SLOTS=4096",
                     "-DIOTRACE_HIST_CELLS=65536")
    monkeypatch.setattr(probe, "tracepoint_fields", lambda ev, cat="block": None)
    assert probe.compile_flags(ProbeOptions(), None, False, "block_io_start", [0]) == (
        f"-I{contract.bpf_dir()}", shift, "-DIOTRACE_CPUS=1", "-DIOTRACE_HIST_CELLS=65536")
    # a large machine's default is the headers' own size
    assert "-DIOTRACE_HIST_CELLS=16384" in probe.compile_flags(ProbeOptions(), None, False, "block_io_start",
                                                               list(range(64)))


def test_raw_path_flags_are_the_layouts():
    layout = types.SimpleNamespace(cflags=lambda: ["-DIOTRACE_OFF_X=8"], group_dead=True,
                                   present=("mm_filemap_get_pages",), stamped=False,
                                   firsts=("writeback_dirty_folio",))
    shift = (os.sysconf("SC_PAGE_SIZE") - 1).bit_length()
    assert probe.compile_flags(ProbeOptions(files=True), layout, False, "block_io_start", [0, 1])[1:] == (
        "-DIOTRACE_OFF_X=8", "-DIOTRACE_HAVE_GROUP_DEAD", "-DIOTRACE_HAVE_MM_FILEMAP_GET_PAGES",
        f"-DIOTRACE_PAGE_SHIFT={shift}", "-DIOTRACE_CPUS=2", "-DIOTRACE_HIST_CELLS=65536")
    # without file rows (top, serve): none of their programs, and none of their work at a completion
    assert probe.compile_flags(ProbeOptions(), layout, False, "block_io_start", [0, 1])[1:] == (
        "-DIOTRACE_OFF_X=8", "-DIOTRACE_HAVE_GROUP_DEAD", "-DIOTRACE_NO_FILES",
        f"-DIOTRACE_PAGE_SHIFT={shift}", "-DIOTRACE_CPUS=2", "-DIOTRACE_HIST_CELLS=65536")
    # a kernel before 5.17 dirties pages on writeback_dirty_page: its program, not the folio one
    layout.firsts = ("writeback_dirty_page",)
    assert "-DIOTRACE_DIRTY_PAGE" in probe.compile_flags(ProbeOptions(), layout, False, "block_io_start", [0, 1])


@pytest.mark.parametrize("cpus, cells", [
    (1, 65536), (2, 65536), (8, 65536),        # the most: 16 disks' histograms fit (docs/costs.md)
    (9, 32768), (16, 32768), (32, 16384),      # a power of two the budget holds over both generations
    (64, 16384), (4096, 16384),                # never fewer than before
])
def test_the_default_histogram_cells_fill_the_budget_between_the_least_and_the_most(cpus, cells):
    c = contract.load()
    assert probe.hist_cells_for(cpus, c) == cells
    assert 2 * cpus * cells <= max(c.const("HIST_CELLS_BUDGET"), 2 * cpus * c.const("HIST_CELLS"))
    # and --hist-cells, given, is what the programs get
    assert "-DIOTRACE_HIST_CELLS=512" in probe.compile_flags(ProbeOptions(hist_cells=512), None, False,
                                                              "block_io_start", list(range(cpus)))


@pytest.mark.parametrize("opts", [ProbeOptions(inflight_slots=1000), ProbeOptions(hist_cells=2)])
def test_sizes_that_are_no_power_of_two_of_at_least_the_probe_window_are_refused(opts):
    with pytest.raises(UserError, match="must be a power of two"):
        probe.check_sizes(opts, contract.load())
    probe.check_sizes(ProbeOptions(inflight_slots=1 << 14, hist_cells=1 << 14), contract.load())


@pytest.mark.parametrize("attach", probe.ATTACH_MODES)
def test_the_program_text_names_the_start_event(attach):
    text = probe.program_text(attach, "block_rq_insert")
    assert "IOTRACE_START_EVENT" not in text and "IOTRACE_START_CATEGORY" not in text
    assert "block_rq_insert" in text


def test_write_back_attribution_off_is_compiled_out(monkeypatch):
    """ProbeOptions(writeback=False), the cost bench's "-writeback": its programs and the request path's look-up
    are left out at compile time (IOTRACE_NO_WRITEBACK), on either path."""
    monkeypatch.setattr(probe, "tracepoint_fields", lambda ev, cat="block": None)
    assert "-DIOTRACE_NO_WRITEBACK" not in probe.compile_flags(ProbeOptions(), None, False, "block_io_start", [0])
    assert "-DIOTRACE_NO_WRITEBACK" in probe.compile_flags(ProbeOptions(writeback=False), None, False,
                                                           "block_io_start", [0])
