"""tracer.sources.kernel: contract.toml's kernel reads resolved against a BTF, and every gap named (no root)."""

from __future__ import annotations

import os

import pytest

from tracer import contract
from tracer.sources import kernel
from tracer.sources.btf import Btf, BtfError, Member

READS = contract.load().kernel
EVENTS = ("block_rq_issue", "block_rq_complete", "sched_process_exit")


class FakeBtf:
    """The few lookups tracer.sources.kernel makes, answered from tables (the real reader has its own tests)."""

    def __init__(self, members: dict, enums: dict, protos: dict):
        self.members, self.enums, self.protos = members, enums, protos

    def member(self, struct: str, path: str) -> Member:
        if (struct, path) not in self.members:
            raise BtfError(f"struct {struct} has no member {path!r}")
        off, size = self.members[struct, path]
        return Member(off, size, off * 8, 0)

    def enumerator(self, name: str) -> int:
        if name not in self.enums:
            raise BtfError(f"no enumerator {name!r}")
        return self.enums[name]

    def func_proto(self, typedef: str) -> list[str]:
        if typedef not in self.protos:
            raise BtfError(f"no typedef {typedef!r}")
        return self.protos[typedef]


def complete_btf() -> FakeBtf:
    """Every entry of the table, at made-up offsets: a struct's members 8 bytes apart, in table order."""
    members, seen = {}, {}
    for s, p, size in READS.members.values():
        seen[s] = seen.get(s, -1) + 1
        members[s, p] = (8 * seen[s], size)
    members["gendisk", "major"], members["gendisk", "first_minor"] = (0, 4), (4, 4)
    enums = {name: 10 + i for i, name in enumerate(READS.enums.values())}
    protos = {f"btf_trace_{ev}": ["void *", *wants[0]] for ev, wants in READS.raw_tps.items()}
    protos["btf_trace_sched_process_exit"].append("bool")
    return FakeBtf(members, enums, protos)


def test_every_entry_becomes_a_flag():
    fake = complete_btf()
    layout = kernel.resolve(fake, READS, EVENTS)
    for name, (s, p, _) in READS.members.items():
        assert layout.values[name] == fake.members[s, p][0]
    assert layout.values["REQ_PREFLUSH"] == fake.enums["__REQ_PREFLUSH"]
    # a head ends where the furthest of its members ends
    struct, names = READS.heads["RQ_HEAD_LEN"]
    assert layout.values["RQ_HEAD_LEN"] == max(layout.values[m] + READS.members[m][2] for m in names)
    assert layout.values["RQ_HEAD_LEN"] >= layout.values["RQ_DATA_LEN"] + 4
    assert layout.start_event == "block_io_start" and layout.group_dead
    assert f"-DIOTRACE_K_RQ_Q={layout.values['RQ_Q']}" in layout.cflags()


@pytest.mark.parametrize("spoil, named", [
    (lambda b: b.members.pop(("request", "cmd_flags")), "cmd_flags"),
    (lambda b: b.members.__setitem__(("request", "__data_len"), (44, 8)), "__data_len is 8 bytes"),
    (lambda b: b.enums.pop("__REQ_PREFLUSH"), "__REQ_PREFLUSH"),
    (lambda b: b.protos.pop("btf_trace_block_rq_issue"), "raw tracepoint block_rq_issue"),
    (lambda b: b.protos.__setitem__("btf_trace_block_rq_complete", ["void *", "struct request *", "int"]),
     "block_rq_complete takes (struct request *, int)"),
    (lambda b: [b.protos.pop(f"btf_trace_{ev}") for ev in kernel.START_EVENTS],
     "block_io_start or block_getrq or block_rq_insert"),
    (lambda b: b.members.__setitem__(("gendisk", "first_minor"), (8, 4)), "first_minor does not follow major"),
    (lambda b: b.members.__setitem__(("request", "__data_len"), (kernel.MAX_HEAD_BYTES, 4)),
     f"beyond the {kernel.MAX_HEAD_BYTES} read in one go"),
])
def test_a_gap_is_named(spoil, named):
    fake = complete_btf()
    spoil(fake)
    with pytest.raises(kernel.LayoutError, match=named.replace("(", r"\(").replace(")", r"\)").replace("*", r"\*")):
        kernel.resolve(fake, READS, EVENTS)


def test_all_gaps_named_at_once():
    fake = complete_btf()
    fake.members.pop(("request", "cmd_flags"))
    fake.enums.pop("REQ_OP_FLUSH")
    with pytest.raises(kernel.LayoutError) as e:
        kernel.resolve(fake, READS, EVENTS)
    assert "cmd_flags" in str(e.value) and "REQ_OP_FLUSH" in str(e.value)


def test_older_start_event_and_no_group_dead():
    fake = complete_btf()
    fake.protos.pop("btf_trace_block_io_start")
    fake.protos["btf_trace_sched_process_exit"].pop()
    layout = kernel.resolve(fake, READS, EVENTS)
    # Linux 5.x-6.4: block_getrq, which every kernel has, carries the start (a bio)
    assert layout.start_event == "block_getrq" and not layout.group_dead


def test_a_start_event_with_other_arguments_is_passed_over():
    fake = complete_btf()
    fake.protos.pop("btf_trace_block_io_start")
    fake.protos["btf_trace_block_getrq"] = ["void *", "struct request_queue *", "int"]     # no form contract.toml lists
    assert kernel.resolve(fake, READS, EVENTS).start_event == "block_rq_insert"


def test_5_10s_block_getrq_is_taken_with_the_bio_s_index():
    fake = complete_btf()
    fake.protos.pop("btf_trace_block_io_start")
    fake.protos["btf_trace_block_getrq"] = ["void *", "struct request_queue *", "struct bio *", "int"]   # Linux 5.10
    layout = kernel.resolve(fake, READS, EVENTS)
    assert layout.start_event == "block_getrq" and layout.values["BLOCK_GETRQ_LAST"] == 1
    fake.protos["btf_trace_block_getrq"] = ["void *", "struct bio *"]
    assert kernel.resolve(fake, READS, EVENTS).values["BLOCK_GETRQ_LAST"] == 0


def test_a_member_listed_again_is_another_era_s_and_the_head_takes_its_struct_s_only():
    # 6.1 on: rq->q->disk, outside the request's head; 5.10: rq->rq_disk, inside it
    fake = complete_btf()
    newer = kernel.resolve(fake, READS, EVENTS).values
    assert newer["RQ_DISK_ERA"] == 0 and newer["RQ_DISK"] == fake.members[("request_queue", "disk")][0]
    fake.members.pop(("request_queue", "disk"))
    fake.members[("request", "rq_disk")] = (120, 8)
    older = kernel.resolve(fake, READS, EVENTS).values
    assert (older["RQ_DISK_ERA"], older["RQ_DISK"]) == (1, 120)
    assert older["RQ_HEAD_LEN"] == 128 > newer["RQ_HEAD_LEN"]
    fake.members.pop(("request", "rq_disk"))
    with pytest.raises(kernel.LayoutError, match="RQ_DISK: .*request_queue.* nor .*rq_disk"):
        kernel.resolve(fake, READS, EVENTS)


@pytest.mark.skipif(not os.access(kernel.BTF_PATH, os.R_OK), reason="no kernel BTF here")
def test_the_running_kernel():
    """The real table against the real BTF: each value is what the BTF reader says."""
    btf = Btf.load()
    layout = kernel.load(EVENTS)
    for name, (struct, path, size) in READS.members.items():
        m = btf.member(struct, path)
        assert (layout.values[name], m.size) == (m.offset, size), name
    for name, enumerator in READS.enums.items():
        assert layout.values[name] == btf.enumerator(enumerator)


# An event whose arguments moved between kernels: contract.toml lists it once a prototype (raw_tp reads)
ERAS = contract.parse('[iotrace]\nprefix = "IOTRACE_"\n[[iotrace.kernel]]\nscope = ["block"]\nreads = [\n'
                      '  ["raw_tp", "moved", "struct a *", "struct b *", "long int"],  # newer\n'
                      '  ["raw_tp", "moved", "struct a *", "long unsigned int", "long unsigned int", "long int"],\n'
                      '  ["raw_tp", "plain", "struct a *"],\n'
                      ']\n').kernel


@pytest.mark.parametrize("args, last", [
    (["struct a *", "struct b *", "long int", "long unsigned int"], 2),
    (["struct a *", "long unsigned int", "long unsigned int", "long int", "long unsigned int"], 3),
])
def test_an_event_listed_per_era_takes_the_kernel_s_prototype(args, last):
    assert ERAS.raw_tps["moved"] == [["struct a *", "struct b *", "long int"],
                                     ["struct a *", "long unsigned int", "long unsigned int", "long int"]]
    fake = FakeBtf({}, {}, {"btf_trace_moved": ["void *", *args], "btf_trace_plain": ["void *", "struct a *"]})
    layout = kernel.resolve(fake, ERAS, ("moved", "plain"), start_events=())
    # the index of the matching entry's last argument; none for an event with one prototype
    assert layout.values == {"MOVED_LAST": last}
    assert layout.cflags() == [f"-DIOTRACE_K_MOVED_LAST={last}"]


def test_an_event_in_neither_era_s_prototype_names_both():
    fake = FakeBtf({}, {}, {"btf_trace_moved": ["void *", "struct a *", "int"]})
    with pytest.raises(kernel.LayoutError) as e:
        kernel.resolve(fake, ERAS, ("moved",), start_events=())
    assert str(e.value) == ("raw tracepoint moved takes (struct a *, int), not (struct a *, struct b *, long int) or "
                            "(struct a *, long unsigned int, long unsigned int, long int)")
