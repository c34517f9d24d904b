"""bpf/maps.bpf.h: the one counted kernel read and the one lookup-or-init, in every program's text."""

import re
import tomllib
from pathlib import Path

import pytest

from tracer import contract
from tracer.sources import bpfobject

PROGRAMS = sorted(p.name for p in contract.bpf_dir().glob("*.bpf.c"))


def test_there_are_the_three_program_files():
    assert PROGRAMS == ["raw_tp.bpf.c", "tasks.bpf.c", "tracepoint.bpf.c"]


@pytest.mark.parametrize("name", PROGRAMS)
def test_each_program_text_has_the_helpers_once_before_its_other_headers(name):
    text = bpfobject.source(contract.bpf_dir(), name)
    # pasted (bcc compiles the text given, its map calls rewritten there), not left to the include path
    assert '#include "maps.bpf.h"' not in text
    assert len(re.findall(r"static __always_inline int kread\(", text)) == 1
    assert len(re.findall(r"static __always_inline void \*lookup_or_init\(", text)) == 1
    # the program defines the failure counter the helpers call
    defined = re.findall(r"^static __always_inline void count_reason\(u32 reason\)", text, re.M)
    assert len(defined) == 2   # declared by maps.bpf.h, defined by the program
    first_include = re.search(r'^#include "([\w.]+)"', (contract.bpf_dir() / name).read_text(), re.M)
    assert first_include and first_include.group(1) == "maps.bpf.h"


@pytest.mark.parametrize("path", sorted(p for p in contract.bpf_dir().iterdir() if p.name != "maps.bpf.h"),
                         ids=lambda p: p.name)
def test_no_file_but_maps_bpf_h_counts_a_read_or_inserts_by_hand(path):
    text = path.read_text()
    # a read whose failure is counted goes through kread; bare reads are left uncounted on purpose
    assert not re.search(r"bpf_probe_read_kernel\([^;]*\)\)\s*\{?\s*count_reason", text)
    assert "int err = bpf_probe_read_kernel" not in text
    # the map inserts are the one-line wrappers (named *_insert) that lookup_or_init calls; wb_begin's is no
    # lookup-or-init: it inserts first, overwrites what another program put there, and counts a new entry
    for m in re.finditer(r"\b(\w+)\.insert\(", text):
        fn = re.findall(r"^static __always_inline \w+ \*?(\w+)\(", text[:m.start()], re.M)
        assert fn and (fn[-1].endswith("_insert") or fn[-1] == "wb_begin"), \
            f"{path.name}: {m.group(1)}.insert outside a wrapper"
    assert "BPF_NOEXIST" not in text


def test_the_package_data_takes_the_new_header():
    # pyproject's package-data for tracer.bpf is "*.bpf.c" and "*.h": maps.bpf.h is installed with the rest
    data = tomllib.loads((Path(__file__).resolve().parents[2] / "pyproject.toml").read_text())
    patterns = data["tool"]["setuptools"]["package-data"]["tracer.bpf"]
    assert any(re.fullmatch(p.replace(".", r"\.").replace("*", ".*"), "maps.bpf.h") for p in patterns)
