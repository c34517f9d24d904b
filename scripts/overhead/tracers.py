"""The tracers the overhead bench measures, each started before a run and stopped after it.

"none" (the baseline), iotrace twice (raw tracepoints, and --attach
tracepoint), the reference design (libbpf-tools' biolatency, in bcc),
bpftrace with an equivalent histogram, blktrace, and the floors: bcc
programs that return at once (perf-event and raw), raw programs that only
read the clock, bpftrace reading the clock.  TRACERS names them in the
order make_tracers() builds them.
"""

from __future__ import annotations

import json
import os
import select
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent.parent
PYTHON = str(ROOT / ".venv" / "bin" / "python") if (ROOT / ".venv").exists() else sys.executable

# The bpftrace peer: the same question iotrace answers (latency per pid and device, from the
# request's start to its completion), written the way a bpftrace user would.
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


_START: list[str] = []


def _probe():
    """This tree's tracer.sources.probe: its start events and their chooser."""
    from tracer.sources import probe  # noqa: PLC0415 - only the peers' start event needs it

    return probe


def start_event() -> str:
    """The request start iotrace takes on this kernel (block_io_start from 6.5, block_getrq before it):
    the peers start their requests there too, so that every tracer runs on the same events."""
    if not _START:
        _START.append(_probe().choose_start_event())
    return _START[0]


def with_start(prog: str) -> str:
    """A peer's program text (bcc C or bpftrace) with START_EVENT made the kernel's start event."""
    return prog.replace("START_EVENT", start_event())


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


def _await_start(proc: subprocess.Popen, stream, needle: str, what: str) -> None:
    """Wait for a tracer process to print `needle`; else kill it and raise with what it printed."""
    if _wait_line(proc, stream, needle, 60) is None:
        said = stream.read() if proc.poll() is not None else ""
        proc.kill()
        proc.wait()
        raise RuntimeError(f"{what} did not start: {said.strip()}")


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
        proc = subprocess.Popen([PYTHON, "-m", "tracer.cli", "-i", "10", "-o", str(self.output), *self.extra],
                                cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=env)
        self.pid = proc.pid
        _await_start(proc, proc.stderr, "tracing block I/O", self.name)
        self.proc = proc

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
    text = ""
    raw = False

    @property
    def events(self) -> tuple[str, ...]:
        return (start_event(), "block_rq_issue", "block_rq_complete")

    def __init__(self) -> None:
        super().__init__()
        self.b = None
        self._why: str | None = None

    def _fn(self, ev: str) -> str:
        return f"raw_tracepoint__{ev}" if self.raw else f"tracepoint__block__{ev}"

    def why_not(self) -> str | None:
        if self.b is None and self._why is None:
            try:
                import bcc  # noqa: PLC0415 - only these tracers need it

                self.b = bcc.BPF(text=with_start(self.text))    # bcc attaches *_PROBE programs as it loads them
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
# The least any exact per-process latency tracer does on these events: a slot per in-flight
# request in a plain array, indexed by a hash of its address (no claim: collisions are lost, which
# a real tracer may not accept), the start and issue stamped and the submitter noted, and three
# log2 counts in a per-CPU array at completion.  No comm, cgroup, filters, series or fine buckets.
# What it costs above "empty_raw" is the floor of the work itself (bench_cost.py's "lean").
class Lean(BccTracer):
    name = "lean"
    raw = True
    text = """
struct slot { u64 rq; u64 id; u64 start; u64 issue; };
BPF_ARRAY(slots, struct slot, 8192);
BPF_PERCPU_ARRAY(hist, u64, 3 * 64);
static __always_inline struct slot *slot_of(u64 rq)
{
    u32 i = (u32)((rq * 0x9E3779B97F4A7C15ULL) >> 51);
    return slots.lookup(&i);
}
static __always_inline void count(u32 base, u64 ns)
{
    u32 k = base + (ns ? bpf_log2l(ns) & 63 : 0);
    u64 *c = hist.lookup(&k);
    if (c)
        (*c)++;
}
RAW_TRACEPOINT_PROBE(START_EVENT)
{
    u64 rq = ctx->args[0];
    struct slot *s = slot_of(rq);
    if (s) {
        s->start = bpf_ktime_get_ns();
        s->id = bpf_get_current_pid_tgid();
        s->issue = 0;
        s->rq = rq;
    }
    return 0;
}
RAW_TRACEPOINT_PROBE(block_rq_issue)
{
    u64 rq = ctx->args[0];
    struct slot *s = slot_of(rq);
    if (s && s->rq == rq)
        s->issue = bpf_ktime_get_ns();
    return 0;
}
RAW_TRACEPOINT_PROBE(block_rq_complete)
{
    u64 rq = ctx->args[0], now;
    struct slot *s = slot_of(rq);
    if (!s || s->rq != rq)
        return 0;
    now = bpf_ktime_get_ns();
    count(0, now - s->start);
    count(64, now - s->issue);
    count(128, s->issue - s->start);
    s->rq = 0;
    return 0;
}
"""


# The same least work on the kernel's stamps (iotrace's --stamps kernel): the start notes the
# submitter in its slot and reads no clock, no program runs on the issue, and the completion reads
# the clock once and the request's start_time_ns (at its offset in the running kernel's BTF), one
# log2 count.  The floor of the work of that design (bench_cost.py's "lean_kernel").
class LeanKernel(BccTracer):
    name = "lean_kernel"
    raw = True

    @property
    def events(self) -> tuple[str, ...]:
        return (start_event(), "block_rq_complete")

    @property
    def text(self) -> str:
        from tracer.sources import kernel  # noqa: PLC0415 - the BTF, read when this tracer is built

        offset = kernel.open_btf().member("request", "start_time_ns").offset
        return f"#define RQ_START_NS {offset}\n" + """
struct slot { u64 rq; u64 id; };
BPF_ARRAY(slots, struct slot, 8192);
BPF_PERCPU_ARRAY(hist, u64, 64);
static __always_inline struct slot *slot_of(u64 rq)
{
    u32 i = (u32)((rq * 0x9E3779B97F4A7C15ULL) >> 51);
    return slots.lookup(&i);
}
RAW_TRACEPOINT_PROBE(START_EVENT)
{
    u64 rq = ctx->args[0];
    struct slot *s = slot_of(rq);
    if (s) {
        s->id = bpf_get_current_pid_tgid();
        s->rq = rq;
    }
    return 0;
}
RAW_TRACEPOINT_PROBE(block_rq_complete)
{
    u64 rq = ctx->args[0], now, start = 0;
    struct slot *s = slot_of(rq);
    if (!s || s->rq != rq)
        return 0;
    now = bpf_ktime_get_ns();
    bpf_probe_read_kernel(&start, sizeof(start), (const void *)(rq + RQ_START_NS));
    u32 k = now > start ? bpf_log2l(now - start) & 63 : 0;
    u64 *c = hist.lookup(&k);
    if (c)
        (*c)++;
    s->rq = 0;
    return 0;
}
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

RAW_TRACEPOINT_PROBE(START_EVENT)
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
    name = "reference"
    raw = True
    text = REFERENCE_PROG

    def __init__(self) -> None:
        super().__init__()
        self._base = 0

    def why_not(self) -> str | None:
        if _probe().starts_at_bio(start_event()):
            # libbpf-tools' biolatency times such kernels from block_rq_issue (or -Q's block_rq_insert)
            return (f"the reference design keys a request by its struct request from the start on; "
                    f"{start_event()}, this kernel's start, gives its bio")
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
        proc = subprocess.Popen(["bpftrace", "-e", with_start(self.prog)], stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, text=True)
        self.pid = proc.pid
        _await_start(proc, proc.stdout, "Attach", "bpftrace")
        self.proc = proc
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


TRACERS = ("none", "empty", "empty_raw", "clock_raw", "floor", "reference", "iotrace", "iotrace_tp", "iotrace_kernel",
           "bpftrace", "blktrace")


def make_tracers(shm: Path) -> list[Tracer]:
    return [Untraced(), Empty(), EmptyRaw(), ClockRaw(), BPFTrace(FLOOR_PROG, "floor"), Reference(),
            IOTrace(shm / "iotrace.jsonl"),
            IOTrace(shm / "iotrace-tp.jsonl", ["--attach", "tracepoint"], name="iotrace_tp"),
            IOTrace(shm / "iotrace-kernel.jsonl", ["--stamps", "kernel"], name="iotrace_kernel"),
            BPFTrace(), BlkTrace(shm)]
