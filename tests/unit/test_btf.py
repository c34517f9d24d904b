"""tracer.sources.btf: synthetic BTF blobs written here, and the running kernel's BTF
cross-checked against bpftool.  No root needed."""

from __future__ import annotations

import os
import re
import shutil
import struct
import subprocess
from pathlib import Path

import pytest

from tracer import contract
from tracer.sources import kernel, tasks
from tracer.sources.btf import Btf, BtfError, Member

# -- a small BTF writer


class Writer:
    """Builds a BTF blob type by type; each add method returns the new type's id."""

    def __init__(self):
        self.strings = bytearray(b"\0")
        self.offsets = {"": 0}
        self.types: list[list[int]] = []

    def s(self, name: str) -> int:
        if name not in self.offsets:
            self.offsets[name] = len(self.strings)
            self.strings += name.encode() + b"\0"
        return self.offsets[name]

    def add(self, name, kind, size_or_type, extra=(), vlen=0, kflag=False) -> int:
        info = (int(kflag) << 31) | (kind << 24) | vlen
        self.types.append([self.s(name), info, size_or_type, *extra])
        return len(self.types)

    def int_(self, name, size, signed=False, bits=None, bit_offset=0):
        enc = (1 if signed else 0) << 24 | bit_offset << 16 | (size * 8 if bits is None else bits)
        return self.add(name, 1, size, [enc])

    def ptr(self, t):
        return self.add("", 2, t)

    def array(self, elem, index, n):
        return self.add("", 3, 0, [elem, index, n])

    def struct(self, name, size, members, union=False, kflag=False):
        """members: (name, type, bit offset, bitfield size)."""
        extra = []
        for mname, mtype, bit_off, bits in members:
            assert kflag or not bits, "bitfield sizes need kind_flag"
            extra += [self.s(mname), mtype, bits << 24 | bit_off if kflag else bit_off]
        return self.add(name, 5 if union else 4, size, extra, len(members), kflag)

    def enum(self, name, values, signed=False):
        extra = []
        for vname, v in values:
            extra += [self.s(vname), v & 0xFFFFFFFF]
        return self.add(name, 6, 4, extra, len(values), signed)

    def enum64(self, name, values, signed=False):
        extra = []
        for vname, v in values:
            v &= (1 << 64) - 1
            extra += [self.s(vname), v & 0xFFFFFFFF, v >> 32]
        return self.add(name, 19, 8, extra, len(values), signed)

    def fwd(self, name, union=False):
        return self.add(name, 7, 0, kflag=union)

    def typedef(self, name, t):
        return self.add(name, 8, t)

    def volatile(self, t):
        return self.add("", 9, t)

    def const(self, t):
        return self.add("", 10, t)

    def func_proto(self, ret, params):
        extra = []
        for pname, ptype in params:
            extra += [self.s(pname), ptype]
        return self.add("", 13, ret, extra, len(params))

    def func(self, name, proto):
        return self.add(name, 12, proto)

    def blob(self, order="<", magic=0xEB9F, version=1) -> bytes:
        types = b"".join(struct.pack(f"{order}{len(t)}I", *t) for t in self.types)
        strs = bytes(self.strings)
        header = struct.pack(f"{order}HBBIIIII", magic, version, 0, 24, 0, len(types), len(types), len(strs))
        return header + types + strs


def sample() -> Writer:
    w = Writer()
    int_ = w.int_("int", 4, signed=True)
    uint = w.int_("unsigned int", 4)
    ulong = w.int_("long unsigned int", 8)
    char = w.int_("char", 1, signed=True)
    uchar = w.int_("unsigned char", 1)
    # typedef chain: dev_t -> u32 -> __u32 -> unsigned int
    u32 = w.typedef("u32", w.typedef("__u32", uint))
    dev_t = w.typedef("dev_t", u32)
    const_dev = w.const(dev_t)
    blk_status = w.typedef("blk_status_t", w.typedef("u8", uchar))
    # "request" is declared before it is defined, and "bio" once empty before its real definition
    w.fwd("request")
    w.struct("bio", 0, [])
    req_fwd_queue = w.ptr(w.fwd("request_queue"))
    bvec_iter = w.struct(
        "bvec_iter", 16, [("bi_sector", ulong, 0, 0), ("bi_size", u32, 64, 0), ("bi_idx", uint, 96, 0)]
    )
    inner = w.struct("", 24, [("tag", int_, 0, 0), ("iter", bvec_iter, 64, 0)])
    anon_union = w.struct("", 24, [("", inner, 0, 0), ("raw", ulong, 0, 0)], union=True)
    name_arr = w.array(char, int_, 16)
    request = w.struct(
        "request",
        72,
        [
            ("q", req_fwd_queue, 0, 0),
            ("cmd_flags", const_dev, 64, 0),
            ("state", uint, 96, 3),  # bitfield: bits 96..98
            ("rq_flags", w.volatile(uint), 99, 5),  # bitfield through a qualifier, bits 99..103
            ("", anon_union, 128, 0),
            ("name", name_arr, 320, 0),
            ("__data_len", dev_t, 448, 0),
        ],
        kflag=True,
    )
    w.struct("bio", 24, [("bi_opf", uint, 0, 0), ("bi_iter", bvec_iter, 64, 0)])
    # a union and an old-style bitfield: no kind_flag, the bits are in the INT's encoding
    w.struct("oldbits", 4, [("lo", w.int_("unsigned int", 4, bits=3), 0, 0), ("hi", uint, 3, 0)])
    w.struct("numbers", 8, [("i", int_, 0, 0), ("l", ulong, 0, 0)], union=True)
    w.enum("req_op", [("REQ_OP_READ", 0), ("REQ_OP_WRITE", 1), ("REQ_OP_ZONE_RESET", 0x11)])
    w.enum("signed_enum", [("NEGATIVE", -5), ("SHARED", 3), ("CLASH", 1)], signed=True)
    w.enum("", [("ANON_A", 7), ("SHARED", 3), ("CLASH", 2), ("ANON_MAX", 0xFFFFFFFF)])
    w.enum64("big", [("BIG_LO", 1), ("BIG_HI", 0xFFFFF << 32)])
    w.enum64("", [("BIG_NEG", -1)], signed=True)
    # btf_trace_block_rq_complete: typedef -> PTR -> FUNC_PROTO
    proto = w.func_proto(
        0,
        [("", w.ptr(0)), ("", w.ptr(request)), ("", blk_status), ("", uint), ("", w.ptr(w.const(char)))],
    )
    w.typedef("btf_trace_block_rq_complete", w.ptr(proto))
    w.func("block_rq_complete", proto)
    # more spellings: variadic, pointer to pointer, const pointer, pointer to a function, array, anonymous struct
    fnptr = w.ptr(w.func_proto(int_, [("x", int_)]))
    odd = w.func_proto(
        int_,
        [("", w.ptr(w.ptr(char))), ("", w.const(w.ptr(char))), ("", fnptr), ("", w.ptr(inner)), ("", 0)],
    )
    w.typedef("odd_fn", w.ptr(odd))
    w.typedef("not_a_fn", w.ptr(int_))
    return w


MEMBERS = [
    # (struct, path, offset, size, bit_offset, bitfield_size)
    ("request", "q", 0, 8, 0, 0),  # pointer to a FWD: pointer size, from "long unsigned int"
    ("request", "cmd_flags", 8, 4, 64, 0),  # const + three typedefs
    ("request", "state", 12, 4, 96, 3),
    ("request", "rq_flags", 12, 4, 99, 5),
    ("request", "tag", 16, 4, 128, 0),  # through the anonymous union and struct
    ("request", "raw", 16, 8, 128, 0),
    ("request", "iter", 24, 16, 192, 0),
    ("request", "iter.bi_size", 32, 4, 256, 0),  # offsets add up
    ("request", "iter.bi_idx", 36, 4, 288, 0),
    ("request", "name", 40, 16, 320, 0),  # char[16]
    ("request", "__data_len", 56, 4, 448, 0),
    ("bio", "bi_opf", 0, 4, 0, 0),  # the complete bio, not the empty one before it
    ("bio", "bi_iter.bi_size", 16, 4, 128, 0),
    ("bvec_iter", "bi_sector", 0, 8, 0, 0),
    ("oldbits", "lo", 0, 4, 0, 3),
    ("oldbits", "hi", 0, 4, 3, 0),
    ("numbers", "l", 0, 8, 0, 0),  # unions are looked up like structs
]

ENUM_VALUES = [
    ("req_op", "REQ_OP_READ", 0),
    ("req_op", "REQ_OP_WRITE", 1),
    ("req_op", "REQ_OP_ZONE_RESET", 0x11),
    ("signed_enum", "NEGATIVE", -5),
    ("big", "BIG_LO", 1),
    ("big", "BIG_HI", 0xFFFFF << 32),
]

ENUMERATORS = [
    ("REQ_OP_WRITE", 1),
    ("ANON_A", 7),  # anonymous enum
    ("ANON_MAX", 0xFFFFFFFF),  # unsigned enum
    ("SHARED", 3),  # in two enums with one value
    ("NEGATIVE", -5),
    ("BIG_HI", 0xFFFFF << 32),
    ("BIG_NEG", -1),  # signed ENUM64
]

PROTOS = [
    ("btf_trace_block_rq_complete", ["void *", "struct request *", "blk_status_t", "unsigned int", "const char *"]),
    ("odd_fn", ["char **", "char *const", "int (*)(int)", "struct (anon) *", "..."]),
]

STRUCT_SIZES = [("request", 72), ("bio", 24), ("bvec_iter", 16), ("numbers", 8)]


@pytest.fixture(scope="module", params=["<", ">"], ids=["little-endian", "big-endian"])
def btf(request) -> Btf:
    return Btf.parse(sample().blob(order=request.param))


@pytest.mark.parametrize(("struct_name", "path", "offset", "size", "bit_offset", "bitfield_size"), MEMBERS)
def test_member(btf, struct_name, path, offset, size, bit_offset, bitfield_size):
    assert btf.member(struct_name, path) == Member(offset, size, bit_offset, bitfield_size)


@pytest.mark.parametrize(("struct_name", "size"), STRUCT_SIZES)
def test_struct_size(btf, struct_name, size):
    assert btf.struct_size(struct_name) == size


@pytest.mark.parametrize(("enum", "name", "value"), ENUM_VALUES)
def test_enum_value(btf, enum, name, value):
    assert btf.enum_value(enum, name) == value


@pytest.mark.parametrize(("name", "value"), ENUMERATORS)
def test_enumerator(btf, name, value):
    assert btf.enumerator(name) == value


@pytest.mark.parametrize(("typedef", "params"), PROTOS)
def test_func_proto(btf, typedef, params):
    assert btf.func_proto(typedef) == params


ERRORS = [
    (lambda b: b.member("nosuch", "x"), "no struct or union named 'nosuch'"),
    (lambda b: b.struct_size("request_queue"), "struct request_queue is only declared"),
    (lambda b: b.member("request", "cmd_flagz"), "struct request has no member 'cmd_flagz'"),
    (lambda b: b.member("request", "iter.bi_nope"), r"struct bvec_iter \(at request.iter\) has no member 'bi_nope'"),
    (lambda b: b.member("request", "q.x"), r"request.q is struct request_queue \*, not a struct or union"),
    (lambda b: b.member("request", "iter..bi_size"), "empty component"),
    (lambda b: b.enum_value("nosuch_enum", "A"), "no enum named 'nosuch_enum'"),
    (lambda b: b.enum_value("req_op", "REQ_OP_NOPE"), "enum req_op has no enumerator 'REQ_OP_NOPE'"),
    (lambda b: b.enumerator("NO_SUCH_ENUMERATOR"), "no enumerator named 'NO_SUCH_ENUMERATOR'"),
    (lambda b: b.enumerator("CLASH"), "enumerator 'CLASH' is ambiguous: enum signed_enum = 1, enum \\(anon\\) = 2"),
    (lambda b: b.func_proto("nosuch_t"), "no typedef named 'nosuch_t'"),
    (lambda b: b.func_proto("not_a_fn"), r"typedef not_a_fn is int \*, not a pointer to a function"),
]


@pytest.mark.parametrize(("call", "message"), ERRORS)
def test_lookup_errors(btf, call, message):
    with pytest.raises(BtfError, match=message):
        call(btf)


def test_bad_magic():
    blob = bytearray(sample().blob())
    blob[0:2] = b"\x12\x34"
    with pytest.raises(BtfError, match="bad magic bytes 12 34"):
        Btf.parse(bytes(blob))


def test_bad_version():
    with pytest.raises(BtfError, match="unsupported BTF version 2"):
        Btf.parse(sample().blob(version=2))


@pytest.mark.parametrize(
    ("cut", "message"),
    [
        (10, "shorter than the 24-byte header"),
        (-1, "the string section ends at byte"),
    ],
)
def test_truncated(cut, message):
    with pytest.raises(BtfError, match=f"BTF data truncated: .*{message}"):
        Btf.parse(sample().blob()[:cut])


def test_truncated_type_record():
    """A header claiming a type section that stops inside a record."""
    w = sample()
    blob = bytearray(w.blob())
    type_len = struct.unpack_from("<I", blob, 12)[0]
    struct.pack_into("<III", blob, 12, type_len - 4, type_len - 4, len(blob) - 24 - (type_len - 4))
    with pytest.raises(BtfError, match=f"type id {len(w.types)} runs past the end of the type section"):
        Btf.parse(bytes(blob))


def test_unknown_kind():
    w = Writer()
    w.int_("int", 4)
    w.add("mystery", 25, 0)
    with pytest.raises(BtfError, match="unknown BTF kind 25 at type id 2"):
        Btf.parse(w.blob())


def test_load(tmp_path):
    path = tmp_path / "vmlinux"
    path.write_bytes(sample().blob())
    assert Btf.load(str(path)).member("request", "iter.bi_size").offset == 32
    with pytest.raises(BtfError, match=f"{tmp_path / 'absent'} does not exist"):
        Btf.load(str(tmp_path / "absent"))
    path.write_bytes(b"\0" * 64)
    with pytest.raises(BtfError, match=f"{path}: not BTF data: bad magic"):
        Btf.load(str(path))


# -- the running kernel, cross-checked with bpftool

VMLINUX = Path("/sys/kernel/btf/vmlinux")
KERNEL_MEMBERS = [
    ("request", "q"),
    ("request", "cmd_flags"),
    ("request", "__data_len"),
    ("request", "__sector"),
    ("request", "part"),
    ("request_queue", "disk", "request", "rq_disk"),   # a request's disk; 5.10's (contract.toml: RQ_DISK's forms)
    ("gendisk", "major"),
    ("gendisk", "first_minor"),
    ("bio", "bi_bdev", "bio", "bi_disk"),               # 5.10's bio names its disk
    ("bio", "bi_opf"),
    ("bio", "bi_iter.bi_size"),
    ("block_device", "bd_dev"),
    ("task_struct", "pid"),
    ("task_struct", "tgid"),
]
KERNEL_ENUMS = [
    ("req_op", "REQ_OP_READ"),
    ("req_op", "REQ_OP_WRITE"),
    ("req_op", "REQ_OP_FLUSH"),
    ("req_op", "REQ_OP_DISCARD"),
    ("req_op", "REQ_OP_SECURE_ERASE"),
    ("req_op", "REQ_OP_WRITE_ZEROES"),
    ("req_flag_bits", "__REQ_PREFLUSH"),
]
# enums by another name on older kernels (5.10: enum req_opf)
ENUM_OLDER_NAMES = {"req_op": "req_opf"}


def kernel_form(btf: Btf, entry: tuple[str, ...]) -> tuple[str, str]:
    """Of a KERNEL_MEMBERS entry's forms (struct, member pairs, newest first), the first this kernel has."""
    forms = list(zip(entry[::2], entry[1::2], strict=True))
    for struct_name, path in forms:
        try:
            btf.member(struct_name, path)
        except BtfError:
            continue
        return struct_name, path
    pytest.fail(f"this kernel has none of {forms}")


def _vmlinux_unreadable() -> bool:
    return not os.access(VMLINUX, os.R_OK)


needs_vmlinux = pytest.mark.skipif(_vmlinux_unreadable(), reason=f"{VMLINUX} is not readable")


@pytest.fixture(scope="module")
def kernel_btf() -> Btf:
    return Btf.load()


class RawDump:
    """bpftool's `format raw` text: [id] KIND 'name' key=value..., then a tab-indented line per member."""

    HEAD = re.compile(r"\[(\d+)\] (\w+) '([^']*)'(.*)")
    ENTRY = re.compile(r"\t'([^']*)'(.*)")
    ATTR = re.compile(r"(\w+)=(\S+)")

    def __init__(self, text: str):
        self.types: dict[int, tuple[str, str, dict[str, str], list[tuple[str, dict[str, str]]]]] = {}
        self.by_name: dict[str, list[int]] = {}
        current = None
        for line in text.splitlines():
            if m := self.HEAD.match(line):
                tid, kind, name = int(m[1]), m[2], m[3]
                current = []
                self.types[tid] = (kind, name, dict(self.ATTR.findall(m[4])), current)
                self.by_name.setdefault(name, []).append(tid)
            elif (m := self.ENTRY.match(line)) and current is not None:
                current.append((m[1], dict(self.ATTR.findall(m[2]))))

    def named(self, name: str, kinds: tuple[str, ...]) -> int:
        ids = [t for t in self.by_name[name] if self.types[t][0] in kinds]
        return next((t for t in ids if self.types[t][3] or int(self.types[t][2].get("size", 0))), ids[0])

    def strip(self, tid: int) -> int:
        while self.types[tid][0] in ("TYPEDEF", "CONST", "VOLATILE", "RESTRICT", "TYPE_TAG"):
            tid = int(self.types[tid][2]["type_id"])
        return tid

    def size(self, tid: int) -> int:
        kind, _, attrs, _ = self.types[self.strip(tid)]
        if kind == "PTR":
            return int(self.types[self.named("long int", ("INT",))][2]["size"])
        if kind == "ARRAY":
            return self.size(int(attrs["type_id"])) * int(attrs["nr_elems"])
        return int(attrs["size"])

    def find(self, tid: int, name: str) -> tuple[int, int, int] | None:
        """(bit offset, bitfield size, type id) of member name, through anonymous members."""
        for mname, attrs in self.types[tid][3]:
            bits = int(attrs["bits_offset"])
            if mname == name:
                return bits, int(attrs.get("bitfield_size", 0)), int(attrs["type_id"])
            inner = self.strip(int(attrs["type_id"]))
            if mname == "(anon)" and self.types[inner][0] in ("STRUCT", "UNION"):
                hit = self.find(inner, name)
                if hit:
                    return bits + hit[0], hit[1], hit[2]
        return None

    def member(self, struct_name: str, path: str) -> Member:
        tid = self.named(struct_name, ("STRUCT", "UNION"))
        total = 0
        for part in path.split("."):
            hit = self.find(self.strip(tid), part)
            assert hit is not None, f"bpftool shows no {part!r} in {struct_name}.{path}"
            total += hit[0]
            bitfield, tid = hit[1], hit[2]
        return Member(total // 8, self.size(tid), total, bitfield)

    def enum_value(self, enum: str, name: str) -> int:
        for ename, attrs in self.types[self.named(enum, ("ENUM", "ENUM64"))][3]:
            if ename == name:
                return int(re.sub(r"U?LL$", "", attrs["val"]))
        raise AssertionError(f"bpftool shows no {name} in enum {enum}")


@pytest.fixture(scope="module")
def bpftool_dump() -> RawDump:
    bpftool = shutil.which("bpftool", path=os.environ.get("PATH", "") + ":/usr/sbin:/sbin")
    if bpftool is None:
        pytest.skip("bpftool is not installed")
    out = subprocess.run(
        [bpftool, "btf", "dump", "file", str(VMLINUX), "format", "raw"], capture_output=True, text=True, check=True
    )
    return RawDump(out.stdout)


@needs_vmlinux
@pytest.mark.parametrize("entry", KERNEL_MEMBERS, ids=lambda e: "-".join(e[:2]))
def test_kernel_member(kernel_btf, bpftool_dump, entry):
    struct_name, path = kernel_form(kernel_btf, entry)
    assert kernel_btf.member(struct_name, path) == bpftool_dump.member(struct_name, path)


@needs_vmlinux
@pytest.mark.parametrize(("enum", "name"), KERNEL_ENUMS)
def test_kernel_enum(kernel_btf, bpftool_dump, enum, name):
    try:
        kernel_btf.enum_value(enum, name)
    except (BtfError, KeyError):
        enum = ENUM_OLDER_NAMES.get(enum, enum)
    expected = bpftool_dump.enum_value(enum, name)
    assert kernel_btf.enum_value(enum, name) == expected
    assert kernel_btf.enumerator(name) == expected


@needs_vmlinux
def test_kernel_struct_sizes(kernel_btf, bpftool_dump):
    for name in sorted({kernel_form(kernel_btf, e)[0] for e in KERNEL_MEMBERS}):
        assert kernel_btf.struct_size(name) == int(bpftool_dump.types[bpftool_dump.named(name, ("STRUCT",))][2]["size"])


@needs_vmlinux
def test_kernel_block_rq_complete_proto(kernel_btf):
    assert kernel_btf.func_proto("btf_trace_block_rq_complete") in (
        ["void *", "struct request *", "blk_status_t", "unsigned int"],
        ["void *", "struct request *", "int", "unsigned int"],      # 5.10 (contract.toml lists both)
    )


@needs_vmlinux
def test_the_per_process_tables_fit_this_kernel(kernel_btf):
    """What the per-process programs resolve before they compile, against this kernel's BTF (the 6.1 guest's in
    `make test-kernels`): their own table and events, and every event source either taken or missing because
    the kernel has no such event, never because iotrace reads it in another shape (a prototype or a member)."""
    con = contract.load()
    kernel.load(tasks.RAW_EVENTS, reads=con.kernel.merged(con.kernel_tasks), btf=kernel_btf)
    sources, _ = tasks.choose_sources(kernel_btf, con, syscall_hooks=False)
    for name, text in sources.items():
        if text.startswith(tasks.UNAVAILABLE):
            assert re.fullmatch(r"unavailable: (needs \S+|raw tracepoint \w+(; raw tracepoint \w+)*)", text), \
                (name, text)
    # throttling on every kernel with the event (6.18's prototype and 6.1's older one)
    if _has_typedef(kernel_btf, "btf_trace_balance_dirty_pages"):
        assert sources["throttled"] == "writeback:balance_dirty_pages", sources


def _has_typedef(btf: Btf, name: str) -> bool:
    try:
        btf.func_proto(name)
    except BtfError:
        return False
    return True


@needs_vmlinux
def test_the_shortcuts_fit_this_kernel_or_name_what_it_lacks(kernel_btf):
    """The reads that only skip work against this kernel's BTF (the guests' too): bio.bi_flags, 16 bits, and
    BIO_PAGE_PINNED, one of them (6.5+), read with bi_io_vec in one head; a kernel before 6.5 lacks the flag,
    and the raw path then loads without them (the completion walks to the first page as before)."""
    try:
        values = kernel.load_shortcuts(btf=kernel_btf, strict=True)
    except kernel.LayoutError as exc:
        assert str(exc) == "no enumerator named 'BIO_PAGE_PINNED' in any enum", str(exc)
        assert kernel.load_shortcuts(btf=kernel_btf) == {}
        return
    assert set(values) == {"BIO_FLAGS", "BIO_PAGE_PINNED", "BIO_FILE_HEAD_LEN"}
    assert 0 < values["BIO_FLAGS"] < 64 and 0 <= values["BIO_PAGE_PINNED"] < 16
    # one read spans the flags and bi_io_vec, a block-table member (file_request's walk starts there)
    vec = kernel.load(kernel.START_EVENTS, btf=kernel_btf).values["BIO_IO_VEC"]
    assert values["BIO_FILE_HEAD_LEN"] == max(vec + 8, values["BIO_FLAGS"] + 2) <= kernel.MAX_HEAD_BYTES
    assert kernel.load_shortcuts(btf=kernel_btf) == values


@needs_vmlinux
def test_the_helpers_are_this_kernels_numbers_or_left_out(kernel_btf):
    """bpf_get_current_task_btf (Linux 5.11), with which the programs read the current task's members without a
    copy: its number in this kernel's enum bpf_func_id (the guests' too), or, on 5.10, left out, and the
    programs copy them as before."""
    values = kernel.load_helpers(kernel_btf)
    try:
        number = kernel_btf.enumerator("BPF_FUNC_get_current_task_btf")
    except BtfError:
        assert values == {}
        return
    assert values == {"FUNC_CURRENT_TASK_BTF": number}
    # the helpers are numbered in the order they came: this one long after bpf_get_current_task (35)
    assert number > kernel_btf.enumerator("BPF_FUNC_get_current_task") == 35
    # and both objects get it: the block-layer programs' layout (file rows) and the per-process programs'
    assert kernel.load(kernel.START_EVENTS, btf=kernel_btf).values["FUNC_CURRENT_TASK_BTF"] == number


@needs_vmlinux
def test_the_kernel_stamps_fit_this_kernel_or_name_the_flag(kernel_btf):
    """--stamps kernel's reads against this kernel's BTF (the guests' in `make test-kernels`): every member
    resolves, in one head read; a kernel whose RQF_* flags are #defines (6.1) lacks only the enumerators
    __RQF_IO_STAT and __RQF_STATS, and iotrace then keeps its own stamps (probe.choose_stamps)."""
    try:
        values = kernel.load_stamps(btf=kernel_btf)
    except kernel.LayoutError as exc:
        assert str(exc) == ("no enumerator named '__RQF_IO_STAT' in any enum; "
                            "no enumerator named '__RQF_STATS' in any enum"), str(exc)
        return
    assert values["RQ_START_NS"] + 8 == values["RQ_IO_START_NS"] <= values["RQ_STAMPED_HEAD_LEN"] - 8
    assert values["RQ_STAMPED_HEAD_LEN"] <= kernel.MAX_HEAD_BYTES
    assert 0 <= values["RQF_IO_STAT"] < 32 and 0 <= values["RQF_STATS"] < 32
