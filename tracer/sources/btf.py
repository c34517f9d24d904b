"""The kernel's BTF type information, read in pure Python: struct member
offsets and sizes, enum values and tracepoint prototypes, for the BPF
programs that bcc compiles without CO-RE.

This module owns the BTF format (Documentation/bpf/btf.rst): the header, the
type records and the string section of one self-contained blob such as
/sys/kernel/btf/vmlinux (split BTF of modules is not supported).  It knows
nothing of iotrace's probes: callers ask for, say, ``bio.bi_iter.bi_size``
and turn the answer into ``-D`` flags themselves.

Two layers:

* ``_RawBtf`` checks the header and makes one pass over the type section,
  keeping the section as an array of 32-bit words, each type's word offset,
  a name index for the kinds looked up by name and the list of enums.  No
  per-type Python objects are kept, and names are decoded only when asked for.
* ``Btf`` is the public, typed API on top: dotted member paths through
  anonymous structs and unions, sizes with typedefs and qualifiers resolved,
  enumerators, and function prototypes spelled as C.

Standard library only: this runs at every tracer start.
"""

from __future__ import annotations

import struct
import sys
from array import array
from dataclasses import dataclass

VMLINUX = "/sys/kernel/btf/vmlinux"
MAGIC = 0xEB9F
HEADER = struct.Struct("<HBBIIIII")  # magic, version, flags, hdr_len, type_off, type_len, str_off, str_len

# Kinds (btf.rst, 2.2).
INT, PTR, ARRAY, STRUCT, UNION, ENUM, FWD, TYPEDEF, VOLATILE, CONST, RESTRICT = range(1, 12)
FUNC, FUNC_PROTO, VAR, DATASEC, FLOAT, DECL_TAG, TYPE_TAG, ENUM64 = range(12, 20)

KIND_NAMES = {
    INT: "INT", PTR: "PTR", ARRAY: "ARRAY", STRUCT: "STRUCT", UNION: "UNION", ENUM: "ENUM", FWD: "FWD",
    TYPEDEF: "TYPEDEF", VOLATILE: "VOLATILE", CONST: "CONST", RESTRICT: "RESTRICT", FUNC: "FUNC",
    FUNC_PROTO: "FUNC_PROTO", VAR: "VAR", DATASEC: "DATASEC", FLOAT: "FLOAT", DECL_TAG: "DECL_TAG",
    TYPE_TAG: "TYPE_TAG", ENUM64: "ENUM64",
}

# Words that follow the 3-word common part of a type: FIXED[kind] + vlen * PER_VLEN[kind].
# -1 marks a kind this reader does not know (so it cannot know the record's length).
FIXED = [-1] * 32
PER_VLEN = [0] * 32
for _kind in KIND_NAMES:
    FIXED[_kind] = 0
FIXED[INT] = FIXED[VAR] = FIXED[DECL_TAG] = 1
FIXED[ARRAY] = 3
PER_VLEN[STRUCT] = PER_VLEN[UNION] = PER_VLEN[DATASEC] = PER_VLEN[ENUM64] = 3
PER_VLEN[ENUM] = PER_VLEN[FUNC_PROTO] = 2

# Kinds looked up by name; the pass indexes only these.
NAMED_KINDS = (INT, STRUCT, UNION, ENUM, FWD, TYPEDEF, ENUM64)
_INDEXED = [k in NAMED_KINDS for k in range(32)]
# Kinds that name another type without changing its layout.
TRANSPARENT = frozenset((TYPEDEF, VOLATILE, CONST, RESTRICT, TYPE_TAG))
QUALIFIERS = {CONST: "const", VOLATILE: "volatile", RESTRICT: "restrict"}
U32 = next(code for code in "IL" if array(code).itemsize == 4)  # array typecode of a 32-bit word
MAX_CHAIN = 64  # deeper type chains than this are taken as a loop in corrupt BTF


class BtfError(Exception):
    """BTF is missing or malformed, or lacks what was asked for; the message names which."""


@dataclass(frozen=True)
class Member:
    """Where a struct member lies, counted from the start of the outermost struct."""

    offset: int  # bytes (for a bitfield: the byte holding its first bit)
    size: int  # bytes of the member's type, typedefs and qualifiers resolved
    bit_offset: int  # bits
    bitfield_size: int  # bits; 0 when the member is not a bitfield


class _RawBtf:
    """The type section as 32-bit words, indexed by type id, and the string section."""

    def __init__(self, data: bytes):
        if len(data) < HEADER.size:
            raise BtfError(f"BTF data truncated: {len(data)} bytes, shorter than the {HEADER.size}-byte header")
        magic = int.from_bytes(data[:2], "little")
        if magic == MAGIC:
            order = "little"
        elif magic == 0x9FEB:
            order = "big"
        else:
            raise BtfError(f"not BTF data: bad magic bytes {data[:2].hex(' ')} (expected 9f eb, or eb 9f big-endian)")
        fmt = HEADER.format if order == "little" else ">" + HEADER.format[1:]
        _, version, _, hdr_len, type_off, type_len, str_off, str_len = struct.unpack_from(fmt, data)
        if version != 1:
            raise BtfError(f"unsupported BTF version {version} (only version 1 is known)")
        if hdr_len < HEADER.size:
            raise BtfError(f"bad BTF header: hdr_len {hdr_len} is shorter than {HEADER.size} bytes")
        for what, off, length in (("type", type_off, type_len), ("string", str_off, str_len)):
            end = hdr_len + off + length
            if end > len(data):
                raise BtfError(
                    f"BTF data truncated: the {what} section ends at byte {end} but the data has {len(data)} bytes"
                )
        if type_len % 4:
            raise BtfError(f"bad BTF header: type section length {type_len} is not a multiple of 4")
        words = array(U32)
        words.frombytes(data[hdr_len + type_off : hdr_len + type_off + type_len])
        if order != sys.byteorder:
            words.byteswap()
        self.words = words
        self.strs = data[hdr_len + str_off : hdr_len + str_off + str_len]
        self._str_cache: dict[int, str] = {}
        self._by_name: dict[str, list[int]] | None = None
        self._index()

    def _index(self) -> None:
        """One pass over the types: each one's word offset, names to look up, enums."""
        w = self.words
        n = len(w)
        offs = array(U32, [0])  # offs[id]; id 0 is void and has no record
        add = offs.append
        by_name_off: dict[int, list[int]] = {}
        enums: list[int] = []
        fixed, per_vlen, indexed = FIXED, PER_VLEN, _INDEXED
        pos = 0
        tid = 0
        while pos < n:
            tid += 1
            info = w[pos + 1]
            kind = (info >> 24) & 0x1F
            extra = fixed[kind]
            if extra < 0:
                raise BtfError(f"unknown BTF kind {kind} at type id {tid}")
            add(pos)
            if indexed[kind]:
                name_off = w[pos]
                if name_off:
                    ids = by_name_off.get(name_off)
                    if ids is None:
                        by_name_off[name_off] = [tid]
                    else:
                        ids.append(tid)
                if kind == ENUM or kind == ENUM64:
                    enums.append(tid)
            pos += 3 + extra + (info & 0xFFFF) * per_vlen[kind]
        if pos > n:
            raise BtfError(f"BTF data truncated: type id {tid} runs past the end of the type section")
        self.offs = offs
        self._by_name_off = by_name_off
        self.enums = enums

    # -- strings

    def string(self, off: int) -> str:
        s = self._str_cache.get(off)
        if s is None:
            strs = self.strs
            if off >= len(strs):
                raise BtfError(f"bad BTF: string offset {off} is past the string section ({len(strs)} bytes)")
            end = strs.find(b"\0", off)
            s = strs[off : end if end >= 0 else len(strs)].decode("utf-8", "replace")
            self._str_cache[off] = s
        return s

    def string_is(self, off: int, needle: bytes) -> bool:
        """Whether the string at off is needle (given NUL-terminated), without decoding it."""
        return self.strs.startswith(needle, off)

    def ids_named(self, name: str) -> list[int]:
        """Type ids of the kinds in NAMED_KINDS called name, in id order."""
        if self._by_name is None:
            by_name: dict[str, list[int]] = {}
            for off, ids in self._by_name_off.items():
                by_name.setdefault(self.string(off), []).extend(ids)
            for ids in by_name.values():
                ids.sort()
            self._by_name = by_name
            self._by_name_off = {}
            self._str_cache.clear()
        return self._by_name.get(name, [])

    # -- type records

    def _pos(self, tid: int) -> int:
        if not 0 < tid < len(self.offs):
            raise BtfError(f"bad BTF: type id {tid} does not exist (the last is {len(self.offs) - 1})")
        return self.offs[tid]

    def kind(self, tid: int) -> int:
        return 0 if tid == 0 else (self.words[self._pos(tid) + 1] >> 24) & 0x1F

    def kind_flag(self, tid: int) -> bool:
        return bool(self.words[self._pos(tid) + 1] >> 31)

    def vlen(self, tid: int) -> int:
        return self.words[self._pos(tid) + 1] & 0xFFFF

    def name(self, tid: int) -> str:
        return "" if tid == 0 else self.string(self.words[self._pos(tid)])

    def size_or_type(self, tid: int) -> int:
        return self.words[self._pos(tid) + 2]

    def extra(self, tid: int, i: int) -> int:
        """Word i after the common part (INT encoding, ARRAY fields, members...)."""
        return self.words[self._pos(tid) + 3 + i]

    def entries(self, tid: int, width: int) -> list[tuple[int, ...]]:
        """The vlen records of width words that follow the common part."""
        pos = self._pos(tid)
        w = self.words
        vlen = w[pos + 1] & 0xFFFF
        start = pos + 3
        return [tuple(w[start + i * width : start + (i + 1) * width]) for i in range(vlen)]


class Btf:
    """Struct layouts, enum values and function prototypes from one BTF blob."""

    def __init__(self, raw: _RawBtf):
        self._raw = raw
        self._ptr_size: int | None = None
        self._members: dict[tuple[str, str], Member] = {}

    @classmethod
    def load(cls, path: str = VMLINUX) -> Btf:
        """Read and index a BTF file; BtfError names the file and what is wrong with it."""
        try:
            with open(path, "rb") as f:
                data = f.read()
        except FileNotFoundError:
            raise BtfError(f"{path} does not exist (is the kernel built with CONFIG_DEBUG_INFO_BTF=y?)") from None
        except OSError as e:
            raise BtfError(f"cannot read {path}: {e.strerror}") from None
        try:
            return cls.parse(data)
        except BtfError as e:
            raise BtfError(f"{path}: {e}") from None

    @classmethod
    def parse(cls, data: bytes) -> Btf:
        """Index a BTF blob already in memory (either byte order, as its magic says)."""
        return cls(_RawBtf(bytes(data)))

    # -- public lookups

    def member(self, struct: str, path: str) -> Member:
        """The member at a dotted path ("bi_iter.bi_size") in struct or union `struct`.

        Members of anonymous struct and union members are found as if they were
        direct, as in C.  Offsets add up along the path.
        """
        key = (struct, path)
        found = self._members.get(key)
        if found is not None:
            return found
        raw = self._raw
        tid = self._struct_id(struct)
        bits = 0
        walked = struct
        parts = path.split(".")
        for i, part in enumerate(parts):
            if not part:
                raise BtfError(f"bad member path {path!r} for struct {struct}: empty component")
            if i:
                target = self._resolve(tid)
                if raw.kind(target) not in (STRUCT, UNION):
                    raise BtfError(
                        f"{walked} is {self._c_type(tid)}, not a struct or union, so it has no member {part!r}"
                    )
                tid = target
            hit = self._find(tid, part)
            if hit is None:
                where = f" (at {walked})" if i else ""
                raise BtfError(f"{self._c_type(tid)}{where} has no member {part!r}")
            bit_off, bitfield_size, tid = hit
            bits += bit_off
            walked += "." + part
        found = Member(bits // 8, self._size(tid, walked), bits, bitfield_size)
        self._members[key] = found
        return found

    def struct_size(self, struct: str) -> int:
        """sizeof(struct `struct`) (or of the union of that name), in bytes."""
        return self._raw.size_or_type(self._struct_id(struct))

    def enum_value(self, enum: str, name: str) -> int:
        """The value of enumerator `name` in the enum (ENUM or ENUM64) called `enum`."""
        raw = self._raw
        candidates = [t for t in raw.ids_named(enum) if raw.kind(t) in (ENUM, ENUM64)]
        if not candidates:
            raise BtfError(f"no enum named {enum!r} in BTF")
        complete = [t for t in candidates if raw.vlen(t)] or candidates
        tid = complete[0]
        needle = name.encode() + b"\0"
        for name_off, value in self._enumerators(tid):
            if raw.string_is(name_off, needle):
                return value
        raise BtfError(f"enum {enum} has no enumerator {name!r}")

    def enumerator(self, name: str) -> int:
        """The value of enumerator `name` in whichever enum, named or anonymous, holds it."""
        raw = self._raw
        needle = name.encode() + b"\0"
        found: dict[int, list[int]] = {}
        for tid in raw.enums:
            for name_off, value in self._enumerators(tid):
                if raw.string_is(name_off, needle):
                    found.setdefault(value, []).append(tid)
        if not found:
            raise BtfError(f"no enumerator named {name!r} in any enum")
        if len(found) > 1:
            where = ", ".join(f"{self._c_type(ids[0])} = {value}" for value, ids in found.items())
            raise BtfError(f"enumerator {name!r} is ambiguous: {where}")
        return next(iter(found))

    def func_proto(self, typedef: str) -> list[str]:
        """Parameter types, as C, of a typedef of a pointer to a function prototype.

        For "btf_trace_block_rq_complete": ["void *", "struct request *", "blk_status_t",
        "unsigned int"].  Typedef names are kept as written; "..." ends a variadic list.
        """
        raw = self._raw
        ids = [t for t in raw.ids_named(typedef) if raw.kind(t) == TYPEDEF]
        if not ids:
            raise BtfError(f"no typedef named {typedef!r} in BTF")
        ptr = self._resolve(raw.size_or_type(ids[0]))
        proto = self._resolve(raw.size_or_type(ptr)) if raw.kind(ptr) == PTR else 0
        if raw.kind(proto) != FUNC_PROTO:
            raise BtfError(
                f"typedef {typedef} is {self._c_type(raw.size_or_type(ids[0]))}, not a pointer to a function"
            )
        return self._params(proto)

    # -- helpers

    def _struct_id(self, name: str) -> int:
        raw = self._raw
        ids = raw.ids_named(name)
        candidates = [t for t in ids if raw.kind(t) in (STRUCT, UNION)]
        if not candidates:
            if any(raw.kind(t) == FWD for t in ids):
                raise BtfError(f"struct {name} is only declared, never defined, in BTF")
            raise BtfError(f"no struct or union named {name!r} in BTF")
        for tid in candidates:
            if raw.vlen(tid) or raw.size_or_type(tid):
                return tid
        return candidates[0]

    def _resolve(self, tid: int) -> int:
        """tid with typedefs, qualifiers and type tags stripped."""
        raw = self._raw
        for _ in range(MAX_CHAIN):
            if raw.kind(tid) not in TRANSPARENT:
                return tid
            tid = raw.size_or_type(tid)
        raise BtfError(f"bad BTF: type chain from type id {tid} is longer than {MAX_CHAIN} (a loop?)")

    def _find(self, tid: int, name: str, depth: int = 0) -> tuple[int, int, int] | None:
        """(bit offset, bitfield size, type id) of member `name` of struct/union tid, looking
        through anonymous members; None if it has none."""
        raw = self._raw
        if depth > MAX_CHAIN:
            raise BtfError(f"bad BTF: anonymous members nest deeper than {MAX_CHAIN} in type id {tid}")
        needle = name.encode() + b"\0"
        kflag = raw.kind_flag(tid)
        for name_off, mtype, off in raw.entries(tid, 3):
            if kflag:
                bit_off, bitfield_size = off & 0xFFFFFF, off >> 24
            else:
                bit_off, bitfield_size = off, 0
            if name_off:
                if not raw.string_is(name_off, needle):
                    continue
                if not kflag:  # old encoding: a bitfield is an INT whose bits or bit offset say so
                    base = self._resolve(mtype)
                    if raw.kind(base) == INT:
                        enc = raw.extra(base, 0)
                        nr_bits, int_off = enc & 0xFF, (enc >> 16) & 0xFF
                        if int_off or nr_bits != raw.size_or_type(base) * 8:
                            bit_off, bitfield_size = bit_off + int_off, nr_bits
                return bit_off, bitfield_size, mtype
            inner = self._resolve(mtype)
            if raw.kind(inner) in (STRUCT, UNION):
                hit = self._find(inner, name, depth + 1)
                if hit is not None:
                    return bit_off + hit[0], hit[1], hit[2]
        return None

    def _size(self, tid: int, what: str) -> int:
        raw = self._raw
        tid = self._resolve(tid)
        kind = raw.kind(tid)
        if kind in (INT, STRUCT, UNION, ENUM, ENUM64, FLOAT, DATASEC):
            return raw.size_or_type(tid)
        if kind == PTR:
            return self._pointer_size()
        if kind == ARRAY:
            return self._size(raw.extra(tid, 0), what) * raw.extra(tid, 2)
        raise BtfError(f"{what} is {self._c_type(tid)}, which has no size")

    def _pointer_size(self) -> int:
        """The size of long, which is the pointer size on Linux; 8 if BTF has no long."""
        if self._ptr_size is None:
            raw = self._raw
            self._ptr_size = 8
            for name in ("long int", "long unsigned int", "long", "unsigned long"):
                ints = [t for t in raw.ids_named(name) if raw.kind(t) == INT]
                if ints:
                    self._ptr_size = raw.size_or_type(ints[0])
                    break
        return self._ptr_size

    def _enumerators(self, tid: int) -> list[tuple[int, int]]:
        """(name offset, value) of each enumerator of ENUM or ENUM64 tid, signed if kind_flag says so."""
        raw = self._raw
        signed = raw.kind_flag(tid)
        if raw.kind(tid) == ENUM:
            if signed:
                return [(off, v - (1 << 32) if v >> 31 else v) for off, v in raw.entries(tid, 2)]
            return raw.entries(tid, 2)
        out = []
        for off, lo, hi in raw.entries(tid, 3):
            v = hi << 32 | lo
            out.append((off, v - (1 << 64) if signed and v >> 63 else v))
        return out

    def _params(self, proto: int) -> list[str]:
        out = []
        for name_off, ptype in self._raw.entries(proto, 2):
            out.append("..." if ptype == 0 and name_off == 0 else self._c_type(ptype))
        return out

    def _c_type(self, tid: int, depth: int = 0) -> str:
        """tid spelled roughly as C: "struct request *", "const char *", "char *const", "int[4]"."""
        if depth > MAX_CHAIN:
            raise BtfError(f"bad BTF: type chain through type id {tid} is longer than {MAX_CHAIN} (a loop?)")
        raw = self._raw
        kind = raw.kind(tid)
        if kind == 0:
            return "void"
        name = raw.name(tid)
        if kind in (INT, FLOAT, TYPEDEF):
            return name
        if kind in (STRUCT, UNION, ENUM, ENUM64, FWD):
            tag = {STRUCT: "struct", UNION: "union", ENUM: "enum", ENUM64: "enum"}.get(kind)
            if tag is None:  # FWD: kind_flag says union
                tag = "union" if raw.kind_flag(tid) else "struct"
            return f"{tag} {name or '(anon)'}"
        target = raw.size_or_type(tid)
        if kind == PTR:
            if raw.kind(self._resolve_tags(target)) == FUNC_PROTO:
                proto = self._resolve_tags(target)
                ret = self._c_type(raw.size_or_type(proto), depth + 1)
                return f"{ret} (*)({', '.join(self._params(proto)) or 'void'})"
            inner = self._c_type(target, depth + 1)
            return inner + ("*" if inner.endswith("*") else " *")
        if kind in QUALIFIERS:
            inner = self._c_type(target, depth + 1)
            if raw.kind(self._resolve_tags(target)) == PTR:
                return f"{inner}{QUALIFIERS[kind]}"
            return f"{QUALIFIERS[kind]} {inner}"
        if kind == TYPE_TAG:
            return self._c_type(target, depth + 1)
        if kind == ARRAY:
            return f"{self._c_type(raw.extra(tid, 0), depth + 1)}[{raw.extra(tid, 2)}]"
        if kind == FUNC_PROTO:
            ret = self._c_type(target, depth + 1)
            return f"{ret} ({', '.join(self._params(tid)) or 'void'})"
        return f"{KIND_NAMES.get(kind, kind)} {name or '(anon)'}"

    def _resolve_tags(self, tid: int) -> int:
        raw = self._raw
        for _ in range(MAX_CHAIN):
            if raw.kind(tid) != TYPE_TAG:
                return tid
            tid = raw.size_or_type(tid)
        raise BtfError(f"bad BTF: type tag chain from type id {tid} is longer than {MAX_CHAIN} (a loop?)")
