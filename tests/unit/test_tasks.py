"""Per-process rows ("tasks") of every dump: I/O wait, file reads, disk reads, fsync, throttling.

The BPF test runs a trainer whose forked workers read 64 MiB of files cold in
epoch 1 and warm in epoch 2, and checks the rows against references: delay
accounting's block-I/O delay (taskstats) for io_wait_s, the bytes the workers
counted for read_bytes, the read series and /proc/PID/io for disk_read_bytes.
The rest needs no root.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tracer import contract
from tracer.errors import UserError
from tracer.model import dump
from tracer.model.sections import Tasks
from tracer.pipeline import aggregate
from tracer.sources import kernel
from tracer.sources.btf import BtfError, Member
from tracer.sources.tasks import (
    COUNTERS,
    EVERY_MODE_SOURCES,
    PAGECACHE_SOURCES,
    READ_SYSCALLS,
    SYNC_SYSCALLS,
    TaskRaw,
    Window,
    choose_sources,
    choose_syscalls,
    reason_names,
    syscall_numbers,
)

# ---- pure parts -----------------------------------------------------------

def counts(**kw) -> tuple[int, ...]:
    return tuple(kw.get(c, 0) for c in COUNTERS)


def test_window_takes_differences_and_forgets_exited_processes():
    w = Window()
    rows, gone = w.take([(10, 1, 100, 0, "a", counts(read_bytes=5)), (11, 1, 100, 0, "b", counts())],
                        start_ns=50, keep_idle=False)
    # a process first seen in the window is in it, idle or not
    assert [(r.pid, r.counts["read_bytes"], r.started) for r in rows] == [(10, 5, True), (11, 0, True)]
    assert gone == []
    rows, gone = w.take([(10, 1, 100, 900, "a", counts(read_bytes=12, io_wait_ns=3)),
                         (11, 1, 100, 0, "b", counts())], start_ns=500, keep_idle=True)
    a, b = rows
    assert (a.counts["read_bytes"], a.counts["io_wait_ns"], a.exited, a.started) == (7, 3, True, False)
    assert (b.pid, any(b.counts.values()), b.started) == (11, False, False)    # kept: keep_idle
    assert gone == [10] and 10 not in w.seen
    rows, _ = w.take([(11, 1, 100, 0, "b", counts())], start_ns=900, keep_idle=False)
    assert rows == []       # nothing new, not started here, no pid filter: no row


def test_a_reused_pid_counts_from_zero():
    w = Window()
    w.take([(10, 1, 100, 0, "a", counts(reads=9))], 0, False)
    rows, _ = w.take([(10, 2, 700, 0, "b", counts(reads=2))], 600, False)
    assert rows[0].counts["reads"] == 2 and rows[0].started


def raw(pid, **kw) -> TaskRaw:
    return TaskRaw(pid, 1, f"p{pid}", {c: kw.get(c, 0) for c in COUNTERS}, exited=True)


def series(pid, op, nbytes, tgid=None):
    return dump.Series(pid=pid, comm=f"p{pid}", device="loop0", devno="7:0", op=op, count=1, bytes=nbytes,
                       phases={}, tgid=tgid if tgid is not None else pid)


def test_task_rows_take_disk_reads_from_the_read_series_of_the_process():
    rows = aggregate.task_rows([raw(5, read_bytes=100, io_wait_ns=2_500_000_000), raw(6)],
                               [series(5, "read", 40), series(5, "write", 99), series(7, "read", 8, tgid=5),
                                series(9, "read", 3)])
    by = {r.pid: r for r in rows}
    assert by[5].disk_read_bytes == 48 and by[5].read_bytes == 100 and by[5].io_wait_s == 2.5
    assert by[6].disk_read_bytes == 0 and by[6].exited
    assert by[9].disk_read_bytes == 3 and by[9].read_bytes == 0     # disk reads without a row of its own


def test_merged_dumps_add_task_rows_by_pid():
    # (a row that is no row, as in a hand-edited file, is the reader's error: tests/unit/test_sections.py)
    merged = dump.merge_tasks([Tasks.from_json(rows).rows for rows in (
        [{"pid": 5, "comm": "a", "io_wait_s": 0.1, "read_bytes": 10, "exited": False}],
        [{"pid": 5, "comm": "b", "io_wait_s": 0.2, "read_bytes": 5, "exited": True},
         {"pid": 6, "comm": "c", "read_bytes": 1}])])
    assert merged[0].to_json() == {"pid": 5, "comm": "b", "io_wait_s": 0.3, "read_bytes": 15, "exited": True,
                         "io_waits": 0, "reads": 0, "disk_read_bytes": 0, "fsync_s": 0, "fsyncs": 0,
                         "throttled_s": 0, "throttles": 0, "ppid": 0, "started": False}
    assert [r.pid for r in merged] == [5, 6]


def test_the_header_and_the_kernel_table_parse():
    assert reason_names() == ["tasks_full", "threads_full", "pids_full", "kernel_read", "waits_full"]
    con = contract.load()
    reads = con.kernel_tasks
    assert reads.bits == {"TASK_IN_IOWAIT": ("task_struct", "in_iowait")}
    assert {"sched_switch", "sched_wakeup"} <= reads.raw_tps.keys()
    assert "TASK_FILES" in reads.members
    # the block-layer programs' table holds none of them: a kernel without one costs them nothing
    assert not (reads.members.keys() | reads.raw_tps.keys() | reads.bits.keys()) & \
        (con.kernel.members.keys() | con.kernel.raw_tps.keys() | con.kernel.bits.keys())


def test_the_raw_syscall_entries_are_apart_and_by_architecture():
    con = contract.load()
    common, x86 = con.kernel_syscalls[""], con.kernel_syscalls["x86_64"]
    assert common.raw_tps == {"sys_enter": [["struct pt_regs *", "long int"]],
                              "sys_exit": [["struct pt_regs *", "long int"]]}
    assert x86.members["REGS_ARG0"] == ("pt_regs", "di", 8) and x86.members["REGS_NR"] == ("pt_regs", "orig_ax", 8)
    # none of them in the tables every variant needs: a kernel without them only loses the raw variant
    assert not (x86.members.keys() | common.raw_tps.keys()) & (
        con.kernel_tasks.members.keys() | con.kernel_tasks.raw_tps.keys() | con.kernel.members.keys())


UNISTD_64 = "#ifndef _ASM_UNISTD_64_H\n" + "".join(
    f"#define __NR_{n} {nr}\n" for n, nr in (("read", 0), ("write", 1), ("fsync", 74), ("fdatasync", 75),
                                               ("pread64", 17), ("readv", 19), ("preadv", 295),
                                               ("preadv2", 327), ("sync_file_range", 277)))


def test_syscall_numbers_come_from_the_header_tree_then_usr_include(tmp_path):
    build, usr = tmp_path / "build", tmp_path / "usr"
    (usr / "x86_64-linux-gnu/asm").mkdir(parents=True)
    (usr / "x86_64-linux-gnu/asm/unistd_64.h").write_text(UNISTD_64)
    nrs = syscall_numbers("x86_64", build, usr)
    assert nrs["read"] == 0 and nrs["preadv2"] == 327 and set(nrs) == set(READ_SYSCALLS + SYNC_SYSCALLS)
    tree = build / "arch/x86/include/generated/uapi/asm"
    tree.mkdir(parents=True)
    (tree / "unistd_64.h").write_text(UNISTD_64.replace("__NR_read 0", "__NR_read 1000"))
    assert syscall_numbers("x86_64", build, usr)["read"] == 1000
    (tree / "unistd_64.h").write_text("#define __NR_read 0\n")        # incomplete: the next one is taken
    assert syscall_numbers("x86_64", build, usr)["read"] == 0
    with pytest.raises(kernel.LayoutError, match="no header numbering read"):
        syscall_numbers("x86_64", build, tmp_path / "nothing")


class RegsBtf:
    def __init__(self, protos=True):
        self.protos = protos

    def member(self, struct, path):
        return Member({"di": 112, "orig_ax": 120, "thread_info.status": 16}[path], 8 if struct == "pt_regs" else 4,
                      0, 0)

    def func_proto(self, typedef):
        if not self.protos:
            raise BtfError(f"no typedef named {typedef!r} in BTF")
        return ["void *", "struct pt_regs *", "long int"]


def test_raw_syscalls_are_taken_when_all_is_there_else_the_fallback_says_why(tmp_path):
    con = contract.load()
    tree = tmp_path / "arch/x86/include/generated/uapi/asm"
    tree.mkdir(parents=True)
    (tree / "unistd_64.h").write_text(UNISTD_64)
    mode, flags, note = choose_syscalls("auto", RegsBtf(), con, tmp_path, "x86_64")
    assert (mode, note) == ("raw_tp", "")
    assert {"-DIOTRACE_TASKS_RAW_SYSCALLS", "-DIOTRACE_K_REGS_ARG0=112", "-DIOTRACE_K_REGS_NR=120",
            "-DIOTRACE_NR_READ=0", "-DIOTRACE_NR_SYNC_FILE_RANGE=277"} <= set(flags)
    mode, flags, note = choose_syscalls("auto", RegsBtf(), con, tmp_path, "aarch64")
    assert (mode, flags) == ("tracepoint", []) and "no struct pt_regs mapping for aarch64" in note and "x86_64" in note
    mode, _, note = choose_syscalls("auto", RegsBtf(protos=False), con, tmp_path, "x86_64")
    assert mode == "tracepoint" and "raw tracepoint sys_enter" in note
    with pytest.raises(UserError, match="raw tracepoint sys_exit"):
        choose_syscalls("raw_tp", RegsBtf(protos=False), con, tmp_path, "x86_64")
    assert choose_syscalls("tracepoint", RegsBtf(), con, Path("/nonexistent"), "x86_64") == ("tracepoint", [], "")


class BitBtf:
    def __init__(self, bit_offset: int, bits: int):
        self.m = Member(bit_offset // 8, 4, bit_offset, bits)

    def member(self, struct, path):
        return self.m


def test_a_one_bit_field_becomes_its_byte_and_mask():
    reads = contract.KernelReads({}, {}, {}, {}, {"X": ("task_struct", "in_iowait")})
    assert kernel.resolve_bits(BitBtf(8 * 1193 + 3, 1), reads) == {"X": 1193, "X_MASK": 8}
    with pytest.raises(kernel.LayoutError, match="one-bit"):
        kernel.resolve_bits(BitBtf(80, 2), reads)


# ---- the trainer, traced --------------------------------------------------


# balance_dirty_pages' whole prototype (after the tracepoint's data pointer) as BTF spells it: since the limits
# moved into struct dirty_throttle_control (this 6.18), and before (Debian 12's 6.1): pause is its 7th and 11th
UL, L = "long unsigned int", "long int"
BDP_618 = ["struct bdi_writeback *", "struct dirty_throttle_control *", UL, UL, UL, UL, L, UL]
BDP_61 = ["struct bdi_writeback *", UL, UL, UL, UL, UL, UL, UL, UL, UL, L, UL]


class SourcesBtf:
    """A kernel's BTF with some of the page-cache sources' tracepoints (`have`), every member they read."""

    PROTOS = {"mm_filemap_get_pages": ["void *", "struct address_space *", "long unsigned int", "long unsigned int"],
              "mm_filemap_add_to_page_cache": ["void *", "struct folio *"],
              "ext4_sync_file_enter": ["void *", "struct file *", "int"],
              "ext4_sync_file_exit": ["void *", "struct inode *", "int"],
              "balance_dirty_pages": ["void *", *BDP_618]}

    def __init__(self, have=tuple(PROTOS), members=True, bdp=None):
        self.have, self.members = set(have), members
        self.PROTOS = dict(self.PROTOS, **({"balance_dirty_pages": ["void *", *bdp]} if bdp else {}))

    def member(self, struct, path):
        if not self.members:
            raise BtfError(f"struct {struct} has no member {path}")
        return Member({"i_size": 80, "flags": 0, "_flags_1": 64, "mapping": 24, "index": 32}[path], 8, 0, 0)

    def enumerator(self, name):
        return {"PG_head": 6}[name]

    def func_proto(self, typedef):
        name = typedef.removeprefix("btf_trace_")
        if name not in self.have:
            raise BtfError(f"no typedef named {typedef!r} in BTF")
        return self.PROTOS[name]


@pytest.mark.parametrize("have,members,want,bdp", [
    # Linux 6.18: every source
    (tuple(SourcesBtf.PROTOS), True, {"reads": "filemap:mm_filemap_get_pages",
                                      "cache": "filemap:mm_filemap_add_to_page_cache",
                                      "fsync": "ext4:ext4_sync_file_enter+ext4:ext4_sync_file_exit"}, BDP_618),
    # Debian 12's 6.1: no mm_filemap_get_pages, so no reads and no misses (they pair with a read's batch);
    # balance_dirty_pages in its older prototype
    (("mm_filemap_add_to_page_cache", "ext4_sync_file_enter", "ext4_sync_file_exit", "balance_dirty_pages"), True,
     {"reads": "unavailable: raw tracepoint mm_filemap_get_pages", "cache": "unavailable: needs filemap:",
      "fsync": "ext4:ext4_sync_file_enter+ext4:ext4_sync_file_exit"}, BDP_61),
    # no ext4 events (ext4 not built in): fsync alone is missing
    (("mm_filemap_get_pages", "mm_filemap_add_to_page_cache", "balance_dirty_pages"), True,
     {"reads": "filemap:mm_filemap_get_pages", "cache": "filemap:mm_filemap_add_to_page_cache",
      "fsync": "unavailable: raw tracepoint ext4_sync_file_enter; raw tracepoint ext4_sync_file_exit"}, BDP_618),
    # the events, but a folio or inode layout iotrace cannot read: those counters are missing, fsync is not
    (tuple(SourcesBtf.PROTOS), False, {"reads": "unavailable: struct inode has no member i_size",
                                       "cache": "unavailable: needs", "fsync": "ext4:ext4_sync_file_enter"},
     BDP_618),
])
def test_each_page_cache_source_is_chosen_where_the_kernel_has_it_else_said_unavailable(have, members, want, bdp):
    sources, flags = choose_sources(SourcesBtf(have, members, bdp), contract.load(), syscall_hooks=False)
    for name, text in want.items():
        assert sources[name].startswith(text), (name, sources[name])
    assert sources["io_wait"] == "sched:sched_switch+sched_wakeup"
    assert sources["throttled"] == "writeback:balance_dirty_pages"
    # throttling in either prototype: pause is the argument before start_time, the last
    assert "-DIOTRACE_TASKS_THROTTLE" in flags and f"-DIOTRACE_K_BALANCE_DIRTY_PAGES_LAST={len(bdp) - 2}" in flags
    on = {name for name, (_, flag) in PAGECACHE_SOURCES.items() if flag in flags}
    assert on == {name for name in PAGECACHE_SOURCES if not sources[name].startswith("unavailable")}
    assert ("-DIOTRACE_K_INODE_SIZE=80" in flags) == ("reads" in on)
    assert ("-DIOTRACE_K_PG_HEAD=6" in flags) == ("cache" in on)
    # never a syscall hook in the default mode: that is its cost promise
    assert not any("SYSCALLS" in f for f in flags)


@pytest.mark.parametrize("bdp,want", [
    (BDP_618, ["-DIOTRACE_TASKS_THROTTLE", "-DIOTRACE_K_BALANCE_DIRTY_PAGES_LAST=6"]),
    (BDP_61, ["-DIOTRACE_TASKS_THROTTLE", "-DIOTRACE_K_BALANCE_DIRTY_PAGES_LAST=10"]),
    # a third shape (a later kernel that moves pause again): throttling alone is missing, named, not guessed
    (["struct bdi_writeback *", "struct dirty_throttle_control *", L], "unavailable: raw tracepoint "
     "balance_dirty_pages takes (struct bdi_writeback *, struct dirty_throttle_control *, long int), not ("),
])
@pytest.mark.parametrize("hooks", [False, True])
def test_throttling_reads_pause_where_the_kernel_s_prototype_puts_it(bdp, want, hooks):
    """Either prototype contract.toml lists is taken, and the flag says which argument is pause; in both modes."""
    sources, flags = choose_sources(SourcesBtf(bdp=bdp), contract.load(), syscall_hooks=hooks, syscalls="raw_tp")
    if isinstance(want, str):
        assert sources["throttled"].startswith(want), sources["throttled"]
        assert not any("THROTTLE" in f or "BALANCE_DIRTY" in f for f in flags)
    else:
        assert sources["throttled"] == "writeback:balance_dirty_pages"
        assert flags[-2:] == want
    # the other sources do not depend on it
    assert sources["fsync"].startswith("syscalls:" if hooks else "ext4:")


def test_with_syscall_hooks_reads_and_fsync_are_the_syscalls_and_no_page_counts():
    sources, flags = choose_sources(SourcesBtf(), contract.load(), syscall_hooks=True, syscalls="raw_tp")
    assert flags == ["-DIOTRACE_TASKS_SYSCALLS", "-DIOTRACE_TASKS_THROTTLE", "-DIOTRACE_K_BALANCE_DIRTY_PAGES_LAST=6"]
    assert sources["reads"] == "syscalls:read,pread64,readv,preadv,preadv2 (raw sys_enter/sys_exit)"
    assert sources["fsync"].startswith("syscalls:fsync,fdatasync,sync_file_range")
    assert sources["cache"].startswith("unavailable: --tasks")


def test_the_page_cache_sources_kernel_entries_are_apart_from_every_other_table():
    con = contract.load()
    assert set(con.kernel_sources) == set(PAGECACHE_SOURCES) | set(EVERY_MODE_SOURCES)
    get_pages = SourcesBtf.PROTOS["mm_filemap_get_pages"][1:]
    assert con.kernel_sources["reads"].raw_tps == {"mm_filemap_get_pages": [get_pages]}
    assert con.kernel_sources["cache"].enums == {"PG_HEAD": "PG_head"}
    # apart from the tasks object's own table: a source's missing entry makes only that source unavailable
    names = set().union(*(r.members.keys() | r.raw_tps.keys() for r in con.kernel_sources.values()))
    assert not names & (con.kernel_tasks.members.keys() | con.kernel_tasks.raw_tps.keys())
    # the core object's per-file rows read some of the same (another object): the same entry in both
    for r in con.kernel_sources.values():
        for name in r.members.keys() & con.kernel.members.keys():
            assert r.members[name] == con.kernel.members[name], name
        for name in r.raw_tps.keys() & con.kernel.raw_tps.keys():
            assert r.raw_tps[name] == con.kernel.raw_tps[name], name


# ---- what the kernel lacks: one start line and the dumps' "unavailable" ------------------------------

def test_each_missing_source_is_named_in_one_start_line_and_the_dump_field():
    """A fake kernel per case: the block-layer probe's gaps (tracer.sources.probe.unavailable) and the
    per-process rows' sources from a fake BTF (choose_sources) go into one dict, one line, never a zero."""
    from tracer.cli.trace import unavailable_line
    from tracer.pipeline.windows import unavailable as gather
    from tracer.sources.probe import unavailable

    # Linux 6.18, raw path, every event: nothing missing, no line
    assert unavailable("block_io_start", True, ("mm_filemap_get_pages", "iomap_dio_rw_begin"), True) == {}
    full, _ = choose_sources(SourcesBtf(), contract.load(), syscall_hooks=False)
    assert gather({}, full) == {} and unavailable_line({}) == ""
    # Debian 12's 6.1: block_getrq starts requests, no mm_filemap_get_pages (files' and tasks' reads)
    probe = unavailable("block_getrq", True, ("iomap_dio_rw_begin",), True)
    assert set(probe) == {"start", "mm_filemap_get_pages"}
    assert "block:block_getrq" in probe["start"] and "cache_read_bytes" in probe["mm_filemap_get_pages"]
    six1, _ = choose_sources(SourcesBtf(("mm_filemap_add_to_page_cache", "ext4_sync_file_enter",
                                         "ext4_sync_file_exit", "balance_dirty_pages"), bdp=BDP_61),
                             contract.load(), syscall_hooks=False)
    got = gather(probe, six1)
    assert set(got) == {"start", "mm_filemap_get_pages", "tasks.reads", "tasks.cache"}
    assert got["tasks.reads"].startswith("raw tracepoint mm_filemap_get_pages")
    line = unavailable_line(got)
    assert line.count("\n") == 0 and all(f"{k}: " in line for k in got) and "--tasks counts reads" in line
    # before 6.5 without a scheduler start: block_rq_insert, said with what it misses where it misses
    blind = unavailable("block_rq_insert", False, (), True, ("loop3",))["start"]
    assert "pass an I/O scheduler" in blind and "loop3" in blind
    assert unavailable("block_rq_insert", False, (), True, ()) == {}    # every traced disk has a scheduler
    # the perf-event path: no per-file rows at all (not a per-event list); no group_dead: said
    tp = unavailable("block_io_start", True, None, False)
    assert set(tp) == {"files", "group_dead"} and "--attach raw_tp" in tp["files"]
    # without files (top, serve) their events are no lack
    assert unavailable("block_io_start", False, None, True) == {}
    # --tasks: the cache counter is off by design, not a kernel's lack; a missing throttle event is
    hooks, _ = choose_sources(SourcesBtf(("mm_filemap_get_pages",)), contract.load(), syscall_hooks=True)
    assert set(gather({}, hooks)) == {"tasks.throttled"}


def test_the_dump_carries_unavailable_even_when_empty():
    from types import SimpleNamespace

    from tracer.pipeline.windows import DumpWindows

    w = DumpWindows(SimpleNamespace(unavailable={"start": "no block:block_io_start"}),
                    SimpleNamespace(sources={"reads": "unavailable: no event", "io_wait": "sched:x"}))
    assert w.unavailable.to_json() == {"start": "no block:block_io_start", "tasks.reads": "no event"}
    assert DumpWindows(SimpleNamespace(unavailable={})).unavailable.to_json() == {}
