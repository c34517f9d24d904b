"""tracer.sources.ticks: the tick count as CLOCK_MONOTONIC, from /proc/timer_list readings."""

import os

import pytest

from tracer.sources import ticks

HEADER = """Timer List Version: v0.10
HRTIMER_MAX_CLOCK_BASES: 8
now at {now} nsecs

cpu: 0
 clock 0:
  .base:               pK-error
  .idle_jiffies   : {idle}
  .last_jiffies   : {idle}
jiffies: {jiffies}

cpu: 1
jiffies: {jiffies}
"""


def text(now: int, jiffies: int) -> str:
    return HEADER.format(now=now, jiffies=jiffies, idle=jiffies - 3)


def readings(*pairs):
    """A read() giving these (now, jiffies) readings in turn, and a sleep that records what it was asked."""
    texts = iter(text(n, j) for n, j in pairs)
    slept = []
    return (lambda: next(texts)), slept.append, slept


def test_parse_takes_the_header_time_and_the_first_tick_count():
    assert ticks.parse(text(6159565935704, 4296432108)) == (6159565935704, 4296432108)


@pytest.mark.parametrize("body", ["now at 5 nsecs\n", "jiffies: 7\n", "", "now at x nsecs\njiffies: 7\n"])
def test_parse_without_either_is_none(body):
    assert ticks.parse(body) is None


@pytest.mark.parametrize("hz", ticks.KERNEL_HZ)
def test_calibrate_finds_hz_and_a_base_that_never_runs_ahead(hz):
    tick = 1_000_000_000 // hz
    j0 = (1 << 32) - 300 * hz + 1_539_812          # INITIAL_JIFFIES plus some uptime
    t0 = 6_159_565_935_704
    span = 160_000_000
    # the second reading's tick count is one newer than its time (the file is written after its header)
    j1 = j0 + span // tick + 1
    read, sleep, slept = readings((t0, j0), (t0 + span, j1))
    got = ticks.calibrate(read, sleep)
    assert got is not None and (got.hz, got.tick_ns) == (hz, tick)
    assert slept == [ticks.SPAN_NS / 1e9]
    # at the second reading: one tick count too new, lowered by a tick, so at most the reading's time
    assert got.monotonic_ns(j1) == t0 + span - tick
    # a later tick count, read at any moment of its tick: never ahead of the clock, under 3 ticks behind
    for j in (j1 + 1, j1 + 1000):
        for into in (0, tick - 1):
            true_now = t0 + span + (j - j1 - 1) * tick + into
            assert 0 <= true_now - got.monotonic_ns(j) < 3 * tick


def test_calibrate_wraps_the_base_to_64_bits():
    """jiffies * tick_ns is far above the monotonic time: the base is a u64 the programs add."""
    j0 = (1 << 32) - 75_000
    read, sleep, _ = readings((10**12, j0), (10**12 + 80_000_000, j0 + 20))
    got = ticks.calibrate(read, sleep)
    assert got is not None and 0 <= got.base < 1 << 64
    assert got.monotonic_ns(j0 + 20) == 10**12 + 80_000_000 - got.tick_ns


@pytest.mark.parametrize("pairs", [
    ((10**12, 1000), (10**12 + 80_000_000, 1000 + 14)),      # 175 Hz: no kernel builds with it
    ((10**12, 1000), (10**12 + 1_000, 1001)),                # the readings too close to tell
    ((10**12, 1000), (10**12 - 80_000_000, 1020)),           # time going back
])
def test_calibrate_refuses_what_no_kernel_tick_is(pairs):
    read, sleep, _ = readings(*pairs)
    assert ticks.calibrate(read, sleep) is None


def test_calibrate_without_the_file_is_none():
    def read():
        raise PermissionError("/proc/timer_list")
    assert ticks.calibrate(read, lambda s: None) is None


def test_calibrate_on_this_kernel():
    if not os.access(ticks.TIMER_LIST, os.R_OK):
        pytest.skip("/proc/timer_list needs root")
    got = ticks.calibrate()
    if got is None:
        pytest.skip("this kernel prints no tick count (no CONFIG_TICK_ONESHOT)")
    now, jiffies = ticks.parse(open(ticks.TIMER_LIST).read())
    # the reading's tick count may be one newer than its time: up to a tick ahead of it, under 3 behind
    assert -got.tick_ns <= now - got.monotonic_ns(jiffies) < 3 * got.tick_ns
