"""cgroup v2 ids to paths, and paths to the container they belong to.

The BPF programs record the cgroup v2 id of the task that made each request
(Series.cgroup_id).  On cgroup v2 that id is the inode number of the
cgroup's directory in the cgroup2 filesystem, so ``CgroupResolver`` finds a
path by walking the hierarchy and caches what it found (bounded, refreshed
on a miss).  ``container_of`` names the container a path belongs to from
the path shapes that container runtimes and the kubelet create:

    /system.slice/docker-<64 hex>.scope, /docker/<64 hex>      docker:<12 hex>
    .../cri-containerd-<id>.scope, /k8s.io/<64 hex>             containerd:<12>
    .../crio-<id>.scope                                         crio:<12>
    .../libpod-<64 hex>.scope                                   podman:<12>
    /lxc.payload.<name>, /lxc/<name>                            lxc:<name>
    any other cgroup named by 64 hex digits                     container:<12>
    /kubepods.slice/kubepods-burstable.slice/
        kubepods-burstable-pod<uid, _ for ->.slice/<runtime>-<id>.scope
    /kubepods/burstable/pod<uid>/<id> (cgroupfs driver)         k8s:pod<uid>/<12>
    the pod's own cgroup (or its runtime's conmon)              k8s:pod<uid>
    /system.slice/<name>.service                                service:<name>

For a plain host process (the root cgroup, init.scope, a login session under
user.slice, kernel threads) and for anything not recognised it returns "".
Ids are shortened to 12 characters, as `docker ps` and `crictl ps` show
them; pod UIDs stay whole.  No root needed: cgroupfs is world-readable.
"""

from __future__ import annotations

import os
import re
import time
from collections import OrderedDict
from collections.abc import Iterable

from tracer.contract import RefusedEnvironment
from tracer.errors import UserError

ENV_ROOT = "IOTRACE_CGROUP_ROOT"   # where the host's cgroup2 hierarchy is mounted, if not found in mountinfo
DEFAULT_ROOTS = ("/sys/fs/cgroup", "/sys/fs/cgroup/unified")
SHORT_ID = 12

# A cgroup that has gone by the time we walk stays unknown; asking again for
# every dump that mentions it would walk the tree each time.
NEGATIVE_TTL_S = 60.0


def env_root() -> str | None:
    """$IOTRACE_CGROUP_ROOT (the host's cgroup2 mounted elsewhere, as in the DaemonSet), or None when unset.

    Refused under sudo (SUDO_UID set), as $IOTRACE_BPF_DIR is: where sudo keeps IOTRACE_* (env_keep),
    root would walk a tree the invoking user chose and put what it found there in the dumps (names of
    directories only root may list).  Trace and serve ask before they start, so the refusal is one line.
    """
    root = os.environ.get(ENV_ROOT)
    if root and os.environ.get("SUDO_UID"):
        raise RefusedEnvironment(f"${ENV_ROOT} is not honoured under sudo (root would read the cgroup tree the "
                                 f"invoking user chose): unset it, or run as root without sudo")
    return root or None


def cgroup2_mount(mountinfo: str = "/proc/self/mountinfo") -> tuple[str, str] | None:
    """(mount point, root of the hierarchy it shows) of the cgroup2 filesystem, or None.

    A hybrid (v1 + v2) host mounts it at /sys/fs/cgroup/unified; a container
    may see a subtree only (its root is then not "/").
    """
    found = []
    try:
        with open(mountinfo) as f:
            for line in f:
                left, _, right = line.partition(" - ")
                fields, fstype = left.split(), right.split(" ", 1)[0]
                if fstype == "cgroup2" and len(fields) >= 5:
                    found.append((_unescape(fields[4]), _unescape(fields[3])))
    except OSError:
        return None
    for preferred in DEFAULT_ROOTS:
        for mount, root in found:
            if mount == preferred:
                return mount, root
    return found[0] if found else None


def resolve_cgroup(path: str) -> tuple[int, int]:
    """(id, depth below the hierarchy's root) of the cgroup v2 at `path`, absolute or under the mount.

    What the kernel-side --cgroup filter compares: the submitter's ancestor
    at that depth must have that id (the inode number of its directory).
    """
    full, rel, root = _locate(path)
    # a container may see a subtree of the hierarchy: its depth counts too
    depth = [p for p in (root.strip("/").split("/") if root != "/" else []) + rel.split("/") if p not in ("", ".")]
    return os.stat(full).st_ino, len(depth)


def cgroup_path(path: str) -> str:
    """The cgroup v2 at `path` (as --cgroup takes it) as /proc/PID/cgroup names it: "/system.slice/x.scope"."""
    rel = _locate(path)[1]
    return "/" if rel == "." else "/" + rel


def _locate(path: str) -> tuple[str, str, str]:
    """(its directory, its path relative to the mount, the mount's root) of the cgroup v2 at `path`."""
    found = cgroup2_mount()
    if found is None:
        raise UserError("--cgroup needs the cgroup v2 hierarchy, and none is mounted "
                        "(mount -t cgroup2 none /sys/fs/cgroup/unified)")
    mount, root = found
    full = os.path.realpath(path if path == mount or path.startswith(mount + "/") else
                            os.path.join(mount, path.lstrip("/")))
    rel = os.path.relpath(full, mount)
    if rel.startswith(".."):
        raise UserError(f"--cgroup {path}: not under the cgroup v2 mount {mount}")
    if not os.path.isfile(os.path.join(full, "cgroup.procs")):
        raise UserError(f"--cgroup {path}: no such cgroup v2 ({full} has no cgroup.procs)")
    return full, rel, root


def cgroup_of(pid: int, proc: str = "/proc") -> str | None:
    """Process `pid`'s cgroup v2 path, from /proc/PID/cgroup's "0::" line; None once it is gone (or has none).

    The text is the kernel's, but a cgroup's name is whoever made it: only compared, never shown.
    """
    try:
        with open(f"{proc}/{pid}/cgroup", "rb") as f:
            for line in f.read(1 << 16).decode(errors="replace").splitlines():
                if line.startswith("0::"):
                    return line[3:].removesuffix(" (deleted)")
    except OSError:
        pass
    return None


def within(path: str, cgroup: str) -> bool:
    """Whether cgroup path `path` is `cgroup` or below it (both as /proc/PID/cgroup names them)."""
    top = cgroup.rstrip("/")
    return not top or path == top or path.startswith(top + "/")


def _unescape(field: str) -> str:
    # mountinfo writes space, tab, newline and backslash as octal escapes
    return re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), field)


class CgroupResolver:
    """cgroup v2 id -> path relative to the hierarchy's root ("/", "/system.slice/x.service").

    Holds at most `max_entries` ids (least recently used go first), so a
    node where containers come and go keeps a flat memory.  A miss walks the
    hierarchy once for all ids asked together (``paths``), remembering only
    those asked for.
    """

    def __init__(self, root: str | None = None, max_entries: int = 16384, negative_ttl_s: float = NEGATIVE_TTL_S):
        self._prefix = ""
        if root is None:
            root = env_root()
            if root is not None:
                # the host's /sys/fs/cgroup mounted elsewhere: on a hybrid host, v2 is its unified/
                if not os.path.exists(f"{root}/cgroup.controllers") and os.path.exists(
                        f"{root}/unified/cgroup.controllers"):
                    root = f"{root}/unified"
            else:
                mount = cgroup2_mount()
                root, self._prefix = mount if mount else (DEFAULT_ROOTS[0], "/")
        self.root = root.rstrip("/") or "/"
        # a mount of a subtree shows paths below its root; one outside our cgroup namespace
        # shows as "/.." and cannot be placed: then paths are relative to the mount
        if self._prefix in ("", "/") or ".." in self._prefix.split("/"):
            self._prefix = ""
        self._prefix = self._prefix.rstrip("/")
        self.max_entries = max_entries
        self.negative_ttl_s = negative_ttl_s
        self._paths: OrderedDict[int, str] = OrderedDict()
        self._missing: OrderedDict[int, float] = OrderedDict()
        self.walks = 0

    def __len__(self) -> int:
        return len(self._paths)

    def path(self, cgroup_id: int) -> str | None:
        return self.paths([cgroup_id]).get(cgroup_id)

    def paths(self, ids: Iterable[int]) -> dict[int, str]:
        """Path of each id that names a live cgroup (id 0, "not recorded", never does)."""
        out: dict[int, str] = {}
        wanted: set[int] = set()
        now = time.monotonic()
        for i in set(ids):
            if i <= 0:
                continue
            if i in self._paths:
                self._paths.move_to_end(i)
                out[i] = self._paths[i]
            elif now - self._missing.get(i, -1e18) >= self.negative_ttl_s:
                wanted.add(i)
        if wanted:
            found = self._walk(wanted)
            for i in wanted:
                if i in found:
                    self._remember(i, found[i])
                    out[i] = found[i]
                    self._missing.pop(i, None)
                else:
                    self._missing[i] = now
                    self._missing.move_to_end(i)
            while len(self._missing) > self.max_entries:
                self._missing.popitem(last=False)
        return out

    def _remember(self, cgroup_id: int, path: str) -> None:
        self._paths[cgroup_id] = path
        self._paths.move_to_end(cgroup_id)
        while len(self._paths) > self.max_entries:
            self._paths.popitem(last=False)

    def _walk(self, wanted: set[int]) -> dict[int, str]:
        """Directory inode -> path for the wanted ids, stopping once all are found."""
        self.walks += 1
        found: dict[int, str] = {}
        try:
            root_ino = os.stat(self.root).st_ino
        except OSError:
            return found
        if root_ino in wanted:
            found[root_ino] = self._prefix or "/"
        stack = [(self.root, self._prefix)]
        while stack and len(found) < len(wanted):
            fs_dir, rel = stack.pop()
            try:
                entries = list(os.scandir(fs_dir))
            except OSError:
                continue    # removed while we walk, or not readable
            for e in entries:
                try:
                    if not e.is_dir(follow_symlinks=False):
                        continue
                    ino = e.inode()
                except OSError:
                    continue
                path = f"{rel}/{e.name}"
                if ino in wanted:
                    found[ino] = path
                stack.append((e.path, path))
        return found


# ---- container identity from a cgroup path -------------------------------------

_HEX64 = r"[0-9a-f]{64}"
# scope units that container runtimes (through systemd) name after the container id
_SCOPES = (
    (re.compile(rf"^docker-({_HEX64})\.scope$"), "docker"),
    (re.compile(r"^cri-containerd-([0-9a-zA-Z_.-]+?)\.scope$"), "containerd"),
    (re.compile(r"^crio-(?!conmon-)([0-9a-zA-Z_.-]+?)\.scope$"), "crio"),
    (re.compile(rf"^libpod-({_HEX64})(?:\.scope)?$"), "podman"),
    (re.compile(rf"^nerdctl-({_HEX64})\.scope$"), "containerd"),
)
_BARE_ID = re.compile(rf"^{_HEX64}$")   # the cgroupfs drivers name a container's cgroup by its id alone
# under a parent of this name, a bare id is this runtime's (docker's cgroupfs driver, containerd's k8s.io namespace)
_BARE_PARENTS = {"docker": "docker", "k8s.io": "containerd", "libpod_parent": "podman"}
# systemd driver: kubepods-pod<uid>.slice, kubepods-burstable-pod<uid>.slice (the uid's dashes as _);
# kind and some distributions nest it: kubelet-kubepods-besteffort-pod<uid>.slice
_POD_SLICE = re.compile(r"^(?:[a-z]+-)?kubepods(?:-[a-z]+)?-pod([0-9a-fA-F_-]+)\.slice$")
_POD_DIR = re.compile(r"^pod([0-9a-fA-F-]+)$")   # cgroupfs driver: kubepods/burstable/pod<uid>


def _runtime_id(parent: str, segment: str) -> tuple[str, str] | None:
    """(runtime, id) if a path segment is a container's own cgroup; runtime "container" when unknown."""
    for rx, runtime in _SCOPES:
        m = rx.match(segment)
        if m:
            return runtime, m.group(1)
    if _BARE_ID.match(segment):
        return _BARE_PARENTS.get(parent, "container"), segment
    return None


def _pod(parts: list[str]) -> str | None:
    for i, seg in enumerate(parts):
        m = _POD_SLICE.match(seg) or (_POD_DIR.match(seg) if any("kubepods" in p for p in parts[:i]) else None)
        if not m:
            continue
        uid = m.group(1).replace("_", "-")
        if i + 1 < len(parts):
            rid = _runtime_id(seg, parts[i + 1])
            if rid:
                return f"k8s:pod{uid}/{rid[1][:SHORT_ID]}"
        return f"k8s:pod{uid}"     # the pod's own cgroup (or its runtime's conmon): no one container
    return None


def container_of(path: str | None) -> str:
    """A short name for the container whose cgroup `path` is (or is below); "" for a host process.

    Kubernetes pods are "k8s:pod<uid>/<container id>" ("k8s:pod<uid>" for
    the pod's own cgroup); other containers "<runtime>:<id>"; a systemd
    system service "service:<unit name>".  The first (outermost) container
    on the path wins: that is the one the host runs.  "" for the root cgroup,
    init.scope, login sessions and user services (user.slice), virtual
    machines (machine.slice) and anything not recognised.
    """
    if not path:
        return ""
    parts = [p for p in path.split("/") if p]
    if any("kubepods" in p for p in parts):
        pod = _pod(parts)
        if pod:
            return pod
    for i, seg in enumerate(parts):
        rid = _runtime_id(parts[i - 1] if i else "", seg)
        if rid:
            return f"{rid[0]}:{rid[1][:SHORT_ID]}"
        if seg.startswith("lxc.payload."):
            return f"lxc:{seg.removeprefix('lxc.payload.')}"
        if seg == "lxc" and i + 1 < len(parts):
            return f"lxc:{parts[i + 1]}"
    if parts and parts[0] == "system.slice":
        # template instances sit in a slice of their own: system.slice/system-getty.slice/getty@tty1.service
        for seg in parts[1:]:
            if seg.endswith(".service"):
                return f"service:{seg.removesuffix('.service')}"
            if not seg.endswith(".slice"):
                break
    return ""


# ---- dumps ---------------------------------------------------------------------

_default: CgroupResolver | None = None


def default_resolver() -> CgroupResolver:
    global _default
    if _default is None:
        _default = CgroupResolver()
    return _default


def resolve_containers(dump, resolver: CgroupResolver | None = None) -> None:
    """Fill each Series.container of `dump` from its cgroup_id (in place).

    One walk of the hierarchy at most, for all ids the cache does not know;
    ids of cgroups already gone stay "" (the walk is not repeated for them
    for a while).
    """
    if not dump.series:
        return
    if resolver is None:    # not `or`: an empty resolver is falsy (len 0)
        resolver = default_resolver()
    paths = resolver.paths(s.cgroup_id for s in dump.series)
    names = {i: container_of(p) for i, p in paths.items()}
    for s in dump.series:
        s.container = names.get(s.cgroup_id, s.container)
