"""`iotrace bench`: fio workloads run under iotrace, repeated, summarised into a result file.

Owns the named, versioned suites; the scratch loop device they run on (always
detached and its backing file removed, also on Ctrl-C, SIGTERM and errors);
running each repetition as `python -m tracer.cli -o X.jsonl --dev LOOP -- fio
...` in its own process group, so a failing or stuck run is isolated and can
be stopped whole; and turning its dumps and fio's JSON into a
tracer.model.benchresult.BenchResult.  `iotrace compare` (tracer.cli.compare) reads
two results; the command line is tracer.cli.bench.
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import platform
import signal
import socket
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import TextIO

from tracer.errors import UserError
from tracer.model import benchresult as br
from tracer.text import safe

SCRATCH_MB = 256
DEFAULT_DIR = "/dev/shm"
DEFAULT_REPEAT = 5
DEFAULT_OUTPUT = "bench.json"
SRC_ROOT = Path(__file__).resolve().parent.parent


@dataclass(frozen=True)
class Workload:
    name: str
    fio: tuple[str, ...]        # fio options (or a job file); the bench adds the device and the output


@dataclass(frozen=True)
class Suite:
    name: str
    version: str
    workloads: tuple[Workload, ...]

    @property
    def id(self) -> str:
        return f"{self.name}-{self.version}"


def _job(name: str, *opts: str) -> Workload:
    # every suite job: O_DIRECT (the page cache would hide the device), a fixed length and a fixed
    # random sequence, so repetitions differ only by the machine's noise
    return Workload(name, (f"--name={name}", *opts, "--direct=1", "--time_based=1", "--runtime=2",
                           "--randrepeat=1", "--norandommap=1", "--group_reporting=1"))


# A released suite never changes: results compare only within one suite version.  To change
# a workload, add the next version ("quick-v2") and leave this one as it is.
QUICK_V1 = Suite("quick", "v1", (
    _job("randread-4k-qd1", "--rw=randread", "--bs=4k", "--ioengine=psync"),
    _job("randread-4k-qd32", "--rw=randread", "--bs=4k", "--ioengine=libaio", "--iodepth=32"),
    _job("seqread-1m", "--rw=read", "--bs=1M", "--ioengine=psync"),
    _job("randwrite-4k-fsync", "--rw=randwrite", "--bs=4k", "--ioengine=psync", "--fsync=1"),
))
SUITES = {s.id: s for s in (QUICK_V1,)}
DEFAULT_SUITE = QUICK_V1.id


def find_suite(name: str) -> Suite:
    """A suite by id ("quick-v1"), or by name alone for its newest version ("quick")."""
    if name in SUITES:
        return SUITES[name]
    versions = [s for s in SUITES.values() if s.name == name]
    if versions:
        return max(versions, key=lambda s: int(s.version.lstrip("v")))
    raise UserError(f"--suite {name}: no such suite; known suites: {', '.join(SUITES)}")


@dataclass
class Plan:
    suite: str
    version: str
    workloads: list[Workload]
    repeat: int
    output: str
    directory: str
    dev: str | None


# ---- the device --------------------------------------------------------------

@dataclass(frozen=True)
class Device:
    path: str           # /dev/loop3
    name: str           # loop3
    devno: str          # 7:3
    info: dict          # what the result's environment says about it


def device_at(path: str, **info) -> Device:
    from tracer.sources import devices

    found = devices.device_filter([path])       # resolved as the traced run will resolve its --dev
    dev, name = found.devs[0], found.names[0]
    return Device(f"/dev/{name}", name, devices.devno(dev), {"name": name, **info})


def _fs_type(directory: str) -> str:
    """The filesystem type holding `directory` (longest mount point that contains it)."""
    best, fstype = "", "?"
    real = os.path.realpath(directory)
    try:
        with open("/proc/self/mounts") as f:
            for line in f:
                parts = line.split()
                mnt = parts[1].replace("\\040", " ")
                if (real == mnt or real.startswith(mnt.rstrip("/") + "/")) and len(mnt) >= len(best):
                    best, fstype = mnt, parts[2]
    except OSError:
        pass
    return fstype


@contextmanager
def _signals_held() -> Iterator[None]:
    """Hold SIGINT/SIGTERM (they arrive afterwards) so a second Ctrl-C cannot cut a teardown short."""
    held = {signal.SIGINT, signal.SIGTERM}
    old = signal.pthread_sigmask(signal.SIG_BLOCK, held)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, old)


@contextmanager
def scratch_loop(directory: str, size_mb: int = SCRATCH_MB) -> Iterator[Device]:
    """A loop device over a freshly written file in `directory`; detached and removed on exit."""
    try:
        fd, backing = tempfile.mkstemp(prefix="iotrace-bench-", suffix=".img", dir=directory)
    except OSError as exc:
        raise UserError(f"--dir {directory}: cannot create the scratch device's file: {exc.strerror}") from None
    path = None
    try:
        try:
            # written, not sparse: reads of holes and of data cost differently, and the
            # write workloads would turn one into the other between repetitions
            with os.fdopen(fd, "wb") as f:
                chunk = b"\xa5" * (1 << 20)
                for _ in range(size_mb):
                    f.write(chunk)
        except OSError as exc:
            raise UserError(f"--dir {directory}: cannot write {size_mb} MiB: {exc.strerror}") from None
        with _signals_held():       # attached means recorded, so the finally below detaches it
            r = subprocess.run(["losetup", "--find", "--show", "--direct-io=off", backing],
                               capture_output=True, text=True)
            path = r.stdout.strip() if r.returncode == 0 else None
        if not path:
            raise UserError(f"losetup could not attach a loop device: {r.stderr.strip() or r.returncode}")
        yield device_at(path, kind="loop", backing=backing, backing_fs=_fs_type(directory), size_mb=size_mb)
    finally:
        with _signals_held():
            if path:
                subprocess.run(["losetup", "-d", path], capture_output=True)
            try:
                os.unlink(backing)
            except OSError:
                pass


# ---- one repetition ----------------------------------------------------------

def _child_env() -> dict[str, str]:
    env = dict(os.environ)
    # under sudo the tracer runs its command as the invoking user, who may not open the
    # scratch device; the bench's fio must stay root
    for k in ("SUDO_UID", "SUDO_GID", "SUDO_USER", "SUDO_COMMAND"):
        env.pop(k, None)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(SRC_ROOT), env.get("PYTHONPATH")) if p)
    return env


def _stop(proc: subprocess.Popen) -> None:
    """End a run's whole process group: SIGTERM (iotrace passes it to fio and still exits in order), then KILL.

    An interrupted run's dumps are thrown away, so the grace is short: a tracer
    still compiling its BPF programs (seconds, more on a busy machine) reads
    its SIGTERM only afterwards, and the teardown must not wait for that.
    """
    for sig, wait in ((signal.SIGTERM, 3), (signal.SIGKILL, 5)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(wait)
            return
        except subprocess.TimeoutExpired:
            continue


def _unblock_signals() -> None:
    signal.pthread_sigmask(signal.SIG_SETMASK, set())


def _run(cmd: list[str]) -> tuple[int, str]:
    # started means recorded: a signal between the fork and `proc` would orphan the run.  The
    # child unblocks them again before exec (a blocked mask is inherited), or it would never stop
    with _signals_held():
        proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                text=True, env=_child_env(), start_new_session=True, preexec_fn=_unblock_signals)
    try:
        _, err = proc.communicate()
    except BaseException:
        # Ctrl-C, SIGTERM or anything else: nothing may keep the device open when it is detached
        with _signals_held():       # nor may a second Ctrl-C cut this short
            _stop(proc)
        raise
    return proc.returncode, err


def _why(stderr: str) -> str:
    """The run's last error line: fio's, or iotrace's without its prefix (ours is added once)."""
    lines = [ln.strip().removeprefix("iotrace: ") for ln in stderr.splitlines()
             if ln.strip() and not ln.startswith(("iotrace: tracing", "iotrace: markers"))]
    return lines[-1] if lines else "no message"


def fio_iops(path: Path) -> dict[str, float]:
    """fio's IOPS per iotrace op, summed over the jobs of its JSON output."""
    text = path.read_text()
    obj = json.loads(text[text.index("{"):])      # fio may put a warning line before the JSON
    out: dict[str, float] = {}
    for job in obj["jobs"]:
        for section, op in (("read", "read"), ("write", "write"), ("trim", "discard")):
            st = job.get(section, {})
            if st.get("total_ios"):
                out[op] = out.get(op, 0.0) + float(st["iops"])
    return out


def rep_from(dumps_path: Path, fio_path: Path | None, dev: Device) -> br.Rep:
    """One repetition's record: iotrace's dumps merged per op on the device, with fio's IOPS."""
    from tracer.codec import jsonl
    from tracer.model import dump as dumpmod

    dumps = list(jsonl.read(str(dumps_path)))
    if not dumps:
        raise UserError(f"iotrace wrote no dump to {dumps_path}")
    merged = dumpmod.merge_dumps(dumps)
    # one row per op: every process of the workload together
    rows = dumpmod.merge_by_device_op(s for s in merged.series if s.devno == dev.devno)
    iops = {}
    if fio_path is not None:
        try:
            iops = fio_iops(fio_path)
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise UserError(f"cannot read fio's JSON output {fio_path}: {exc}") from None
    ops = {s.op: br.OpRun(s.count, s.bytes / 1e6, iops.get(s.op),
                          {ph: st.summary_us() for ph, st in s.phases.items() if st.count})
           for s in rows}
    dropped = {k: v for k, v in merged.dropped.items() if v}
    # requests the kernel completed on the device that iotrace neither recorded nor counted as
    # dropped (README, 'Coverage'): a repetition that lost some says so
    unexplained = dumpmod.unexplained_loss(merged.coverage, dropped, dev.name)
    if unexplained > 0:
        dropped["unseen"] = unexplained
    return br.Rep(ops, dropped)


def run_rep(w: Workload, dev: Device, scratch: bool, workdir: Path, n: int) -> br.Rep:
    """Repetition `n` (from 1) of a workload, traced; its files go to `workdir`."""
    dumps_path, fio_path = workdir / f"{w.name}.{n}.jsonl", workdir / f"{w.name}.{n}.fio.json"
    fio = ["fio", *([f"--filename={dev.path}"] if scratch else []), *w.fio,
           "--output-format=json", f"--output={fio_path}"]
    rc, err = _run([sys.executable, "-m", "tracer.cli", "-o", str(dumps_path), "--dev", dev.name, "--", *fio])
    if rc != 0:
        raise UserError(f"workload {w.name}, repetition {n}, failed (exit {rc}): {_why(err)}")
    rep = rep_from(dumps_path, fio_path, dev)
    if not rep.ops:
        raise UserError(f"workload {w.name} did no I/O on {dev.name}"
                        + ("; leave filename= to the bench" if scratch else "; does it use that disk?"))
    return rep


# ---- the run -----------------------------------------------------------------

def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def _quiet(cmd: list[str]) -> str | None:
    try:
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return None
    return r.stdout.strip() if r.returncode == 0 and r.stdout.strip() else None


def environment(dev: Device) -> dict:
    try:
        version = importlib.metadata.version("iotrace")
    except importlib.metadata.PackageNotFoundError:
        version = "unknown"
    # safe.directory: as root, git refuses to read a checkout owned by another user
    commit = _quiet(["git", "-c", f"safe.directory={SRC_ROOT}", "-C", str(SRC_ROOT), "describe", "--always",
                     "--dirty"])
    return {"kernel": platform.release(), "cpu": _cpu_model(), "nproc": os.cpu_count(), "host": socket.gethostname(),
            "device": dev.info, "iotrace": version, "commit": commit, "fio": _quiet(["fio", "--version"]),
            "python": platform.python_version(), "date": datetime.now(UTC).isoformat(timespec="seconds")}


def _describe(rep: br.Rep) -> str:
    from tracer.units import fmt_latency

    parts = []
    for op, o in rep.ops.items():
        total = o.latency_us.get("total", {})
        iops = f" {o.iops:.0f} IOPS" if o.iops else ""
        parts.append(f"{op} {o.count}{iops} p50 {fmt_latency(total.get('p50'))} p99 {fmt_latency(total.get('p99'))}")
    return "; ".join(parts)


def run_plan(plan: Plan, dev: Device, scratch: bool, workdir: Path, progress: TextIO) -> list[br.WorkloadResult]:
    reps: dict[str, list[br.Rep]] = {w.name: [] for w in plan.workloads}
    total, done = plan.repeat * len(plan.workloads), 0
    # round-robin, not one workload at a time: slow drift in the machine then spreads over every
    # workload's repetitions instead of shifting one workload against the others
    for i in range(plan.repeat):
        for w in plan.workloads:
            done += 1
            rep = run_rep(w, dev, scratch, workdir, i + 1)
            reps[w.name].append(rep)
            print(f"bench: {done}/{total} {safe(w.name)} #{i + 1}: {_describe(rep)}", file=progress, flush=True)
    return [br.WorkloadResult(w.name, list(w.fio), reps[w.name]) for w in plan.workloads]


@contextmanager
def interruptible() -> Iterator[None]:
    """SIGINT and SIGTERM unwind as KeyboardInterrupt, so the device is torn down either way.

    Set here, not left to Python's default: a process started with SIGINT
    ignored (a background job of a script, some CI runners) inherits that, and
    Python then installs no KeyboardInterrupt for it, so Ctrl-C did nothing.
    """
    def raise_interrupt(signum, frame):
        raise KeyboardInterrupt

    old = {s: signal.signal(s, raise_interrupt) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for s, handler in old.items():
            signal.signal(s, handler)
