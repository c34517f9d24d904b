"""The in-flight table's claims without BPF compare-and-swap (kernels before 5.12: compat.bpf.h tag_cas).

The loader probes the verifier for cmpxchg (bpfobject.has_cmpxchg) and, where it is refused, compiles
the emulated claim.  Here, on a kernel that has it, iotrace is run with the probe answering no, so that
the emulation is what runs: two fio jobs on two CPUs start requests at once, whose slots are claimed and
freed concurrently, and every request must be recorded once, on both attach paths.
"""

from __future__ import annotations

import json
import os
import subprocess

import pytest
from conftest import PYTHON, ROOT, TIMEOUT_SCALE, assert_count, fio_cmd, read_dumps, read_stats, series_of

from tracer.sources import bpfobject

bpf = pytest.mark.bpf

# iotrace's command line with the probe saying the kernel has no cmpxchg; it says which flags it compiled with
NO_CMPXCHG = """
import runpy, sys
from tracer.sources import bpfobject, probe
bpfobject.has_cmpxchg = lambda: False
compile_flags = probe.compile_flags
def said(*a, **kw):
    flags = compile_flags(*a, **kw)
    print("cflags:", *flags, file=sys.stderr)
    return flags
probe.compile_flags = said
sys.argv[0] = "iotrace"
runpy.run_module("tracer.cli", run_name="__main__")
"""


def kernel_version() -> tuple[int, int]:
    major, minor = os.uname().release.split(".")[:2]
    return int(major), int("".join(c for c in minor if c.isdigit()))


@bpf
def test_the_cmpxchg_probe_agrees_with_the_kernel_version():
    # BPF_CMPXCHG came with Linux 5.12 (upstream 5ffa25502b5a)
    assert bpfobject.has_cmpxchg() == (kernel_version() >= (5, 12))


@bpf
@pytest.mark.parametrize("attach", ["raw_tp", "tracepoint"])
def test_emulated_claims_record_every_request(attach, loop, tmp_path):
    out = tmp_path / "run.jsonl"
    before = read_stats(loop.name)[0]
    r = subprocess.run([PYTHON, "-c", NO_CMPXCHG, "--attach", attach, "--no-tasks", "--dev", loop.name,
                        "-o", str(out), "--", *fio_cmd(loop.path, size="32M", ioengine="libaio", iodepth=16,
                                                       numjobs=2, group_reporting=1)],
                       cwd=ROOT, capture_output=True, text=True, timeout=180 * TIMEOUT_SCALE)
    reads = read_stats(loop.name)[0] - before
    assert r.returncode == 0, r.stderr
    assert "-DIOTRACE_NO_CMPXCHG" in r.stderr, r.stderr
    fio = json.loads(r.stdout[r.stdout.index("{"):r.stdout.rindex("}") + 1])["jobs"][0]["read"]
    assert fio["total_ios"] == 2 * 8192 >= reads > 16000
    (dump,) = read_dumps(out)
    rows = series_of(dump, comm="fio", device=loop.name, op="read")    # a row per fio job
    assert len(rows) == 2
    assert_count(sum(row["count"] for row in rows), reads, [dump], device=loop.name)
    # a kernel before 5.12 (no cmpxchg, the same release) counts no skipped events either: said, not read as 0
    assert ("skipped" in dump.get("unavailable", {})) == (kernel_version() < (5, 12)), dump.get("unavailable")
    # no slot lost to a claim race: the table never filled, nothing completed without its start
    assert not dump["dropped"]["inflight_full"] and not dump["dropped"]["no_start"], dump["dropped"]


# The same, and the per-process object's compile flags said too (its waits table claims entries the same way)
NO_CMPXCHG_TASKS = NO_CMPXCHG.replace("""sys.argv[0] = "iotrace"
""", """from tracer.sources import tasks
made = tasks.BpfObject
def tasks_object(source, variants, what):
    print("tasks cflags:", *variants[0].cflags, file=sys.stderr)
    return made(source, variants, what)
tasks.BpfObject = tasks_object
sys.argv[0] = "iotrace"
""")


# Runs its arguments and says the voluntary context switches the child made (its rusage): every I/O wait is one
VOLUNTARY = """
import os, subprocess, sys
child = subprocess.Popen(sys.argv[1:])
_, status, usage = os.wait4(child.pid, 0)
print("voluntary switches:", usage.ru_nvcsw, file=sys.stderr)
sys.exit(os.waitstatus_to_exitcode(status))
"""


@bpf
def test_emulated_claims_keep_every_io_wait(loop, tmp_path):
    """The per-process programs keep a blocked thread's wait in a table whose entries are claimed and freed
    as the in-flight slots are (compat.bpf.h tag_cas, tag_clear): without cmpxchg (Linux 5.10, which
    refused the exchange itself: "BPF_STX uses reserved fields") they load, and each time dd blocked on
    one of its O_DIRECT reads is counted.  The reference is the kernel's count of dd's voluntary context
    switches: a read whose request completed before dd went to sleep (the loop worker on the other CPU is
    that quick now and then) is no wait, and dd blocks once or twice on something else (measured on 6.18
    with cmpxchg and without: 1999 waits of 2000 switches, 2000 of 2001)."""
    out = tmp_path / "run.jsonl"
    r = subprocess.run([PYTHON, "-c", NO_CMPXCHG_TASKS, "--dev", loop.name, "-o", str(out), "--",
                        PYTHON, "-c", VOLUNTARY,
                        "dd", f"if={loop.path}", "of=/dev/null", "bs=4k", "count=2000", "iflag=direct"],
                       cwd=ROOT, capture_output=True, text=True, timeout=180 * TIMEOUT_SCALE)
    assert r.returncode == 0, r.stderr
    said = [ln for ln in r.stderr.splitlines() if ln.startswith("tasks cflags:")]
    assert said and "-DIOTRACE_NO_CMPXCHG" in said[0].split(), r.stderr
    (switches,) = [int(ln.split()[-1]) for ln in r.stderr.splitlines() if ln.startswith("voluntary switches:")]
    (dump,) = read_dumps(out)
    assert "unavailable" not in dump["tasks_sources"]["io_wait"], dump["tasks_sources"]
    (dd,) = [t for t in dump["tasks"] if t["comm"] == "dd"]
    assert not any(k.startswith("tasks_") and n for k, n in dump["dropped"].items()), dump["dropped"]
    # nearly every read blocked, and each block was a wait counted: none lost to a claim
    assert 1500 <= switches - 5 <= dd["io_waits"] <= switches and dd["io_wait_s"] > 0, (switches, dd)
