"""Shared fixtures: loop devices that are always torn down, an ext4 on one,
fio, and running iotrace as a real process.

Tests that need root and BPF are marked `bpf`.  Without root or BPF they
skip, except under IOTRACE_REQUIRE_BPF=1 (CI), where they fail instead.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from tracer.model.dump import merge_coverage, unrecorded
from tracer.model.sections import Coverage, read_sections
from tracer.sources.probe import USER_DROPS

ROOT = Path(__file__).resolve().parent.parent
PYTHON = sys.executable
REQUIRE_BPF = os.environ.get("IOTRACE_REQUIRE_BPF") == "1"
NOBODY = 65534
SUDO_ENV = {"SUDO_UID": str(NOBODY), "SUDO_GID": str(NOBODY), "SUDO_USER": "nobody"}

# `sudo -E make test` would hand its SUDO_* to every iotrace the tests start, which would then open
# -o files as that user, in pytest's tmp dirs that only root may enter: a test that means sudo says so
for _var in ("SUDO_UID", "SUDO_GID", "SUDO_USER", "SUDO_COMMAND"):
    os.environ.pop(_var, None)


def bpf_unavailable() -> str | None:
    """Why BPF tests cannot run here, or None."""
    if os.geteuid() != 0:
        return "needs root"
    try:
        import bcc  # noqa: F401
    except ImportError:
        return "bcc is not importable"
    if not Path("/sys/kernel/tracing/events/block").is_dir():
        return "tracefs with block events is not mounted"
    if shutil.which("fio") is None:
        return "fio is not installed"
    return None


def pytest_collection_modifyitems(config, items):
    # tests/privileged/ load BPF programs (root), tests/unit/ never do: the directory says which
    for item in items:
        where = Path(str(item.path)).parent.name
        if where == "privileged":
            item.add_marker(pytest.mark.bpf)
        elif where == "unit" and "bpf" in item.keywords:
            raise pytest.UsageError(f"{item.nodeid} is marked bpf: BPF tests belong in tests/privileged/")
    reason = bpf_unavailable()
    if not reason:
        return
    for item in items:
        if "bpf" in item.keywords:
            if REQUIRE_BPF:
                item.add_marker(pytest.mark.usefixtures("_fail_without_bpf"))
            else:
                item.add_marker(pytest.mark.skip(reason=f"BPF test: {reason}"))


@pytest.fixture
def _fail_without_bpf():
    pytest.fail(f"IOTRACE_REQUIRE_BPF=1 but this BPF test cannot run: {bpf_unavailable()}")


class LoopDevice:
    def __init__(self, path: str, backing: Path):
        self.path = path
        self.name = os.path.basename(path)
        self.backing = backing

    def __repr__(self) -> str:
        return f"LoopDevice({self.path})"


@pytest.fixture
def nobody_dir() -> Iterator[Path]:
    """A fresh directory under /tmp owned by `nobody` (pytest's tmp dirs are closed to it); removed after."""
    d = Path(tempfile.mkdtemp(prefix="iotrace-nobody-", dir="/tmp"))
    try:
        os.chown(d, NOBODY, NOBODY)
        yield d
    finally:
        shutil.rmtree(d, ignore_errors=True)


@pytest.fixture
def make_loop(tmp_path):
    """Factory: make_loop(size_mb=64, backing_dir=None) -> LoopDevice; all detached at teardown."""
    made: list[LoopDevice] = []

    def make(size_mb: int = 64, backing_dir: Path | None = None) -> LoopDevice:
        backing = (backing_dir or tmp_path) / f"loop{len(made)}.img"
        with open(backing, "wb") as f:
            f.truncate(size_mb << 20)
        path = subprocess.run(["losetup", "--find", "--show", "--direct-io=off", str(backing)],
                              check=True, capture_output=True, text=True).stdout.strip()
        dev = LoopDevice(path, backing)
        made.append(dev)
        return dev

    yield make
    for dev in reversed(made):
        subprocess.run(["losetup", "-d", dev.path], check=False, capture_output=True)


@pytest.fixture
def loop(make_loop) -> LoopDevice:
    return make_loop()


def make_ext4(dev: str, mnt: Path, options: str | None = None) -> None:
    """A fresh ext4 on block device `dev`, mounted at `mnt` (made if missing) with mount `options`.

    Inode tables and journal are initialised now: ext4lazyinit would otherwise write while a test traces.
    """
    subprocess.run(["mkfs.ext4", "-q", "-F", "-E", "lazy_itable_init=0,lazy_journal_init=0", dev],
                   check=True, capture_output=True)
    mnt.mkdir(exist_ok=True)
    mount_ext4(dev, mnt, options)


def mount_ext4(dev: str, mnt: Path, options: str | None = None) -> None:
    """mount -o OPTIONS DEV MNT; no_prefetch_block_bitmaps (which keeps ext4 from reading the disk at mount
    while a test traces) is dropped where ext4 does not know it: 5.10's prefetches only when asked."""
    try:
        subprocess.run(["mount", *(["-o", options] if options else []), dev, str(mnt)], check=True,
                       capture_output=True)
    except subprocess.CalledProcessError:
        if not options or "no_prefetch_block_bitmaps" not in options.split(","):
            raise
        rest = ",".join(o for o in options.split(",") if o != "no_prefetch_block_bitmaps")
        subprocess.run(["mount", *(["-o", rest] if rest else []), dev, str(mnt)], check=True, capture_output=True)


def umount(mnt: Path) -> None:
    """Unmount, never failing a teardown: udev may hold a just-detached loop device (and so the file it sat
    on) for a moment, so retry for up to 5 s; if something still holds it (a trainer that outlived a failure),
    detach it lazily so the loop device's own teardown can still let go of it once the holder exits."""
    for _ in range(50):
        if subprocess.run(["umount", str(mnt)], capture_output=True).returncode == 0:
            return
        time.sleep(0.1)
    subprocess.run(["umount", "-l", str(mnt)], check=False, capture_output=True)


@pytest.fixture
def ext4_mnt(make_loop, tmp_path):
    """(loop device, mount point): a fresh ext4 on a 256 MiB loop device; unmounted at teardown."""
    loop = make_loop(256)
    mnt = tmp_path / "mnt"
    # noatime: reading the data must not write inodes; no bitmap prefetch: no background reads
    make_ext4(loop.path, mnt, "noatime,no_prefetch_block_bitmaps")
    try:
        yield loop, mnt
    finally:
        umount(mnt)


def drop_caches() -> None:
    """Write back and drop the page cache, so that the next reads come from the devices."""
    subprocess.run(["sync"], check=True)
    Path("/proc/sys/vm/drop_caches").write_text("3\n")


def framework_python(venv: str, make_target: str) -> Path:
    """The interpreter of a framework's own venv in the checkout (.venv-tf, .venv-torch); without it the
    test skips, or fails under IOTRACE_REQUIRE_BPF=1, saying which make target builds it."""
    python = ROOT / venv / "bin" / "python"
    if not python.exists():
        why = f"no venv at {python}: run `make {make_target}`"
        if REQUIRE_BPF:
            pytest.fail(why)
        pytest.skip(why)
    return python


def epoch_windows(path: Path, epochs: int, context: str = "") -> dict[str, list[dict]]:
    """The marker dumps of a training run whose epochs are tracer.marker windows with a checkpoint
    nested in each, by label; asserts they came in that order ("epoch N" once, after its checkpoint: its
    slices before and after it are folded into one dump, tracer.model.slices)."""
    markers = [d for d in read_dumps(path) if d["kind"] == "marker"]
    expected = ["before epoch 1"] + [label for n in range(1, epochs + 1)
                                     for label in (f"epoch {n} / checkpoint", f"epoch {n}")]
    assert [d["label"] for d in markers] == expected, context
    by_label: dict[str, list[dict]] = {}
    for d in markers:
        by_label.setdefault(d["label"], []).append(d)
    return by_label


def bytes_of(dumps: list[dict], device: str, op: str, tgid: int | None = None) -> int:
    """Bytes of `op` on `device` over `dumps` (of process `tgid` only, if given)."""
    return sum(s["bytes"] for d in dumps for s in series_of(d, device=device, op=op)
               if tgid is None or s["tgid"] == tgid)


def run_traced_group(args: list[str], env: dict[str, str], timeout: float) -> tuple[int, str, str]:
    """Run `python -m tracer.cli ARGS` in its own session, killing the whole group on a timeout.

    run_iotrace would kill only the tracer and leave a traced trainer holding
    a mount; here the trainer (in the tracer's process group) goes too.
    """
    p = subprocess.Popen([PYTHON, "-m", "tracer.cli", *args], cwd=ROOT, env=env, text=True,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)
    try:
        out, err = p.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGKILL)
        out, err = p.communicate()
        pytest.fail(f"the traced training run took more than {timeout}s\nstdout:\n{out}\nstderr:\n{err}")
    return p.returncode, out, err


# Subprocess timeouts are set for this machine's speed; a slower one (a TCG guest: make test-kernels)
# stretches them by this factor.
TIMEOUT_SCALE = float(os.environ.get("IOTRACE_TIMEOUT_SCALE", "1") or 1)


def run_iotrace(args: list[str], timeout: float = 120, **kw) -> subprocess.CompletedProcess:
    """Run `python -m tracer.cli ARGS` and capture its output."""
    return subprocess.run([PYTHON, "-m", "tracer.cli", *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=timeout * TIMEOUT_SCALE, **kw)


@contextmanager
def reaped(*procs: subprocess.Popen) -> Iterator[None]:
    """Processes a test started: whatever the test does or fails, none outlives the block."""
    try:
        yield
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()


def put_json(d, fields: dict):
    """Dump `d` with the sections of `fields` (as a JSON line holds them: {"loop": {...}, ...}) set."""
    sections, unknown = read_sections(fields, set())
    assert not unknown, unknown
    return d.put(*sections.values())


def read_dumps(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def read_stats(name: str) -> tuple[int, int]:
    """(reads completed, ms spent reading) of a disk, from /proc/diskstats."""
    for line in open("/proc/diskstats"):
        f = line.split()
        if f[2] == name:
            return int(f[3]), int(f[6])
    raise AssertionError(f"{name} not in /proc/diskstats")


def fio_cmd(filename: str, name: str = "job", **opts) -> list[str]:
    """A fio command line with --output-format=json; options as keyword arguments."""
    base = {"rw": "randread", "bs": "4k", "size": "16M", "direct": 1, "ioengine": "psync"}
    base.update(opts)
    return ["fio", f"--name={name}", f"--filename={filename}", "--output-format=json",
            *(f"--{k}={v}" for k, v in base.items())]


def series_of(dump: dict, comm: str | None = None, device: str | None = None, op: str | None = None) -> list[dict]:
    return [s for s in dump["series"]
            if (comm is None or s["comm"] == comm) and (device is None or s["device"] == device)
            and (op is None or s["op"] == op)]


def skipped_by_kernel(dumps: list[dict]) -> int:
    """Requests the kernel did not show iotrace, as iotrace counted them (probe.USER_DROPS), over dumps."""
    return sum(d["dropped"].get(reason, 0) for d in dumps for reason in USER_DROPS)


def unseen_on(device: str, dumps: list[dict]) -> int | None:
    """Requests /proc/diskstats completed on `device` that iotrace did not record, over `dumps`;
    None where a pid or cgroup filter leaves some out by design."""
    cov = merge_coverage([Coverage.from_json(d["coverage"]) for d in dumps if "coverage" in d])
    if cov and cov.filtered:
        return None
    return sum(unrecorded(cov, device).values())


def assert_count(got: int, want: int, dumps: list[dict], device: str | None = None) -> None:
    """`got` is exact, short only by requests iotrace counted as never shown it by the kernel
    (USER_DROPS: a skipped start, a completion found lost); on `device`, one only the test uses,
    the coverage against /proc/diskstats must show no more missing (unless a filter leaves some out
    by design): nothing is lost uncounted."""
    skipped = skipped_by_kernel(dumps)
    assert want - skipped <= got <= want, f"count {got}, expected {want} (counted as not shown: {skipped})"
    unseen = unseen_on(device, dumps) if device else None
    if unseen is not None:
        assert unseen <= skipped, f"{unseen} request(s) missing on {device} per /proc/diskstats, {skipped} counted"


def _blkio_v1() -> Path | None:
    """The cgroup v1 blkio hierarchy's mount point, if the host has one with read throttling."""
    try:
        mounts = Path("/proc/self/mounts").read_text().splitlines()
    except OSError:
        return None
    for line in mounts:
        parts = line.split()
        if len(parts) >= 4 and parts[2] == "cgroup" and "blkio" in parts[3].split(","):
            root = Path(parts[1])
            if (root / "blkio.throttle.read_iops_device").exists():
                return root
    return None


def _whole_disk(rdev: int) -> str:
    """'MAJ:MIN' of the disk holding device number `rdev` (a partition's parent disk)."""
    sysdir = Path(f"/sys/dev/block/{os.major(rdev)}:{os.minor(rdev)}")
    if (sysdir / "partition").exists():
        return (sysdir.resolve().parent / "dev").read_text().strip()
    return f"{os.major(rdev)}:{os.minor(rdev)}"


@contextmanager
def traced_event(event: str, flt: str, buffer_kb: int = 4096) -> Iterator[list[str]]:
    """One tracepoint ("category/name") recorded, where `flt` holds, in a private tracefs instance for the
    block (other tracers' and iotrace's own are untouched): a reference of the kernel's own.  Yields a list
    that holds the instance's trace lines once the block has ended; a buffer overrun fails the test."""
    from tracer.sources.probe import tracefs

    inst = tracefs() / "instances" / f"iotrace-ref-{event.replace('/', '-')}-{os.getpid()}"
    inst.mkdir()
    ev = inst / "events" / event
    lines: list[str] = []
    try:
        (inst / "buffer_size_kb").write_text(f"{buffer_kb}\n")
        (ev / "filter").write_text(flt + "\n")
        (ev / "enable").write_text("1\n")
        yield lines
        (ev / "enable").write_text("0\n")
        lines += [ln for ln in (inst / "trace").read_text().splitlines() if not ln.startswith("#")]
        overrun = sum(int(ln.split()[1]) for cpu in (inst / "per_cpu").iterdir()
                      for ln in (cpu / "stats").read_text().splitlines() if ln.startswith("overrun:"))
        assert overrun == 0, f"the {event} reference's buffer overran"
    finally:
        (ev / "enable").write_text("0\n")
        inst.rmdir()


def evict(*paths: Path) -> None:
    """Write back and drop the page cache of these files (directories: every file below them) only, so that
    their next reads come from the device while everything else stays cached."""
    subprocess.run(["sync"], check=True)
    files = []
    for p in paths:
        p = Path(p)
        files += [q for q in p.rglob("*") if q.is_file()] if p.is_dir() else [p]
    for f in files:
        fd = os.open(f, os.O_RDONLY)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


@pytest.fixture
def slow_reads():
    """Factory: slow_reads(loop, bps) -> a cgroup.procs path whose processes read the disk under the loop
    device's backing file at most `bps` bytes a second (blk-throttle).  The loop device issues its reads of
    the backing file on behalf of the reader's cgroup, so the loop device itself is as slow as a slow disk,
    its requests still started by the readers (and their waits I/O wait).  Evict the data set (evict(), with
    the backing file) rather than drop every cache, and move the trainer in once it has imported its
    framework: the processes in the cgroup read everything else from that disk slowly too.  cgroup v1
    blkio, else v2's io.max; skips (fails under IOTRACE_REQUIRE_BPF=1)
    where neither is there.  The cgroup goes at teardown, once the test's processes have left it."""
    made: list[Path] = []

    def make(loop, bps: int) -> Path:
        st_dev = os.stat(loop.backing).st_dev
        why = None
        if os.major(st_dev) == 0:
            why = f"the loop device's backing file is on no disk ({loop.backing}): nothing to throttle"
        else:
            spec = _whole_disk(st_dev)
            name = f"iotrace-test-{os.getpid()}-{len(made)}"
            v1 = _blkio_v1()
            if v1 is not None:
                cg = v1 / name
                cg.mkdir()
                made.append(cg)
                (cg / "blkio.throttle.read_bps_device").write_text(f"{spec} {bps}\n")
                return cg / "cgroup.procs"
            from tracer.sources.cgroups import cgroup2_mount

            found = cgroup2_mount()
            root = Path(found[0]) if found else None
            if root is not None and "io" in (root / "cgroup.controllers").read_text().split():
                try:
                    (root / "cgroup.subtree_control").write_text("+io\n")
                except OSError:
                    pass
                cg = root / name
                cg.mkdir()
                made.append(cg)
                if (cg / "io.max").exists():
                    (cg / "io.max").write_text(f"{spec} rbps={bps}\n")
                    return cg / "cgroup.procs"
            why = "no cgroup blkio (v1) or io (v2) controller to throttle a device's reads with"
        if REQUIRE_BPF:
            pytest.fail(why)
        pytest.skip(why)

    yield make
    for cg in made:
        for _ in range(50):
            try:
                cg.rmdir()
                break
            except OSError:
                import time

                time.sleep(0.1)     # its last processes are still exiting
