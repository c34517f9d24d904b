"""bpf/compat.bpf.h: the one place that names each kernel difference the loader decides, pasted into every
program and installed with the rest."""

import re
import tomllib
from pathlib import Path

import pytest

from tracer import contract
from tracer.sources import bpfobject, probe

PROGRAMS = ("raw_tp.bpf.c", "tasks.bpf.c", "tracepoint.bpf.c")


def _compat() -> str:
    return (contract.bpf_dir() / "compat.bpf.h").read_text()


@pytest.mark.parametrize("name", PROGRAMS)
def test_each_program_has_the_header_pasted_once(name):
    text = bpfobject.source(contract.bpf_dir(), name)
    assert text.count("#define IOTRACE_COMPAT_BPF_H") == 1
    assert '#include "compat.bpf.h"' not in text


def test_every_flag_the_loader_sets_for_a_kernel_difference_has_its_block():
    # the optional events' IOTRACE_HAVE_<EVENT> are named by event; the others by macro
    text = _compat()
    for event in probe.RAW_PRESENT_EVENTS:
        assert re.search(rf"^ \*   {event}\(", text, re.M), event
    for flag in ("IOTRACE_START_BIO", "IOTRACE_HAVE_GROUP_DEAD", "IOTRACE_K_BALANCE_DIRTY_PAGES_LAST"):
        assert flag in text, flag


def test_no_program_tests_a_moved_flag_itself():
    # the #ifdefs that moved: group_dead everywhere, the bio start outside whole programs' blocks
    for name in PROGRAMS:
        text = (contract.bpf_dir() / name).read_text()
        assert "IOTRACE_HAVE_GROUP_DEAD" not in text, name
        assert "IOTRACE_K_BALANCE_DIRTY_PAGES_LAST]" not in text, name


def test_each_version_is_confirmed_or_said_not_to_be():
    # a "Linux N.M" or an upstream commit id, or the words that say it could not be confirmed
    blocks = re.findall(r"/\*\n(.*?)\*/", _compat(), re.S)[1:]
    assert len(blocks) >= 5
    for block in blocks:
        said = re.search(r"Linux \d+\.\d+|upstream [0-9a-f]{12}|version not confirmed", block)
        assert said, block[:80]


def test_the_package_data_takes_the_header():
    data = tomllib.loads((Path(__file__).resolve().parents[2] / "pyproject.toml").read_text())
    patterns = data["tool"]["setuptools"]["package-data"]["tracer.bpf"]
    assert any(re.fullmatch(p.replace(".", r"\.").replace("*", ".*"), "compat.bpf.h") for p in patterns)
