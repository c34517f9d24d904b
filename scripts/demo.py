#!/usr/bin/env python3
"""iotrace demo: trace a stand-in training input pipeline on a throwaway disk.

Run as root (the tracer loads BPF programs):

    sudo .venv/bin/python scripts/demo.py        (or: sudo make demo)

It makes a 512 MiB sparse file in a temp dir, attaches it as a loop device,
formats it ext4 and mounts it; writes a small data set there with
scripts/workload.py prepare; syncs and drops the page cache so the first
epoch reads from disk; then runs

    python -m tracer.cli -o TMP/demo.jsonl --dev loopN -- python scripts/workload.py --mark ...

with its tables in a file (TMP/out/live.txt; --save keeps it) and, on this
terminal, the workload's epoch lines and the end of the run: about a screen.  Each epoch of the workload is a marker
window "epoch N" with its checkpoint nested in it, "epoch N / checkpoint"
(tracer.marker), sent with the loop's wait for data; the per-process rows
(on by default, no flag) add each process's I/O wait, file and disk read
bytes and page-cache hits.  It shows the whole run's table, the waits and
iotrace's verdict per window (was the epoch waiting
for the disk, the cold first one, or not, the warm ones?), the top files and
a short guide to reading them.  A disk that
serves 150 MB in a second makes no epoch wait, so by default the workload
reads the disk under the loop device at --slow-disk MB/s (a cgroup's
blk-throttle limit for the workload's processes; 0: the disk's own speed).
Whatever happens (errors, Ctrl-C, SIGTERM) it unmounts, detaches
the loop device and deletes the temp dir.  Needs mkfs.ext4 and losetup;
fio is not needed.  Takes well under a minute.
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
WORKLOAD = ROOT / "scripts" / "workload.py"
PY = sys.executable
DISK_MIB = 512


def say(msg: str) -> None:
    print(f"demo: {msg}", flush=True)


class DemoError(Exception):
    """One line for the user; the demo exits 1 after tearing down."""


# ---- preflight ---------------------------------------------------------------

def preflight() -> None:
    if os.geteuid() != 0:
        raise DemoError("must run as root (it loads BPF programs and makes a loop device): "
                        "sudo .venv/bin/python scripts/demo.py")
    for tool, package in (("mkfs.ext4", "e2fsprogs"), ("losetup", "util-linux"), ("mount", "mount"),
                          ("umount", "mount")):
        if shutil.which(tool) is None:
            raise DemoError(f"{tool} not found in PATH: install the {package} package")
    try:
        import bcc  # noqa: F401
    except ImportError:
        raise DemoError(f"bcc is not importable from {PY}: run 'make setup', use .venv/bin/python") from None
    if not WORKLOAD.is_file():
        raise DemoError(f"{WORKLOAD} is missing")


def run(cmd: list[str], what: str, **kw) -> str:
    """Run a setup command quietly; a failure becomes one DemoError line."""
    p = subprocess.run(cmd, capture_output=True, text=True, **kw)
    if p.returncode != 0:
        detail = (p.stderr or p.stdout).strip().splitlines()
        raise DemoError(f"{what} failed: {' '.join(cmd)}: {detail[-1] if detail else f'exit {p.returncode}'}")
    return p.stdout


# ---- the scratch disk: everything made here is undone by teardown() ---------

class ScratchDisk:
    def __init__(self) -> None:
        self.tmp: Path | None = None
        self.loop: str | None = None

    @property
    def backing(self) -> Path:
        return self.tmp / "disk.img"

    @property
    def mnt(self) -> Path:
        return self.tmp / "mnt"

    def create(self) -> None:
        self.tmp = Path(tempfile.mkdtemp(prefix="iotrace-demo-"))
        os.chmod(self.tmp, 0o755)        # the workload may run as the sudo user
        with open(self.backing, "wb") as f:
            f.truncate(DISK_MIB << 20)   # sparse
        self.loop = run(["losetup", "--find", "--show", str(self.backing)], "attaching a loop device").strip()
        # write the inode tables and journal now, so no ext4lazyinit I/O runs during the trace
        run(["mkfs.ext4", "-q", "-E", "lazy_itable_init=0,lazy_journal_init=0", self.loop], "mkfs.ext4")
        self.mnt.mkdir()
        run(["mount", "-t", "ext4", self.loop, str(self.mnt)], "mounting the loop device")

    def mounted(self) -> bool:
        if self.tmp is None:
            return False
        target = str(self.mnt)
        with open("/proc/self/mountinfo") as f:
            return any(line.split()[4] == target for line in f)

    def attached(self) -> list[str]:
        """Every loop device backed by our file (also one losetup attached just as we were interrupted)."""
        if self.tmp is None:
            return []
        p = subprocess.run(["losetup", "-n", "-O", "NAME", "-j", str(self.backing)],
                           capture_output=True, text=True)
        devs = set(p.stdout.split())
        if self.loop:
            devs.add(self.loop)
        return sorted(devs)

    def teardown(self) -> list[str]:
        """Undo create(), as far as it got; returns what could not be undone."""
        problems = []
        if self.mounted():
            for _ in range(10):
                if subprocess.run(["umount", str(self.mnt)], capture_output=True).returncode == 0:
                    break
                time.sleep(0.3)
            else:
                subprocess.run(["umount", "-l", str(self.mnt)], capture_output=True)
            if self.mounted():
                problems.append(f"{self.mnt} is still mounted")
        for dev in self.attached():
            r = subprocess.run(["losetup", "-d", dev], capture_output=True, text=True)
            if r.returncode != 0 and "No such device" not in r.stderr and "No such device" not in r.stdout:
                problems.append(f"losetup -d {dev}: {r.stderr.strip()}")
        if self.tmp is not None and not self.mounted():
            shutil.rmtree(self.tmp, ignore_errors=True)
            if self.tmp.exists():
                problems.append(f"{self.tmp} could not be removed")
        elif self.tmp is not None:
            problems.append(f"{self.tmp} left in place (still mounted)")
        return problems


def chown_tree(top: Path, uid: int, gid: int) -> None:
    os.chown(top, uid, gid)
    for d, dirs, files in os.walk(top):
        for name in dirs + files:
            os.chown(os.path.join(d, name), uid, gid, follow_symlinks=False)


def drop_caches() -> None:
    os.sync()
    with open("/proc/sys/vm/drop_caches", "w") as f:
        f.write("3\n")


# ---- a slow disk: blk-throttle for the workload's processes ----------------

class SlowDisk:
    """A cgroup whose processes read the disk under `backing` at most `mbps` MB/s (cgroup v1 blkio, else
    v2 io.max).  The loop device reads its backing file for the reader's cgroup, so the loop device is
    as slow as a slow disk.  `wrap(cmd)` runs a command in it; `why` says why there is none."""

    def __init__(self, backing: Path, mbps: float):
        self.cg: Path | None = None
        self.why = ""
        try:
            dev = os.stat(backing).st_dev
            if os.major(dev) == 0:
                raise OSError(f"{backing} is on no disk")
            sysdir = Path(f"/sys/dev/block/{os.major(dev)}:{os.minor(dev)}")
            spec = ((sysdir.resolve().parent / "dev").read_text().strip() if (sysdir / "partition").exists()
                    else f"{os.major(dev)}:{os.minor(dev)}")
            limit = f"{spec} {int(mbps * 1e6)}"
            v1 = Path("/sys/fs/cgroup/blkio")
            if (v1 / "blkio.throttle.read_bps_device").exists():
                self.cg = v1 / f"iotrace-demo-{os.getpid()}"
                self.cg.mkdir()
                (self.cg / "blkio.throttle.read_bps_device").write_text(limit + "\n")
                return
            v2 = Path("/sys/fs/cgroup")
            if "io" not in (v2 / "cgroup.controllers").read_text().split():
                raise OSError("no cgroup io controller")
            (v2 / "cgroup.subtree_control").write_text("+io\n")
            self.cg = v2 / f"iotrace-demo-{os.getpid()}"
            self.cg.mkdir()
            (self.cg / "io.max").write_text(limit.replace(" ", " rbps=") + "\n")
        except OSError as exc:
            self.why = str(exc.strerror or exc)
            self.remove()

    def wrap(self, cmd: list[str]) -> list[str]:
        if self.cg is None:
            return cmd
        return ["sh", "-c", 'echo $$ > "$0" && exec "$@"', str(self.cg / "cgroup.procs"), *cmd]

    def remove(self) -> None:
        if self.cg is not None:
            for _ in range(50):
                try:
                    self.cg.rmdir()
                    break
                except FileNotFoundError:
                    break
                except OSError:
                    time.sleep(0.1)     # the workload's last processes are still exiting
            self.cg = None


# ---- running the tracer ------------------------------------------------------

def run_traced(cmd: list[str], stdout) -> int:
    """Run the tracer in its own process group, its output (and the workload's) to `stdout`, its errors to
    this terminal.

    Ctrl-C (or SIGTERM to the demo) is passed on to the whole group, as a
    terminal would: the workload stops, the tracer prints what it has.  A
    second Ctrl-C ends the tracer too, a third kills the group.
    """
    proc = subprocess.Popen(cmd, cwd=ROOT, process_group=0, stdout=stdout)
    pgid = proc.pid
    interrupts = 0
    try:
        while True:
            try:
                return proc.wait()
            except KeyboardInterrupt:
                interrupts += 1
                if interrupts == 1:
                    print(file=sys.stderr)
                    say("interrupted: stopping the workload; the tracer prints what it collected "
                        "(Ctrl-C again to stop it now)")
                _signal_group(pgid, signal.SIGINT if interrupts < 3 else signal.SIGKILL)
    finally:
        # nothing of the group may outlive the tracer: it would keep the mount busy
        if proc.poll() is None:
            _signal_group(pgid, signal.SIGKILL)
            proc.wait()
        if _signal_group(pgid, 0):
            _signal_group(pgid, signal.SIGTERM)
            for _ in range(20):
                if not _signal_group(pgid, 0):
                    break
                time.sleep(0.1)
            else:
                _signal_group(pgid, signal.SIGKILL)


def _signal_group(pgid: int, sig: int) -> bool:
    try:
        os.killpg(pgid, sig)
        return True
    except ProcessLookupError:
        return False


# ---- after the run -----------------------------------------------------------

GUIDE = """\
\nHow to read it (the tracer's table of each window is in {live}: {n} lines)
  * A row per process, disk and op: loader-N are the input workers, trainer the main process, which
    writes the checkpoint ('epoch N / checkpoint', a window nested in 'epoch N').  p50 is the typical
    request, p99 1 in 100 waited longer: a step waits for its slowest batch, so the tail stalls the GPU.
    QUEUE is a request's wait before the disk took it, DEVICE the disk's own time.
  * Epoch 1 is cold (the page cache was dropped): the loaders read from disk and wait; the ~150 MB
    data set then fits in RAM, so epochs 2 and 3 hardly touch the disk.  The verdicts above say it.
  * Epochs side by side: iotrace report FILE --by label (keep FILE with --save)."""


def summary(live: Path) -> list[str]:
    """What the demo shows of the tracer's output: the workload's epoch lines and the end of the run (the
    whole run's table, the waits and verdicts per window, the files), from the first 'whole run' line."""
    try:
        lines = live.read_text(errors="replace").splitlines()
    except OSError:
        return []
    end = next((i for i, line in enumerate(lines) if line.startswith("whole run:")), len(lines))
    epochs = [line for line in lines[:end] if line.startswith("epoch ") and "/" in line.split(":", 1)[0]]
    return epochs + lines[end:]


def _raise_interrupt(signum, frame):
    raise KeyboardInterrupt


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="demo.py", formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Trace a stand-in training input pipeline (scripts/workload.py) with iotrace on a "
        "throwaway 512 MiB ext4 loop disk: cold first epoch, checkpoint writes, per-process p50/p99/p99.9.",
        epilog="What it does, as root:\n"
               "  1. temp dir, 512 MiB sparse file, losetup --find --show, mkfs.ext4 -q, mount\n"
               "  2. workload.py prepare (2000 small samples + 4 x 16 MiB shards), sync,\n"
               "     echo 3 > /proc/sys/vm/drop_caches (so epoch 1 reads from disk)\n"
               "  3. python -m tracer.cli -o TMP/demo.jsonl --dev loopN -- "
               "python scripts/workload.py --mark ...\n"
               "     (each epoch a marker window 'epoch N', its checkpoint 'epoch N / checkpoint')\n"
               "  4. the end of the tracer's output (whole run, waits and verdict per epoch: cold epoch 1\n"
               "     vs the warm ones, top files) and a short guide; every window's table is in a file\n"
               "  5. always (also on error or Ctrl-C): umount, losetup -d, remove the temp dir\n"
               "Needs root, bcc (make setup), mkfs.ext4 and losetup; fio is not needed. Under a minute.")
    p.add_argument("--epochs", type=int, default=3, help="training epochs (default 3)")
    p.add_argument("--workers", type=int, default=4, help="loader worker processes (default 4)")
    p.add_argument("--slow-disk", type=float, default=40.0, metavar="MBPS",
                   help="the workload reads the disk under the loop device at this many MB/s (default 40; "
                        "0: the disk's own speed, at which even a cold epoch may not wait)")
    p.add_argument("--save", metavar="FILE.jsonl",
                   help="copy the tracer's dumps here before the temp dir goes, for "
                        "'python -m tracer.cli report FILE.jsonl'")
    ns = p.parse_args(argv)

    # SIGTERM takes the same way out as Ctrl-C: through every finally below
    signal.signal(signal.SIGTERM, _raise_interrupt)
    try:
        preflight()
    except DemoError as exc:
        say(f"error: {exc}")
        return 1
    t0 = time.monotonic()
    disk = ScratchDisk()
    slow = None
    status = 0
    try:
        disk.create()
        name = os.path.basename(disk.loop)
        say(f"{disk.loop}: {DISK_MIB} MiB sparse file, ext4, mounted on {disk.mnt}")
        data, ckpt = disk.mnt / "data", disk.mnt / "checkpoints"
        subprocess.run([PY, str(WORKLOAD), "prepare", str(data)], check=True)
        ckpt.mkdir()
        if os.environ.get("SUDO_UID"):   # the tracer runs the command as the sudo user
            chown_tree(disk.mnt, int(os.environ["SUDO_UID"]), int(os.environ.get("SUDO_GID", "0")))
        drop_caches()
        say("synced and dropped the page cache: epoch 1 starts cold")
        # under sudo the tracer opens -o as the sudo user (tracer.osutil): a directory of theirs for it
        out_dir = disk.tmp / "out"
        out_dir.mkdir()
        if os.environ.get("SUDO_UID"):
            os.chown(out_dir, int(os.environ["SUDO_UID"]), int(os.environ.get("SUDO_GID", "0")))
        dump = out_dir / "demo.jsonl"
        workload = [PY, str(WORKLOAD), str(data), "--epochs", str(ns.epochs), "--workers", str(ns.workers),
                    "--checkpoint-dir", str(ckpt), "--mark"]
        if ns.slow_disk > 0:
            slow = SlowDisk(disk.backing, ns.slow_disk)
            say(f"the workload reads the disk at most {ns.slow_disk:g} MB/s (cgroup {slow.cg})" if slow.cg else
                f"cannot slow the disk down ({slow.why}): the workload reads it at its own speed")
            workload = slow.wrap(workload)
        cmd = [PY, "-m", "tracer.cli", "-o", str(dump), "--dev", name, "--", *workload]
        say("running: " + " ".join(os.path.relpath(c, ROOT) if c.startswith(str(ROOT)) else c for c in cmd))
        sys.stdout.flush()
        live = out_dir / "live.txt"
        with open(live, "w") as f:
            status = run_traced(cmd, f)
        if ns.save and dump.exists() and dump.stat().st_size:
            shutil.copyfile(dump, ns.save)
            shutil.copyfile(live, ns.save + ".txt")
        lines = summary(live)
        if lines:
            print("\n".join(lines))
            n = sum(1 for _ in open(live, errors="replace"))
            print(GUIDE.format(live=f"{ns.save}.txt" if ns.save else "the temp dir", n=n))
            if ns.save:
                say(f"dumps saved to {ns.save}, the tracer's tables to {ns.save}.txt: render them again with "
                    f"'python -m tracer.cli report {ns.save}'")
        if status != 0:
            say(f"the tracer exited with status {status}"
                + ("" if lines else " before writing any report"))
    except DemoError as exc:
        say(f"error: {exc}")
        status = 1
    except subprocess.CalledProcessError as exc:
        say(f"error: {' '.join(map(str, exc.cmd))} exited with status {exc.returncode}")
        status = 1
    except KeyboardInterrupt:
        print(file=sys.stderr)
        say("interrupted")
        status = 130
    finally:
        # a second Ctrl-C must not cut the teardown short
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        if slow is not None:
            slow.remove()
        problems = disk.teardown()
        for prob in problems:
            say(f"teardown: {prob}")
        if disk.tmp is not None and not problems:
            say(f"cleaned up: unmounted, detached {disk.loop or 'no loop device'}, removed {disk.tmp}")
        say(f"took {time.monotonic() - t0:.1f} s")
    return status or (1 if problems else 0)


if __name__ == "__main__":
    sys.exit(main())
