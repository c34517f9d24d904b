"""The "files" section of a dump: a row per (file, process) of the window (tracer.sources.files;
docs/training.md, "Files: which files the I/O was for").

A row names the file (its filesystem's device, inode number and a path),
its process (pid, comm, container), the bytes it read through the page cache
(None where the kernel has no mm_filemap_get_pages: Linux before 6.12, or the
perf-event path), the bytes of its read requests (from disk) and of its
write requests (write-back included, charged to the dirtier), and its
requests' count and total-latency buckets (IOTRACE_FILE_HIST_SUB_BITS: 4 a
power of two, so p50 and p99 are within 12.5%); O_DIRECT's bytes, counted as
asked when it starts (no request of its is a file's: its pages are the
process's memory), are in disk_read_bytes / written_bytes and direct_bytes.  A window keeps its top N
rows by bytes moved (read from disk + written, then read from disk, then read
through the cache: rank()); the rest
are summed into one "(other files)" row whose `files` says how many.

The section is registered in tracer.model.sections' SECTIONS.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import ClassVar

from tracer import contract
from tracer.model.jsoncheck import array, obj, text, whole
from tracer.model.sectionbase import Section

OTHER = "(other files)"


def _sub_bits() -> int:
    return contract.load().const("FILE_HIST_SUB_BITS")


def bucket_range(i: int, sub_bits: int | None = None) -> tuple[int, int]:
    """[low, high) nanoseconds of file-latency bucket `i` (files.bpf.h's file_bucket)."""
    s = _sub_bits() if sub_bits is None else sub_bits
    if i < (1 << s):
        return i, i + 1
    msb = (i >> s) + s - 1
    low = ((1 << s) | (i & ((1 << s) - 1))) << (msb - s)
    return low, low + (1 << (msb - s))


def bucket_of(ns: int, sub_bits: int | None = None) -> int:
    """The bucket of `ns` (as the programs compute it; for tests and checks)."""
    s = _sub_bits() if sub_bits is None else sub_bits
    if ns < (1 << s):
        return ns
    msb = ns.bit_length() - 1
    return ((msb - s + 1) << s) | ((ns >> (msb - s)) & ((1 << s) - 1))


def percentile_ns(hist: dict[int, int], q: float, sub_bits: int | None = None) -> float | None:
    """The q-quantile (0..1) of a bucket histogram, at its bucket's midpoint; None when empty."""
    total = sum(hist.values())
    if not total:
        return None
    rank = max(1, int(q * total + 0.999999))     # the smallest value with at least q of the samples at or below
    seen = 0
    for b in sorted(hist):
        seen += hist[b]
        if seen >= rank:
            low, high = bucket_range(b, sub_bits)
            return (low + high - 1) / 2
    return None


@dataclass
class FileRow:
    dev: str                    # "major:minor" of the file's filesystem ("" for the other files)
    ino: int
    path: str                   # a path a person recognizes (tracer.sources.files); untrusted text
    pid: int = 0
    comm: str = ""
    container: str = ""
    cgroup_id: int = 0
    cache_read_bytes: int | None = None     # None: not measurable on this kernel or path
    disk_read_bytes: int = 0
    written_bytes: int = 0
    requests: int = 0
    direct_bytes: int = 0       # of disk_read_bytes and written_bytes: O_DIRECT's, as asked (no requests, no latency)
    hist: dict[int, int] = field(default_factory=dict)     # total-latency bucket -> requests
    files: int = 1              # file rows summed in this one (the other files' row: more)

    @property
    def key(self) -> tuple[str, int, int, str]:
        return (self.dev, self.ino, self.pid, self.path if self.path == OTHER else "")

    def p_us(self, q: float) -> float | None:
        ns = percentile_ns(self.hist, q)
        return None if ns is None else round(ns / 1000, 1)

    # Hand-written, not tracer.model.fieldwise: a row writes p50_us and p99_us, which it does not read (they
    # follow from hist), and its hist as sorted [bucket, count] pairs; its checks run in their own order.
    @classmethod
    def from_json(cls, v) -> FileRow:
        v = obj(v, "a files row")
        cache = v.get("cache_read_bytes")
        hist = {}
        for pair in array(v.get("hist", []), "files hist"):
            b, n = array(pair, "files hist entry")
            hist[whole(b, "files hist bucket")] = whole(n, "files hist count")
        return cls(text(v.get("dev", ""), "files dev"), whole(v.get("ino", 0), "files ino"),
                   text(v.get("path", ""), "files path"), whole(v.get("pid", 0), "files pid"),
                   text(v.get("comm", ""), "files comm"), text(v.get("container", ""), "files container"),
                   whole(v.get("cgroup_id", 0), "files cgroup_id"),
                   None if cache is None else whole(cache, "files cache_read_bytes"),
                   *(whole(v.get(k, 0), f"files {k}")
                     for k in ("disk_read_bytes", "written_bytes", "requests", "direct_bytes")),
                   hist, whole(v.get("files", 1), "files files"))

    def to_json(self) -> dict:
        out = {f.name: getattr(self, f.name) for f in fields(self) if f.name != "hist"}
        out["p50_us"] = self.p_us(0.5)
        out["p99_us"] = self.p_us(0.99)
        out["hist"] = [[b, n] for b, n in sorted(self.hist.items())]
        return out

    def add(self, r: FileRow) -> None:
        """Another window's row of the same file and process (or another file, into the other files' row)."""
        if r.cache_read_bytes is not None:
            self.cache_read_bytes = (self.cache_read_bytes or 0) + r.cache_read_bytes
        self.disk_read_bytes += r.disk_read_bytes
        self.written_bytes += r.written_bytes
        self.requests += r.requests
        self.direct_bytes += r.direct_bytes
        for b, n in r.hist.items():
            self.hist[b] = self.hist.get(b, 0) + n
        self.comm = r.comm or self.comm
        self.container = r.container or self.container
        self.path = r.path or self.path

    def copy(self) -> FileRow:
        return FileRow(**{f.name: getattr(self, f.name) for f in fields(self)} | {"hist": dict(self.hist)})


def moved(r: FileRow) -> int:
    """The bytes a file's row moved to or from the disk: read from disk + written (write-back included)."""
    return r.disk_read_bytes + r.written_bytes


def rank(r: FileRow) -> tuple[int, int, int]:
    """Bigger first: bytes moved (a checkpoint written and never read ranks as a shard read), then read from
    disk, then read through the cache."""
    return (moved(r), r.disk_read_bytes, r.cache_read_bytes or 0)


def bounded(rows: list[FileRow], top: int) -> list[FileRow]:
    """The `top` rows by rank(), then one row summing the others (if any), its `files` their number."""
    rows = sorted(rows, key=lambda r: (tuple(-x for x in rank(r)), r.path, r.pid))
    if top < 0 or len(rows) <= top:
        return rows
    kept, rest = rows[:top], rows[top:]
    other = FileRow("", 0, OTHER, files=0, cache_read_bytes=None)
    for r in rest:
        other.add(r)
        other.files += r.files
    other.comm = other.container = ""
    other.path = OTHER
    return [*kept, other]


@dataclass
class Files(Section):
    """A window's file rows, top first, the other files' row last (an empty list: no file I/O seen)."""

    key: ClassVar[str] = "files"
    null_is_absent: ClassVar[bool] = False
    rows: list[FileRow] = field(default_factory=list)

    @classmethod
    def from_json(cls, v) -> Files:
        return cls([FileRow.from_json(r) for r in array(v, "files")])

    def to_json(self) -> list[dict]:
        return [r.to_json() for r in self.rows]

    @classmethod
    def merger(cls) -> FilesMerger:
        return FilesMerger()


class FilesMerger:
    """Rows of disjoint windows added up by (file, pid); the other files' rows into one, kept last."""

    def __init__(self) -> None:
        self.out: dict[tuple, FileRow] | None = None

    def add(self, d) -> None:
        if d.files is not None:
            self.add_rows(d.files.rows)

    def add_rows(self, rows: list[FileRow]) -> None:
        out = self.out = {} if self.out is None else self.out
        for r in rows:
            acc = out.get(r.key)
            if acc is None:
                out[r.key] = r.copy()
            else:
                if r.path == OTHER:
                    acc.files = max(acc.files, r.files)     # the same files may be among the others again
                acc.add(r)

    def result(self) -> Files | None:
        if self.out is None:
            return None
        rows = sorted((r for r in self.out.values() if r.path != OTHER),
                      key=lambda r: (tuple(-x for x in rank(r)), r.path, r.pid))
        return Files(rows + [r for r in self.out.values() if r.path == OTHER])


def fill_containers(d) -> None:
    """Each file row's container, from the dump's series of the same cgroup (resolved already)."""
    if d.files is None:
        return
    names = {s.cgroup_id: s.container for s in d.series if s.container}
    for r in d.files.rows:
        r.container = names.get(r.cgroup_id, r.container)
