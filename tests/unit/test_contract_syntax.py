"""The contract is read from bpf/iotrace.h's C syntax only: its comments are pure comments.

What an entry means (whose kernel read it is, which constant user space may set) is a table line
(KSCOPE, TUNABLE, SET_BY_USER), never a word in a trailing /* ... */.
"""

import re

import pytest

from tracer import contract
from tracer.sources import probe
from tracer.sources.probe import ProbeOptions

COMMENT = re.compile(r"/\*.*?\*/", re.S)
HEADERS = ("iotrace.h", "tasks.h")


def _text(name: str) -> str:
    return (contract.bpf_dir() / name).read_text()


@pytest.mark.parametrize("name", HEADERS)
def test_parsing_gives_the_same_contract_with_every_comment_stripped(name):
    text = _text(name)
    stripped = COMMENT.sub("", text)
    assert "/*" not in stripped
    assert contract.parse(stripped) == contract.parse(text)


def test_the_stripped_header_still_has_every_table():
    c = contract.parse(COMMENT.sub("", _text("iotrace.h")))
    assert c.kernel.raw_tps and c.kernel_tasks.members and c.events and c.tunables
    assert set(c.kernel_syscalls) == {"", "x86_64"}
    assert set(c.kernel_sources) == set(contract.TASK_SOURCES)


def test_a_scope_written_as_a_comment_means_nothing():
    text = _text("iotrace.h")
    entry = "KSCOPE(tasks)\nKMEMBER(TASK_TGID, task_struct, tgid, 4)\n"
    assert text.count(entry) == 1
    commented = "KMEMBER(TASK_TGID, task_struct, tgid, 4)\t/* KSCOPE(tasks) tasks.bpf.c */\n"
    c = contract.parse(text.replace(entry, commented))
    # the per-process programs' own entries fall back to the scope before them: the block-layer programs'
    # kernel stamps (KSCOPE(block, stamps))
    assert not c.kernel_tasks.members and "TASK_TGID" in c.kernel_stamps.members


@pytest.mark.parametrize("scope", ["KSCOPE(tasks, pagecache)", "KSCOPE(files)", "KSCOPE(tasks, syscalls, x86, 2)",
                                   "KSCOPE(block, reads)", "KSCOPE()"])
def test_a_scope_the_parser_does_not_know_is_refused(scope):
    text = _text("iotrace.h").replace("\nKSCOPE(tasks)\n", f"\n{scope}\n")
    with pytest.raises(ValueError, match="KSCOPE"):
        contract.parse(text)


def test_the_overridable_constants_are_the_ones_defined_under_ifndef():
    text = _text("iotrace.h")
    guarded = set(re.findall(r"^#ifndef IOTRACE_(\w+)\n#define IOTRACE_\1\b", text, re.M))
    c = contract.parse(text)
    assert set(c.overrides) == guarded - {"H"}   # IOTRACE_H: the include guard
    assert c.overrides["CPUS"] == c.overrides["PAGE_SHIFT"] == "set_by_user"
    assert "INFLIGHT_SLOTS" in c.tunables and "CPUS" not in c.tunables


@pytest.mark.parametrize("line", ["TUNABLE(NO_SUCH_SIZE)", "TUNABLE(INFLIGHT_SLOTS)", "OVERRIDE(HIST_CELLS)"])
def test_an_override_entry_that_names_no_constant_twice_or_is_unknown_is_refused(line):
    text = _text("iotrace.h").replace("SET_BY_USER(CPUS)\n", f"SET_BY_USER(CPUS)\n{line}\n")
    with pytest.raises(ValueError, match="IOTRACE_OVERRIDE_TABLE"):
        contract.parse(text)


def test_the_sizes_the_loader_sets_are_tunables(monkeypatch):
    monkeypatch.setattr(probe, "tracepoint_fields", lambda ev, cat="block": None)
    opts = ProbeOptions(inflight_slots=4096, hist_entries=1024, series_entries=2048, hist_cells=512)
    flags = probe.compile_flags(opts, None, False, "block_io_start", [0])
    c = contract.load()
    sizes = {f[len("-DIOTRACE_"):].split("=")[0] for f in flags if f.startswith("-DIOTRACE_") and "=" in f}
    assert sizes - {"CPUS", "PAGE_SHIFT"} == {"INFLIGHT_SLOTS", "HIST_ENTRIES", "SERIES_ENTRIES", "HIST_CELLS"}
    assert sizes <= set(c.overrides)
    assert sizes - {"CPUS", "PAGE_SHIFT"} <= set(c.tunables)
