"""The contract is bpf/contract.toml, read by tomllib: its comments are pure comments, and the C the
programs include is written from it (tracer.contract.render_header), never typed a second time.

What an entry means (whose kernel read it is, which constant user space may set) is a key or a scope,
never a word in a comment.
"""

import re
import subprocess
import sys
from pathlib import Path

import pytest

from tracer import contract
from tracer.sources import probe
from tracer.sources.probe import ProbeOptions

ROOT = Path(__file__).resolve().parents[2]


def _text() -> str:
    return (contract.bpf_dir() / contract.CONTRACT_FILE).read_text()


def _without_comments(text: str) -> str:
    """contract.toml with every comment dropped: a '#' outside a basic string to the end of its line."""
    out = []
    for line in text.splitlines():
        quoted, escaped, cut = False, False, len(line)
        for i, ch in enumerate(line):
            if quoted:
                quoted, escaped = (escaped or ch != '"'), (not escaped and ch == "\\")
            elif ch == '"':
                quoted = True
            elif ch == "#":
                cut = i
                break
        out.append(line[:cut].rstrip())
    return "\n".join(out)


@pytest.mark.parametrize("part", contract.PARTS)
def test_the_generated_headers_are_what_the_contract_writes(part):
    """bpf/<part>_defs.h is render_header's output for the contract in the tree: edit one alone, this fails."""
    written = (contract.bpf_dir() / contract.header_file(part)).read_text()
    assert written == contract.render_header(_text(), part)


def test_make_contract_check_says_which_header_is_stale(tmp_path):
    """`python -m tracer.contract --check` (CI's guard) exits 1 naming the header that differs; the
    default mode writes it; a second check passes."""
    for name in (contract.CONTRACT_FILE, *map(contract.header_file, contract.PARTS)):
        (tmp_path / name).write_text((contract.bpf_dir() / name).read_text())
    (tmp_path / "iotrace.h").write_text("")
    toml = tmp_path / contract.CONTRACT_FILE
    toml.write_text(toml.read_text().replace("WHO_SLOTS = { value = 64,", "WHO_SLOTS = { value = 128,"))
    env_run = [sys.executable, "-m", "tracer.contract"]
    env = {"IOTRACE_BPF_DIR": str(tmp_path), "PATH": "/usr/bin:/bin"}
    r = subprocess.run([*env_run, "--check"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=60)
    assert r.returncode == 1 and "iotrace_defs.h" in r.stderr and "tasks_defs.h" not in r.stderr
    assert subprocess.run(env_run, cwd=ROOT, env=env, timeout=60).returncode == 0
    assert "#define IOTRACE_WHO_SLOTS 128\t" in (tmp_path / "iotrace_defs.h").read_text()
    assert subprocess.run([*env_run, "--check"], cwd=ROOT, env=env, timeout=60).returncode == 0


@pytest.mark.parametrize("part", contract.PARTS)
def test_parsing_gives_the_same_contract_with_every_comment_stripped(part):
    text = _text()
    stripped = _without_comments(text)
    assert stripped.count("#") < text.count("#") and not re.search(r"^\s*#", stripped, re.M)
    assert contract.parse(stripped, part) == contract.parse(text, part)
    assert contract.render_header(stripped, part) == contract.render_header(text, part)


def test_the_contract_has_every_table():
    c = contract.load()
    assert c.kernel.raw_tps and c.kernel_tasks.members and c.events and c.tunables
    assert set(c.kernel_syscalls) == {"", "x86_64"}
    assert set(c.kernel_sources) == set(contract.TASK_SOURCES)
    assert contract.load("tasks").names("tasks_reason", "IOTRACE_TASKS_DROP_") == [
        "tasks_full", "threads_full", "pids_full", "kernel_read", "waits_full"]


def test_a_header_defines_each_constant_and_code_with_its_value():
    """The generated C and the Python side agree value by value (a name, an expression, an enumerator)."""
    c = contract.load()
    header = contract.render_header(_text(), "iotrace")
    assert ("#define IOTRACE_HIST_BUCKETS ((IOTRACE_HIST_MAX_MSB - IOTRACE_HIST_SUB_BITS + 2) "
            "<< IOTRACE_HIST_SUB_BITS)") in header
    assert c.const("HIST_BUCKETS") == (c.max_msb - c.sub_bits + 2) << c.sub_bits == 4096
    assert "#define IOTRACE_HASH_MUL 0x9E3779B97F4A7C15ULL\t" in header
    assert c.const("HASH_MUL") == 0x9E3779B97F4A7C15
    for i, reason in enumerate(c.reasons):
        assert f"\tIOTRACE_{reason.upper()} = {i}," in header
    assert f"\tIOTRACE_REASON_COUNT = {len(c.reasons)}," in header


def test_the_overridable_constants_are_the_ones_defined_under_ifndef():
    header = contract.render_header(_text(), "iotrace")
    guarded = set(re.findall(r"^#ifndef IOTRACE_(\w+)\n#define IOTRACE_\1 ", header, re.M))
    c = contract.load()
    assert set(c.overrides) == guarded
    assert c.overrides["CPUS"] == c.overrides["PAGE_SHIFT"] == "set_by_user"
    assert "INFLIGHT_SLOTS" in c.tunables and "CPUS" not in c.tunables


def test_a_scope_written_as_a_comment_means_nothing():
    text = _text()
    entry = '[[iotrace.kernel]]\nscope = ["tasks"]\n'
    assert text.count(entry) == 1
    c = contract.parse(text.replace(entry, '[[iotrace.kernel]]  # scope = ["tasks"]\nscope = ["block", "stamps"]\n'))
    # the per-process programs' own entries are now the kernel stamps' scope, whatever the comment says
    assert not c.kernel_tasks.members and "TASK_TGID" in c.kernel_stamps.members


def test_the_shortcuts_are_a_scope_of_their_own():
    """The reads that only skip work are resolved apart (kernel.load_shortcuts): never in the block table, whose
    every entry a kernel must have."""
    c = contract.load()
    assert {"BIO_FLAGS"} == set(c.kernel_shortcuts.members) and {"BIO_PAGE_PINNED"} == set(c.kernel_shortcuts.enums)
    # its head spans a block-table member: resolved with that table's members, yet named in no other scope
    assert c.kernel_shortcuts.heads == {"BIO_FILE_HEAD_LEN": ("bio", ["BIO_FLAGS", "BIO_IO_VEC"])}
    assert "BIO_IO_VEC" in c.kernel.members and "BIO_FILE_HEAD_LEN" not in c.kernel.heads
    assert not {"BIO_FLAGS", "BIO_PAGE_PINNED"} & (set(c.kernel.members) | set(c.kernel.enums))
    assert "shortcuts" not in c.kernel_events
    # the helpers that spare work: helper numbers only, in no table a kernel must have
    assert c.kernel_helpers.enums == {"FUNC_CURRENT_TASK_BTF": "BPF_FUNC_get_current_task_btf"}
    assert not (c.kernel_helpers.members or c.kernel_helpers.heads or c.kernel_helpers.raw_tps)
    assert "FUNC_CURRENT_TASK_BTF" not in {*c.kernel_tasks.enums, *c.kernel_shortcuts.enums, *c.kernel.enums}
    with pytest.raises(contract.ContractError, match="enum bpf_func_id only"):
        contract.parse(_text().replace('scope = ["helpers"]\nreads = [\n',
                                       'scope = ["helpers"]\nreads = [\n  ["member", "X", "task_struct", "pid", 4],\n'))


@pytest.mark.parametrize("scope", ['["tasks", "pagecache"]', '["files"]', '["tasks", "syscalls", "x86", "2"]',
                                   '["block", "Reads"]', '[]', '"tasks"'])
def test_a_scope_the_parser_does_not_know_is_refused(scope):
    text = _text().replace('\nscope = ["tasks"]\n', f"\nscope = {scope}\n")
    with pytest.raises(contract.ContractError, match="scope"):
        contract.parse(text)


@pytest.mark.parametrize("read", ['["member", "X", "task_struct", "pid"]', '["member", "X", "task_struct", "pid", "4"]',
                                  '["members", "X", "task_struct", "pid", 4]', '["raw_tp", "sched_x"]', '"enum"'])
def test_a_bad_kernel_read_is_named(read):
    text = _text().replace('\nscope = ["tasks"]\nreads = [\n', f'\nscope = ["tasks"]\nreads = [\n  {read},\n')
    with pytest.raises(contract.ContractError, match=r"kernel scope \['tasks'\]: bad read|a \[\[iotrace.kernel\]\]"):
        contract.parse(text)


@pytest.mark.parametrize("entry, says", [
    ('NO_SIZE = { value = 1, override = "sometimes" }', "override is one of"),
    ('NO_SIZE = { value = "NOT_DEFINED_YET + 1" }', "uses NOT_DEFINED_YET"),
    ('NO_SIZE = { value = "1 ** 2" }', "not an integer expression"),
    ('NO_SIZE = { value = "(1" }', "not an expression"),
    ('NO_SIZE = { value = "2 * 3", suffix = "ULL" }', "a suffix goes on a literal"),
    ('NO_SIZE = { value = 1, doc = "ends */ here" }', "would end the header's comment"),
    ('NO_SIZE = { value = 1, tunable = true }', "takes value, doc, suffix, override"),
])
def test_a_bad_constant_is_named(entry, says):
    text = _text().replace("[iotrace.constants]\n", f"[iotrace.constants]\n{entry}\n", 1)
    with pytest.raises(contract.ContractError, match=re.escape(says)):
        contract.parse(text)


def test_a_bad_enum_is_named():
    text = _text().replace('[iotrace.enums.phase]\ncount = "PHASE_COUNT"', '[iotrace.enums.phase]\ncount = "PHASES"')
    with pytest.raises(contract.ContractError, match="enum phase"):
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
