"""cgroup ids to paths (on a made-up tree, and on the real cgroup2 hierarchy as root) and
container identities from the cgroup path shapes runtimes really create; the CONTAINER column
and the "container" JSON field."""

from __future__ import annotations

import io
import os
import subprocess
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import numpy as np
import pytest

from tracer.codec.jsonl import from_json, to_json
from tracer.model.dump import Dump, PhaseStats, Series
from tracer.model.histogram import Histogram
from tracer.sources import cgroups
from tracer.sources.cgroups import CgroupResolver, container_of
from tracer.views.report import render_table

CID = "4f1c2b9d8e7a6f5e4d3c2b1a0f9e8d7c6b5a4f3e2d1c0b9a8f7e6d5c4b3a2f10"   # 64 hex, as runtimes make them
CID2 = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"
UID = "2d1c4a5e-8f3b-4c1d-9e2a-1b2c3d4e5f60"
UID_ = UID.replace("-", "_")      # the systemd cgroup driver's spelling
SHORT = CID[:12]

SHAPES = [
    # host processes: nothing to name
    ("/", ""),
    ("/init.scope", ""),
    ("/user.slice/user-1000.slice/session-3.scope", ""),
    ("/user.slice/user-1000.slice/user@1000.service/app.slice/app-gnome-firefox-4242.scope", ""),
    ("/system.slice/var-lib-docker.mount", ""),
    ("/machine.slice/machine-qemu\\x2d1\\x2dvm1.scope", ""),
    ("/kubepods.slice/kubepods-burstable.slice", ""),            # a QoS class, no pod
    ("/docker", ""),
    # Docker: systemd and cgroupfs drivers, rootless, docker-in-docker (the outer one is the host's)
    (f"/system.slice/docker-{CID}.scope", f"docker:{SHORT}"),
    (f"/docker/{CID}", f"docker:{SHORT}"),
    (f"/docker/{CID}/docker/{CID2}", f"docker:{SHORT}"),
    (f"/user.slice/user-1000.slice/user@1000.service/docker-{CID}.scope", f"docker:{SHORT}"),
    (f"/system.slice/docker-{CID}.scope/init", f"docker:{SHORT}"),
    # containerd outside Kubernetes, CRI-O, podman, LXC
    (f"/system.slice/cri-containerd-{CID}.scope", f"containerd:{SHORT}"),
    (f"/system.slice/nerdctl-{CID}.scope", f"containerd:{SHORT}"),
    (f"/k8s.io/{CID}", f"containerd:{SHORT}"),
    (f"/machine.slice/crio-{CID}.scope", f"crio:{SHORT}"),
    (f"/machine.slice/libpod-{CID}.scope", f"podman:{SHORT}"),
    (f"/machine.slice/libpod-{CID}.scope/container", f"podman:{SHORT}"),
    (f"/user.slice/user-1000.slice/user@1000.service/user.slice/libpod-{CID}.scope", f"podman:{SHORT}"),
    (f"/libpod_parent/libpod-{CID}", f"podman:{SHORT}"),
    (f"/machine.slice/libpod-conmon-{CID}.scope", ""),
    ("/lxc.payload.web1", "lxc:web1"),
    ("/lxc/web1", "lxc:web1"),
    ("/lxc.monitor.web1", ""),
    (f"/anything/{CID}", f"container:{SHORT}"),
    # Kubernetes, systemd driver: guaranteed, burstable and besteffort pods, any runtime
    (f"/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{UID_}.slice/cri-containerd-{CID}.scope",
     f"k8s:pod{UID}/{SHORT}"),
    (f"/kubepods.slice/kubepods-pod{UID_}.slice/crio-{CID}.scope", f"k8s:pod{UID}/{SHORT}"),
    (f"/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod{UID_}.slice/docker-{CID}.scope",
     f"k8s:pod{UID}/{SHORT}"),
    (f"/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{UID_}.slice/crio-{CID}.scope/container",
     f"k8s:pod{UID}/{SHORT}"),
    (f"/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{UID_}.slice", f"k8s:pod{UID}"),
    (f"/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{UID_}.slice/crio-conmon-{CID}.scope",
     f"k8s:pod{UID}"),
    # kind nests the kubelet's tree under its own slice
    (f"/kubelet.slice/kubelet-kubepods.slice/kubelet-kubepods-besteffort.slice/"
     f"kubelet-kubepods-besteffort-pod{UID_}.slice/cri-containerd-{CID}.scope", f"k8s:pod{UID}/{SHORT}"),
    # Kubernetes, cgroupfs driver (also k3s)
    (f"/kubepods/burstable/pod{UID}/{CID}", f"k8s:pod{UID}/{SHORT}"),
    (f"/kubepods/pod{UID}/{CID}", f"k8s:pod{UID}/{SHORT}"),
    (f"/kubepods/besteffort/pod{UID}/{CID}", f"k8s:pod{UID}/{SHORT}"),
    (f"/kubepods/besteffort/pod{UID}", f"k8s:pod{UID}"),
    # systemd system services (not user services: those are someone's session)
    ("/system.slice/ssh.service", "service:ssh"),
    ("/system.slice/containerd.service", "service:containerd"),
    ("/system.slice/postgresql@15-main.service", "service:postgresql@15-main"),
    ("/system.slice/system-getty.slice/getty@tty1.service", "service:getty@tty1"),
    ("/system.slice/kubelet.service/extra", "service:kubelet"),
]


@pytest.mark.parametrize(("path", "want"), SHAPES, ids=[p or "empty" for p, _ in SHAPES])
def test_container_of(path, want):
    assert container_of(path) == want


def test_container_of_nothing():
    assert container_of(None) == ""
    assert container_of("") == ""


# ---- the resolver on a tree made here (inode numbers work the same on any filesystem) ----

@pytest.fixture
def tree(tmp_path) -> Path:
    for d in ("system.slice/ssh.service", f"system.slice/docker-{CID}.scope", "user.slice/user-1000.slice"):
        (tmp_path / d).mkdir(parents=True)
    (tmp_path / "system.slice" / "cgroup.procs").write_text("")   # files are not cgroups
    return tmp_path


def ino(p: Path) -> int:
    return os.stat(p).st_ino


def test_resolver_finds_paths_and_caches(tree):
    r = CgroupResolver(root=str(tree))
    docker = tree / "system.slice" / f"docker-{CID}.scope"
    ssh = tree / "system.slice" / "ssh.service"
    got = r.paths([ino(docker), ino(ssh), ino(tree)])
    assert got == {ino(docker): f"/system.slice/docker-{CID}.scope", ino(ssh): "/system.slice/ssh.service",
                   ino(tree): "/"}
    assert r.walks == 1                       # one walk for all three
    assert r.path(ino(ssh)) == "/system.slice/ssh.service"
    assert r.walks == 1                       # from the cache
    assert r.path(ino(tree / "system.slice" / "cgroup.procs")) is None


def test_resolver_refreshes_on_a_miss(tree):
    r = CgroupResolver(root=str(tree))
    r.path(ino(tree / "user.slice"))
    new = tree / "user.slice" / "user-1000.slice" / "session-9.scope"
    new.mkdir()
    assert r.path(ino(new)) == "/user.slice/user-1000.slice/session-9.scope"
    assert r.walks == 2


def test_resolver_does_not_walk_again_for_a_gone_cgroup(tree):
    r = CgroupResolver(root=str(tree), negative_ttl_s=60)
    gone = tree / "gone"
    gone.mkdir()
    gone_id = ino(gone)
    gone.rmdir()
    assert r.path(gone_id) is None
    assert r.path(gone_id) is None
    assert r.walks == 1
    again = CgroupResolver(root=str(tree), negative_ttl_s=0)
    again.path(gone_id)
    again.path(gone_id)
    assert again.walks == 2
    assert r.path(0) is None and r.walks == 1    # 0: "not recorded", never looked up


def test_resolver_cache_is_bounded_lru(tree):
    dirs = []
    for i in range(6):
        d = tree / f"c{i}"
        d.mkdir()
        dirs.append(d)
    r = CgroupResolver(root=str(tree), max_entries=3)
    for d in dirs:
        assert r.path(ino(d)) == f"/{d.name}"
    assert len(r) == 3
    walks = r.walks
    assert r.path(ino(dirs[-1])) == f"/{dirs[-1].name}"      # recent: still cached
    assert r.walks == walks
    assert r.path(ino(dirs[0])) == f"/{dirs[0].name}"        # evicted: found again by a walk
    assert r.walks == walks + 1


def test_root_from_the_environment(tmp_path, monkeypatch):
    """A container mounts the host's /sys/fs/cgroup elsewhere; on a hybrid host v2 is its unified/."""
    hybrid = tmp_path / "hybrid"
    (hybrid / "unified" / "kubepods.slice").mkdir(parents=True)
    (hybrid / "unified" / "cgroup.controllers").write_text("")
    (hybrid / "memory").mkdir()
    monkeypatch.setenv(cgroups.ENV_ROOT, str(hybrid))
    r = CgroupResolver()
    assert r.root == str(hybrid / "unified")
    assert r.path(ino(hybrid / "unified" / "kubepods.slice")) == "/kubepods.slice"
    unified = tmp_path / "unified"
    (unified / "system.slice").mkdir(parents=True)
    (unified / "cgroup.controllers").write_text("")
    monkeypatch.setenv(cgroups.ENV_ROOT, str(unified))
    assert CgroupResolver().root == str(unified)


def test_cgroup2_mount_from_mountinfo(tmp_path):
    hybrid = tmp_path / "hybrid"
    hybrid.write_text(
        "31 23 0:28 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755\n"
        "35 31 0:32 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory\n"
        "41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw\n")
    assert cgroups.cgroup2_mount(str(hybrid)) == ("/sys/fs/cgroup/unified", "/")
    unified = tmp_path / "unified"
    unified.write_text(
        "50 1 0:44 /some\\040dir /host/sys/fs/cgroup rw shared:3 - cgroup2 cgroup2 rw,nsdelegate\n"
        "51 1 0:26 / /sys/fs/cgroup rw,nosuid shared:4 - cgroup2 cgroup2 rw,nsdelegate\n")
    assert cgroups.cgroup2_mount(str(unified)) == ("/sys/fs/cgroup", "/")
    sub = tmp_path / "sub"
    sub.write_text("50 1 0:44 /some\\040dir /host/cg rw shared:3 - cgroup2 cgroup2 rw\n")
    assert cgroups.cgroup2_mount(str(sub)) == ("/host/cg", "/some dir")
    none = tmp_path / "none"
    none.write_text("31 23 0:28 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755\n")
    assert cgroups.cgroup2_mount(str(none)) is None
    assert cgroups.cgroup2_mount(str(tmp_path / "missing")) is None


# ---- dumps: resolve_containers, the JSON field, the table column ----

def series(comm: str, cgroup_id: int = 0, container: str = "") -> Series:
    vals = np.array([50_000, 60_000, 70_000])
    st = PhaseStats(Histogram.from_values(vals), float(vals.sum()), int(vals.min()), int(vals.max()))
    return Series(1234, comm, "loop0", "7:0", "read", 3, 12288, {"total": st}, tgid=1234, cgroup_id=cgroup_id,
                  container=container)


def dump_of(*ss: Series) -> Dump:
    t = datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC)
    return Dump("interval", t, t + timedelta(seconds=1), "host", "6.18", list(ss))


def test_resolve_containers_fills_series(tree):
    docker = ino(tree / "system.slice" / f"docker-{CID}.scope")
    d = dump_of(series("fio", docker), series("bash", ino(tree / "user.slice")), series("kworker/0:1", 0))
    cgroups.resolve_containers(d, CgroupResolver(root=str(tree)))
    assert [s.container for s in d.series] == [f"docker:{SHORT}", "", ""]


def test_container_in_json_round_trip():
    d = dump_of(series("fio", 7, f"docker:{SHORT}"), series("dd", 8))
    obj = to_json(d)
    assert [s["container"] for s in obj["series"]] == [f"docker:{SHORT}", ""]
    back = from_json(obj)
    assert [s.container for s in back.series] == [f"docker:{SHORT}", ""]
    del obj["series"][0]["container"]        # dumps written before the field read as ""
    assert from_json(obj).series[0].container == ""


def test_container_column_only_when_some_row_has_one():
    plain = io.StringIO()
    render_table(dump_of(series("fio"), series("dd")), plain)
    assert "CONTAINER" not in plain.getvalue()
    mixed = io.StringIO()
    render_table(dump_of(series("fio", 7, f"k8s:pod{UID}/{SHORT}"), series("dd")), mixed)
    lines = mixed.getvalue().splitlines()
    head = next(line for line in lines if "COMM" in line)
    assert head.endswith("CONTAINER")
    fio = next(line for line in lines if " fio " in line)
    dd = next(line for line in lines if " dd " in line)
    assert fio.endswith(f"k8s:pod{UID}/{SHORT}") and dd.endswith(" -")
    # the column starts where its heading does
    assert fio.index("k8s:") == head.index("CONTAINER")


# ---- the real cgroup2 hierarchy: a cgroup's id is its directory's inode ----

def _real_root() -> str | None:
    mount = cgroups.cgroup2_mount()
    return mount[0] if mount and os.geteuid() == 0 and os.access(mount[0], os.W_OK) else None


@pytest.mark.skipif(_real_root() is None, reason="needs root and a writable cgroup2 hierarchy")
def test_real_cgroup_resolves_to_its_path():
    root = Path(_real_root())
    cg = root / f"iotrace-test-{os.getpid()}"
    cg.mkdir()
    child = None
    try:
        child = subprocess.Popen(["sleep", "30"])
        (cg / "cgroup.procs").write_text(str(child.pid))
        # the kernel's own view of where the process is
        line = next(x for x in Path(f"/proc/{child.pid}/cgroup").read_text().splitlines() if x.startswith("0::"))
        assert line == f"0::/{cg.name}"
        r = CgroupResolver()
        assert r.root == str(root)
        assert r.path(ino(cg)) == f"/{cg.name}"
        assert r.path(ino(root)) == "/"
    finally:
        if child:
            child.kill()
            child.wait()
        for _ in range(50):     # the killed process leaves the cgroup asynchronously
            try:
                cg.rmdir()
                break
            except OSError:
                time.sleep(0.05)


# ---- end to end: fio in a cgroup shaped like a Docker container's ----
