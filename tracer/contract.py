"""The kernel/user contract, read from bpf/iotrace.h.

bpf/iotrace.h is the single source of truth for the bucket scheme, the op,
phase and drop-reason codes and the map sizes.  This module parses its
``#define IOTRACE_*`` constants and ``enum iotrace_*`` members so that no
number is typed twice; struct layouts come from bcc, which compiles the
header.  Pure Python: importable without root, bcc or numpy.
"""

from __future__ import annotations

import ast
import os
import re
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path

# within one line: a bare #define (the include guard) must not take the next line as its value
_DEFINE = re.compile(r"^[ \t]*#define[ \t]+(IOTRACE_\w+)[ \t]+(.+?)[ \t]*(?:/\*.*)?$", re.M)
_ENUM = re.compile(r"enum\s+(iotrace_\w+)\s*\{(.*?)\};", re.S)
_MEMBER = re.compile(r"^\s*(IOTRACE_\w+)\s*=\s*(\d+)\s*,", re.M)
_EVENT_TABLE = re.compile(r"^#ifdef IOTRACE_EVENT_TABLE\b(.*?)^#endif", re.M | re.S)
_EVENT_ENTRY = re.compile(r"^EVENT\(([^)]*)\)\s*(?:/\*.*\*/)?\s*$")
EVENT_WHEN = ("always", "start", "bio", "present", "dirty")
_KERNEL_TABLE = re.compile(r"^#ifdef IOTRACE_KERNEL_TABLE\b(.*?)^#endif", re.M | re.S)
_KERNEL_ENTRY = re.compile(r"^(KMEMBER|KENUM|KHEAD|KRAWTP|KBIT|KSCOPE)\((.*?)\)\s*(?:/\*.*\*/)?\s*$")
# KSCOPE(tasks, <source>): one event source of the per-process programs, resolved apart
TASK_SOURCES = ("reads", "cache", "fsync", "throttled")
_OVERRIDE_TABLE = re.compile(r"^#ifdef IOTRACE_OVERRIDE_TABLE\b(.*?)^#endif", re.M | re.S)
_OVERRIDE_ENTRY = re.compile(r"^(TUNABLE|SET_BY_USER)\((\w+)\)\s*(?:/\*.*\*/)?\s*$")


ENV_BPF_DIR = "IOTRACE_BPF_DIR"


class RefusedEnvironment(Exception):
    """An environment variable that would make root compile or read what the user behind sudo chose."""


def bpf_dir() -> Path:
    """Where the BPF sources live: $IOTRACE_BPF_DIR, else the installed package's tracer/bpf/ (a wheel or
    `pip install .`), else the checkout's bpf/ (an editable install, or running from the tree).

    $IOTRACE_BPF_DIR (a checkout's bpf/ under development) is honoured only when not under sudo
    (SUDO_UID unset): where sudo keeps IOTRACE_* (env_keep), root would compile the invoking user's
    source, and show its compiler's errors about files only root may read.
    """
    env = os.environ.get(ENV_BPF_DIR)
    if env:
        if os.environ.get("SUDO_UID"):
            raise RefusedEnvironment(f"${ENV_BPF_DIR} is not honoured under sudo (root would compile the BPF "
                                     f"source the invoking user chose): unset it, or run as root without sudo")
        return Path(env)
    here = Path(__file__).resolve().parent
    installed = here / "bpf"
    return installed if (installed / "iotrace.h").is_file() else here.parent / "bpf"


def _eval_int(expr: str, known: dict[str, int]) -> int:
    """Evaluate a C integer expression made of literals, known names and + - << >> * ( )."""
    text = re.sub(r"\b(IOTRACE_\w+)\b", lambda m: str(known[m.group(1)]), expr)
    text = re.sub(r"\b(0[xX][0-9a-fA-F]+|\d+)[uUlL]+\b", r"\1", text)
    tree = ast.parse(text, mode="eval")
    allowed = (ast.Expression, ast.BinOp, ast.UnaryOp, ast.Constant, ast.Add, ast.Sub,
               ast.Mult, ast.LShift, ast.RShift, ast.USub, ast.FloorDiv)
    for node in ast.walk(tree):
        if not isinstance(node, allowed):
            raise ValueError(f"unsupported expression in iotrace.h: {expr!r}")
    return int(eval(compile(tree, "<iotrace.h>", "eval")))  # noqa: S307 - vetted AST above


@dataclass(frozen=True)
class KernelReads:
    """What the raw-tracepoint programs read of the kernel (iotrace.h's IOTRACE_KERNEL_TABLE)."""

    members: dict[str, tuple[str, str, int]]   # NAME -> (struct, member path, bytes read)
    enums: dict[str, str]                      # NAME -> enumerator
    heads: dict[str, tuple[str, list[str]]]    # NAME -> (struct, member NAMEs read in one go)
    # event -> its prototypes, each the argument types as ctx->args[] holds them (up to the last one read), in
    # table order: an event listed more than once has one prototype per kernel era, and the kernel must have one
    raw_tps: dict[str, list[list[str]]]
    bits: dict[str, tuple[str, str]] = field(default_factory=dict)   # NAME -> (struct, one-bit member)
    # NAME -> its older forms, newest first, for a member listed again under the same NAME (another kernel
    # era's: the first the kernel has is read, and IOTRACE_K_<NAME>_ERA says which, 0 for `members`' own)
    older: dict[str, list[tuple[str, str, int]]] = field(default_factory=dict)

    def merged(self, other: KernelReads) -> KernelReads:
        return KernelReads({**self.members, **other.members}, {**self.enums, **other.enums},
                           {**self.heads, **other.heads}, {**self.raw_tps, **other.raw_tps},
                           {**self.bits, **other.bits}, {**self.older, **other.older})


@dataclass(frozen=True)
class Contract:
    """Constants and code tables shared with the BPF programs."""

    defines: dict[str, int]
    enums: dict[str, dict[str, int]]
    kernel: KernelReads = field(default_factory=lambda: KernelReads({}, {}, {}, {}))
    # the entries under KSCOPE(tasks): read by the per-process programs only, so a kernel that
    # lacks one costs the block-layer programs nothing
    kernel_tasks: KernelReads = field(default_factory=lambda: KernelReads({}, {}, {}, {}))
    # the entries under KSCOPE(tasks, syscalls[, arch]): the per-process programs' raw sys_enter/sys_exit
    # variant only, by architecture ("" for every one; else platform.machine(), e.g. "x86_64")
    kernel_syscalls: dict[str, KernelReads] = field(default_factory=dict)
    # the entries under KSCOPE(tasks, reads|cache|fsync|throttled): one source each of the per-process programs
    # (page-cache, ext4 and write-back events), resolved apart: a kernel without one loses that counter only
    kernel_sources: dict[str, KernelReads] = field(default_factory=dict)
    # the entries under KSCOPE(block, stamps): read by the block-layer programs only with --stamps kernel (the
    # request's own start_time_ns / io_start_time_ns), resolved apart: a kernel without them keeps iotrace's stamps
    kernel_stamps: KernelReads = field(default_factory=lambda: KernelReads({}, {}, {}, {}))
    # IOTRACE_EVENT_TABLE: the block-layer programs' events, in the table's order
    events: tuple[Event, ...] = ()
    # IOTRACE_OVERRIDE_TABLE: the constants user space may set, NAME (without IOTRACE_) -> "tunable" (a map
    # size an option may change) or "set_by_user" (a fact of the running machine)
    overrides: dict[str, str] = field(default_factory=dict)
    # the entries under KSCOPE(block, <event>): read by that event's block-layer program only, resolved with
    # it where it is attached (a kernel without the event, or with another of its group, needs none of them)
    kernel_events: dict[str, KernelReads] = field(default_factory=dict)

    @property
    def tunables(self) -> list[str]:
        """The map sizes an option may change, e.g. 'INFLIGHT_SLOTS'."""
        return [n for n, kind in self.overrides.items() if kind == "tunable"]

    def const(self, name: str) -> int:
        return self.defines["IOTRACE_" + name]

    def names(self, enum: str, prefix: str) -> list[str]:
        """Enum member names, lower-case without prefix, in code order (the *_COUNT excluded)."""
        members = self.enums["iotrace_" + enum]
        out = [""] * len(members)
        for full, code in members.items():
            if full.endswith("_COUNT"):
                continue
            out[code] = full[len(prefix):].lower()
        return [n for n in out if n]

    @property
    def ops(self) -> list[str]:
        return self.names("op", "IOTRACE_OP_")

    @property
    def phases(self) -> list[str]:
        return self.names("phase", "IOTRACE_PHASE_")

    @property
    def reasons(self) -> list[str]:
        """Drop and note reasons, e.g. 'drop_no_start', 'note_merged'."""
        return self.names("reason", "IOTRACE_")

    @property
    def drops(self) -> list[str]:
        """The kernel's drop reasons without their prefix, e.g. 'no_start' (the notes lose nothing)."""
        return [r.removeprefix("drop_") for r in self.reasons if r.startswith("drop_")]

    @property
    def shown_phases(self) -> list[str]:
        """The phases in the order reports show them: the total latency first, then its parts."""
        return ["total", *(p for p in self.phases if p != "total")]

    @property
    def sector_size(self) -> int:
        """Bytes per sector, the unit of the block layer's and /proc/diskstats' sector counts."""
        return self.const("SECTOR_SIZE")

    @property
    def sub_bits(self) -> int:
        return self.const("HIST_SUB_BITS")

    @property
    def max_msb(self) -> int:
        return self.const("HIST_MAX_MSB")

    @property
    def buckets(self) -> int:
        return self.const("HIST_BUCKETS")


def _parse_kernel(text: str) -> tuple[KernelReads, KernelReads, dict[str, KernelReads], dict[str, KernelReads],
                                       KernelReads, dict[str, KernelReads]]:
    """(the block-layer programs' reads: KSCOPE(block), the table's start; the per-process programs':
    KSCOPE(tasks); their raw-syscall variant's by architecture: KSCOPE(tasks, syscalls[, arch]), "" for
    every one; their event sources' by source: KSCOPE(tasks, reads|cache|fsync|throttled); the kernel
    stamps' extra reads: KSCOPE(block, stamps); one block-layer program's own: KSCOPE(block, <event>))."""
    block, tasks, stamps = KernelReads({}, {}, {}, {}), KernelReads({}, {}, {}, {}), KernelReads({}, {}, {}, {})
    syscalls: dict[str, KernelReads] = {}
    sources: dict[str, KernelReads] = {}
    events: dict[str, KernelReads] = {}
    reads = block
    table = _KERNEL_TABLE.search(text)
    for line in (table.group(1).splitlines() if table else ()):
        if not line.strip():
            continue
        m = _KERNEL_ENTRY.match(line.strip())
        if not m:
            raise ValueError(f"iotrace.h: bad line in IOTRACE_KERNEL_TABLE: {line.strip()!r}")
        kind, args = m.group(1), [a.strip() for a in m.group(2).split(",")]
        if kind == "KSCOPE":
            reads = _scope(args, line, block, tasks, syscalls, sources, stamps, events)
        elif kind == "KMEMBER" and args[0] in reads.members:
            reads.older.setdefault(args[0], []).append((args[1], args[2], int(args[3])))
        elif kind == "KMEMBER":
            reads.members[args[0]] = (args[1], args[2], int(args[3]))
        elif kind == "KENUM":
            reads.enums[args[0]] = args[1]
        elif kind == "KHEAD":
            reads.heads[args[0]] = (args[1], args[2:])
        elif kind == "KBIT":
            reads.bits[args[0]] = (args[1], args[2])
        else:
            reads.raw_tps.setdefault(args[0], []).append(args[1:])
    return block, tasks, syscalls, sources, stamps, events


def _scope(args: list[str], line: str, block: KernelReads, tasks: KernelReads,
           syscalls: dict[str, KernelReads], sources: dict[str, KernelReads], stamps: KernelReads,
           events: dict[str, KernelReads]) -> KernelReads:
    """The reads a KSCOPE(program[, part[, arch]]) line puts the entries after it in."""
    if args == ["block"]:
        return block
    if args == ["block", "stamps"]:
        return stamps
    if len(args) == 2 and args[0] == "block" and re.fullmatch(r"[a-z]\w+", args[1]):
        return events.setdefault(args[1], KernelReads({}, {}, {}, {}))
    if args == ["tasks"]:
        return tasks
    if args[:2] == ["tasks", "syscalls"] and len(args) <= 3 and all(re.fullmatch(r"\w+", a) for a in args):
        return syscalls.setdefault(args[2] if len(args) == 3 else "", KernelReads({}, {}, {}, {}))
    if len(args) == 2 and args[0] == "tasks" and args[1] in TASK_SOURCES:
        return sources.setdefault(args[1], KernelReads({}, {}, {}, {}))
    raise ValueError(f"iotrace.h: bad KSCOPE in IOTRACE_KERNEL_TABLE: {line.strip()!r}")


def _parse_overrides(text: str, defines: dict[str, int]) -> dict[str, str]:
    """IOTRACE_OVERRIDE_TABLE: NAME -> "tunable" or "set_by_user"; each must name a #define of the header."""
    table = _OVERRIDE_TABLE.search(text)
    out: dict[str, str] = {}
    for line in (table.group(1).splitlines() if table else ()):
        if not line.strip():
            continue
        m = _OVERRIDE_ENTRY.match(line.strip())
        if not m or "IOTRACE_" + m.group(2) not in defines or m.group(2) in out:
            raise ValueError(f"iotrace.h: bad line in IOTRACE_OVERRIDE_TABLE: {line.strip()!r}")
        out[m.group(2)] = m.group(1).lower()
    return out


@dataclass(frozen=True)
class Event:
    """One line of IOTRACE_EVENT_TABLE: a tracepoint the block-layer programs attach to."""

    name: str                   # block_rq_issue
    category: str               # its tracefs category: block, sched
    short: str                  # its skips are reported as "skipped_<short>"
    paths: tuple[str, ...]      # the attach paths with a program on it: raw_tp, tracepoint
    when: str                   # EVENT_WHEN: always, start (the first one present starts requests), bio, present,
                                # dirty (the first one present is a page dirtied)
    fields: tuple[str, ...]     # the tracepoint format fields the perf-event program reads


def _parse_events(text: str) -> tuple[Event, ...]:
    table = _EVENT_TABLE.search(text)
    out = []
    for line in (table.group(1).splitlines() if table else ()):
        if not line.strip():
            continue
        m = _EVENT_ENTRY.match(line.strip())
        args = [a.strip() for a in m.group(1).split(",")] if m else []
        if len(args) != 6 or args[4] not in EVENT_WHEN:
            raise ValueError(f"iotrace.h: bad line in IOTRACE_EVENT_TABLE: {line.strip()!r}")
        name, category, short, paths, when, fields = args
        out.append(Event(name, category, short, tuple(paths.split()), when,
                         () if fields == "-" else tuple(fields.split())))
    return tuple(out)


def parse(text: str) -> Contract:
    defines: dict[str, int] = {}
    for name, expr in _DEFINE.findall(text):
        try:
            defines[name] = _eval_int(expr, defines)
        except (KeyError, SyntaxError, ValueError):
            continue  # not an integer constant (e.g. the include guard)
    enums = {name: {m: int(v) for m, v in _MEMBER.findall(body)} for name, body in _ENUM.findall(text)}
    for name, members in enums.items():
        count = [v for m, v in members.items() if m.endswith("_COUNT")]
        if not count or sorted(v for m, v in members.items() if not m.endswith("_COUNT")) != list(range(count[0])):
            raise ValueError(f"enum {name} in iotrace.h must number its members 0..N-1 and end with *_COUNT = N")
    block, tasks, syscalls, sources, stamps, event_reads = _parse_kernel(text)
    events = _parse_events(text)
    stray = set(event_reads) - {e.name for e in events}
    if stray:
        raise ValueError(f"iotrace.h: KSCOPE(block, <event>) for events not in IOTRACE_EVENT_TABLE: {sorted(stray)}")
    return Contract(defines, enums, block, tasks, syscalls, sources, stamps, events,
                    _parse_overrides(text, defines), event_reads)


@lru_cache(maxsize=1)
def load() -> Contract:
    """The contract of the installed BPF sources."""
    return parse((bpf_dir() / "iotrace.h").read_text())
