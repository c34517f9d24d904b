"""The kernel/user contract, read from bpf/contract.toml.

bpf/contract.toml is the single source of truth for the bucket scheme, the
op, phase and drop-reason codes, the map sizes, the kernel members and raw
tracepoints the programs read and the events they attach to.  This module
reads it with tomllib (no number is typed twice) and writes from it the C
definitions the BPF programs include (render_header; `make contract`, i.e.
``python -m tracer.contract``); struct layouts come from bcc, which compiles
bpf/iotrace.h.  Pure Python: importable without root, bcc or numpy.
"""

from __future__ import annotations

import ast
import io
import os
import sys
import tokenize
import tomllib
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path

EVENT_WHEN = ("always", "start", "bio", "present", "dirty")
# ["tasks", <source>]: one event source of the per-process programs, resolved apart
TASK_SOURCES = ("reads", "cache", "fsync", "throttled")
OVERRIDES = ("tunable", "set_by_user")
# the parts of contract.toml: each one generated header, included by the header named after the part
PARTS = ("iotrace", "tasks")
CONTRACT_FILE = "contract.toml"


class ContractError(ValueError):
    """bpf/contract.toml says something this module cannot take (one line: where, and what)."""


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


def header_file(part: str) -> str:
    """The generated header of a part of contract.toml, e.g. iotrace_defs.h."""
    return f"{part}_defs.h"


# ---- constants: an integer, or a C expression of literals and earlier names --------------------------

_BINOPS = {ast.Add: lambda a, b: a + b, ast.Sub: lambda a, b: a - b, ast.Mult: lambda a, b: a * b,
           ast.Div: lambda a, b: a // b, ast.LShift: lambda a, b: a << b, ast.RShift: lambda a, b: a >> b}


def _expression(name: str, text: str) -> ast.expr:
    try:
        return ast.parse(text, mode="eval").body
    except SyntaxError:
        raise ContractError(f"{CONTRACT_FILE}: {name}: {text!r} is not an expression") from None


def _evaluate(name: str, node: ast.expr, known: dict[str, int]) -> int:
    """The value of a constant's expression: integer literals, names defined before it, + - * / << >>."""
    if isinstance(node, ast.Constant) and isinstance(node.value, int) and not isinstance(node.value, bool):
        return node.value
    if isinstance(node, ast.Name):
        if node.id not in known:
            raise ContractError(f"{CONTRACT_FILE}: {name} uses {node.id}, not a constant defined before it")
        return known[node.id]
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
        return -_evaluate(name, node.operand, known)
    if isinstance(node, ast.BinOp) and type(node.op) in _BINOPS:
        return _BINOPS[type(node.op)](_evaluate(name, node.left, known), _evaluate(name, node.right, known))
    raise ContractError(f"{CONTRACT_FILE}: {name}: {ast.unparse(node)!r} is not an integer expression "
                        f"(literals, earlier constants, + - * / << >>)")


def _c_text(written: str, prefix: str) -> str:
    """A constant's expression as C: as written in contract.toml, its names prefixed (read by Python's
    tokenizer: the operators and parentheses left as the author wrote them, which C reads alike)."""
    out, last = [], 0
    for tok in tokenize.generate_tokens(io.StringIO(written).readline):
        if tok.type == tokenize.NAME:
            out += [written[last:tok.start[1]], prefix + tok.string]
            last = tok.end[1]
    return "".join(out) + written[last:]


@dataclass(frozen=True)
class Constant:
    """One entry of [<part>.constants]."""

    name: str            # without the prefix: HIST_BUCKETS
    value: int
    c_text: str          # the value as the generated header writes it
    doc: str = ""
    override: str = ""   # "", or one of OVERRIDES: defined under #ifndef


def _constants(table: dict, prefix: str) -> list[Constant]:
    out: list[Constant] = []
    known: dict[str, int] = {}
    for name, entry in table.items():
        entry = entry if isinstance(entry, dict) else {"value": entry}
        unknown = set(entry) - {"value", "doc", "suffix", "override"}
        if unknown or "value" not in entry:
            raise ContractError(f"{CONTRACT_FILE}: constant {name}: takes value, doc, suffix, override "
                                f"(not {sorted(unknown) or 'without a value'})")
        raw, override, suffix = entry["value"], entry.get("override", ""), entry.get("suffix", "")
        if override and override not in OVERRIDES:
            raise ContractError(f"{CONTRACT_FILE}: constant {name}: override is one of {', '.join(OVERRIDES)}, "
                                f"not {override!r}")
        if suffix not in ("", "U", "UL", "ULL"):
            raise ContractError(f"{CONTRACT_FILE}: constant {name}: suffix {suffix!r} is not U, UL or ULL")
        node = _expression(name, raw.strip()) if isinstance(raw, str) else ast.Constant(raw)
        value = _evaluate(name, node, known)
        text = _c_text(raw.strip(), prefix) if isinstance(raw, str) else str(raw)
        if suffix and not isinstance(node, ast.Constant):
            raise ContractError(f"{CONTRACT_FILE}: constant {name}: a suffix goes on a literal, not {text}")
        if "*/" in entry.get("doc", ""):
            raise ContractError(f"{CONTRACT_FILE}: constant {name}: its doc would end the header's comment")
        known[name] = value
        out.append(Constant(name, value, text + suffix, entry.get("doc", ""), override))
    return out


def _enums(table: dict, prefix: str) -> dict[str, tuple[list[tuple[str, str]], str]]:
    """enum name -> ([(member, doc)], count name), members numbered in order."""
    out = {}
    for name, entry in table.items():
        members, count = entry.get("members"), entry.get("count")
        if not isinstance(count, str) or not count.endswith("_COUNT") or not isinstance(members, list) \
                or not all(isinstance(m, list) and len(m) == 2 and all(isinstance(x, str) for x in m) for m in members):
            raise ContractError(f"{CONTRACT_FILE}: enum {name}: members = [[NAME, doc], ...] and count = "
                                f"\"<NAME>_COUNT\"")
        if any("*/" in doc for _, doc in members):
            raise ContractError(f"{CONTRACT_FILE}: enum {name}: a doc would end the header's comment")
        out[name] = ([(m, doc) for m, doc in members], count)
    return out


# ---- the kernel reads and the events: read by user space only --------------------------------------

@dataclass(frozen=True)
class KernelReads:
    """What the raw-tracepoint programs read of the kernel (contract.toml's [[iotrace.kernel]])."""

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
    # the entries under scope ["tasks"]: read by the per-process programs only, so a kernel that
    # lacks one costs the block-layer programs nothing
    kernel_tasks: KernelReads = field(default_factory=lambda: KernelReads({}, {}, {}, {}))
    # the entries under scope ["tasks", "syscalls"[, arch]]: the per-process programs' raw sys_enter/sys_exit
    # variant only, by architecture ("" for every one; else platform.machine(), e.g. "x86_64")
    kernel_syscalls: dict[str, KernelReads] = field(default_factory=dict)
    # the entries under scope ["tasks", reads|cache|fsync|throttled]: one source each of the per-process programs
    # (page-cache, ext4 and write-back events), resolved apart: a kernel without one loses that counter only
    kernel_sources: dict[str, KernelReads] = field(default_factory=dict)
    # the entries under scope ["block", "stamps"]: read by the block-layer programs only with --stamps kernel (the
    # request's own start_time_ns / io_start_time_ns), resolved apart: a kernel without them keeps iotrace's stamps
    kernel_stamps: KernelReads = field(default_factory=lambda: KernelReads({}, {}, {}, {}))
    # [iotrace] events: the block-layer programs' events, in the table's order
    events: tuple[Event, ...] = ()
    # the constants user space may set (their override), NAME (without IOTRACE_) -> "tunable" (a map
    # size an option may change) or "set_by_user" (a fact of the running machine)
    overrides: dict[str, str] = field(default_factory=dict)
    # the entries under scope ["block", <event>]: read by that event's block-layer program only, resolved with
    # it where it is attached (a kernel without the event, or with another of its group, needs none of them)
    kernel_events: dict[str, KernelReads] = field(default_factory=dict)
    # the entries under scope ["block", "shortcuts"]: reads that only let the block-layer programs skip work, resolved
    # apart where the raw path loads: a kernel without them does that work (e.g. 6.1 has no BIO_PAGE_PINNED)
    kernel_shortcuts: KernelReads = field(default_factory=lambda: KernelReads({}, {}, {}, {}))
    # the entries under scope ["helpers"]: BPF helpers that spare the programs work, each an enumerator of the
    # kernel's enum bpf_func_id, resolved one by one for both objects: a kernel without one does that work
    kernel_helpers: KernelReads = field(default_factory=lambda: KernelReads({}, {}, {}, {}))

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


_READ_ARITY = {"member": 4, "enum": 2, "bit": 3}


def _scope(scope: list[str], block: KernelReads, tasks: KernelReads, syscalls: dict[str, KernelReads],
           sources: dict[str, KernelReads], stamps: KernelReads, events: dict[str, KernelReads],
           shortcuts: KernelReads, helpers: KernelReads) -> KernelReads:
    """The reads a [[iotrace.kernel]] scope = [program, part, arch] puts its entries in."""
    if scope == ["block"]:
        return block
    if scope == ["block", "stamps"]:
        return stamps
    if scope == ["block", "shortcuts"]:
        return shortcuts
    if scope == ["helpers"]:
        return helpers
    if len(scope) == 2 and scope[0] == "block" and scope[1].isidentifier() and scope[1].islower():
        return events.setdefault(scope[1], KernelReads({}, {}, {}, {}))
    if scope == ["tasks"]:
        return tasks
    if scope[:2] == ["tasks", "syscalls"] and len(scope) <= 3 and all(s.isidentifier() for s in scope):
        return syscalls.setdefault(scope[2] if len(scope) == 3 else "", KernelReads({}, {}, {}, {}))
    if len(scope) == 2 and scope[0] == "tasks" and scope[1] in TASK_SOURCES:
        return sources.setdefault(scope[1], KernelReads({}, {}, {}, {}))
    raise ContractError(f"{CONTRACT_FILE}: unknown kernel scope {scope}")


def _add_read(reads: KernelReads, entry: list, scope: list[str]) -> None:
    kind, args = (entry[0], entry[1:]) if entry and isinstance(entry, list) else ("", [])
    if kind not in ("member", "enum", "head", "raw_tp", "bit") or len(args) < 2 \
            or (kind in _READ_ARITY and len(args) != _READ_ARITY[kind]) \
            or not all(isinstance(a, int if (kind == "member" and i == 3) else str) for i, a in enumerate(args)):
        raise ContractError(f"{CONTRACT_FILE}: kernel scope {scope}: bad read {entry!r}")
    name = args[0]
    if kind == "member" and name in reads.members:
        reads.older.setdefault(name, []).append((args[1], args[2], args[3]))
    elif kind == "member":
        reads.members[name] = (args[1], args[2], args[3])
    elif kind == "enum":
        reads.enums[name] = args[1]
    elif kind == "head":
        reads.heads[name] = (args[1], list(args[2:]))
    elif kind == "bit":
        reads.bits[name] = (args[1], args[2])
    else:
        reads.raw_tps.setdefault(name, []).append(list(args[1:]))


def _kernel(scopes: list) -> tuple[KernelReads, KernelReads, dict[str, KernelReads], dict[str, KernelReads],
                                   KernelReads, dict[str, KernelReads], KernelReads, KernelReads]:
    """(the block-layer programs' reads: ["block"]; the per-process programs': ["tasks"]; their
    raw-syscall variant's by architecture: ["tasks", "syscalls"[, arch]], "" for every one; their event
    sources' by source: ["tasks", reads|cache|fsync|throttled]; the kernel stamps' extra reads:
    ["block", "stamps"]; one block-layer program's own: ["block", <event>]; the block-layer programs' shortcuts:
    ["block", "shortcuts"]; the helpers that spare work: ["helpers"])."""
    block, tasks, stamps = KernelReads({}, {}, {}, {}), KernelReads({}, {}, {}, {}), KernelReads({}, {}, {}, {})
    shortcuts, helpers = KernelReads({}, {}, {}, {}), KernelReads({}, {}, {}, {})
    syscalls: dict[str, KernelReads] = {}
    sources: dict[str, KernelReads] = {}
    events: dict[str, KernelReads] = {}
    for entry in scopes:
        scope = entry.get("scope")
        if not isinstance(scope, list) or not all(isinstance(s, str) for s in scope) \
                or not isinstance(entry.get("reads"), list) or set(entry) != {"scope", "reads"}:
            raise ContractError(f"{CONTRACT_FILE}: a [[iotrace.kernel]] is scope = [...] and reads = [...]")
        reads = _scope(scope, block, tasks, syscalls, sources, stamps, events, shortcuts, helpers)
        for read in entry["reads"]:
            _add_read(reads, read, scope)
    if helpers.members or helpers.heads or helpers.raw_tps or helpers.bits:
        raise ContractError(f"{CONTRACT_FILE}: kernel scope [\"helpers\"] holds enumerators of enum bpf_func_id only")
    return block, tasks, syscalls, sources, stamps, events, shortcuts, helpers


@dataclass(frozen=True)
class Event:
    """One of contract.toml's events: a tracepoint the block-layer programs attach to."""

    name: str                   # block_rq_issue
    category: str               # its tracefs category: block, sched
    short: str                  # its skips are reported as "skipped_<short>"
    paths: tuple[str, ...]      # the attach paths with a program on it: raw_tp, tracepoint
    when: str                   # EVENT_WHEN: always, start (the first one present starts requests), bio, present,
                                # dirty (the first one present is a page dirtied)
    fields: tuple[str, ...]     # the tracepoint format fields the perf-event program reads


_EVENT_KEYS = {"name", "category", "short", "paths", "when", "fields"}


def _events(entries: list) -> tuple[Event, ...]:
    out = []
    for e in entries:
        if not isinstance(e, dict) or set(e) != _EVENT_KEYS or e["when"] not in EVENT_WHEN \
                or not all(isinstance(e[k], str) for k in ("name", "category", "short", "when")) \
                or not all(isinstance(e[k], list) for k in ("paths", "fields")):
            raise ContractError(f"{CONTRACT_FILE}: bad event {e!r}: each has {', '.join(sorted(_EVENT_KEYS))}, "
                                f"when one of {', '.join(EVENT_WHEN)}")
        out.append(Event(e["name"], e["category"], e["short"], tuple(e["paths"]), e["when"], tuple(e["fields"])))
    return tuple(out)


# ---- the contract of one part -------------------------------------------------------------------------

def _part(text: str, part: str) -> dict:
    try:
        doc = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ContractError(f"{CONTRACT_FILE}: {exc}") from None
    got = doc.get(part)
    if not isinstance(got, dict) or not isinstance(got.get("prefix"), str):
        raise ContractError(f"{CONTRACT_FILE}: no [{part}] with its prefix")
    unknown = set(got) - {"prefix", "constants", "enums", "kernel", "events"}
    if unknown:
        raise ContractError(f"{CONTRACT_FILE}: [{part}] has {', '.join(sorted(unknown))}, which nothing reads")
    return got


def parse(text: str, part: str = "iotrace") -> Contract:
    """The contract of one part ([iotrace] or [tasks]) of contract.toml's text."""
    doc = _part(text, part)
    prefix = doc["prefix"]
    constants = _constants(doc.get("constants", {}), prefix)
    defines = {prefix + c.name: c.value for c in constants}
    enums = {}
    for name, (members, count) in _enums(doc.get("enums", {}), prefix).items():
        enums["iotrace_" + name] = {**{prefix + m: i for i, (m, _) in enumerate(members)}, prefix + count: len(members)}
    block, tasks, syscalls, sources, stamps, event_reads, shortcuts, helpers = _kernel(doc.get("kernel", []))
    events = _events(doc.get("events", []))
    stray = set(event_reads) - {e.name for e in events}
    if stray:
        raise ContractError(f"{CONTRACT_FILE}: kernel scopes [\"block\", <event>] for events not in its "
                            f"events: {sorted(stray)}")
    overrides = {c.name: c.override for c in constants if c.override}
    return Contract(defines, enums, block, tasks, syscalls, sources, stamps, events, overrides, event_reads, shortcuts,
                    helpers)


def render_header(text: str, part: str) -> str:
    """The C definitions of one part of contract.toml's text: what `make contract` writes to its header."""
    doc = _part(text, part)
    prefix = doc["prefix"]
    guard = f"{prefix}DEFS_H" if part != "iotrace" else "IOTRACE_DEFS_H"
    out = ["/* SPDX-License-Identifier: GPL-2.0 */",
           f"/* Written by `make contract` from bpf/{CONTRACT_FILE} [{part}], where each value is explained:",
           " * edit that file, not this one (tests/unit/test_contract_syntax.py compares the two). */",
           f"#ifndef {guard}", f"#define {guard}", ""]
    for c in _constants(doc.get("constants", {}), prefix):
        line = f"#define {prefix}{c.name} {c.c_text}" + (f"\t/* {c.doc} */" if c.doc else "")
        out += [f"#ifndef {prefix}{c.name}", line, "#endif"] if c.override else [line]
    for name, (members, count) in _enums(doc.get("enums", {}), prefix).items():
        out += ["", f"enum iotrace_{name} {{"]
        out += [f"\t{prefix}{m} = {i}," + (f"\t/* {d} */" if d else "") for i, (m, d) in enumerate(members)]
        out += [f"\t{prefix}{count} = {len(members)},", "};"]
    return "\n".join([*out, "", f"#endif /* {guard} */", ""])


@lru_cache(maxsize=len(PARTS))
def load(part: str = "iotrace") -> Contract:
    """The contract of the installed BPF sources: one part of their contract.toml (a ContractError naming the
    file if it cannot be read or taken)."""
    path = bpf_dir() / CONTRACT_FILE
    try:
        text = path.read_text()
    except (OSError, UnicodeDecodeError) as exc:
        raise ContractError(f"cannot read {path}: {getattr(exc, 'strerror', None) or exc}") from None
    try:
        return parse(text, part)
    except ContractError as exc:
        raise ContractError(f"{path.parent}/{exc}") from None


def main(argv: list[str] | None = None) -> int:
    """`make contract`: write each part's header next to contract.toml (or, with --check, say which differ)."""
    args = sys.argv[1:] if argv is None else argv
    src = bpf_dir()
    text = (src / CONTRACT_FILE).read_text()
    stale = []
    for part in PARTS:
        path, want = src / header_file(part), render_header(text, part)
        if path.is_file() and path.read_text() == want:
            continue
        stale.append(path.name)
        if "--check" not in args:
            path.write_text(want)
    if stale and "--check" in args:
        print(f"contract: {', '.join(stale)} differ from {CONTRACT_FILE}: run `make contract`", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
