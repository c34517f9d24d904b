"""The kernel layout the raw-tracepoint programs read, from the running kernel's BTF.

Owns one step: turning bpf/contract.toml's [[iotrace.kernel]] (struct members,
enum values, one-read struct heads, raw tracepoints and their arguments, an
event's prototype per kernel era where its arguments moved) into the
compiler flags ``-DIOTRACE_K_<NAME>=<value>``, or a LayoutError that names
everything the running kernel lacks.  bcc compiles against whatever
header tree is installed and applies no CO-RE relocation, so these values
are the only kernel layout the programs may rely on.  Pure Python over
tracer.sources.btf: no bcc, no root (the BTF file is world-readable).
"""

from __future__ import annotations

import sys
from collections.abc import Iterable
from dataclasses import dataclass, replace

from tracer import contract
from tracer.sources.btf import Btf, BtfError

BTF_PATH = "/sys/kernel/btf/vmlinux"
# A head is read into the program's stack in one go: keep it small (5.10's request head, which reaches
# rq_disk and part, is 176 bytes; its stamped head, which no 5.10 run compiles, 200)
MAX_HEAD_BYTES = 208
# The request start: the first of these the kernel has (contract.toml's events, when "start":
# block_io_start from 6.5 on, else block_getrq), if its arguments fit
START_EVENTS = tuple(e.name for e in contract.load().events if e.when == "start")


class LayoutError(Exception):
    """The running kernel lacks something the raw-tracepoint programs read."""


@dataclass(frozen=True)
class Layout:
    values: dict[str, int]      # NAME -> byte offset, enum value or head length
    start_event: str            # one of START_EVENTS
    group_dead: bool            # sched_process_exit passes group_dead (its second argument)
    present: tuple[str, ...] = ()   # the optional raw tracepoints (present_events) this kernel has
    firsts: tuple[str, ...] = ()    # of each group of alternatives load() was given, the one taken


    @property
    def stamped(self) -> bool:
        """Whether the kernel stamps' reads (scope ["block", "stamps"]) are resolved in: --stamps kernel."""
        return "RQ_STAMPED_HEAD_LEN" in self.values

    def cflags(self) -> list[str]:
        return [f"-DIOTRACE_K_{name}={value}" for name, value in sorted(self.values.items())]


def _which(proto: list[str] | None, wants: list[list[str]]) -> list[str] | None:
    """The first of an event's prototypes (contract.toml's raw_tp reads of it) that the kernel's `proto` begins with."""
    # proto[0] is the tracepoint's private data pointer, which ctx->args[] does not hold
    return next((want for want in wants if proto and proto[1:1 + len(want)] == want), None)


def _spelled(wants: list[list[str]]) -> str:
    return " or ".join(f"({', '.join(want)})" for want in wants)


def _member_offset(btf: Btf, struct: str, path: str, size: int) -> int | str:
    """The byte offset of `struct`'s member `path`, read as `size` bytes; or why this kernel has it not so."""
    try:
        m = btf.member(struct, path)
    except BtfError as exc:
        return str(exc)
    if m.bitfield_size or m.size != size:
        return (f"struct {struct} member {path} is {m.size} bytes"
                f"{' (a bitfield)' if m.bitfield_size else ''}; iotrace reads {size}")
    return m.offset


def _last_flag(event: str, wants: list[list[str]], want: list[str]) -> dict[str, int]:
    """For an event with more than one prototype: <EVENT>_LAST, the ctx->args[] index of the last argument
    the matching one lists (the argument that moved between kernels, which such an entry exists to read)."""
    return {f"{event.upper()}_LAST": len(want) - 1} if len(wants) > 1 else {}


def resolve(btf: Btf, reads: contract.KernelReads, events: Iterable[str],
            start_events: tuple[str, ...] = START_EVENTS) -> Layout:
    """Every value of `reads`, and the raw tracepoints `events` (START_EVENTS[0] stands for the start;
    no start is looked for when `start_events` is empty, as for the per-process syscall programs).

    Collects every problem before raising, so one run names them all.
    """
    values: dict[str, int] = {}
    missing: list[str] = []
    taken: dict[str, tuple[str, str, int]] = {}     # NAME -> the form of it this kernel has
    for name, newest in reads.members.items():
        forms = [newest, *reads.older.get(name, ())]
        problems: list[str] = []
        for era, (struct, path, size) in enumerate(forms):
            got = _member_offset(btf, struct, path, size)
            if isinstance(got, str):
                problems.append(got)
                continue
            values[name] = got
            taken[name] = forms[era]
            if len(forms) > 1:
                values[f"{name}_ERA"] = era
            break
        else:
            missing.append(problems[0] if len(problems) == 1 else f"{name}: {' nor '.join(problems)}")
    for name, enumerator in reads.enums.items():
        try:
            values[name] = btf.enumerator(enumerator)
        except BtfError as exc:
            missing.append(str(exc))
    for name, (struct, members) in reads.heads.items():
        # a member listed whose form on this kernel is another struct's (an older era's) is not in the head
        members = [m for m in members if m not in taken or taken[m][0] == struct]
        if all(m in values for m in members):
            values[name] = max(values[m] + taken[m][2] for m in members)
            if values[name] > MAX_HEAD_BYTES:
                missing.append(f"struct {struct}: the members {', '.join(members)} end {values[name]} bytes "
                               f"in, beyond the {MAX_HEAD_BYTES} read in one go")
    if {"DISK_MAJOR", "DISK_FIRST_MINOR"} <= values.keys() and values["DISK_FIRST_MINOR"] != values["DISK_MAJOR"] + 4:
        missing.append("struct gendisk: first_minor does not follow major (they are read together)")

    def proto(event: str) -> list[str] | None:
        try:
            return btf.func_proto(f"btf_trace_{event}")
        except BtfError:
            return None

    start = next((ev for ev in start_events if _which(proto(ev), reads.raw_tps[ev])), None)
    if start is None and start_events:
        missing.append(f"raw tracepoint {' or '.join(start_events)} with the arguments iotrace reads "
                       f"({'; '.join(f'{ev}: ' + _spelled(reads.raw_tps[ev]) for ev in start_events)})")
    elif start is not None:
        values.update(_last_flag(start, reads.raw_tps[start], _which(proto(start), reads.raw_tps[start]) or []))
    group_dead = False
    for event in events:
        if event in START_EVENTS:
            continue
        p, wants = proto(event), reads.raw_tps[event]
        want = _which(p, wants)
        if p is None:
            missing.append(f"raw tracepoint {event}")
        elif want is None:
            missing.append(f"raw tracepoint {event} takes ({', '.join(p[1:])}), not {_spelled(wants)}")
        else:
            values.update(_last_flag(event, wants, want))
            if event == "sched_process_exit":
                group_dead = p[2:3] == ["bool"]
    if missing:
        raise LayoutError("; ".join(missing))
    return Layout(values, start or "", group_dead)


def resolve_bits(btf: Btf, reads: contract.KernelReads) -> dict[str, int]:
    """The KBIT entries: NAME -> the byte holding the bit, NAME_MASK -> its mask in that byte.

    Only the per-process table has them (load() resolves them with the rest),
    so a kernel without one costs the block-layer programs nothing.
    Little-endian only (BTF counts bit offsets in memory order there).
    """
    values: dict[str, int] = {}
    missing: list[str] = []
    for name, (struct, path) in reads.bits.items():
        try:
            m = btf.member(struct, path)
        except BtfError as exc:
            missing.append(str(exc))
            continue
        if m.bitfield_size != 1 or sys.byteorder != "little":
            missing.append(f"struct {struct} member {path} is not a one-bit field on a little-endian machine")
            continue
        values[name] = m.bit_offset // 8
        values[name + "_MASK"] = 1 << (m.bit_offset % 8)
    if missing:
        raise LayoutError("; ".join(missing))
    return values


def present_events(btf: Btf, reads: contract.KernelReads, events: Iterable[str]) -> tuple[str, ...]:
    """Those of the optional raw tracepoints `events` (the event table's "present" ones) this kernel has with
    the arguments the programs read: the programs for the others are left out, not an error."""
    out = []
    for event in events:
        try:
            p = btf.func_proto(f"btf_trace_{event}")
        except BtfError:
            continue
        if _which(p, reads.raw_tps[event]):
            out.append(event)
    return tuple(out)


def load_stamps(path: str = BTF_PATH, btf: Btf | None = None) -> dict[str, int]:
    """The values the kernel stamps read (scope ["block", "stamps"], with the block members its head spans), or a
    LayoutError naming what this kernel lacks (on 6.1 the enumerator __RQF_STATS: RQF_* were #defines)."""
    c = contract.load()
    reads = c.kernel_stamps.merged(contract.KernelReads(c.kernel.members, {}, {}, {}, older=c.kernel.older))
    return resolve(open_btf(path) if btf is None else btf, reads, (), start_events=()).values


def load_shortcuts(path: str = BTF_PATH, btf: Btf | None = None, strict: bool = False) -> dict[str, int]:
    """The values of the reads that only let the block-layer programs skip work (scope ["block", "shortcuts"]):
    all or, where this kernel lacks one, none (the programs then do that work); `strict`: a LayoutError
    naming what it lacks instead."""
    c = contract.load()
    own = c.kernel_shortcuts
    # with the block members its heads span (bio.bi_io_vec), said by the block table
    spanned = {m: c.kernel.members[m] for _, members in own.heads.values() for m in members if m in c.kernel.members}
    reads = own.merged(contract.KernelReads(spanned, {}, {}, {}, older=c.kernel.older))
    try:
        values = resolve(open_btf(path) if btf is None else btf, reads, (), start_events=()).values
        return {name: value for name, value in values.items() if name in {*own.members, *own.enums, *own.heads}}
    except LayoutError:
        if strict:
            raise
        return {}


def load_helpers(btf: Btf) -> dict[str, int]:
    """The helpers of scope ["helpers"] this kernel has, each by its number in enum bpf_func_id (a program uses
    one only where it is defined, IOTRACE_K_<NAME>, and does the work without it elsewhere)."""
    out = {}
    for name, enumerator in contract.load().kernel_helpers.enums.items():
        try:
            out[name] = btf.enumerator(enumerator)
        except BtfError:
            continue
    return out


def open_btf(path: str = BTF_PATH) -> Btf:
    """The running kernel's BTF, or a LayoutError saying why not."""
    try:
        return Btf.load(path)
    except BtfError as exc:
        raise LayoutError(str(exc)) from None


def _with_scopes(reads: contract.KernelReads, own: dict[str, contract.KernelReads],
                 events: Iterable[str]) -> contract.KernelReads:
    """`reads` and the reads of those of `events` that have their own (scope ["block", <event>])."""
    for event in events:
        if event in own:
            reads = reads.merged(own[event])
    return reads


def load(events: Iterable[str], path: str = BTF_PATH, reads: contract.KernelReads | None = None,
         btf: Btf | None = None, start_events: tuple[str, ...] = START_EVENTS,
         optional: Iterable[str] = (), firsts: tuple[tuple[str, ...], ...] = ()) -> Layout:
    """The layout of the running kernel for the raw tracepoints `events` and the table `reads` (the
    block-layer programs' by default), one-bit fields included; LayoutError if it cannot be had.
    `btf`: one already read (else the file at `path` is); `optional`: raw tracepoints looked for too,
    those present in Layout.present; `firsts`: groups of alternative raw tracepoints, newest first, of
    which the first this kernel has is taken with `events` (Layout.firsts; the newest, named missing,
    where it has none)."""
    c = contract.load()
    own = {} if reads is not None else c.kernel_events     # scope ["block", <event>]: the default table's
    shortcuts = reads is None       # scope ["block", "shortcuts"]: the default table's, resolved in below
    reads = c.kernel if reads is None else reads
    btf = open_btf(path) if btf is None else btf
    taken = tuple((present_events(btf, reads, group) or group)[0] for group in firsts)
    events = (*events, *taken)
    layout = replace(resolve(btf, _with_scopes(reads, own, events), events, start_events), firsts=taken)
    if optional:
        values, present = dict(layout.values), []
        for event in present_events(btf, reads, optional):
            if event in own:     # its own reads alone (the table's are resolved above); lacking them, left out
                try:
                    values.update(resolve(btf, own[event], (), start_events=()).values)
                except LayoutError:
                    continue
            present.append(event)
        layout = replace(layout, values=values, present=tuple(present))
    if reads.bits:
        layout = replace(layout, values={**layout.values, **resolve_bits(btf, reads)})
    if shortcuts:
        layout = replace(layout, values={**layout.values, **load_shortcuts(btf=btf), **load_helpers(btf)})
    return layout
