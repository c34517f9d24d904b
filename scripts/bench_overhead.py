#!/usr/bin/env python3
"""What tracing costs the traced: fio IOPS and BPF run time per request under iotrace and its peers.

On a fast request-based device (a loop device over a file in /dev/shm),
fio random 4 KiB reads with direct=1 run under: no tracer (the baseline),
iotrace twice (its default raw-tracepoint attach, "iotrace", and
`--attach tracepoint`, "iotrace_tp"), "reference" (the libbpf-tools
biolatency design, in bcc: raw tracepoints, a hash keyed by the request
pointer, per-CPU log2 histograms of total, queue and device time),
bpftrace running an equivalent per-(pid, device) latency histogram, and
blktrace recording to /dev/shm where it can run; and, to show where the
cost lies, four floors: "empty" and "empty_raw" (bcc programs that return
at once on the three tracepoints, perf-event and raw), "clock_raw" (raw
programs that only read the clock, which any latency tracer must) and
"floor" (bpftrace reading the clock there).  Runs are interleaved (each repetition
starts every tracer once, in a rotating order, and runs every workload
under it), and each tracer's IOPS is divided by the baseline's *of the
same repetition*, so slow drifts of this noisy VM cancel out.  The table
shows the median of those ratios and their spread (min..max).

A separate pass with kernel.bpf_stats_enabled=1 measures, for every BPF
tracer, the BPF run time per request: fio reads a fixed number of 4 KiB
blocks at queue depth 32, and the run time the tracer's programs (the ones
that appeared when it started, read with `bpftool prog show -j`) gained
meanwhile is divided by the requests fio completed; interleaved rounds,
median shown.  These tracers watch every disk, so other I/O on the machine
during a run (a shared VM) runs their programs too: each program here runs
once per request, so where the busiest one ran more often than fio's
requests, its run count is the divisor instead (the table notes it).
The statistics are off during the IOPS runs, since they cost a little
themselves.  A verdict block checks the issue's targets against this
very run.

    sudo .venv/bin/python scripts/bench_overhead.py            # make bench
    sudo .venv/bin/python scripts/bench_overhead.py --quick    # a smoke run
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import platform
import select
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PYTHON = str(ROOT / ".venv" / "bin" / "python") if (ROOT / ".venv").exists() else sys.executable
BACKING_MB = 256
STATS_SYSCTL = Path("/proc/sys/kernel/bpf_stats_enabled")

# The targets, checked by the verdict block.
TARGET_NS_PER_REQUEST = 450
TARGET_IOPS_RATIO = 0.90
TARGET_MIN_ROUNDS = 5
TARGET_WORKLOAD = "qd32"

# The bpftrace peer: the same question iotrace answers (latency per pid and device, from the
# request's start to its completion), written the way a bpftrace user would.  START_EVENT, here and
# in the programs below, is the start event iotrace uses (start_event()): block_io_start, or
# block_getrq before Linux 6.5 (whose dev and sector are read alike; it has nr_sector, not bytes).
BPFTRACE_PROG = r"""
tracepoint:block:START_EVENT { @start[args->dev, args->sector] = nsecs; @who[args->dev, args->sector] = pid; }
tracepoint:block:block_rq_complete /@start[args->dev, args->sector]/ {
    @usecs[@who[args->dev, args->sector], args->dev] = hist((nsecs - @start[args->dev, args->sector]) / 1000);
    delete(@start[args->dev, args->sector]); delete(@who[args->dev, args->sector]);
}
"""


# The floor: programs on the same three tracepoints that only read the clock, which any latency
# tracer must do; what iotrace costs beyond this is its own work.
FLOOR_PROG = r"""
tracepoint:block:START_EVENT, tracepoint:block:block_rq_issue, tracepoint:block:block_rq_complete {
    $t = nsecs; if ($t == 1) { printf("never\\n"); }
}
"""


@dataclass(frozen=True)
class Workload:
    name: str
    iodepth: int
    jobs: int

    def _common(self, device: str) -> list[str]:
        return ["fio", f"--name={self.name}", f"--filename={device}", "--rw=randread", "--bs=4k", "--direct=1",
                "--ioengine=libaio", f"--iodepth={self.iodepth}", f"--numjobs={self.jobs}", "--group_reporting",
                "--norandommap", "--randrepeat=0", "--output-format=json"]

    def fio_args(self, device: str, seconds: float) -> list[str]:
        return [*self._common(device), "--time_based", f"--runtime={seconds}", "--ramp_time=500ms"]

    def fio_fixed(self, device: str, ios: int) -> list[str]:
        """Exactly `ios` reads (per job), no ramp: every request the programs ran for is one fio counts."""
        return [*self._common(device), f"--number_ios={ios}", f"--io_size={ios * 4096}"]


WORKLOADS = [Workload("qd1", 1, 1), Workload("qd32", 32, 1), Workload("qd1x2", 1, 2), Workload("qd32x2", 32, 2)]
STATS_WORKLOAD = Workload("qd32", 32, 1)     # the issue's: fio 4 KiB randread qd32


@dataclass
class Run:
    tracer: str
    workload: str
    rep: int
    iops: float
    clat_p50_us: float
    clat_p99_us: float


@dataclass
class CostRun:
    """One bpf_stats run of one tracer: its programs' run time over fio's requests."""

    tracer: str
    round: int
    requests: int                   # fio's
    seen: int                       # requests the programs saw: fio's, or more where other I/O ran them too
    iops: float
    ns_per_request: float           # run time over `seen`
    programs: dict[str, dict]       # name -> id, runs, run_time_ns, missed
    recorded: int | None = None     # the reference's: requests its histogram counted

    @property
    def valid(self) -> bool:
        """Its busiest program ran for (nearly) every fio request: attached, and the statistics on throughout."""
        busiest = max((p["runs"] for p in self.programs.values()), default=0)
        return busiest >= 0.95 * self.requests


@dataclass
class Result:
    environment: dict
    seconds: float
    reps: int
    stats_rounds: int = 0
    stats_ios: int = 0
    runs: list[Run] = field(default_factory=list)
    cost_runs: list[CostRun] = field(default_factory=list)
    unavailable: dict[str, str] = field(default_factory=dict)   # tracer -> why it did not run
    attach: dict[str, str] = field(default_factory=dict)        # iotrace run -> the "attach" its dump reports
    notes: list[str] = field(default_factory=list)
    interrupted: str = ""


# ---- BPF program bookkeeping --------------------------------------------------

BPF_ENABLE_STATS, BPF_STATS_RUN_TIME = 32, 0
SYS_BPF = {"x86_64": 321, "aarch64": 280, "ppc64le": 361, "s390x": 351}.get(platform.machine())


class BPFStats:
    """kernel.bpf_stats_enabled=1 while inside: by holding a BPF_ENABLE_STATS fd where the kernel has it.

    The fd is counted apart from the sysctl, so neither writes the other's value: a test on this
    shared machine that turns the sysctl off cannot stop our statistics midway, and we never turn
    it off under someone else.  Without the syscall, the sysctl itself, put back as it was after.
    """

    def __init__(self) -> None:
        self.fd = -1
        self.old: str | None = None

    def __enter__(self) -> BPFStats:
        if SYS_BPF is not None:
            libc = ctypes.CDLL(None, use_errno=True)
            attr = (ctypes.c_uint32 * 32)()         # union bpf_attr, zeroed: enable_stats.type first
            attr[0] = BPF_STATS_RUN_TIME
            libc.syscall.restype = ctypes.c_long
            self.fd = libc.syscall(ctypes.c_long(SYS_BPF), ctypes.c_int(BPF_ENABLE_STATS), ctypes.byref(attr),
                                   ctypes.c_uint(ctypes.sizeof(attr)))
        if self.fd < 0:
            self.old = STATS_SYSCTL.read_text().strip()
            STATS_SYSCTL.write_text("1")
        return self

    def __exit__(self, *exc) -> None:
        if self.fd >= 0:
            os.close(self.fd)
        elif self.old is not None:
            STATS_SYSCTL.write_text(self.old)


def bpf_programs() -> dict[int, dict]:
    """Every BPF program loaded on the machine, by id, as `bpftool prog show -j` lists it."""
    r = subprocess.run(["bpftool", "prog", "show", "-j"], capture_output=True, text=True, check=True)
    return {p["id"]: p for p in json.loads(r.stdout or "[]")}


def held_program_ids(pid: int | str = "self") -> set[int]:
    """Ids of the BPF programs a process holds a file descriptor of (from /proc/PID/fdinfo)."""
    ids = set()
    fdinfo = Path(f"/proc/{pid}/fdinfo")
    try:
        entries = list(fdinfo.iterdir())
    except OSError:
        return ids
    for f in entries:
        try:
            for line in f.read_text().splitlines():
                if line.startswith("prog_id:"):
                    ids.add(int(line.split()[1]))
        except (OSError, ValueError):
            pass    # closed meanwhile
    return ids


def foreign_program_ids(ours: set[int]) -> set[int]:
    """Programs held by processes other than these: others' tools that loaded while ours started."""
    ids = set()
    for d in Path("/proc").iterdir():
        if d.name.isdigit() and int(d.name) not in ours:
            ids |= held_program_ids(d.name)
    return ids


# ---- tracers -----------------------------------------------------------------

class Tracer:
    """Start before a run, stop after it; `why_not()` says why it cannot run here, or None.

    `bpf` tracers take part in the bpf_stats pass; `prog_ids` are the programs a tracer
    loaded once for all its runs (the others' are found by diffing around start()), and
    `pid` the process holding them.
    """

    name = "none"
    bpf = False

    def __init__(self) -> None:
        self.prog_ids: dict[int, str] = {}
        self.pid: int = os.getpid()

    def why_not(self) -> str | None:
        return None

    def start(self, device: str) -> None:
        pass

    def stop(self) -> None:
        pass


class Untraced(Tracer):
    name = "none"


def _wait_line(proc: subprocess.Popen, stream, needle: str, timeout: float) -> str | None:
    """Read the stream until needle shows up; None if the process ended or time ran out."""
    deadline = time.monotonic() + timeout
    fd = stream.fileno()
    buf = b""
    while time.monotonic() < deadline:
        ready, _, _ = select.select([fd], [], [], 0.1)
        if ready:
            chunk = os.read(fd, 4096)
            if not chunk:
                return None
            buf += chunk
            if needle.encode() in buf:
                return buf.decode(errors="replace")
        elif proc.poll() is not None:
            return None
    return None


def _end(proc: subprocess.Popen | None, timeout: float = 60) -> None:
    """SIGINT a tracer process we started, and kill it if it does not go."""
    if proc is None:
        return
    if proc.poll() is None:
        proc.send_signal(signal.SIGINT)
    try:
        proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.communicate()


class IOTrace(Tracer):
    name = "iotrace"
    bpf = True

    def __init__(self, output: Path, extra: list[str] | None = None, name: str = "iotrace"):
        super().__init__()
        self.name = name
        self.output = output
        self.extra = extra or []
        self.proc: subprocess.Popen | None = None
        self.attach = ""

    def start(self, device: str) -> None:
        # the default a user would run: every process, every device, a report every 10 s
        # without SUDO_*: under sudo iotrace would open -o (root's scratch dir) as the invoking user
        env = {k: v for k, v in os.environ.items() if not k.startswith("SUDO_")}
        self.proc = subprocess.Popen([PYTHON, "-m", "tracer.cli", "-i", "10", "-o", str(self.output), *self.extra],
                                     cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=env)
        self.pid = self.proc.pid
        if _wait_line(self.proc, self.proc.stderr, "tracing block I/O", 60) is None:
            err = self.proc.stderr.read() if self.proc.poll() is not None else ""
            self.proc.kill()
            self.proc.wait()
            self.proc = None
            raise RuntimeError(f"{self.name} did not start: {err.strip()}")

    def stop(self) -> None:
        _end(self.proc)
        self.proc = None
        try:
            lines = self.output.read_text().splitlines()
            self.attach = json.loads(lines[-1]).get("attach", "?") if lines else "?"
            self.output.unlink()
        except (OSError, ValueError):
            pass


class BccTracer(Tracer):
    """Programs built with bcc in this process, loaded once, attached for each run."""

    bpf = True
    text = ""               # START_EVENT stands for the start event
    raw = False

    def __init__(self, start: str) -> None:
        super().__init__()
        self.start_event = start
        self.events: tuple[str, ...] = (start, "block_rq_issue", "block_rq_complete")
        self.b = None
        self._why: str | None = None

    def _fn(self, ev: str) -> str:
        return f"raw_tracepoint__{ev}" if self.raw else f"tracepoint__block__{ev}"

    def why_not(self) -> str | None:
        if self.b is None and self._why is None:
            try:
                import bcc  # noqa: PLC0415 - only these tracers need it

                # bcc attaches *_PROBE programs as it loads them
                self.b = bcc.BPF(text=self.text.replace("START_EVENT", self.start_event))
                self._detach()
                for ev in self.events:
                    fd = self.b.load_func(self._fn(ev).encode(), self._prog_type(bcc)).fd
                    info = Path(f"/proc/self/fdinfo/{fd}").read_text()
                    pid = next(int(x.split()[1]) for x in info.splitlines() if x.startswith("prog_id:"))
                    self.prog_ids[pid] = self._fn(ev)
            except Exception as exc:  # bcc raises bare Exception on compile/load errors
                lines = str(exc).strip().splitlines() or [type(exc).__name__]
                self._why = f"cannot load {self.name} programs with bcc: {lines[-1]}"
        return self._why

    def _prog_type(self, bcc) -> int:
        return bcc.BPF.RAW_TRACEPOINT if self.raw else bcc.BPF.TRACEPOINT

    def _detach(self) -> None:
        if self.b is None:
            return
        for ev in self.events:
            try:
                if self.raw:
                    self.b.detach_raw_tracepoint(ev.encode())
                else:
                    self.b.detach_tracepoint(f"block:{ev}".encode())
            except Exception:  # noqa: BLE001 - not attached: nothing to undo
                pass

    def start(self, device: str) -> None:
        for ev in self.events:
            if self.raw:
                self.b.attach_raw_tracepoint(tp=ev.encode(), fn_name=self._fn(ev).encode())
            else:
                self.b.attach_tracepoint(tp=f"block:{ev}".encode(), fn_name=self._fn(ev).encode())

    def stop(self) -> None:
        self._detach()


# Below the floor: programs on the same tracepoints that return at once, loaded with bcc as
# iotrace's are.  What they cost is the kernel's price for running any BPF program there: "empty"
# on the perf-event path (which fills the tracepoint's record before calling it), "empty_raw" on
# the raw tracepoints (which hand over the arguments as they are).
class Empty(BccTracer):
    name = "empty"
    text = """
TRACEPOINT_PROBE(block, START_EVENT) { return 0; }
TRACEPOINT_PROBE(block, block_rq_issue) { return 0; }
TRACEPOINT_PROBE(block, block_rq_complete) { return 0; }
"""


class EmptyRaw(BccTracer):
    name = "empty_raw"
    raw = True
    text = """
RAW_TRACEPOINT_PROBE(START_EVENT) { return 0; }
RAW_TRACEPOINT_PROBE(block_rq_issue) { return 0; }
RAW_TRACEPOINT_PROBE(block_rq_complete) { return 0; }
"""



# The floor of any latency tracer on raw tracepoints: the same programs reading the clock (into
# a per-CPU array, so that the read stays), which each of the three must do; what iotrace costs
# beyond this is its own work.
class ClockRaw(BccTracer):
    name = "clock_raw"
    raw = True
    text = """
BPF_PERCPU_ARRAY(last, u64, 1);
static __always_inline int stamp(void)
{
    u32 z = 0;
    u64 *t = last.lookup(&z);

    if (t)
        *t = bpf_ktime_get_ns();
    return 0;
}
RAW_TRACEPOINT_PROBE(START_EVENT) { return stamp(); }
RAW_TRACEPOINT_PROBE(block_rq_issue) { return stamp(); }
RAW_TRACEPOINT_PROBE(block_rq_complete) { return stamp(); }
"""
# The reference design, as libbpf-tools' biolatency builds it: raw tracepoints, in-flight
# requests in a hash keyed by the struct request pointer, and log2 histograms (of total, queue
# and device time, in microseconds) in a per-CPU array: no per-process keys.  It stores the
# submitter's tgid as a per-process tracer must, and does no more with it.
REFERENCE_SLOTS = 32
REFERENCE_PROG = "#define SLOTS " + str(REFERENCE_SLOTS) + """
struct inflight_t { u64 start; u64 issue; u32 tgid; };
BPF_HASH(inflight, u64, struct inflight_t, 10240);
BPF_PERCPU_ARRAY(hists, u64, 3 * SLOTS);            /* total, queue, device */

static __always_inline u32 log2_32(u32 v)
{
    u32 r, s;
    r = (v > 0xffff) << 4; v >>= r;
    s = (v > 0xff) << 3; v >>= s; r |= s;
    s = (v > 0xf) << 2; v >>= s; r |= s;
    s = (v > 0x3) << 1; v >>= s; r |= s;
    return r | (v >> 1);
}

static __always_inline u32 log2_64(u64 v)
{
    u32 hi = v >> 32;
    return hi ? log2_32(hi) + 32 : log2_32((u32)v);
}

static __always_inline void count(u32 phase, u64 ns)
{
    u32 slot = log2_64(ns / 1000);
    if (slot >= SLOTS)
        slot = SLOTS - 1;
    u32 key = phase * SLOTS + slot;
    u64 *c = hists.lookup(&key);
    if (c)
        (*c)++;
}

RAW_TRACEPOINT_PROBE(block_io_start)
{
    u64 rq = ctx->args[0];
    struct inflight_t s = {};
    s.start = bpf_ktime_get_ns();
    s.tgid = bpf_get_current_pid_tgid() >> 32;
    inflight.update(&rq, &s);
    return 0;
}

RAW_TRACEPOINT_PROBE(block_rq_issue)
{
    u64 rq = ctx->args[0];
    struct inflight_t *s = inflight.lookup(&rq);
    if (s)
        s->issue = bpf_ktime_get_ns();
    return 0;
}

RAW_TRACEPOINT_PROBE(block_rq_complete)
{
    u64 rq = ctx->args[0];
    struct inflight_t *s = inflight.lookup(&rq);
    if (!s)
        return 0;
    u64 now = bpf_ktime_get_ns();
    count(0, now - s->start);
    if (s->issue) {
        count(1, s->issue - s->start);
        count(2, now - s->issue);
    }
    inflight.delete(&rq);
    return 0;
}
"""


class Reference(BccTracer):
    """Always on block_io_start: the design keys a request by the struct request its start is given,
    which block_getrq (the start before Linux 6.5) does not give (it names the bio)."""

    name = "reference"
    raw = True
    text = REFERENCE_PROG

    def __init__(self) -> None:
        super().__init__("block_io_start")
        self._base = 0

    def why_not(self) -> str | None:
        if _probe().tracepoint_fields(self.start_event) is None:
            return (f"needs block:{self.start_event} (Linux 6.5+): it keys a request by the struct request "
                    "its start gives, which block_getrq (a bio) does not")
        return super().why_not()

    def _total(self) -> int:
        hists = self.b["hists"]
        return sum(sum(hists[hists.Key(i)]) for i in range(REFERENCE_SLOTS))

    def start(self, device: str) -> None:
        self._base = self._total()
        super().start(device)

    def recorded(self) -> int:
        """Requests in its total-time histogram since start(): proof it saw them."""
        return self._total() - self._base


class BPFTrace(Tracer):
    name = "bpftrace"
    bpf = True

    def __init__(self, prog: str = BPFTRACE_PROG, name: str = "bpftrace"):
        super().__init__()
        self.prog = prog
        self.name = name
        self.proc: subprocess.Popen | None = None

    def why_not(self) -> str | None:
        return None if shutil.which("bpftrace") else "not installed (apt install bpftrace)"

    def start(self, device: str) -> None:
        self.proc = subprocess.Popen(["bpftrace", "-e", self.prog], stdout=subprocess.PIPE,
                                     stderr=subprocess.STDOUT, text=True)
        self.pid = self.proc.pid
        if _wait_line(self.proc, self.proc.stdout, "Attach", 60) is None:
            out = self.proc.stdout.read() if self.proc.poll() is not None else ""
            self.proc.kill()
            self.proc.wait()
            self.proc = None
            raise RuntimeError(f"bpftrace did not start: {out.strip()}")
        time.sleep(0.5)     # it prints "Attaching" before the last probe is in

    def stop(self) -> None:
        _end(self.proc)
        self.proc = None


class BlkTrace(Tracer):
    name = "blktrace"

    def __init__(self, outdir: Path):
        super().__init__()
        self.outdir = outdir
        self.proc: subprocess.Popen | None = None
        self._why: str | None = None
        self._probed = False

    def why_not(self) -> str | None:
        if not shutil.which("blktrace"):
            return "not installed (apt install blktrace)"
        return self._why

    def probe(self, device: str) -> None:
        """Try it once: on some machines opening its debugfs relay files is denied."""
        if self._probed or not shutil.which("blktrace"):
            return
        self._probed = True
        debug = Path("/sys/kernel/debug")
        mounted = False
        if not (debug / "block").is_dir():
            # blktrace's relay files live in debugfs; a blktrace user mounts it first
            mounted = subprocess.run(["mount", "-t", "debugfs", "none", str(debug)], capture_output=True,
                                     check=False).returncode == 0
        try:
            self.start(device)
            self.stop()
        except RuntimeError as exc:
            self._why = f"cannot run here: {exc}"
            self.proc = None
            if mounted:
                subprocess.run(["umount", str(debug)], capture_output=True, check=False)

    def start(self, device: str) -> None:
        self.proc = subprocess.Popen(["blktrace", "-d", device, "-D", str(self.outdir)], stdout=subprocess.DEVNULL,
                                     stderr=subprocess.PIPE, text=True)
        time.sleep(1.0)
        if self.proc.poll() is not None:
            err = [line for line in self.proc.stderr.read().strip().splitlines() if line.strip()]
            self.proc = None
            raise RuntimeError(err[0] if err else "exited at once")

    def stop(self) -> None:
        _end(self.proc)
        self.proc = None
        for f in self.outdir.glob("*.blktrace.*"):
            f.unlink()


TRACERS = ("none", "empty", "empty_raw", "clock_raw", "floor", "reference", "iotrace", "iotrace_tp", "bpftrace",
           "blktrace")


def _probe():
    """iotrace's tracer.sources.probe, from this tree (imported only when the bench runs)."""
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))
    from tracer.sources import probe  # noqa: PLC0415 - not needed for --help

    return probe


def start_event() -> str:
    """The start event iotrace uses on this kernel, by its own choice (honouring $IOTRACE_START_EVENT):
    block_io_start from Linux 6.5 on, block_getrq before."""
    probe = _probe()
    from tracer.errors import UserError  # noqa: PLC0415

    try:
        return probe.choose_start_event()
    except UserError as exc:
        raise RuntimeError(str(exc)) from None


def make_tracers(shm: Path, start: str) -> list[Tracer]:
    """Every tracer; those with programs of their own start requests on `start` (iotrace's start event)."""
    return [Untraced(), Empty(start), EmptyRaw(start), ClockRaw(start),
            BPFTrace(FLOOR_PROG.replace("START_EVENT", start), "floor"), Reference(),
            IOTrace(shm / "iotrace.jsonl"),
            IOTrace(shm / "iotrace-tp.jsonl", ["--attach", "tracepoint"], name="iotrace_tp"),
            BPFTrace(BPFTRACE_PROG.replace("START_EVENT", start)), BlkTrace(shm)]


# ---- signals -------------------------------------------------------------------

class Interrupted(BaseException):
    """A signal asked the bench to stop: unwinds through every `finally`, which tear down."""


_signals = {"deferred": False, "pending": ""}


def _on_signal(signum, frame) -> None:
    name = signal.Signals(signum).name
    if _signals["deferred"]:            # tearing down: that must not be cut short, by a second ^C or a first
        _signals["pending"] = _signals["pending"] or name
        return
    _signals["deferred"] = True
    raise Interrupted(name)


def install_signal_handlers() -> None:
    """Our own handlers, also where the bench was started with SIGINT ignored (a background job)."""
    for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(s, _on_signal)


# ---- the bench -----------------------------------------------------------------

def _fio(argv: list[str]) -> dict:
    r = subprocess.run(argv, capture_output=True, text=True, check=True)
    return json.loads(r.stdout[r.stdout.index("{"):])["jobs"][0]["read"]


def run_fio(w: Workload, device: str, seconds: float) -> tuple[float, float, float]:
    job = _fio(w.fio_args(device, seconds))
    pct = job["clat_ns"]["percentile"]
    return job["iops"], pct["50.000000"] / 1e3, pct["99.000000"] / 1e3


def environment() -> dict:
    cpu = ""
    try:
        cpu = next(line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo") if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    fio = subprocess.run(["fio", "--version"], capture_output=True, text=True).stdout.strip()
    return {"kernel": platform.release(), "cpu": cpu, "nproc": os.cpu_count(), "fio": fio,
            "date": time.strftime("%Y-%m-%dT%H:%M:%S%z")}


def cost_run(t: Tracer, device: str, ios: int, rnd: int) -> CostRun:
    """Start the tracer, run fio for `ios` requests with bpf_stats on, and charge it what its programs gained."""
    before = set(bpf_programs())
    t.start(device)
    try:
        if t.prog_ids:
            mine = dict(t.prog_ids)
        else:
            added = set(bpf_programs()) - before
            added -= foreign_program_ids({os.getpid(), t.pid})
            mine = dict.fromkeys(sorted(added), "")
        with BPFStats():
            p0 = bpf_programs()
            job = _fio(STATS_WORKLOAD.fio_fixed(device, ios))
            p1 = bpf_programs()
        recorded = t.recorded() if isinstance(t, Reference) else None
    finally:
        t.stop()
    requests = job["total_ios"]
    programs: dict[str, dict] = {}
    names = [mine[i] or p1.get(i, {}).get("name", "") for i in mine]
    for i, name in zip(mine, names, strict=True):
        if i not in p0 or i not in p1:
            continue
        if not name or names.count(name) > 1:
            name = f"{name or 'prog'}#{i}"
        runs = p1[i].get("run_cnt", 0) - p0[i].get("run_cnt", 0)
        ns = p1[i].get("run_time_ns", 0) - p0[i].get("run_time_ns", 0)
        missed = p1[i].get("recursion_misses", 0) - p0[i].get("recursion_misses", 0)
        programs[name] = {"id": i, "runs": runs, "run_time_ns": ns, "missed": missed}
    total = sum(p["run_time_ns"] for p in programs.values())
    seen = max([requests, *(p["runs"] for p in programs.values())])
    return CostRun(t.name, rnd, requests, seen, job["iops"], total / seen if seen else 0.0, programs, recorded)


def program_costs(res: Result, tracers: list[Tracer], device: str, rounds: int, ios: int) -> None:
    """The bpf_stats pass: every BPF tracer, `rounds` interleaved rounds of `ios` requests each."""
    bpf = [t for t in tracers if t.bpf]
    for rnd in range(rounds):
        order = bpf[rnd % len(bpf):] + bpf[:rnd % len(bpf)]
        for t in order:
            c = cost_run(t, device, ios, rnd)
            res.cost_runs.append(c)
            print(f"  bpf_stats round {rnd + 1}/{rounds} {t.name:10} {c.ns_per_request:7.0f} ns/request "
                  f"{c.iops:9.0f} IOPS", file=sys.stderr)


def bench(args) -> Result:
    res = Result(environment=environment(), seconds=args.seconds, reps=args.reps)
    shm: Path | None = None
    device = ""
    tracers: list[Tracer] = []
    try:
        shm = Path(tempfile.mkdtemp(prefix="iotrace-bench-", dir="/dev/shm"))
        backing = shm / "iotrace-bench.img"
        with open(backing, "wb") as f:
            os.posix_fallocate(f.fileno(), 0, BACKING_MB << 20)   # real pages: no reads of holes
        device = subprocess.run(["losetup", "--find", "--show", str(backing)], check=True, capture_output=True,
                                text=True).stdout.strip()
        res.environment["device"] = f"{device} over {backing} (tmpfs)"
        start = args.start_event
        res.environment["start_event"] = start
        tracers = [t for t in make_tracers(shm, start) if t.name in args.tracers]
        if start != "block_io_start" and "reference" in args.tracers:
            res.notes.append(f"the tracers start requests on block:{start}, reference (by design) on "
                             "block:block_io_start where the kernel has it")
        workloads = [w for w in WORKLOADS if w.name in args.workloads]
        for t in tracers:
            if isinstance(t, BlkTrace):
                t.probe(device)
            why = t.why_not()
            if why:
                res.unavailable[t.name] = why
        active = [t for t in tracers if t.name not in res.unavailable]
        stats_on = 0
        for rep in range(args.reps):
            order = active[rep % len(active):] + active[:rep % len(active)]
            for t in order:
                t.start(device)
                try:
                    for w in workloads:
                        iops, p50, p99 = run_fio(w, device, args.seconds)
                        res.runs.append(Run(t.name, w.name, rep, iops, p50, p99))
                        stats_on += STATS_SYSCTL.read_text().strip() != "0"
                        print(f"  rep {rep + 1}/{args.reps} {w.name:7} {t.name:10} {iops:10.0f} IOPS",
                              file=sys.stderr)
                finally:
                    t.stop()
                if isinstance(t, IOTrace):
                    res.attach[t.name] = t.attach
        if stats_on:
            res.notes.append(f"kernel.bpf_stats_enabled was on (not by this bench) after {stats_on} of the "
                             f"{len(res.runs)} IOPS runs: those paid for the statistics")
        if args.stats_rounds and any(t.bpf for t in active):
            res.stats_rounds, res.stats_ios = args.stats_rounds, args.stats_ios
            program_costs(res, active, device, args.stats_rounds, args.stats_ios)
    except Interrupted as exc:
        res.interrupted = str(exc)
        print(f"bench_overhead: {exc}: tearing down", file=sys.stderr)
    finally:
        _signals["deferred"] = True
        for t in tracers:
            try:
                t.stop()    # each is a no-op unless a signal cut a run short
            except Exception as exc:  # noqa: BLE001 - the device must go regardless
                print(f"bench_overhead: stopping {t.name}: {exc}", file=sys.stderr)
        if device:
            subprocess.run(["losetup", "-d", device], check=False)
        if shm:
            shutil.rmtree(shm, ignore_errors=True)
    res.interrupted = res.interrupted or _signals["pending"]
    return res


# ---- the table -----------------------------------------------------------------

def summarize_costs(res: Result) -> dict[str, dict]:
    """Per tracer: median ns of BPF per request over the rounds, and each program's share."""
    out = {}
    for t in dict.fromkeys(c.tracer for c in res.cost_runs):
        every = [c for c in res.cost_runs if c.tracer == t]
        runs = [c for c in every if c.valid] or every
        progs: dict[str, dict] = {}
        for name in dict.fromkeys(n for c in runs for n in c.programs):
            per = [(c.programs[name], c.seen) for c in runs if name in c.programs]
            progs[name] = {
                "runs_per_request": statistics.median(p["runs"] / n for p, n in per if n),
                "ns_per_run": statistics.median(p["run_time_ns"] / p["runs"] for p, _ in per if p["runs"])
                if any(p["runs"] for p, _ in per) else 0.0,
                "ns_per_request": statistics.median(p["run_time_ns"] / n for p, n in per if n),
                "missed": sum(p["missed"] for p, _ in per),
            }
        recorded = [c.recorded / c.seen for c in runs if c.recorded is not None and c.seen]
        out[t] = {"ns_per_request": statistics.median(c.ns_per_request for c in runs),
                  "recorded_per_request": statistics.median(recorded) if recorded else None,
                  "rounds": [round(c.ns_per_request, 1) for c in runs],
                  "seen_per_fio_request": [round(c.seen / c.requests, 3) for c in runs if c.requests],
                  "invalid_rounds": len(every) - len([c for c in every if c.valid]),
                  "iops": statistics.median(c.iops for c in runs), "programs": progs}
    return out


def summarize(res: Result, costs: dict[str, dict]) -> list[dict]:
    """Per (workload, tracer): median IOPS ratio to the same repetition's baseline, its spread, and BPF ns/request."""
    rows = []
    base = {(r.workload, r.rep): r for r in res.runs if r.tracer == "none"}
    for w in dict.fromkeys(r.workload for r in res.runs):
        for t in dict.fromkeys(r.tracer for r in res.runs):
            runs = [r for r in res.runs if r.workload == w and r.tracer == t]
            if not runs:
                continue
            ratios = [r.iops / base[(w, r.rep)].iops for r in runs if (w, r.rep) in base]
            cost = costs.get(t) if w == STATS_WORKLOAD.name else None
            rows.append({
                "workload": w, "tracer": t, "iops": statistics.median(r.iops for r in runs),
                "ratio": statistics.median(ratios) if ratios else None,
                "ratio_min": min(ratios) if ratios else None, "ratio_max": max(ratios) if ratios else None,
                "ratio_rounds": len(ratios),
                "clat_p50_us": statistics.median(r.clat_p50_us for r in runs),
                "clat_p99_us": statistics.median(r.clat_p99_us for r in runs),
                "ns_per_request": cost["ns_per_request"] if cost else None,
                "ns_rounds": cost["rounds"] if cost else None,
            })
    return rows


def verdict(res: Result, rows: list[dict], costs: dict[str, dict]) -> list[dict]:
    """The issue's targets, from this run's own numbers."""
    checks = []

    def check(what: str, ok: bool | None, detail: str) -> None:
        checks.append({"target": what, "met": ok, "detail": detail})

    ns = {t: c["ns_per_request"] for t, c in costs.items()}
    me = ns.get("iotrace")
    if me is None:
        check(f"iotrace BPF ns/request <= {TARGET_NS_PER_REQUEST}", None, "iotrace's bpf_stats were not measured")
    else:
        clock = ns.get("clock_raw")
        floor = f"; three raw programs that only read the clock: {clock:.0f} ns" if clock is not None else ""
        check(f"iotrace BPF ns/request <= {TARGET_NS_PER_REQUEST}", me <= TARGET_NS_PER_REQUEST,
              f"{me:.0f} ns (median of {len(costs['iotrace']['rounds'])} rounds){floor}")
        for peer in ("reference", "bpftrace"):
            if peer in ns:
                check(f"iotrace BPF ns/request < {peer}'s", me < ns[peer], f"{me:.0f} vs {ns[peer]:.0f} ns")
            else:
                check(f"iotrace BPF ns/request < {peer}'s", None, f"{peer} was not measured")
    ratio = {r["tracer"]: r for r in rows if r["workload"] == TARGET_WORKLOAD and r["ratio"] is not None}
    it = ratio.get("iotrace")
    if it is None:
        check(f"iotrace {TARGET_WORKLOAD} IOPS >= {TARGET_IOPS_RATIO:.2f} of untraced", None,
              f"iotrace and the baseline did not both run {TARGET_WORKLOAD}")
    else:
        n = it["ratio_rounds"]
        few = f"; only {n} rounds, the target asks for >= {TARGET_MIN_ROUNDS}" if n < TARGET_MIN_ROUNDS else ""
        floor = ratio.get("empty_raw")
        beside = f"; empty_raw floor {floor['ratio']:.3f}" if floor else ""
        ok = it["ratio"] >= TARGET_IOPS_RATIO if n >= TARGET_MIN_ROUNDS else None
        if few and it["ratio"] < TARGET_IOPS_RATIO:
            ok = False
        check(f"iotrace {TARGET_WORKLOAD} IOPS >= {TARGET_IOPS_RATIO:.2f} of untraced", ok,
              f"{it['ratio']:.3f} (median of {n}, {it['ratio_min']:.3f}..{it['ratio_max']:.3f}){beside}{few}")
        bt = ratio.get("bpftrace")
        if bt:
            check(f"iotrace {TARGET_WORKLOAD} IOPS above bpftrace's", it["ratio"] > bt["ratio"],
                  f"{it['ratio']:.3f} vs {bt['ratio']:.3f}{beside}")
        else:
            check(f"iotrace {TARGET_WORKLOAD} IOPS above bpftrace's", None, "bpftrace was not measured")
    return checks


def _mark(ok: bool | None) -> str:
    return {True: "met", False: "NOT MET", None: "not judged"}[ok]


def print_table(res: Result, rows: list[dict], costs: dict[str, dict], checks: list[dict], out=sys.stdout) -> None:
    env = res.environment
    out.write(f"\niotrace overhead bench: {env['kernel']}, {env['nproc']} CPUs, {env['cpu']}\n"
              f"device {env.get('device', '?')}, start event {env.get('start_event', '?')}; "
              f"fio randread 4k direct=1 libaio, {res.seconds:g} s x {res.reps} "
              f"interleaved repetitions\n")
    if res.stats_rounds:
        out.write(f"BPF ns/req: kernel.bpf_stats_enabled=1, separate pass: {res.stats_ios} requests of "
                  f"{STATS_WORKLOAD.name} per run, median of {res.stats_rounds} interleaved rounds\n")
    if res.interrupted:
        out.write(f"INTERRUPTED ({res.interrupted}): partial results\n")
    out.write(f"\n{'workload':8} {'tracer':10} {'IOPS':>9} {'vs none':>8} {'spread':>12} {'lost':>7} "
              f"{'clat p50':>9} {'clat p99':>9} {'BPF ns/req':>10}  rounds\n")
    for r in rows:
        ratio = "" if r["ratio"] is None else f"{r['ratio']:8.3f}"
        spread = "" if r["ratio"] is None else f"{r['ratio_min']:.3f}..{r['ratio_max']:.3f}"
        lost = "" if r["ratio"] is None else f"{(1 - r['ratio']) * 100:6.1f}%"
        ns = "" if r["ns_per_request"] is None else f"{r['ns_per_request']:10.0f}"
        rounds = "" if r["ns_rounds"] is None else " ".join(f"{x:.0f}" for x in r["ns_rounds"])
        out.write(f"{r['workload']:8} {r['tracer']:10} {r['iops']:9.0f} {ratio:>8} {spread:>12} {lost:>7} "
                  f"{r['clat_p50_us']:7.1f}us {r['clat_p99_us']:7.1f}us {ns:>10}  {rounds}\n")
    for name, why in res.unavailable.items():
        out.write(f"{name}: not measured: {why}\n")
    for name, attach in res.attach.items():
        out.write(f"{name}: its dumps say attach={attach}\n")
    for note in res.notes:
        out.write(f"note: {note}\n")
    for t, c in costs.items():
        if c["invalid_rounds"]:
            out.write(f"note: {c['invalid_rounds']} of {t}'s bpf_stats runs saw its programs run for fewer than "
                      "0.95 of fio's requests (detached, or the statistics off meanwhile): left out of its median"
                      f"{' (all were: kept)' if c['invalid_rounds'] == len(c['rounds']) else ''}\n")
        extra = [x for x in c["seen_per_fio_request"] if x > 1.02]
        if extra:
            out.write(f"note: other I/O on the machine ran {t}'s programs too in {len(extra)} of its "
                      f"{len(c['rounds'])} bpf_stats runs (up to {max(extra):.2f} events per fio request); "
                      "those divide by the events seen\n")
    if costs:
        out.write("\nBPF run time per request, by program (kernel.bpf_stats_enabled, medians over rounds):\n")
        out.write(f"  {'tracer':10} {'program':32} {'runs/req':>8} {'ns/run':>7} {'ns/req':>7} {'skipped':>7}\n")
        for t, c in sorted(costs.items(), key=lambda kv: kv[1]["ns_per_request"]):
            out.write(f"  {t:10} {'(all)':32} {'':>8} {'':>7} {c['ns_per_request']:7.0f}\n")
            for name, p in sorted(c["programs"].items(), key=lambda kv: -kv[1]["ns_per_request"]):
                if p["runs_per_request"] or p["ns_per_request"]:
                    out.write(f"  {'':10} {name[:32]:32} {p['runs_per_request']:8.2f} {p['ns_per_run']:7.0f} "
                              f"{p['ns_per_request']:7.0f} {p['missed']:7d}\n")
            if c.get("recorded_per_request") is not None:
                out.write(f"  {'':10} {'(requests in its histogram)':32} {c['recorded_per_request']:8.2f}\n")
    if checks:
        out.write("\nThe issue's targets, from this run:\n")
        for c in checks:
            out.write(f"  {_mark(c['met']):10} {c['target']}: {c['detail']}\n")


def main() -> int:
    install_signal_handlers()
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--reps", type=int, default=5, help="interleaved repetitions (default 5)")
    p.add_argument("--seconds", type=float, default=3, help="fio run time per run, after 0.5 s of ramp (default 3)")
    p.add_argument("--workloads", default=",".join(w.name for w in WORKLOADS),
                   help="comma-separated subset of " + ", ".join(w.name for w in WORKLOADS))
    p.add_argument("--tracers", default=",".join(TRACERS),
                   help="comma-separated subset of " + ", ".join(TRACERS) + "; empty/empty_raw = bcc programs "
                        "that return at once on the three tracepoints, perf-event and raw (the kernel's price for "
                        "running any BPF program there); clock_raw = raw programs that only read the clock; floor = "
                        "bpftrace reading only the clock there; reference "
                        "= the libbpf-tools biolatency design; iotrace_tp = iotrace --attach tracepoint")
    p.add_argument("--stats-rounds", type=int, default=3,
                   help="interleaved rounds of the bpf_stats pass (default 3; 0 skips it)")
    p.add_argument("--stats-ios", type=int, default=200_000,
                   help="fio requests per bpf_stats run (default 200000)")
    p.add_argument("--json", metavar="FILE", help="also write the runs and the summary as JSON")
    p.add_argument("--quick", action="store_true", help="2 reps of 2 s, qd32 only, 2 bpf_stats rounds: a smoke run")
    args = p.parse_args()
    if args.quick:
        args.reps, args.seconds, args.workloads = 2, 2, "qd32"
        args.stats_rounds, args.stats_ios = 2, 50_000
    args.workloads = args.workloads.split(",")
    args.tracers = args.tracers.split(",")
    unknown = (set(args.workloads) - {w.name for w in WORKLOADS}) | (set(args.tracers) - set(TRACERS))
    if unknown:
        print(f"bench_overhead: unknown workload or tracer {', '.join(sorted(unknown))}", file=sys.stderr)
        return 2
    if args.reps < 1 or args.stats_rounds < 0 or args.stats_ios < 1:
        print("bench_overhead: --reps and --stats-ios take at least 1, --stats-rounds at least 0", file=sys.stderr)
        return 2
    if os.geteuid() != 0:
        print("bench_overhead: needs root (BPF, losetup): run it with sudo, or `make bench`", file=sys.stderr)
        return 2
    for tool, how in (("fio", "run `make setup`"), ("bpftool", "apt install bpftool (or linux-tools-common)")):
        if not shutil.which(tool):
            print(f"bench_overhead: {tool} not found: {how}", file=sys.stderr)
            return 2
    try:
        args.start_event = start_event()
    except RuntimeError as exc:
        print(f"bench_overhead: {exc}", file=sys.stderr)
        return 2
    res = bench(args)
    costs = summarize_costs(res)
    rows = summarize(res, costs)
    checks = verdict(res, rows, costs)
    print_table(res, rows, costs, checks)
    if args.json:
        Path(args.json).write_text(json.dumps({**asdict(res), "summary": rows, "bpf_cost": costs,
                                               "verdict": checks}, indent=1))
    return 128 + signal.Signals[res.interrupted].value if res.interrupted else 0


if __name__ == "__main__":
    sys.exit(main())
