"""tracer.sources.bpfobject, the one BPF loader of the probe and the per-process tracer, on a fake bcc
(no root, no BPF): variants tried in order, the error named, skipped events as deltas per short name,
config maps, per-CPU counters, one unload."""

from __future__ import annotations

import ctypes as ct
import types

import pytest

from tracer.errors import UserError
from tracer.sources import bpfobject
from tracer.sources.bpfobject import BpfObject, ProgStats, Variant


class Leaf(ct.Structure):
    _fields_ = [("enabled", ct.c_uint32), ("gen", ct.c_uint32), ("filter_pids", ct.c_uint32)]


class FakeArray:
    """A bcc array map: indexed with ctypes ints."""

    Leaf = Leaf

    def __init__(self, store: dict[int, object]):
        self.store = store

    def __setitem__(self, k, v):
        self.store[k.value] = v

    def __getitem__(self, k):
        return self.store[k.value]


class FakeBPF:
    refuse: set[str] = set()        # a compile with one of these flags fails
    made: list = []

    def __init__(self, text: str, cflags: list[str]):
        bad = self.refuse & set(cflags)
        if bad:
            raise Exception(f"bpf: Failed to load program\nverifier said no to {sorted(bad)[0]}\n")
        self.text, self.cflags = text, cflags
        self.funcs = {b"raw_tracepoint__block_rq_issue": types.SimpleNamespace(fd=1),
                      b"tracepoint__block__block_rq_issue": types.SimpleNamespace(fd=2),
                      b"raw_tracepoint__block_rq_complete": types.SimpleNamespace(fd=3)}
        self.tables = {"config": FakeArray({}), "reasons": FakeArray({i: [i, 10 * i] for i in range(3)})}
        self.cleanups = 0
        FakeBPF.made.append(self)

    def __getitem__(self, name):
        return self.tables[name]

    def cleanup(self):
        self.cleanups += 1


@pytest.fixture
def fake_bcc(monkeypatch):
    FakeBPF.refuse, FakeBPF.made = set(), []
    mod = types.SimpleNamespace(BPF=FakeBPF, libbcc=types.SimpleNamespace(lib="libbcc"),
                                utils=types.SimpleNamespace(get_possible_cpus=lambda: [0, 1, 3]))
    monkeypatch.setattr(bpfobject, "import_bcc", lambda: mod)
    monkeypatch.setattr(bpfobject, "return_compiler_memory", lambda: None)
    misses = {1: 0, 2: 0, 3: 0}
    monkeypatch.setattr(bpfobject, "prog_stats", lambda fd: ProgStats(0, 5, misses[fd]))
    return misses


def test_the_first_variant_the_kernel_takes_is_loaded_and_the_refused_ones_say_why(fake_bcc):
    FakeBPF.refuse = {"-DRAW"}
    obj = BpfObject("text", [Variant("raw_tp", ("-DRAW", "-I.")), Variant("tracepoint", ("-I.",))], "the programs")
    assert obj.variant.name == "tracepoint" and FakeBPF.made[-1].cflags == ["-I."]
    assert [(v.name, why) for v, why in obj.refused] == [("raw_tp", "verifier said no to -DRAW")]
    assert obj.lib == "libbcc" and bpfobject.possible_cpus() == [0, 1, 3]
    one = BpfObject("text", [Variant("raw_tp", ("-I.",))], "the programs")
    assert one.variant.name == "raw_tp" and one.refused == []


def test_when_no_variant_loads_the_last_error_is_named(fake_bcc):
    FakeBPF.refuse = {"-DRAW", "-I."}
    with pytest.raises(UserError, match=r"^could not load the per-process programs: verifier said no to -I\.$"):
        BpfObject("text", [Variant("raw_tp", ("-DRAW",)), Variant("tracepoint", ("-I.",))],
                  "the per-process programs")


def test_skipped_events_are_deltas_per_short_name_and_programs_stats_by_name(fake_bcc):
    obj = BpfObject("text", [Variant("raw_tp", ())], "x")
    assert set(obj.stats()) == {"block_rq_issue", "block_rq_complete"}     # by tracepoint: two share one
    assert set(obj.costs(bpfobject.function_name)) == {"raw_tracepoint__block_rq_issue",
                                                       "tracepoint__block__block_rq_issue",
                                                       "raw_tracepoint__block_rq_complete"}
    short = {"block_rq_issue": "issue", "block_rq_complete": None}.get
    assert obj.skipped(short) == {"issue": 0}
    fake_bcc[1], fake_bcc[2], fake_bcc[3] = 2, 3, 7
    assert obj.skipped(short) == {"issue": 5}
    fake_bcc[1] = 4
    assert obj.skipped(short) == {"issue": 2} and obj.skipped(short) == {"issue": 0}


def test_config_counters_and_one_unload(fake_bcc):
    obj = BpfObject("text", [Variant("raw_tp", ())], "x")
    obj.write_config("config", enabled=1, filter_pids=1)
    obj.update_config("config", gen=1)
    cfg = obj["config"][ct.c_int(0)]
    assert (cfg.enabled, cfg.gen, cfg.filter_pids) == (1, 1, 1)
    obj.write_config("config", gen=0)       # anew: the fields not given are 0
    assert (obj["config"][ct.c_int(0)].enabled, obj["config"][ct.c_int(0)].gen) == (0, 0)
    assert obj.counters("reasons", 3) == [0, 11, 22]
    made = FakeBPF.made[-1]
    obj.close()
    obj.close()
    assert made.cleanups == 1 and obj.bpf is None


def test_source_pastes_the_shared_headers_with_line_directives(tmp_path):
    (tmp_path / "core.bpf.h").write_text("int core;\n")
    (tmp_path / "raw.bpf.c").write_text('// head\n#include "core.bpf.h"\n#include "other.h"\nint main;\n')
    text = bpfobject.source(tmp_path, "raw.bpf.c")
    assert text == '// head\n#line 1 "core.bpf.h"\nint core;\n\n#line 3 "raw.bpf.c"\n#include "other.h"\nint main;\n'
