"""Per-process rows of every dump: I/O wait, file reads, page-cache misses, fsync time, dirty-page throttling.

Owns bpf/tasks.bpf.c (a BPF object of its own, beside tracer.sources.probe's): it
loads and attaches it, keeps its pid filter (the same semantics as the
block-layer probe's: the given processes and, unless told not to, the
processes they fork from then on; every process when none is given), and
turns the kernel's cumulative per-process counters into per-window
differences at each `drain()`.  A process that exited is reported in the
window it exited in, then forgotten (its entry deleted in the kernel).

What is measured, and where (the kernel's own accounting points):

- io_wait: from the moment a thread blocks with task_struct.in_iowait set
  (sched_switch, not a preemption) to its wakeup (sched_wakeup): delay
  accounting's block-I/O delay, what iotop's IO> shows.  Like delay
  accounting, a wait is counted when it ends.
- read_bytes, reads, read_pages: by default (no --tasks) the buffered reads
  the page cache serves, from its own event (filemap:mm_filemap_get_pages,
  bpf/pagecache.bpf.h): each read's range of pages counted once, clipped at
  the file's size; whole pages, so exact for page-aligned reads (read,
  pread, readv, sendfile, splice, io_uring alike; O_DIRECT is not in the
  page cache).  With --tasks (syscall_hooks): what read, pread64, readv,
  preadv and preadv2 returned from regular files (the raw sys_enter/sys_exit
  tracepoints, or where those cannot be used the syscalls' own perf-event
  tracepoints: see choose_syscalls; the fd's file type read through
  current->files at entry), read_pages 0.
- missed_pages (default only): pages a reader's own reads added to the page
  cache (filemap:mm_filemap_add_to_page_cache, readahead of a miss), so the
  page-cache hit ratio is 1 - missed_pages / read_pages.
- fsync: by default time in ext4_sync_file (fsync, fdatasync, msync of ext4
  files: ext4's enter/exit events); with --tasks time inside the fsync,
  fdatasync and sync_file_range syscalls.
- throttled: I/O waits that balance_dirty_pages began (it traces a pause
  > 0, then sleeps in io_schedule_timeout); also counted in io_wait.  The
  event's arguments changed (Linux 6.1 passes the limits one by one, newer
  kernels a struct): contract.toml lists both prototypes, the kernel's is taken.

Which source each counter came from is the dump's "tasks_sources"
(`TaskTracer.sources`): an event, the syscalls, or "unavailable: why" where
the kernel lacks the event (choose_sources, per source at load).

The disk side (disk_read_bytes) comes from the dump's own read series:
see tracer.pipeline.aggregate.task_rows.
"""

from __future__ import annotations

import ctypes as ct
import os
import platform
import re
import time
from dataclasses import dataclass, field, replace
from pathlib import Path

from tracer import contract
from tracer.errors import UserError
from tracer.sources import bpfobject, kernel
from tracer.sources.bpfobject import BpfObject, Variant, function_name
from tracer.sources.proctree import PROC, stat_of

COUNTERS = ("io_wait_ns", "io_waits", "read_bytes", "reads", "read_pages", "missed_pages", "fsync_ns", "fsyncs",
            "throttle_ns", "throttles")
RAW_EVENTS = ("sched_switch", "sched_wakeup", "sched_process_fork", "sched_process_exit")
# The syscalls timed (asm/unistd*.h's __NR_<name>): their reads' bytes, the syncs' time
READ_SYSCALLS = ("read", "pread64", "readv", "preadv", "preadv2")
SYNC_SYSCALLS = ("fsync", "fdatasync", "sync_file_range")
SYSCALL_EVENTS = ("sys_enter", "sys_exit")
SYSCALL_MODES = ("raw_tp", "tracepoint")
# The event sources, each taken where the running kernel has its events (choose_sources): source -> (its
# tracepoints as category:name, compile flag); their kernel reads are contract.toml's reads under the
# scope ["tasks", <source>].  The default mode's (bpf/pagecache.bpf.h), which --tasks' syscall hooks replace:
PAGECACHE_SOURCES = {
    "reads": (("filemap:mm_filemap_get_pages",), "-DIOTRACE_TASKS_PC_READS"),
    "cache": (("filemap:mm_filemap_add_to_page_cache",), "-DIOTRACE_TASKS_PC_CACHE"),
    "fsync": (("ext4:ext4_sync_file_enter", "ext4:ext4_sync_file_exit"), "-DIOTRACE_TASKS_PC_FSYNC"),
}
# ... and those of every mode
EVERY_MODE_SOURCES = {"throttled": (("writeback:balance_dirty_pages",), "-DIOTRACE_TASKS_THROTTLE")}
# The source every mode has on every kernel (the rows' raw events: RAW_EVENTS)
FIXED_SOURCES = {"io_wait": "sched:sched_switch+sched_wakeup"}
UNAVAILABLE = "unavailable"
# Per architecture (platform.machine()): the uapi header that numbers its syscalls, and where it is,
# relative to the kernel header tree bcc compiles against, then to /usr/include (linux-libc-dev).
# The pt_regs members are contract.toml's, under the scope ["tasks", "syscalls", <arch>].
UNISTD = {"x86_64": ("arch/x86/include/generated/uapi/asm/unistd_64.h",
                     "x86_64-linux-gnu/asm/unistd_64.h", "asm/unistd_64.h")}
_NR = re.compile(r"^#define\s+__NR_(\w+)\s+(\d+)\s*$", re.M)


def header() -> contract.Contract:
    """The per-process programs' constants and reason codes (bpf/contract.toml's [tasks])."""
    return contract.load("tasks")


def reason_names() -> list[str]:
    """The drop reasons of the per-process programs, e.g. 'tasks_full'."""
    return header().names("tasks_reason", "IOTRACE_TASKS_DROP_")


@dataclass
class TaskRaw:
    """One process's counters over one window, as drained (before the disk side is added)."""

    pid: int
    ppid: int
    comm: str
    counts: dict[str, int]          # COUNTERS -> this window's amount
    started: bool = False           # first seen in this window (forked, or first traced)
    exited: bool = False            # its last thread exited in this window


@dataclass
class _Seen:
    first_ns: int
    counts: tuple[int, ...]


@dataclass
class Window:
    """The kernel's cumulative entries turned into one window's rows; pure, no BPF."""

    seen: dict[int, _Seen] = field(default_factory=dict)

    def take(self, entries: list[tuple[int, int, int, int, str, tuple[int, ...]]], start_ns: int,
             keep_idle: bool) -> tuple[list[TaskRaw], list[int]]:
        """(rows, tgids to delete) from entries (tgid, ppid, first_ns, exit_ns, comm, counters).

        A tgid whose first_ns changed is a new process (pid reused): counted
        from zero.  `keep_idle`: a row for every entry, even one with nothing
        new (the pid filter's processes are all "traced processes").
        """
        rows, gone = [], []
        for tgid, ppid, first_ns, exit_ns, comm, counts in entries:
            prev = self.seen.get(tgid)
            base = prev.counts if prev is not None and prev.first_ns == first_ns else (0,) * len(COUNTERS)
            delta = {name: max(0, c - b) for name, c, b in zip(COUNTERS, counts, base, strict=True)}
            started = prev is None or prev.first_ns != first_ns
            started = started and first_ns >= start_ns
            exited = exit_ns != 0
            if keep_idle or exited or started or any(delta.values()):
                rows.append(TaskRaw(tgid, ppid, comm, delta, started, exited))
            if exited:
                gone.append(tgid)
                self.seen.pop(tgid, None)
            else:
                self.seen[tgid] = _Seen(first_ns, tuple(counts))
        rows.sort(key=lambda r: r.pid)
        return rows, gone


def syscall_numbers(arch: str, headers: Path, usr_include: Path = Path("/usr/include")) -> dict[str, int]:
    """The numbers of READ_SYSCALLS and SYNC_SYSCALLS on `arch`, from its asm/unistd header.

    The running kernel has no file that numbers its syscalls (tracefs's
    syscalls events give their arguments, not their numbers), but the
    numbers are its ABI: never changed once given, so any kernel's or libc's
    copy of the header has the running kernel's numbers for these (all
    older than 4.6, preadv2's).  Looked for first in the header tree bcc
    compiles against (`headers`, the arch package's generated uapi, which
    scripts/setup.sh installs for bcc), then in linux-libc-dev's.
    KeyError if `arch` has no entry in UNISTD; LayoutError if no header
    names them all.
    """
    in_tree, *system = UNISTD[arch]
    tried = [headers / in_tree, *(usr_include / s for s in system)]
    for path in tried:
        try:
            found = {name: int(nr) for name, nr in _NR.findall(path.read_text())}
        except OSError:
            continue
        want = READ_SYSCALLS + SYNC_SYSCALLS
        if all(n in found for n in want) and len({found[n] for n in want}) == len(want):
            return {n: found[n] for n in want}
    raise kernel.LayoutError(f"no header numbering {', '.join(READ_SYSCALLS + SYNC_SYSCALLS)} "
                             f"(tried {', '.join(map(str, tried))})")


def choose_syscalls(mode: str, btf, con: contract.Contract, headers: Path,
                    arch: str | None = None) -> tuple[str, list[str], str]:
    """How the read and sync syscalls are timed: (one of SYSCALL_MODES, its compiler flags, why not raw_tp).

    raw_tp: the raw sys_enter/sys_exit tracepoints, which run for every
    syscall and return at once for any other number; they need the raw
    tracepoints, the struct pt_regs members of contract.toml's reads for this
    architecture and the syscall numbers (syscall_numbers).  tracepoint: the
    syscalls' own perf-event tracepoints, which need nothing of the kernel's
    layout but share the perf-event and kprobe programs' per-CPU recursion
    guard: other tools' programs skip events while they run (both variants
    put every syscall of the machine on the syscall-tracepoint slow path;
    costs in bpf/tasks.bpf.c).  "auto" takes raw_tp when it can, and says
    why not.
    """
    if mode == "tracepoint":
        return "tracepoint", [], ""
    if mode not in ("auto", "raw_tp"):
        raise UserError(f"the per-process syscall programs attach auto, {' or '.join(SYSCALL_MODES)}, not {mode!r}")
    arch = arch or platform.machine()
    try:
        regs = con.kernel_syscalls.get(arch)
        if regs is None or arch not in UNISTD:
            known = sorted(a for a in con.kernel_syscalls if a and a in UNISTD)
            raise kernel.LayoutError(f"iotrace has no struct pt_regs mapping for {arch} "
                                     f"(bpf/contract.toml and tracer/sources/tasks.py's UNISTD have one for "
                                     f"{', '.join(known) or 'none'})")
        reads = con.kernel_syscalls.get("", contract.KernelReads({}, {}, {}, {})).merged(regs)
        layout = kernel.load(SYSCALL_EVENTS, reads=reads, btf=btf, start_events=())
        numbers = syscall_numbers(arch, headers)
    except kernel.LayoutError as exc:
        if mode == "raw_tp":
            raise UserError(f"per-process rows on raw syscall tracepoints: {exc}") from None
        return "tracepoint", [], str(exc)
    return "raw_tp", ["-DIOTRACE_TASKS_RAW_SYSCALLS", *layout.cflags(),
                      *(f"-DIOTRACE_NR_{name.upper()}={nr}" for name, nr in sorted(numbers.items()))], ""


def choose_sources(btf, con: contract.Contract, syscall_hooks: bool, syscalls: str = "") -> tuple[dict[str, str],
                                                                                                 list[str]]:
    """Where reads, page-cache misses, fsync and throttling come from: ({counter group: source}, compiler flags).

    Without `syscall_hooks` (the default): each of PAGECACHE_SOURCES whose
    tracepoints the running kernel's BTF has with the arguments read, and
    its kernel members, else "unavailable: why" (a kernel before 6.12 has
    no mm_filemap_get_pages; "cache" needs "reads": a miss is paired with
    the read batch that follows it).  With them (--tasks): reads and fsync
    on the syscalls (`syscalls`: the variant choose_syscalls took), no
    cache source.  EVERY_MODE_SOURCES in both.  The source of each is said
    in every dump.
    """
    sources = dict(FIXED_SOURCES)
    if syscall_hooks:
        how = {"raw_tp": "raw sys_enter/sys_exit", "tracepoint": "perf-event tracepoints"}.get(syscalls, syscalls)
        sources["reads"] = f"syscalls:{','.join(READ_SYSCALLS)} ({how})"
        sources["fsync"] = f"syscalls:{','.join(SYNC_SYSCALLS)} ({how})"
        sources["cache"] = f"{UNAVAILABLE}: --tasks counts reads at the syscalls (hits: 1 - disk_read_bytes/read_bytes)"
        return sources, ["-DIOTRACE_TASKS_SYSCALLS", *_event_sources(btf, con, EVERY_MODE_SOURCES, sources)]
    return sources, _event_sources(btf, con, {**PAGECACHE_SOURCES, **EVERY_MODE_SOURCES}, sources)


def _event_sources(btf, con: contract.Contract, table: dict[str, tuple[tuple[str, ...], str]],
                   sources: dict[str, str]) -> list[str]:
    """Each source of `table` into `sources`, its events or "unavailable: why"; the flags of those taken."""
    flags: list[str] = []
    for name, (events, flag) in table.items():
        if name == "cache" and sources["reads"].startswith(UNAVAILABLE):
            sources[name] = f"{UNAVAILABLE}: needs {PAGECACHE_SOURCES['reads'][0][0]}"
            continue
        reads = con.kernel_sources.get(name, contract.KernelReads({}, {}, {}, {}))
        try:
            layout = kernel.load([e.split(":", 1)[1] for e in events], reads=reads, btf=btf, start_events=())
        except kernel.LayoutError as exc:
            sources[name] = f"{UNAVAILABLE}: {exc}"
            continue
        sources[name] = "+".join(events)
        flags += [flag, *layout.cflags()]
    return flags


def page_shift() -> int:
    """log2 of the page size (the kernel's PAGE_SHIFT: pages of the page cache's events)."""
    return (os.sysconf("SC_PAGESIZE") - 1).bit_length()


def _proc_ppid(pid: int, proc: str = PROC) -> int:
    """A process's parent from /proc, 0 if it cannot be read (it exited)."""
    try:
        return stat_of(pid, proc).ppid
    except (OSError, ValueError):
        return 0


def _proc_comm(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/comm") as f:
            return f.read().strip()
    except OSError:
        return ""


class TaskTracer:
    """bpf/tasks.bpf.c loaded and attached; `drain()` gives a window's TaskRaw rows, `close()` detaches."""

    def __init__(self, pids: list[int] | None = None, follow_children: bool = True, syscalls: str = "auto",
                 syscall_hooks: bool = False):
        """`syscall_hooks` (--tasks): reads and fsyncs timed at the syscalls, the fallback and the baseline
        (every syscall of the machine pays for it), else from the page cache's and ext4's own events
        (choose_sources; `self.sources` says which each counter has).  `syscalls`: how the syscalls are
        timed with hooks, "auto" or one of SYSCALL_MODES (choose_syscalls); the one taken is
        `self.syscalls` ("" without hooks), and `self.syscalls_note` says why "auto" did not take raw_tp."""
        headers = bpfobject.preflight()
        try:
            con = contract.load()
            # one read of the BTF for the members, raw tracepoints and one-bit fields alike
            btf = kernel.open_btf()
            layout = kernel.load(RAW_EVENTS, reads=con.kernel.merged(con.kernel_tasks), btf=btf)
            # the helpers that spare work, those this kernel has (scope ["helpers"])
            layout = replace(layout, values={**layout.values, **kernel.load_helpers(btf)})
        except kernel.LayoutError as exc:
            raise UserError(f"per-process rows need the kernel's BTF: {exc}") from None
        cflags = [f"-I{contract.bpf_dir()}", *layout.cflags(), f"-DIOTRACE_PAGE_SHIFT={page_shift()}"]
        if layout.group_dead:
            cflags.append("-DIOTRACE_HAVE_GROUP_DEAD")
        if not bpfobject.has_cmpxchg():
            # the waits table claims and frees entries as the block programs' slots (compat.bpf.h tag_cas)
            cflags.append("-DIOTRACE_NO_CMPXCHG")
        self.syscalls, self.syscalls_note = "", ""
        variants = []
        if syscall_hooks:
            self.syscalls, syscall_flags, self.syscalls_note = choose_syscalls(syscalls, btf, con, headers)
            self.sources, source_flags = choose_sources(btf, con, True, self.syscalls)
            variants.append(Variant(self.syscalls, (*cflags, *source_flags, *syscall_flags)))
            if self.syscalls == "raw_tp" and syscalls == "auto":
                # should the kernel refuse the raw variant, "auto" still has the perf-event one
                variants.append(Variant("tracepoint", (*cflags, *source_flags)))
        else:
            self.sources, source_flags = choose_sources(btf, con, False)
            variants.append(Variant("pagecache", (*cflags, *source_flags)))
            if source_flags:
                # should the kernel refuse the page-cache programs, the scheduler's rows still load
                variants.append(Variant("sched", tuple(cflags)))
        self.bpf: BpfObject | None = BpfObject(bpfobject.source(contract.bpf_dir(), "tasks.bpf.c"), variants,
                                               "the per-process programs")
        if self.bpf.refused and syscall_hooks:
            self.syscalls = self.bpf.variant.name
            self.syscalls_note = f"the raw sys_enter/sys_exit programs did not load: {self.bpf.refused[0][1]}"
            self.sources = choose_sources(btf, con, True, self.syscalls)[0]
        elif self.bpf.refused:
            why = f"{UNAVAILABLE}: the page-cache programs did not load: {self.bpf.refused[0][1]}"
            self.sources.update({name: why for name in (*PAGECACHE_SOURCES, *EVERY_MODE_SOURCES)})
        self.reasons = reason_names()
        self.filtered = bool(pids)
        self._window = Window()
        self._reasons_seen = [0] * len(self.reasons)
        self._start_ns = time.monotonic_ns()
        for pid in pids or ():
            self.add_pid(pid)
        self.bpf.write_config("tconfig", enabled=1, filter_pids=1 if pids else 0,
                              follow_children=1 if follow_children else 0)

    def add_pid(self, pid: int) -> None:
        """Trace process `pid` (and, with follow_children, what it forks from now on)."""
        tpids, tasks = self.bpf["tpids"], self.bpf["tasks"]
        tpids[tpids.Key(pid)] = ct.c_uint8(1)
        v = tasks.Leaf()
        v.first_ns = time.monotonic_ns()
        v.ppid = _proc_ppid(pid)
        v.comm = _proc_comm(pid).encode()[:15]
        tasks[tasks.Key(pid)] = v

    def traced_pids(self) -> set[int]:
        """What the pid filter holds now: the processes added and those the kernel's fork hook added."""
        return {k.value for k in self.bpf["tpids"].keys()}

    def drain(self, final: bool = False) -> list[TaskRaw]:
        """The window since the last drain: a row per process with something in it (every traced
        process when a pid filter is set), exited ones included, then forgotten."""
        tasks = self.bpf["tasks"]
        entries = []
        for k, v in tasks.items():
            comm = bytes(v.comm).split(b"\0", 1)[0].decode(errors="replace")
            entries.append((k.value, v.ppid, v.first_ns, v.exit_ns, comm, tuple(getattr(v, c) for c in COUNTERS)))
        rows, gone = self._window.take(entries, self._start_ns, keep_idle=self.filtered)
        for tgid in gone:
            try:
                del tasks[tasks.Key(tgid)]
            except KeyError:
                pass
        for r in rows:
            if not r.ppid and not r.exited:
                r.ppid = _proc_ppid(r.pid)
        self._start_ns = time.monotonic_ns()
        return rows

    def dropped(self) -> dict[str, int]:
        """Events lost since the last call, by reason ("tasks_<reason>"), non-zero ones only; the kernel's
        skips of these programs (recursion misses) as "tasks_skipped_<program>"."""
        totals = self.bpf.counters("treasons", len(self.reasons))
        out = {f"tasks_{name}": t - s for name, t, s in zip(self.reasons, totals, self._reasons_seen, strict=True)
               if t - s}
        self._reasons_seen = totals
        out.update({f"tasks_skipped_{name}": n for name, n in self.bpf.skipped().items() if n})
        return out

    def program_costs(self) -> dict[str, dict[str, int]]:
        """Each program's runs, time (both 0 unless kernel.bpf_stats_enabled) and skipped events, by its
        function's name (as the final dump's bpf_programs has them, "tasks:" before each)."""
        return self.bpf.costs(function_name)

    def close(self) -> None:
        if self.bpf is not None:
            self.bpf.close()
            self.bpf = None


def open_tracer(pids: list[int], follow_children: bool, syscall_hooks: bool = False) -> tuple[TaskTracer | None, str]:
    """A TaskTracer, or (None, why not): the block-layer trace goes on without per-process rows."""
    try:
        return TaskTracer(pids, follow_children, syscall_hooks=syscall_hooks), ""
    except UserError as exc:
        return None, str(exc)

