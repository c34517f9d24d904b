"""Per-file rows, the reading side (bpf/files.bpf.h): one generation's files0/files1 drained, and each file
named by a path a person recognizes.

A row is (file, process): the file's superblock dev_t and inode number, its
bytes read through the page cache, from disk and written, and the latency
buckets of its requests.  Names cost no hook on any syscall: the programs
read a file's dentry name and a few parents' once (file_names, an LRU); here,
at the drain, they are joined under the file's mount point (the traced
process's /proc/PID/mountinfo), and where a traced process has the file open
its /proc/PID/fd link gives the full path instead (only the pids that have
rows, once a window).

Pure parsing (parse_mountinfo, fs_path, fd_paths over a proc root) is
separate from the maps, so the unit tests run them on text.
"""

from __future__ import annotations

import ctypes as ct
import os
from dataclasses import dataclass, field

from tracer import contract


def kernel_dev(major: int, minor: int) -> int:
    """The kernel's dev_t encoding (MKDEV) of major:minor, as the programs read s_dev."""
    return (major << 20) | minor


def dev_name(dev: int) -> str:
    """"major:minor" of a kernel-encoded dev_t."""
    return f"{dev >> 20}:{dev & 0xFFFFF}"


def _unescape(s: str) -> str:
    """mountinfo's octal escapes (\\040 for a space, \\011, \\012, \\134) undone."""
    out, i = [], 0
    while i < len(s):
        if s[i] == "\\" and i + 4 <= len(s) and s[i + 1:i + 4].isdigit():
            out.append(chr(int(s[i + 1:i + 4], 8)))
            i += 4
        else:
            out.append(s[i])
            i += 1
    return "".join(out)


@dataclass(frozen=True)
class Mount:
    root: str           # the directory of the filesystem mounted here ("/" unless a bind of a subtree)
    point: str          # where it is mounted


def parse_mountinfo(text: str) -> dict[int, list[Mount]]:
    """Kernel dev_t -> its mounts, in /proc/PID/mountinfo's order; bad lines are skipped."""
    out: dict[int, list[Mount]] = {}
    for line in text.splitlines():
        f = line.split()
        if len(f) < 10 or "-" not in f[6:]:
            continue
        try:
            major, minor = (int(x) for x in f[2].split(":"))
        except ValueError:
            continue
        out.setdefault(kernel_dev(major, minor), []).append(Mount(_unescape(f[3]), _unescape(f[4])))
    return out


def best_mount(mounts: list[Mount]) -> Mount | None:
    """The mount to name a device's files under: of the whole filesystem if any, the shortest path first."""
    if not mounts:
        return None
    return min(mounts, key=lambda m: (m.root != "/", len(m.point), m.point))


def fs_path(parts: list[str], rooted: bool, mount: Mount | None, dev: int) -> str:
    """A file's path from its dentry names (`parts`, its own name first), under `mount`.

    `rooted`: the last part's parent is the filesystem's root, so the path is
    whole; else "..." stands for the directories not read.  Without a mount
    (not mounted in the traced process's namespace any more) the device names it.
    """
    inner = "/".join(reversed(parts))
    if not parts:
        return f"[{dev_name(dev)}]"      # no dentry: an unlinked file, a block device's own page cache
    if mount is None:
        return f"[{dev_name(dev)}]/{'' if rooted else '.../'}{inner}"
    if not rooted:
        return f"{mount.point.rstrip('/')}/.../{inner}"
    full = "/" + inner
    if mount.root != "/":
        root = mount.root.rstrip("/")
        if not (full == root or full.startswith(root + "/")):
            return f"[{dev_name(dev)}]{full}"          # outside the mounted subtree
        full = full[len(root):] or "/"
    return mount.point.rstrip("/") + full if mount.point != "/" else full


def fd_paths(pid: int, wanted: set[tuple[int, int]], proc: str = "/proc") -> dict[tuple[int, int], str]:
    """(dev, ino) -> the path of `pid`'s open fd on it, for the files of `wanted` it has open."""
    out: dict[tuple[int, int], str] = {}
    fd_dir = f"{proc}/{pid}/fd"
    try:
        fds = os.listdir(fd_dir)
    except OSError:
        return out
    for fd in fds:
        link = f"{fd_dir}/{fd}"
        try:
            st = os.stat(link)
            key = (kernel_dev(os.major(st.st_dev), os.minor(st.st_dev)), st.st_ino)
            if key in wanted and key not in out:
                out[key] = os.readlink(link)
        except OSError:
            continue
    return out


def mounts_of(pid: int, proc: str = "/proc") -> dict[int, list[Mount]]:
    """The mounts `pid` sees (its mount namespace), else the tracer's own."""
    for p in (f"{proc}/{pid}/mountinfo", f"{proc}/self/mountinfo"):
        try:
            with open(p) as f:
                return parse_mountinfo(f.read())
        except OSError:
            continue
    return {}


@dataclass
class FileRaw:
    """One row of files0/files1: a file and a process, in one interval."""

    dev: int                    # kernel-encoded dev_t of the file's filesystem
    ino: int
    tgid: int
    comm: str = ""
    cgroup: int = 0
    cache_bytes: int = 0
    disk_read_bytes: int = 0
    written_bytes: int = 0
    requests: int = 0
    direct_bytes: int = 0       # of disk_read_bytes and written_bytes: O_DIRECT's, as asked
    sum_ns: int = 0
    hist: dict[int, int] = field(default_factory=dict)     # bucket (IOTRACE_FILE_HIST_SUB_BITS) -> requests
    path: str = ""


def name_paths(rows: list[FileRaw], names: dict[tuple[int, int], tuple[list[str], bool]],
               proc: str = "/proc") -> None:
    """Each row's path (in place): its process's open fd on the file, else its dentry names under its mount."""
    by_pid: dict[int, set[tuple[int, int]]] = {}
    for r in rows:
        by_pid.setdefault(r.tgid, set()).add((r.dev, r.ino))
    opened: dict[tuple[int, int], str] = {}
    mounts: dict[int, dict[int, list[Mount]]] = {}
    for pid, wanted in by_pid.items():
        for k, p in fd_paths(pid, wanted - opened.keys(), proc).items():
            opened.setdefault(k, p)
    for r in rows:
        k = (r.dev, r.ino)
        if k in opened:
            r.path = opened[k]
            continue
        parts, rooted = names.get(k, ([], False))
        if r.tgid not in mounts:
            mounts[r.tgid] = mounts_of(r.tgid, proc)
        r.path = fs_path(parts, rooted, best_mount(mounts[r.tgid].get(r.dev, [])), r.dev)
        if not parts:
            r.path += f" inode {r.ino}"


def _text(b) -> str:
    return bytes(b).split(b"\0", 1)[0].decode(errors="replace")


class FileDrain:
    """files0/files1 of a loaded BpfObject (raw_tp.bpf.c), drained one generation at a time."""

    def __init__(self, bpf, cache: bool):
        self.bpf = bpf
        self.cache = cache      # mm_filemap_get_pages is attached: page-cache read bytes are counted

    def drain(self, gen: int) -> list[FileRaw]:
        """Generation `gen`'s rows (the programs write the other one), read and cleared, with their paths."""
        table = self.bpf[f"files{gen}"]
        rows = []
        for k, v in table.items():
            hist = {i: n for i, n in enumerate(v.hist) if n}
            rows.append(FileRaw(k.dev, k.ino, k.tgid, _text(v.comm), v.cgroup, v.cache_bytes,
                                v.disk_read_bytes, v.written_bytes, v.requests, v.direct_bytes, v.sum_ns, hist))
        table.clear()
        names_t = self.bpf["file_names"]
        depth = contract.load().const("NAME_DEPTH")
        names: dict[tuple[int, int], tuple[list[str], bool]] = {}
        for r in rows:
            key = (r.dev, r.ino)
            if key in names:
                continue
            nk = names_t.Key(r.dev, 0, r.ino)
            try:
                n = names_t[nk]
            except KeyError:
                continue
            # the whole array: a char array field reads only up to its first NUL
            field_ = type(n).part
            raw = ct.string_at(ct.addressof(n) + field_.offset, field_.size)
            width = len(raw) // depth
            names[key] = ([_text(raw[i * width:(i + 1) * width]) for i in range(min(n.depth, depth))],
                          bool(n.rooted))
        name_paths(rows, names)
        return rows
