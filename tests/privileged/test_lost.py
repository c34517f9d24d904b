"""Requests whose completion never reached iotrace are found in the in-flight table and counted.

On the perf-event tracepoint path the kernel now and then runs no
block_rq_complete program for a request (README, Dropped events), which no
test can cause on demand; so these tests plant such a request's slot in the
real in-flight table of a loaded probe and check what the collector makes of
it.  (The raw-tracepoint path has no such loss: the kernel counts every
event it skips there, reported per program.)
"""

from __future__ import annotations

import ctypes as ct
import subprocess
import time

import pytest
from reference import groundtruth as gt

from tracer.sources.devices import device_filter, in_flight
from tracer.sources.probe import LOST_MIN_AGE_NS, Probe, ProbeOptions

bpf = pytest.mark.bpf


@pytest.fixture
def probe(loop):
    p = Probe(ProbeOptions(devs=device_filter([loop.path]), attach="tracepoint"))
    try:
        yield p
    finally:
        p.close()


def plant(probe: Probe, index: int, dev: int, start_ns: int, ended: bool = False) -> None:
    """A taken slot of a request at `dev` that started at `start_ns` and never completed (`ended`: one that did,
    its key kept in the slot, as a request object's is between its lives)."""
    slots = probe.bpf["inflight"]
    s = slots.Leaf()
    s.dev, s.sector, s.start_ns, s.remaining, s.life, s.ended = dev, 8 * index, start_ns, 4096, 1, int(ended)
    slots[ct.c_int(index)] = s
    tags, probes = probe.bpf["tags"], slots.max_entries // probe.bpf["tags"].max_entries
    group = tags[ct.c_int(index // probes)]
    group.tag[index % probes] = 0xABCD0001 + 2 * index
    tags[ct.c_int(index // probes)] = group


def lost(raw) -> int:
    return raw.reasons["drop_lost_completion"]


@bpf
def test_a_request_left_in_flight_on_an_idle_device_is_counted_once(probe, loop):
    dev = gt.kdev_of_path(loop.path)
    plant(probe, 5, dev, time.monotonic_ns() - 2 * LOST_MIN_AGE_NS)
    assert lost(probe.drain()) == 1
    assert lost(probe.drain()) == 0            # still there, already counted


@bpf
def test_a_young_request_waits_for_the_final_drain(probe, loop):
    dev = gt.kdev_of_path(loop.path)
    plant(probe, 9, dev, time.monotonic_ns())
    assert lost(probe.drain()) == 0            # may still be on its way to the driver
    t0 = time.monotonic()
    assert lost(probe.drain(final=True)) == 1  # the last drain waits until it is old enough
    assert time.monotonic() - t0 < 2 * LOST_MIN_AGE_NS / 1e9 + 0.5


@bpf
def test_a_request_slow_to_complete_is_not_taken_for_lost(make_loop, tmp_path):
    """A write held in flight for seconds (its loop device's backing file system is frozen)."""
    outer = make_loop(64)
    subprocess.run(["mkfs.ext4", "-q", "-F", outer.path], check=True, capture_output=True)
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    subprocess.run(["mount", outer.path, str(mnt)], check=True, capture_output=True)
    writer = probe = inner = None
    try:
        inner = make_loop(16, backing_dir=mnt)
        dev = gt.kdev_of_path(inner.path)
        probe = Probe(ProbeOptions(devs=device_filter([inner.path]), attach="tracepoint"))
        subprocess.run(["fsfreeze", "-f", str(mnt)], check=True)
        writer = subprocess.Popen(["dd", "if=/dev/zero", f"of={inner.path}", "bs=4k", "count=1", "oflag=direct"],
                                  stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        time.sleep(3 * LOST_MIN_AGE_NS / 1e9)
        assert writer.poll() is None and in_flight(dev), "the write should be stuck in flight"
        assert lost(probe.drain()) == 0
        subprocess.run(["fsfreeze", "-u", str(mnt)], check=True)
        assert writer.wait(30) == 0
        raw = probe.drain(final=True)
        assert lost(raw) == 0
        assert int(raw.series_vals["count"].sum()) == 1      # it completed, and was recorded
    finally:
        subprocess.run(["fsfreeze", "-u", str(mnt)], capture_output=True)
        if writer and writer.poll() is None:
            writer.kill()
            writer.wait()
        if probe:
            probe.close()
        if inner:   # before the unmount: it holds a file there
            subprocess.run(["losetup", "-d", inner.path], capture_output=True)
        subprocess.run(["umount", str(mnt)], capture_output=True)


@bpf
def test_raw_path_counts_an_old_slot_at_the_end_only(loop):
    """Raw path: a slot whose completion never came is counted when its request object starts again (in
    the kernel), or, left at the end, by the last drain while no disk has anything in flight."""
    p = Probe(ProbeOptions(devs=device_filter([loop.path]), attach="raw_tp"))
    try:
        plant(p, 5, 0, time.monotonic_ns() - 2 * LOST_MIN_AGE_NS)     # the raw path learns the disk at completion
        plant(p, 9, 0, time.monotonic_ns())                           # young: may still be on its way
        plant(p, 12, 0, time.monotonic_ns() - 2 * LOST_MIN_AGE_NS, ended=True)    # completed: its key kept
        assert lost(p.drain()) == 0                 # an interval: a later start of the object counts it
        # the last drain's count, taken at moments when no disk of the machine is busy: the old slot only
        seen = set()
        for _ in range(50):
            seen.add(p.ledger.lost_at_end())
            if 1 in seen:
                break
            time.sleep(0.05)
        assert seen <= {0, 1} and 1 in seen, seen
    finally:
        p.close()
