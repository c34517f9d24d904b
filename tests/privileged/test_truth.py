"""iotrace against an exact reference (reference.groundtruth), workload by workload.

Each test runs a workload on loop devices under iotrace while the reference
records every block event in a private tracefs instance, timed by BPF stamps
that bracket iotrace's own, then asserts the comparison: per series
(process, device, op) counts, bytes and phase counts equal; p50, p90, p99
and p99.9 of queue, device and total within 2% of the exact nearest-rank
percentile or in the same bucket; max in the same bucket; the mean; each
up to the stamps' measured jitter (see reference.groundtruth); no series on
one side only (unless the reference explains it) and nothing dropped that
it does not explain.  The failure message is the full iotrace-vs-exact table.

Raw-device workloads run `iotrace -- COMMAND` (the command's process tree);
file-system workloads trace every process on the device (`iotrace --dev`,
ended with SIGINT) so that jbd2 and writeback kworkers are compared too.
Those tests are marked `bpf`; the last few check the reference's own
matching on event sequences taken from real traces, without root.
"""

from __future__ import annotations

import subprocess
import time

import pytest
from conftest import PYTHON, ROOT, fio_cmd, make_ext4, series_of, umount
from reference import groundtruth as gt

from privileged.test_writeback import exact_bytes

bpf = pytest.mark.bpf


@pytest.fixture(autouse=True, params=["raw_tp", "tracepoint"])
def attach(request, monkeypatch):
    """Each test on both attach paths: iotrace and the reference's stamper follow $IOTRACE_ATTACH."""
    monkeypatch.setenv("IOTRACE_ATTACH", request.param)
    return request.param


def kdevs(*loops) -> list[int]:
    return [gt.kdev_of_path(lp.path) for lp in loops]


def dev_args(*loops) -> list[str]:
    return [a for lp in loops for a in ("--dev", lp.name)]


def traced_run(workdir, loops, command: list[str]) -> gt.Run:
    """Run `iotrace --dev ... -- command` with the reference recording: the whole run (its truth's notes too)."""
    return gt.run_command(dev_args(*loops), command, kdevs(*loops), PYTHON, ROOT, workdir)


def traced_command(tmp_path, loops, command: list[str]) -> tuple[gt.Comparison, list[dict]]:
    """traced_run's comparison and iotrace's dumps."""
    run = traced_run(tmp_path, loops, command)
    return run.comparison, run.dumps


def traced_system(tmp_path, loops, command: list[str]) -> tuple[gt.Comparison, list[dict]]:
    """Trace every process on `loops` (iotrace --dev, SIGINT at the end) around `command`; compare."""
    run = gt.run_system(dev_args(*loops), command, kdevs(*loops), PYTHON, ROOT, tmp_path)
    return run.comparison, run.dumps


def assert_matches(cmp: gt.Comparison, dumps: list[dict], required: list[tuple[str, str, str]]) -> None:
    """The workload's own series exist on both sides, then accounting, then latencies match."""
    table = gt.render(cmp)
    final = dumps[-1]
    for comm, device, op in required:
        if not series_of(final, comm=comm, device=device, op=op):
            pytest.fail(f"iotrace reports no {op} of {comm} on {device}\n{table}", pytrace=False)
        if not [s for s in cmp.find(comm=comm, device=device, op=op) if s.status == "compared"]:
            pytest.fail(f"no {op} series of {comm} on {device} on both sides\n{table}", pytrace=False)
    if cmp.accounting_problems():
        pytest.fail("iotrace's counts, bytes, phases or series differ from the exact ones:\n" + table, pytrace=False)
    if not cmp.ok:
        pytest.fail("iotrace's latencies are off the exact ones:\n" + table, pytrace=False)


@pytest.fixture
def ext4(make_loop, tmp_path):
    """An ext4 file system on a fresh loop device, mounted; unmounted at teardown."""
    loop = make_loop(128)
    mnt = tmp_path / "mnt"
    make_ext4(loop.path, mnt, "no_prefetch_block_bitmaps")    # ext4lazyinit would read the disk while we trace
    try:
        yield loop, mnt
    finally:
        umount(mnt)


# ---- raw devices: iotrace -- COMMAND ---------------------------------------------

@bpf
def test_random_reads_qd1(loop, tmp_path):
    cmp, dumps = traced_command(tmp_path, [loop], fio_cmd(loop.path, "qd1", size="16M"))
    assert_matches(cmp, dumps, [("fio", loop.name, "read")])


@bpf
def test_random_reads_qd32(loop, tmp_path):
    cmp, dumps = traced_command(tmp_path, [loop], fio_cmd(loop.path, "qd32", size="32M", ioengine="libaio",
                                                          iodepth=32))
    assert_matches(cmp, dumps, [("fio", loop.name, "read")])


@bpf
def test_sequential_1m_reads(make_loop, tmp_path):
    loop = make_loop(128)
    cmp, dumps = traced_command(tmp_path, [loop], fio_cmd(loop.path, "seq", rw="read", bs="1M", size="64M",
                                                          loops=4))
    assert_matches(cmp, dumps, [("fio", loop.name, "read")])


@bpf
def test_mixed_random_read_write(loop, tmp_path):
    cmp, dumps = traced_command(tmp_path, [loop], fio_cmd(loop.path, "rw", rw="randrw", rwmixread=70, size="16M",
                                                          ioengine="libaio", iodepth=8))
    assert_matches(cmp, dumps, [("fio", loop.name, "read"), ("fio", loop.name, "write")])


@bpf
def test_discards(loop, tmp_path):
    cmp, dumps = traced_command(tmp_path, [loop], fio_cmd(loop.path, "trim", rw="trim", bs="64k", size="32M"))
    assert_matches(cmp, dumps, [("fio", loop.name, "discard")])


@bpf
def test_several_processes_on_two_devices(make_loop, tmp_path):
    a, b = make_loop(), make_loop()
    # each job on its own 8 MiB (offset_increment): two jobs at one sector in flight together are twins the
    # tracepoint path cannot tell apart (see test_two_processes_reading_the_same_blocks), and the comparison
    # fails on them (Comparison.twins); CI's run had 10 such overlaps when both jobs read one range, and two
    # readers' p99s swapped a request (+3.8%, -3.4%)
    reads = fio_cmd(a.path, "mr", size="8M", offset_increment="8M", ioengine="libaio", iodepth=4, numjobs=2)
    writes = fio_cmd(b.path, "mw", rw="randwrite", size="8M", offset_increment="8M", numjobs=2)
    cmp, dumps = traced_command(tmp_path, [a, b], ["sh", "-c", f"{' '.join(reads)} & {' '.join(writes)} & wait"])
    assert_matches(cmp, dumps, [("fio", a.name, "read"), ("fio", b.name, "write")])
    # two fio processes with two job processes each: every job is its own series
    assert len([s for s in cmp.find(comm="fio") if s.status == "compared"]) >= 4, gt.render(cmp)


@bpf
def test_two_processes_reading_the_same_blocks(loop, tmp_path, attach):
    """O_DIRECT readers of one 256 KiB range at queue depth 8 each: requests at one sector are often in
    flight together, and each is attributed and timed as itself."""
    if attach != "raw_tp":
        pytest.skip("the tracepoint path knows a request only by its (dev, sector): twins may swap latencies")
    # size bounds each job at 64 reads a loop (~2 ms on the host; number_ios does not extend it), so whether
    # the jobs overlap is left to when each starts.  (loops=64, 4096 reads each, overlapped every time but then
    # failed 1 run in 11 on the queue phase's p99.9, 406 ns off a ~3 us value: beyond the stamps' measured
    # jitter allowance.)  Overlaps are likely, not certain: on a busy machine, or an emulated guest (5.10 under
    # TCG: none in 3 runs of one loop), one job starts after the other is done.  Every run must match exactly;
    # up to 3 runs for one in which twins were in flight together, each 4 times longer than the last.
    for attempt, loops in enumerate((1, 4, 16)):
        twins = fio_cmd(loop.path, "twins", size="256k", ioengine="libaio", iodepth=8, numjobs=2, loops=loops)
        workdir = tmp_path / f"run{attempt}"
        workdir.mkdir()
        run = traced_run(workdir, [loop], twins)
        assert_matches(run.comparison, run.dumps, [("fio", loop.name, "read")])
        both = [s for s in run.comparison.find(comm="fio", device=loop.name, op="read") if s.status == "compared"]
        assert len(both) == 2, gt.render(run.comparison)
        if run.truth.notes["same_sector_by_request"] > 0:
            break       # the overlaps happened, and the reference told them apart by request, not by order
    else:
        pytest.fail(f"in 3 runs no two requests at one sector were in flight together: {run.truth.notes}")


# ---- ext4 on a loop device: every process on the device ----------------------------

@bpf
def test_buffered_writes_then_fsync(ext4, tmp_path):
    loop, mnt = ext4
    cmp, dumps = traced_system(tmp_path, [loop], fio_cmd(str(mnt / "buf.dat"), "buf", rw="write", size="16M",
                                                         direct=0, end_fsync=1))
    assert_matches(cmp, dumps, [("fio", loop.name, "write")])


@bpf
def test_flushes_fsync_and_fdatasync(ext4, tmp_path):
    loop, mnt = ext4
    fsync = fio_cmd(str(mnt / "a.dat"), "fsync", rw="randwrite", size="2M", direct=0, fsync=8)
    # overwrites of a laid-out file: fdatasync has no metadata to commit, so fio's own flush goes out
    fdatasync = fio_cmd(str(mnt / "b.dat"), "fdatasync", rw="randwrite", size="2M", direct=0, fdatasync=4,
                        overwrite=1)
    cmp, dumps = traced_system(tmp_path, [loop], ["sh", "-c", f"{' '.join(fsync)} && {' '.join(fdatasync)}"])
    assert_matches(cmp, dumps, [("fio", loop.name, "write"), ("fio", loop.name, "flush")])


@bpf
def test_write_back_is_charged_to_the_writer(ext4, tmp_path):
    """16 MiB written without fsync, then handed to the flusher (syncfs): the flusher's requests are the
    writer's write-back on both sides (the reference charges them by the same rule, from ftrace's
    writeback events), and the rest (journal, metadata) is whoever's it is."""
    loop, mnt = ext4
    f = mnt / "wb.dat"
    cmp, dumps = traced_system(tmp_path, [loop], ["sh", "-c", f"head -c 16M /dev/zero > {f} && sync -f {f}"])
    wb = [s for s in series_of(dumps[-1], comm="head", device=loop.name, op="write") if s.get("wb")]
    # all 16 MiB, less a whole request for each the kernel ran no program for, which iotrace counts (a CI run
    # saw a 512 KiB write-back request unseen so by both iotrace and the reference)
    exact_bytes(sum(s["bytes"] for s in wb), 16 << 20, dumps, loop.name)
    # every series' counts, bytes and phase counts as the reference charges them (what is checked here is
    # whose requests they are; their latencies are the same code's as every other test's, and a series of a
    # few samples each fails the 2% / 250 ns jitter bound now and then); the journal's timer may commit
    # at the trace's edge: a request there is in neither side's window
    if [p for p in cmp.accounting_problems() if "at the edge of iotrace's window" not in p]:
        pytest.fail("iotrace's counts, bytes, phases or series differ from the exact ones:\n" + gt.render(cmp),
                    pytrace=False)
    charged = [s for s in cmp.series if s.key[3]]
    assert charged and all(s.status == "compared" for s in charged), gt.render(cmp)


@bpf
def test_other_processes_on_the_device_are_not_traced(make_loop, tmp_path):
    """`iotrace -- COMMAND` counts the command's requests only, while another process reads the same disk."""
    loop = make_loop()
    # thread=1: its job is a thread, not a forked process (fio's job processes call setsid());
    # rate-limited so that the reference's buffers hold its events too, however slow the machine: at
    # 500 a second, ~3 stamps a request, its 2 x 262144 records last 350 s (a TCG guest took 240 s)
    other = subprocess.Popen(fio_cmd(loop.path, "other", size="16M", time_based=1, runtime=60, thread=1,
                                     rate_iops=500),
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        time.sleep(0.5)         # the other reader is in full swing before iotrace starts
        cmp, dumps = traced_command(tmp_path, [loop], fio_cmd(loop.path, "mine", size="8M"))
    finally:
        other.kill()
        other.wait()
    mine = [s for s in cmp.find(comm="fio", device=loop.name, op="read") if s.status == "compared"]
    assert mine, gt.render(cmp)
    assert cmp.excluded, "the reference saw none of the other reader's requests"
    assert_matches(cmp, dumps, [("fio", loop.name, "read")])
