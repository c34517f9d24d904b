"""`make test-kernels`: the project's BPF tests on other kernels, each booted under qemu (TCG).

For each kernel in scripts/kernels/kernels.list (or --kernel): build its guest image once
(build_image.sh, cached outside the clone under a hash of the recipe), put this work tree on a fresh
second disk, boot the image from a throw-away qcow2 overlay, run the fio measurement
(guest_fio.py) and the chosen tests (guest_run.sh, tcg_budget.py) inside it, read the results back
from the disk with debugfs after the guest has powered off, and print

  - one table, test x kernel -> passed / failed / skipped / too slow under TCG / not run,
  - fio's requests against what iotrace recorded and which block tracepoints fired for them,
  - how long the build, the boot, the measurement and the tests took.

Nothing of a run outlives it on the host: qemu is killed on every exit (an exception, SIGTERM, ^C),
the run directory is removed, and no image is ever mounted or attached to a loop device here.
The results and the console log stay in $IOTRACE_KERNEL_CACHE/logs/<kernel>/ for a look afterwards.

Exit status: 0 when every test passed or skipped on every kernel, 1 otherwise.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent
CACHE = Path(os.environ.get("IOTRACE_KERNEL_CACHE", "/var/cache/iotrace-kernels"))

# The tests the matrix runs by default, cheapest first so that a spent budget cuts the most expensive:
# test_btf reads the guest's own /sys/kernel/btf/vmlinux; ground truth and attribution are what an old
# kernel's start event must get right (both parametrized over the attach paths).  Under TCG they take
# ~50 min a kernel (~1-2 min a test).  `--tests all` adds the core counts and percentiles, identity
# under load and --tasks (~2 h more).
DEFAULT_TESTS = [
    "tests/unit/test_btf.py",
    "tests/privileged/test_truth.py",
    "tests/privileged/test_attribution.py",
]
MORE_TESTS = [
    "tests/privileged/test_core.py",
    "tests/privileged/test_identity.py",
    "tests/privileged/test_tasks.py",
]

LABEL = {"passed": "passed", "failed": "FAILED", "timed out": "FAILED (its own timeout: TCG?)", "skipped": "skipped",
         "too slow": "too slow under TCG", "not run": "not run (budget)", "lost": "not run (guest stopped)"}


def log(msg: str) -> None:
    print(f"test-kernels: {msg}", flush=True)


def read_list(path: Path) -> list[list[str]]:
    """kernels.list's lines, each split into its package and the releases its image is built from."""
    return [ln.split("#", 1)[0].split() for ln in path.read_text().splitlines() if ln.split("#", 1)[0].strip()]


def kernel_entry(arg: str, listed: list[list[str]]) -> list[str]:
    """--kernel's argument as a kernels.list line: a listed package alone brings its releases along."""
    fields = arg.split()
    if len(fields) == 1:
        for entry in listed:
            if entry[0] == fields[0]:
                return entry
    return fields


def ensure_host_tools() -> None:
    """qemu and qemu-img from Debian, installed on first use (apt-get update once if need be)."""
    if shutil.which("qemu-system-x86_64") and shutil.which("qemu-img") and shutil.which("debugfs"):
        return
    pkgs = ["qemu-system-x86", "qemu-utils", "e2fsprogs"]
    log(f"apt-get install {' '.join(pkgs)}")
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    cmd = ["apt-get", "install", "-y", "-q", "--no-install-recommends", *pkgs]
    if subprocess.run(cmd, env=env, capture_output=True).returncode != 0:
        subprocess.run(["apt-get", "update", "-q"], env=env, check=True, capture_output=True)
        subprocess.run(cmd, env=env, check=True, capture_output=True)


def build(entry: list[str]) -> tuple[Path, float, bool]:
    """(image dir, seconds spent, whether it was built now rather than found cached)."""
    t0 = time.monotonic()
    wall0 = time.time()
    r = subprocess.run(["bash", str(HERE / "build_image.sh"), *entry], stdout=subprocess.PIPE, text=True)
    if r.returncode != 0:
        raise RuntimeError(f"building the image for {entry[0]} failed (see above)")
    out = Path(r.stdout.strip().splitlines()[-1])
    built = (out / "ready").stat().st_mtime >= wall0 - 1      # made by this call, not found in the cache
    return out, time.monotonic() - t0, built


def tree_files() -> list[str]:
    """The work tree as git knows it: tracked files, and new ones not ignored (so uncommitted work runs)."""
    out = subprocess.run(["git", "-C", str(REPO), "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
                         check=True, capture_output=True).stdout
    return [f for f in out.decode().split("\0") if f]


def make_tree_disk(run: Path, env: dict[str, str]) -> Path:
    """A sparse ext4 image holding src/ (the tree), run.env and room for the tests' loop backing files."""
    top = run / "disk"
    src = top / "src"
    for f in tree_files():
        p = REPO / f
        if not (p.is_file() or p.is_symlink()):
            continue                    # deleted in the work tree, still in the index
        (src / f).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(p, src / f, follow_symlinks=False)
    (top / "run.env").write_text("".join(f"export {k}={shlex.quote(v)}\n" for k, v in env.items()))
    img = run / "tree.img"
    subprocess.run(["mke2fs", "-q", "-t", "ext4", "-L", "iotrace-tree", "-d", str(top), str(img), "8G"],
                   check=True)
    shutil.rmtree(top)
    return img


# qemu 7.2's multi-threaded TCG (one host thread per vCPU) did not survive the kernel rewriting its own
# code while the other vCPU runs it (text_poke_bp, on every tracepoint attach and detach: iotrace's start
# and exit): guest_textpoke.py's churn crashed Debian 13's 6.12 in three boots of three (an int3 Oops at
# a patched site, as in a CI run's fio measurement) and wedged Debian 12's 6.1 in one of one (an RCU
# stall, then silence, as twice in CI), each within 80 s of boot; under thread=single it ran 300 cycles
# whole on 6.12, 6.1 and 5.10.  docs/kernels.md has the runs.
TCG_THREAD = "single"


class Guest:
    """One qemu process; stop() kills it (and anything in its process group) for certain."""

    def __init__(self, image: Path, overlay: Path, tree: Path, console: Path, tcg_thread: str = TCG_THREAD):
        self.console = console
        # TCG: a KVM guest hangs here before the kernel prints anything (kvm-pvm: docs/kernels.md).
        # thread=single (TCG_THREAD): both vCPUs take turns on one host thread.  -cpu max: numpy needs
        # instructions qemu's default CPU model lacks.  panic=1 + -no-reboot: a crash ends qemu.  loglevel=5:
        # warnings reach the console, and with them a lockup's or an Oops' registers and stack.
        self.cmd = [
            "qemu-system-x86_64", "-accel", f"tcg,thread={tcg_thread}", "-cpu", "max", "-smp", "2", "-m", "3G",
            "-kernel", str(image / "vmlinuz"), "-initrd", str(image / "initrd.img"),
            "-drive", f"file={overlay},format=qcow2,if=virtio",
            "-drive", f"file={tree},format=raw,if=virtio",
            "-append", "root=/dev/vda rw console=ttyS0 init=/iotrace-init panic=1 loglevel=5",
            "-display", "none", "-monitor", "none", "-serial", f"file:{console}",
            "-no-reboot", "-nic", "none",
        ]
        self.proc: subprocess.Popen | None = None

    def start(self) -> None:
        self.proc = subprocess.Popen(self.cmd, stdin=subprocess.DEVNULL, start_new_session=True)

    def stop(self) -> None:
        p = self.proc
        if p is None or p.poll() is not None:
            return
        for sig, wait in ((signal.SIGTERM, 5), (signal.SIGKILL, 10)):
            try:
                os.killpg(p.pid, sig)
            except ProcessLookupError:
                return
            try:
                p.wait(wait)
                return
            except subprocess.TimeoutExpired:
                pass


# What a guest kernel prints when a CPU stops answering.  Should a guest wedge all the same, it is
# booted again (--attempts) rather than left to hold CI until its limit.
LOCKUP = re.compile(r"watchdog: BUG: soft lockup|rcu: INFO: rcu_\w+ (self-detected stall|detected stalls)")
# What it prints when it crashes (panic=1 then ends qemu): the first such line is the report's problem.
CRASH = re.compile(r"\bOops: |Kernel panic - not syncing|kernel BUG at |BUG: unable to handle|general protection fault")


class StallWatch:
    """Decides, from the console's lines and when they came, that a guest has wedged: no progress line
    (the guest's own `iotrace-guest: ...`, `tcg_budget: ...`, `guest_fio: ...` lines) for `silence`
    seconds, or for `after_lockup` seconds once the kernel has reported a CPU stuck (LOCKUP).  The
    guest's own limits (a test's, a fio run's) print a line when they fire, so silence past them is a
    guest that no longer runs."""

    def __init__(self, silence: float, after_lockup: float, now: float):
        self.silence, self.after_lockup = silence, after_lockup
        self.last_progress = now
        self.lockup: tuple[float, str] | None = None     # (when, the line) since the last progress line
        self.crash: str | None = None                    # the first line of a kernel crash, if one came

    def feed(self, line: str, progress: bool, now: float) -> None:
        if progress:
            self.last_progress, self.lockup = now, None
        elif self.lockup is None and LOCKUP.search(line):
            self.lockup = (now, line.strip())
        if self.crash is None and not progress and CRASH.search(line):
            self.crash = line.strip()

    def hung(self, now: float) -> str | None:
        """Why the guest counts as wedged now, or None."""
        quiet = now - self.last_progress
        if self.lockup is not None and now - self.lockup[0] >= self.after_lockup:
            return f"its kernel reported a stuck CPU ({self.lockup[1][:120]}) and printed no progress for {quiet:.0f} s"
        if quiet >= self.silence:
            return f"it printed no progress line for {quiet:.0f} s"
        return None


PROGRESS = re.compile(r"(iotrace-guest|tcg_budget|iotrace-init|guest_fio|guest_tpmiss|guest_textpoke): .*")


def watch(guest: Guest, deadline: float, stall: StallWatch) -> tuple[float | None, str]:
    """Follow the console until qemu exits, the deadline passes or the guest wedges (`stall`), echoing
    the guest's progress lines.  Returns (seconds from qemu's start to the guest's first line, how it
    ended: "exited", "deadline" or "hung: <why>")."""
    t0 = time.monotonic()
    up = None
    pos = 0
    while True:
        if guest.console.exists():
            with open(guest.console, "rb") as f:
                f.seek(pos)
                chunk = f.read()
            # only whole lines; the rest is read next time
            cut = chunk.rfind(b"\n") + 1
            pos += cut
            now = time.monotonic()
            for line in chunk[:cut].decode(errors="replace").splitlines():
                # pytest's progress dots may stand before a line on the same console
                m = PROGRESS.search(line)
                stall.feed(line, m is not None, now)
                if m:
                    line = m.group(0)
                    print(f"  guest | {line[:200]}", flush=True)
                if up is None and line.startswith("iotrace-guest: up"):
                    up = time.monotonic() - t0
        if guest.proc.poll() is not None:
            return up, "exited"
        now = time.monotonic()
        if now > deadline:
            return up, "deadline"
        why = stall.hung(now)
        if why:
            return up, f"hung: {why}"
        time.sleep(1)


def fetch_results(tree: Path, dest: Path) -> None:
    """Copy /results out of the (unmounted) ext4 image with debugfs: no mount, no loop device."""
    if dest.exists():
        shutil.rmtree(dest)
    dest.mkdir(parents=True)
    # rdump makes dest/results/; its files move up to dest/
    subprocess.run(["debugfs", "-R", f"rdump /results {dest}", str(tree)], check=False, capture_output=True)
    if (dest / "results").is_dir():
        for f in (dest / "results").iterdir():
            f.rename(dest / f.name)
        (dest / "results").rmdir()


def boot(image: Path, run: Path, kernel: str, args, env: dict[str, str], res: dict) -> tuple[Path, str]:
    """One boot of the image over a fresh overlay and tree disk in `run`: (the tree disk, how it ended:
    "exited", "deadline" or "hung: <why>")."""
    run.mkdir()
    t = time.monotonic()
    tree = make_tree_disk(run, env)
    overlay = run / "root.qcow2"
    subprocess.run(["qemu-img", "create", "-q", "-f", "qcow2", "-F", "raw", "-b", str(image / "root.img"),
                    str(overlay)], check=True)
    res["timings"]["prepare"] = f"{time.monotonic() - t:.0f} s"
    guest = Guest(image, overlay, tree, run / "console.log", args.tcg_thread)
    # the guest's own limits, plus boot and shutdown
    limit = (args.boot_timeout + (4 * args.fio_timeout if not args.no_fio else 0)
             + (900 if args.nullblk else 0) + (4 * args.fio_timeout if args.probe_misses else 0)
             + args.text_poke + args.budget + args.test_timeout + 300)
    log(f"{kernel}: booting (TCG thread={args.tcg_thread}, -smp 2; at most {limit / 60:.0f} min)")
    t = time.monotonic()
    stall = StallWatch(args.stall_timeout, args.lockup_timeout, t)
    try:
        guest.start()
        up, ended = watch(guest, t + limit, stall)
    finally:
        guest.stop()
    if stall.crash:
        res["problems"].append(f"the guest's kernel crashed: {stall.crash[:160]} (see console.log)")
    res["timings"]["guest"] = f"{time.monotonic() - t:.0f} s"
    if up is not None:
        res["timings"]["boot"] = f"{up:.0f} s to init"
    elif not ended.startswith("hung"):     # a wedged boot is run_kernel's to report (retried or not)
        res["problems"].append("the guest never reached its init (see console.log)")
    if ended == "deadline":
        res["problems"].append(f"the guest was still running after {limit:.0f} s: killed")
    return tree, ended


def new_result(kernel: str) -> dict:
    """One kernel's result, filled by a boot (run_kernel) or from the saved logs (load_results)."""
    return {"kernel": kernel, "tests": {}, "fio": None, "timings": {}, "problems": [], "notes": []}


def run_kernel(entry: list[str], args, env: dict[str, str]) -> dict:
    kernel = entry[0]
    res = new_result(kernel)
    image, took, built = build(entry)
    res["timings"]["build"] = f"{took:.0f} s (built now)" if built else "cached"
    if built:
        res["timings"]["build_seconds"] = round(took)
    keep = CACHE / "logs" / kernel
    run = Path(tempfile.mkdtemp(prefix="iotrace-kernels-run-", dir="/var/tmp"))
    wedged: list[Path] = []         # the consoles of boots that wedged and were retried, kept beside the last
    try:
        for attempt in range(1, args.attempts + 1):
            tree, ended = boot(image, run / f"boot{attempt}", kernel, args, env, res)
            if not ended.startswith("hung"):
                break
            why = f"boot {attempt} wedged: {ended.removeprefix('hung: ')}; qemu killed"
            log(f"{kernel}: {why}")
            if attempt < args.attempts:
                wedged.append(run / f"boot{attempt}" / "console.log")
                res["notes"].append(f"{why}, booted again (console-boot{attempt}.log)")
            else:
                res["problems"].append(why)
        fetch_results(tree, keep)
        shutil.copy(tree.parent / "console.log", keep / "console.log")
        for i, console in enumerate(wedged, 1):
            shutil.copy(console, keep / f"console-boot{i}.log")
    finally:
        shutil.rmtree(run, ignore_errors=True)

    return load_results(res, keep, args)


# The perf-event path's bound: completions the kernel skipped while another perf-event BPF program (or a
# map system call) held the CPU's guard, each counted as lost_completion (block_rq_complete's
# recursion_misses).  Measured in Debian 13's 6.12 guest: 16, 16, 9 and 1 of 4096 under a loaded host, 0 in
# three runs on a quiet one; 1% leaves room for a slower host and still fails a silent or uncounted loss.
TRACEPOINT_LOSS_BOUND = 0.01


def fio_problems(fio: dict) -> list[str]:
    """The fio runs in which iotrace did not record every request the disk completed (the run then
    fails; on the perf-event path, up to TRACEPOINT_LOSS_BOUND of them counted as lost_completion
    pass), the disk's requests and merges do not add up to fio's I/Os, the device did not take the
    scheduler the run is for, or iotrace ran without its per-process programs or their I/O wait (on by
    default: a kernel that refuses them would otherwise only leave a note)."""
    out = []
    for r in fio.get("runs", []):
        if r.get("iotrace_recorded") is not None:
            io_wait = (r.get("iotrace_tasks_sources") or {}).get("io_wait", "")
            if not io_wait or io_wait.startswith("unavailable"):
                out.append(f"fio {r.get('scheduler')}/{r.get('attach')}: no per-process I/O wait "
                           f"({io_wait or 'the per-process programs did not load'}): "
                           f"{(r.get('iotrace_stderr') or '').strip()[-300:]}")
        sched, chosen = r.get("scheduler"), r.get("scheduler_set")
        if chosen is not None and f"[{sched}]" not in chosen.split():
            # Linux 5.10's loop devices take no I/O scheduler: the run was not the one its row names
            out.append(f"fio {sched}/{r.get('attach')}: the device's scheduler was {chosen}, not {sched} "
                       f"(offered: {r.get('schedulers_offered')})")
        want, got = r.get("fio_total_ios"), r.get("iotrace_recorded")
        stat = r.get("diskstats", {})
        disk, merged = stat.get("read", want), stat.get("read_merges")
        lost = (r.get("iotrace_dropped") or {}).get("lost_completion", 0)
        if (r.get("attach") == "tracepoint" and not r.get("error") and got is not None and got != disk
                and got + lost == disk and lost <= disk * TRACEPOINT_LOSS_BOUND):
            # the perf-event path's shared guard: completions the kernel skipped, each counted (README)
            continue
        if r.get("error") or want is None or got != disk:
            out.append(f"fio {r.get('scheduler')}/{r.get('attach')}: iotrace recorded {got} of the disk's {disk} "
                       f"requests (fio made {want})" + (f" ({r['error']})" if r.get("error") else ""))
        elif disk != want and (merged is None or disk + merged != want):
            out.append(f"fio {r.get('scheduler')}/{r.get('attach')}: the disk completed {disk} requests, "
                       f"{merged if merged is not None else '?'} merged, for fio's {want}")
    return out


def load_results(res: dict, keep: Path, args) -> dict:
    """The guest's results as saved in `keep` (a run just now, or --from-logs)."""
    res["logs"] = str(keep)
    res["tests_asked"] = bool(args.tests.strip())   # --tests "": a measurement only, no test is missing
    genv = {}
    if (keep / "guest.env").exists():
        genv = dict(ln.split("=", 1) for ln in (keep / "guest.env").read_text().splitlines() if "=" in ln)
    res["guest"] = genv
    for k in ("boot_seconds", "textpoke_seconds", "fio_seconds", "nullblk_seconds", "pytest_seconds"):
        if k in genv:
            res["timings"][k.replace("_seconds", "") + " (guest clock)"] = f"{float(genv[k]):.0f} s"
    if (keep / "fio.json").exists():
        res["fio"] = json.loads((keep / "fio.json").read_text())
        res["problems"] += fio_problems(res["fio"])
    elif not args.no_fio:
        res["problems"].append("no fio.json: the measurement did not finish (see console.log)")

    if (keep / "textpoke.json").exists():
        tp = json.loads((keep / "textpoke.json").read_text())
        res["notes"].append(
            f"text-poke churn: {tp['cycles']} attach/detach cycles of {', '.join(tp['events'])} under "
            f"{tp['load']}, {tp['seconds']:.0f} s, the guest alive after it")
    elif args.text_poke:
        res["problems"].append("no textpoke.json: the attach/detach churn did not finish (see console.log)")

    if (keep / "nullblk.json").exists():
        res["nullblk"] = json.loads((keep / "nullblk.json").read_text())
    elif args.nullblk:
        res["problems"].append("no nullblk.json: the null_blk measurement did not finish (see console.log)")

    collected = []
    if not args.tests.strip():
        pass            # no tests asked for: a collected.txt in the logs is an earlier run's
    elif (keep / "collected.txt").exists():
        collected = [ln.strip() for ln in (keep / "collected.txt").read_text().splitlines() if "::" in ln]
    else:
        res["problems"].append("pytest collected nothing (see console.log)")
    records = {}
    if args.tests.strip() and (keep / "tests.jsonl").exists():
        for ln in (keep / "tests.jsonl").read_text().splitlines():
            try:
                r = json.loads(ln)
            except ValueError:
                continue            # a line cut by a power-off
            records[r["nodeid"]] = r
    for nodeid in collected + [n for n in records if n not in collected]:
        res["tests"][nodeid] = records.get(nodeid, {"nodeid": nodeid, "outcome": "lost", "seconds": 0,
                                                    "detail": "no result: pytest or the guest stopped first"})
    return res


# ---- the report ---------------------------------------------------------------------------------

def rows_of(results: list[dict]) -> list[tuple[str, list[str]]]:
    """Table rows: one per test of tests/privileged; tests/unit's parametrized cases folded into one row
    per test function (test_btf alone has ~200 of them)."""
    order: list[str] = []
    cells: dict[str, list[list[str]]] = {}
    for i, res in enumerate(results):
        for nodeid, r in res["tests"].items():
            key = re.sub(r"\[.*\]$", "", nodeid) if nodeid.startswith("tests/unit/") else nodeid
            if key not in cells:
                order.append(key)
                cells[key] = [[] for _ in results]
            cells[key][i].append(r["outcome"])
    out = []
    for key in order:
        row = []
        for outs in cells[key]:
            if not outs:
                row.append("-")
            elif len(outs) == 1:
                row.append(LABEL[outs[0]])
            else:
                counts: dict[str, int] = {}
                for o in outs:
                    counts[o] = counts.get(o, 0) + 1
                row.append(", ".join(f"{n} {LABEL[o]}" for o, n in sorted(counts.items(), key=lambda x: -x[1])))
        out.append((key, row))
    return out


def table(header: list[str], rows: list[list[str]]) -> str:
    widths = [max(len(str(r[i])) for r in [header, *rows]) for i in range(len(header))]
    fmt = "  ".join(f"{{:<{w}}}" for w in widths)
    lines = [fmt.format(*header), fmt.format(*("-" * w for w in widths))]
    lines += [fmt.format(*map(str, r)) for r in rows]
    return "\n".join(lines)


def report(results: list[dict]) -> bool:
    names = [r["kernel"].removeprefix("linux-image-") for r in results]
    print()
    print("== Kernels tested: test x kernel (TCG guests) ==")
    print(table(["test", *names], [[k, *row] for k, row in rows_of(results)]))
    ok = True
    for res, name in zip(results, names, strict=True):
        counts: dict[str, int] = {}
        for r in res["tests"].values():
            counts[r["outcome"]] = counts.get(r["outcome"], 0) + 1
        print(f"{name}: " + ", ".join(f"{n} {LABEL[o]}" for o, n in sorted(counts.items())))
        if (any(o not in ("passed", "skipped") for o in counts) or (not res["tests"] and res.get("tests_asked", True))
                or res["problems"]):
            ok = False

    for res, name in zip(results, names, strict=True):
        bad = [r for r in res["tests"].values() if r["outcome"] not in ("passed", "skipped")]
        if bad:
            print(f"\n-- {name}: why (first line; full output in {res['logs']}/console.log) --")
            for r in bad:
                print(f"{r['nodeid']}  [{LABEL[r['outcome']]}, {r['seconds']:.0f} s] {r['detail'][:200]}")

    for res, name in zip(results, names, strict=True):
        fio = res.get("fio")
        if not fio:
            continue
        print(f"\n== {name}: fio 4 KiB randread O_DIRECT, libaio, 2 jobs x qd16, {fio['requests']} requests, "
              "loop device on a file on ext4 ==")
        header = ["scheduler", "attach", "fio ios", "stat reads", "merged", "iotrace recorded", "dropped",
                  "getrq", "rq_insert", "rq_issue", "rq_complete", "io_start", "overrun", "note"]
        rows = []
        for r in fio["runs"]:
            tf = r.get("tracefs", {})
            note = r.get("error") or (f"iotrace exit {r['iotrace_rc']}" if r.get("iotrace_rc") else "")
            if r.get("iotrace_stderr") and not note:
                note = "no final dump"
            if note and r.get("iotrace_stderr"):
                note += ": " + " ".join(r["iotrace_stderr"].strip().splitlines()[-1:])[:120]
            if r.get("note"):       # the row ran on another device (guest_fio.py null_disk)
                note = f"{note}; {r['note']}" if note else r["note"]
            rows.append([r["scheduler"], r["attach"], r.get("fio_total_ios", "-"),
                         r.get("diskstats", {}).get("read", "-"), r.get("diskstats", {}).get("read_merges", "-"),
                         r.get("iotrace_recorded", "-"),
                         ",".join(f"{k}={v}" for k, v in (r.get("iotrace_dropped") or {}).items()) or "-",
                         tf.get("block_getrq", "-"), tf.get("block_rq_insert", "-"), tf.get("block_rq_issue", "-"),
                         tf.get("block_rq_complete", "-"), tf.get("block_io_start", "n/a"), tf.get("overrun", "-"),
                         note])
        print(table(header, rows))

    for res, name in zip(results, names, strict=True):
        nb = res.get("nullblk")
        if not nb or "iops" not in nb:
            continue
        print(f"\n== {name}: {nb['fio']} on {nb['device']}, {nb['rounds']} rounds x {nb['seconds']} s, median ==")
        print(table(["programs", "IOPS", "of untraced", "BPF ns/request"],
                    [[n, f"{nb['iops'][n]:.0f}", f"{nb['ratio'].get(n, 0):.3f}", f"{nb['bpf_ns_per_request'][n]:.0f}"]
                     for n in nb["iops"]]))
        for n, progs in (nb.get("by_program") or {}).items():
            if progs:
                print(f"  {n}: " + ", ".join(f"{p} {v:.0f}" for p, v in progs.items() if v) + " ns/request")
        if nb.get("clocksource"):
            print(f"  guest clocksource: {nb['clocksource']}")
        if nb.get("kernel_stamps"):
            print(f"  the kernel row ran on {' and '.join(nb['kernel_stamps'])} stamps (--stamps kernel)")

    print("\n== timings ==")
    for res, name in zip(results, names, strict=True):
        print(f"{name}: " + ", ".join(f"{k} {v}" for k, v in res["timings"].items() if not k.endswith("_seconds")))
        g = res.get("guest", {})
        if g:
            print(f"  guest: btf={g.get('btf')}, clocksource={g.get('clocksource', '?')}, "
                  f"cpuidle={g.get('cpuidle', '?')}, monitor={g.get('monitor', '?')}, "
                  f"block events: {g.get('block_events')}")
        for n in res["notes"]:
            print(f"  note: {n}")
        for p in res["problems"]:
            print(f"  problem: {p}")
        print(f"  results and console log: {res['logs']}")
    return ok


def main() -> int:
    # The defaults give one kernel's truth and attribution tests (~50 min under TCG) room: every limit
    # reached, ~90 min.  CI runs the fio table and test_btf only (.ci/run), ~4 min with the image built.
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--kernel", action="append",
                    help="a linux-image-* package, or a kernels.list line in quotes (repeatable; default: "
                         "kernels.list)")
    ap.add_argument("--tests", default=os.environ.get("IOTRACE_KERNEL_TESTS", " ".join(DEFAULT_TESTS)),
                    help="pytest arguments run in the guest, or 'all' for these and " + " ".join(MORE_TESTS)
                         + " (default: %(default)s)")
    ap.add_argument("--test-timeout", type=float, default=float(os.environ.get("IOTRACE_TEST_TIMEOUT", 300)),
                    help="seconds one test may take in the guest before it counts as too slow under TCG")
    ap.add_argument("--budget", type=float, default=float(os.environ.get("IOTRACE_SESSION_BUDGET", 3600)),
                    help="seconds of tests per kernel; tests left after it are reported not run")
    ap.add_argument("--fio-timeout", type=float, default=300, help="seconds for one traced fio run in the guest")
    ap.add_argument("--boot-timeout", type=float, default=180, help="seconds for the guest to reach its init")
    ap.add_argument("--stall-timeout", type=float,
                    help="seconds without a progress line from the guest after which it counts as wedged "
                         "(default: 300 more than the fio and test limits, each of which prints a line when "
                         "it fires)")
    ap.add_argument("--lockup-timeout", type=float, default=120,
                    help="seconds without progress, once the guest's kernel reported a stuck CPU, after which "
                         "it counts as wedged")
    ap.add_argument("--attempts", type=int, default=2,
                    help="boots of a kernel's guest when one wedges (a guest that crashes is not booted again)")
    ap.add_argument("--tcg-thread", choices=("single", "multi"), default=TCG_THREAD,
                    help="qemu's TCG threads: 'single' runs both vCPUs on one host thread; 'multi' (one each) "
                         "wedged and crashed guests when the kernel patched its code (default: %(default)s)")
    ap.add_argument("--text-poke", type=int, default=0, metavar="CYCLES",
                    help="first attach and detach raw tracepoint programs CYCLES times under context-switch "
                         "load (guest_textpoke.py; ~0.5 s a cycle under TCG): does the guest survive?")
    ap.add_argument("--no-fio", action="store_true", help="skip the fio/tracefs measurement")
    ap.add_argument("--nullblk", action="store_true",
                    help="also measure fio's IOPS on a null_blk disk untraced, under three empty programs and "
                         "under iotrace's request path (guest_nullblk.py; ~3 min under TCG)")
    ap.add_argument("--probe-misses", action="store_true",
                    help="also run guest_tpmiss.py: which completions the perf-event path skips, and in whose "
                         "context (saved as tpmiss.json beside the logs)")
    ap.add_argument("--from-logs", action="store_true",
                    help="boot nothing: print the report of the last run saved in the logs")
    args = ap.parse_args()
    if args.attempts < 1:
        ap.error("--attempts: at least 1")
    if args.stall_timeout is None:
        args.stall_timeout = max(args.fio_timeout, args.test_timeout) + 300
    if args.tests.strip() == "all":
        args.tests = " ".join(DEFAULT_TESTS + MORE_TESTS)
    listed = read_list(HERE / "kernels.list")
    kernels = [kernel_entry(k, listed) for k in args.kernel] if args.kernel else listed
    if args.from_logs:
        results = [load_results(new_result(k[0]), CACHE / "logs" / k[0], args) for k in kernels]
        return 0 if report(results) else 1
    if os.geteuid() != 0:
        log("needs root (debootstrap, chroot): run it as root or with sudo")
        return 2

    # SIGTERM and SIGHUP unwind like ^C, so that every `finally` (qemu killed, run dir removed) runs.
    def _stop(signum, frame):
        raise KeyboardInterrupt(f"signal {signum}")
    signal.signal(signal.SIGTERM, _stop)
    signal.signal(signal.SIGHUP, _stop)

    env = {"IOTRACE_TESTS": args.tests, "IOTRACE_TEST_TIMEOUT": str(int(args.test_timeout)),
           "IOTRACE_SESSION_BUDGET": str(int(args.budget)), "IOTRACE_FIO": "0" if args.no_fio else "1",
           "IOTRACE_NULLBLK": "1" if args.nullblk else "0",
           "IOTRACE_FIO_TIMEOUT": str(int(args.fio_timeout)),
           "IOTRACE_PROBE_MISSES": "1" if args.probe_misses else "0", "IOTRACE_TEXT_POKE": str(args.text_poke),
           "IOTRACE_PROGRESS": "/dev/console"}
    t0 = time.monotonic()
    ensure_host_tools()
    results = []
    for k in kernels:
        log(f"{k[0]}: image ({'guest ' + k[1] if len(k) > 1 else 'guest bookworm'}"
            f"{', the kernel from ' + k[2] if len(k) > 2 else ''})")
        results.append(run_kernel(k, args, env))
    ok = report(results)
    print(f"\ntest-kernels: {len(kernels)} kernel(s) in {(time.monotonic() - t0) / 60:.1f} min")
    return 0 if ok else 1


if __name__ == "__main__":
    try:
        sys.exit(main())
    except KeyboardInterrupt as e:
        log(f"stopped ({e or 'interrupted'}); the guest was killed")
        sys.exit(130)
