"""One BPF object: a bpf/ source compiled by bcc with its flags, its programs attached, their kernel
statistics and skipped events read, unloaded once.

Both of iotrace's BPF sides load through it: the request tracer
(tracer.sources.probe.Probe: raw_tp.bpf.c or tracepoint.bpf.c over the
shared core) and the per-process tracer (tracer.sources.tasks.TaskTracer:
tasks.bpf.c).  What differs between them (which source, which flags, which
maps to fill) stays with them; what is the same is here:

- preflight(): root, bcc importable, kernel headers: checked before any
  other work, so a machine that cannot trace says so first;
- source(): the text bcc compiles, the shared `#include "x.bpf.h"` headers
  pasted in (bcc rewrites map calls in the main text only);
- BpfObject(text, variants, what): compiled with the first variant's flags
  the kernel accepts (a variant is a name and its cflags: the per-process
  tracer falls back from raw syscall tracepoints to perf-event ones); bcc
  attaches every program the text defines by its name
  (TRACEPOINT_PROBE / RAW_TRACEPOINT_PROBE), which is how the event table
  (contract.toml's events) decides what is attached: the source
  defines a program for exactly its table events (tests/unit/test_events.py);
- its programs' statistics from the kernel (BPF_OBJ_GET_INFO_BY_FD: runs, run
  time, recursion misses) and the events skipped since the last look, per
  program or per the short name the caller reports them under;
- config maps (one-element arrays) written and updated; per-CPU counter
  arrays summed; close() unloads once.
"""

from __future__ import annotations

import atexit
import ctypes as ct
import functools
import os
import platform
import re
import struct
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from tracer.errors import UserError

# ---- before any work: can this machine trace? ------------------------------------

def check_privileges() -> None:
    if os.geteuid() == 0:
        return
    raise UserError("tracing needs root (or CAP_BPF and CAP_PERFMON): run it with sudo")


def import_bcc():
    try:
        import bcc  # noqa: PLC0415 - optional until tracing actually starts
    except ImportError:
        raise UserError("bcc is not installed for this Python: run 'apt-get install python3-bpfcc' "
                        "and use a venv made with '/usr/bin/python3 -m venv --system-site-packages'") from None
    return bcc


def kernel_headers() -> Path:
    """The header tree bcc will compile against, or a UserError saying how to get one.

    bcc looks in /lib/modules/$(uname -r)/build (and source).  Where the
    distribution has no headers for this kernel, `make setup` links its
    generic header package there; that is sound only because the BPF code
    reads tracepoint fields alone, never kernel structs.
    """
    override = os.environ.get("BCC_KERNEL_SOURCE")
    if override and os.environ.get("SUDO_UID"):
        # bcc reads it itself: where sudo keeps it, root would compile against headers the invoking user chose
        raise UserError("$BCC_KERNEL_SOURCE is not honoured under sudo (root would compile against headers the "
                        "invoking user chose): unset it, or run as root without sudo")
    release = platform.release()
    # bcc itself uses BCC_KERNEL_SOURCE alone when it is set
    tried = [Path(override)] if override else [Path("/lib/modules") / release / "build"]
    for p in tried:
        if (p / "include").is_dir() or (p / "Makefile").is_file():
            return p
    raise UserError(f"no kernel headers for {release} (tried {', '.join(map(str, tried))}); "
                    f"run 'make setup', or 'apt-get install linux-headers-{release}'")


def possible_cpus() -> list[int]:
    """The CPUs the kernel may bring up (a per-CPU map has a value for each)."""
    return import_bcc().utils.get_possible_cpus()


def preflight() -> Path:
    """Root, bcc and kernel headers, in that order (the first missing one is the error); the header tree."""
    check_privileges()
    import_bcc()
    return kernel_headers()


# ---- the text bcc compiles ----------------------------------------------------------

SHARED_INCLUDE = re.compile(r'^#include "(\w+\.bpf\.h)"$', re.M)


def source(src_dir: Path, name: str) -> str:
    """The text bcc compiles for bpf/`name`: its `#include "x.bpf.h"` lines replaced by those files.

    bcc rewrites map calls (`table.lookup(&k)`) in the main text only: in an
    included header they would compile to indirect calls the verifier
    refuses.  So the shared core is pasted in, with #line directives that
    keep compiler messages naming the right file and line.
    """
    def paste(m: re.Match) -> str:
        line = text.count("\n", 0, m.start()) + 2
        return f'#line 1 "{m.group(1)}"\n{(src_dir / m.group(1)).read_text()}\n#line {line} "{name}"'

    text = (src_dir / name).read_text()
    return SHARED_INCLUDE.sub(paste, text)


# ---- program statistics, through the kernel's own interface ---------------------------

# struct bpf_prog_info of the kernel's UAPI (linux/bpf.h), up to the fields
# iotrace reads; the kernel fills what it knows and the struct only grows.
class _BpfProgInfo(ct.Structure):
    _fields_ = [
        ("type", ct.c_uint32), ("id", ct.c_uint32), ("tag", ct.c_uint8 * 8),
        ("jited_prog_len", ct.c_uint32), ("xlated_prog_len", ct.c_uint32),
        ("jited_prog_insns", ct.c_uint64), ("xlated_prog_insns", ct.c_uint64),
        ("load_time", ct.c_uint64), ("created_by_uid", ct.c_uint32), ("nr_map_ids", ct.c_uint32),
        ("map_ids", ct.c_uint64), ("name", ct.c_char * 16), ("ifindex", ct.c_uint32),
        ("gpl_compatible", ct.c_uint32), ("netns_dev", ct.c_uint64), ("netns_ino", ct.c_uint64),
        ("nr_jited_ksyms", ct.c_uint32), ("nr_jited_func_lens", ct.c_uint32),
        ("jited_ksyms", ct.c_uint64), ("jited_func_lens", ct.c_uint64),
        ("btf_id", ct.c_uint32), ("func_info_rec_size", ct.c_uint32), ("func_info", ct.c_uint64),
        ("nr_func_info", ct.c_uint32), ("nr_line_info", ct.c_uint32), ("line_info", ct.c_uint64),
        ("jited_line_info", ct.c_uint64), ("nr_jited_line_info", ct.c_uint32),
        ("line_info_rec_size", ct.c_uint32), ("jited_line_info_rec_size", ct.c_uint32),
        ("nr_prog_tags", ct.c_uint32), ("prog_tags", ct.c_uint64),
        ("run_time_ns", ct.c_uint64), ("run_cnt", ct.c_uint64), ("recursion_misses", ct.c_uint64),
    ]


class _BpfInfoAttr(ct.Structure):
    _fields_ = [("bpf_fd", ct.c_uint32), ("info_len", ct.c_uint32), ("info", ct.c_uint64)]


# the bpf(2) syscall's number per architecture (asm/unistd*.h's __NR_bpf)
SYS_BPF = {"x86_64": 321, "aarch64": 280, "riscv64": 280, "ppc64le": 361, "s390x": 351}.get(platform.machine(), 321)
_BPF_OBJ_GET_INFO_BY_FD = 15


@dataclass(frozen=True)
class ProgStats:
    run_time_ns: int        # 0 unless kernel.bpf_stats_enabled
    run_cnt: int
    recursion_misses: int   # events skipped: the program was already running on that CPU
    misses_counted: bool = True     # False before Linux 5.12, whose bpf_prog_info has no recursion_misses


def prog_stats(fd: int) -> ProgStats:
    """The kernel's statistics of the BPF program open as `fd`."""
    info = _BpfProgInfo()
    attr = _BpfInfoAttr(fd, ct.sizeof(info), ct.addressof(info))
    libc = ct.CDLL(None, use_errno=True)
    if libc.syscall(SYS_BPF, _BPF_OBJ_GET_INFO_BY_FD, ct.byref(attr), ct.sizeof(attr)) != 0:
        err = ct.get_errno()
        raise OSError(err, f"BPF_OBJ_GET_INFO_BY_FD: {os.strerror(err)}")
    # the kernel writes back how much of the struct it knows
    return ProgStats(info.run_time_ns, info.run_cnt, info.recursion_misses,
                     attr.info_len >= _BpfProgInfo.recursion_misses.offset + 8)


# ---- instruction-set features, probed the way bpftool does: by loading one --------

_BPF_PROG_LOAD = 5
_BPF_PROG_TYPE_SOCKET_FILTER = 1
_BPF_PROG_TYPE_TRACEPOINT = 5


class _BpfProgLoadAttr(ct.Structure):
    _fields_ = [("prog_type", ct.c_uint32), ("insn_cnt", ct.c_uint32), ("insns", ct.c_uint64),
                ("license", ct.c_uint64), ("log_level", ct.c_uint32), ("log_size", ct.c_uint32),
                ("log_buf", ct.c_uint64)]


def _insn(code: int, dst: int = 0, src: int = 0, off: int = 0, imm: int = 0) -> bytes:
    """One struct bpf_insn: opcode, dst/src registers in one byte, 16-bit offset, 32-bit immediate."""
    return struct.pack("<BBhi", code, (src << 4) | dst, off, imm)


# r1 = 0; *(u64 *)(r10 - 8) = r1; r0 = 0; r0 = cmpxchg(*(u64 *)(r10 - 8), r0, r1); r0 = 0; exit
_CMPXCHG_PROG = b"".join((
    _insn(0xb7, dst=1), _insn(0x7b, dst=10, src=1, off=-8), _insn(0xb7, dst=0),
    _insn(0xdb, dst=10, src=1, off=-8, imm=0xf1),  # BPF_STX | BPF_DW | BPF_ATOMIC, BPF_CMPXCHG
    _insn(0xb7, dst=0), _insn(0x95)))


# r1 = 0; call bpf_get_current_ancestor_cgroup_id (helper 123); r0 = 0; exit
_ANCESTOR_CGROUP_PROG = b"".join((_insn(0xb7, dst=1), _insn(0x85, imm=123), _insn(0xb7, dst=0), _insn(0x95)))


def _verifier_takes(prog_type: int, prog: bytes) -> bool:
    """Whether the kernel loads `prog` (struct bpf_insn's, GPL) as a program of `prog_type`."""
    insns = ct.create_string_buffer(prog, len(prog))
    lic = ct.create_string_buffer(b"GPL")
    attr = _BpfProgLoadAttr(prog_type, len(prog) // 8, ct.addressof(insns), ct.addressof(lic), 0, 0, 0)
    libc = ct.CDLL(None, use_errno=True)
    fd = libc.syscall(SYS_BPF, _BPF_PROG_LOAD, ct.byref(attr), ct.sizeof(attr))
    if fd < 0:
        return False
    os.close(fd)
    return True


@functools.cache
def has_cmpxchg() -> bool:
    """Whether the kernel's verifier takes BPF's atomic compare-and-swap (upstream 5ffa25502b5a,
    Linux 5.12): the in-flight table claims its slots with it, and emulates it before (compat.bpf.h)."""
    return _verifier_takes(_BPF_PROG_TYPE_SOCKET_FILTER, _CMPXCHG_PROG)


@functools.cache
def has_ancestor_cgroup() -> bool:
    """Whether tracing programs may call bpf_get_current_ancestor_cgroup_id (not on Debian 11's 5.10; on
    6.1): --cgroup's test of a thread's cgroup or one below it (core.bpf.h; compat.bpf.h without it)."""
    return _verifier_takes(_BPF_PROG_TYPE_TRACEPOINT, _ANCESTOR_CGROUP_PROG)


def tracepoint_of(fn_name: str) -> str:
    """bcc's program name -> its tracepoint: tracepoint__block__block_rq_issue, raw_tracepoint__block_rq_issue."""
    return fn_name.rsplit("__", 1)[-1]


def function_name(fn_name: str) -> str:
    """bcc's program name as it is (the per-process tracer reports its costs under these)."""
    return fn_name


# ---- what the one-time compile leaves behind ----------------------------------------------

COMPILER_LIBS = ("libLLVM", "libclang")
MADV_DONTNEED = 4


def return_compiler_memory() -> None:
    """Give back what a BPF compile left resident.

    clang's working memory is freed but kept by malloc: trim it.  And the
    compiler's code (libLLVM, libclang-cpp: ~90 MB of pages touched while
    compiling) stays mapped for nothing: drop those pages from this process.
    Only executable, read-only mappings qualify: they are private file
    mappings never written, so a page needed again is simply read back from
    the file.  (Read-only data may hold relocated pointers; it is left alone.)
    A long-running tracer goes from ~150 MB resident to ~40 MB.
    """
    try:
        libc = ct.CDLL("libc.so.6", use_errno=True)
        libc.malloc_trim(0)
        libc.madvise.argtypes = (ct.c_void_p, ct.c_size_t, ct.c_int)
        with open("/proc/self/maps") as maps:
            for line in maps:
                fields = line.split()
                if len(fields) < 6 or fields[1] != "r-xp" or not any(n in fields[5] for n in COMPILER_LIBS):
                    continue
                lo, hi = (int(x, 16) for x in fields[0].split("-"))
                libc.madvise(lo, hi - lo, MADV_DONTNEED)
    except (OSError, AttributeError, ValueError):
        pass    # not glibc or no /proc: only memory, never correctness


# ---- the object -------------------------------------------------------------------------

@dataclass(frozen=True)
class Variant:
    """One way to compile a source: a name (what the caller reports as taken) and its compiler flags."""

    name: str
    cflags: tuple[str, ...]


class BpfObject:
    """A source compiled, loaded and attached by bcc; `obj[name]` is one of its maps."""

    def __init__(self, text: str, variants: Sequence[Variant], what: str):
        """Compile `text` with the first of `variants` the kernel takes; UserError("could not load `what`:
        ...") naming the last one's error if none loads.  `self.variant` is the one taken and
        `self.refused` says why each earlier one was not ([(variant, why)])."""
        if not variants:
            raise ValueError("no variant to compile")
        bcc = import_bcc()
        self.refused: list[tuple[Variant, str]] = []
        self.bpf = None
        for i, v in enumerate(variants):
            try:
                self.bpf = bcc.BPF(text=text, cflags=list(v.cflags))
            except Exception as exc:  # bcc raises bare Exception for compile/load/attach errors
                why = str(exc).strip().splitlines()[-1]
                if i == len(variants) - 1:
                    raise UserError(f"could not load {what}: {why}") from None
                self.refused.append((v, why))
                continue
            self.variant = v
            break
        self.lib = bcc.libbcc.lib
        self._misses_seen: dict[str, int] = {}
        return_compiler_memory()

    def __getitem__(self, name: str):
        return self.bpf[name]

    # -- its programs, as the kernel counts them

    def _programs(self, name: Callable[[str], str] = tracepoint_of) -> list[tuple[str, int]]:
        """(name(its function's name), fd) of every loaded program."""
        return [(name(fn_name.decode() if isinstance(fn_name, bytes) else fn_name), fn.fd)
                for fn_name, fn in self.bpf.funcs.items()]

    def counts_misses(self) -> bool:
        """Whether the kernel counts the events it skipped for these programs (recursion_misses, Linux 5.12+)."""
        return all(st.misses_counted for st in self.stats().values())

    def stats(self, name: Callable[[str], str] = tracepoint_of) -> dict[str, ProgStats]:
        """Each program's kernel statistics, by name(its function's name) (default: its tracepoint)."""
        return {n: prog_stats(fd) for n, fd in self._programs(name)}

    def costs(self, name: Callable[[str], str] = tracepoint_of) -> dict[str, dict[str, int]]:
        """Each program's runs, run time (both 0 unless kernel.bpf_stats_enabled) and events skipped."""
        return {n: {"runs": st.run_cnt, "run_time_ns": st.run_time_ns, "missed": st.recursion_misses}
                for n, st in self.stats(name).items()}

    def skipped(self, short: Callable[[str], str | None] = lambda event: event) -> dict[str, int]:
        """Events the kernel skipped since the last call (recursion misses), per short(tracepoint) (programs
        with one short name added up; None leaves a program out).  Every name is there, 0 included."""
        totals: dict[str, int] = {}
        for event, fd in self._programs():
            name = short(event)
            if name is not None:
                totals[name] = totals.get(name, 0) + prog_stats(fd).recursion_misses
        out = {name: n - self._misses_seen.get(name, 0) for name, n in totals.items()}
        self._misses_seen = totals
        return out

    # -- its maps

    def write_config(self, table: str, **values: int) -> None:
        """Element 0 of the array `table` set anew: these fields, the others 0."""
        t = self.bpf[table]
        cfg = t.Leaf()
        for k, v in values.items():
            setattr(cfg, k, v)
        t[ct.c_int(0)] = cfg

    def update_config(self, table: str, **values: int) -> None:
        """Element 0 of the array `table`: these fields changed, the others kept."""
        t = self.bpf[table]
        cfg = t[ct.c_int(0)]
        for k, v in values.items():
            setattr(cfg, k, v)
        t[ct.c_int(0)] = cfg

    def counters(self, table: str, n: int) -> list[int]:
        """Elements 0..n-1 of the per-CPU array `table`, each summed over the CPUs."""
        t = self.bpf[table]
        return [sum(t[ct.c_int(i)]) for i in range(n)]

    def close(self) -> None:
        """Detach and free, once."""
        if self.bpf is None:
            return
        self.bpf.cleanup()
        # bcc registered the same cleanup at exit; running it twice fails loudly
        atexit.unregister(self.bpf.cleanup)
        self.bpf = None
