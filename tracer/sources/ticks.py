"""The kernel's tick count (jiffies) as CLOCK_MONOTONIC: what a start program reads instead of the clock.

With --stamps kernel a request's start program reads the time only to date its in-flight slot (the
lost-request ledger, a stale slot's take-over) and to time the rare request the kernel gave no start
stamp.  bpf_jiffies64() costs a fraction of bpf_ktime_get_ns() (docs/costs.md), and the tick count
becomes CLOCK_MONOTONIC nanoseconds as jiffies * tick_ns + base: this module finds tick_ns (the
kernel's 10^9 / HZ) and base from two readings of /proc/timer_list, whose header has the monotonic
time ("now at N nsecs") and whose per-CPU parts the tick count ("jiffies: N") of the same moment.

A reading's tick count may be a tick newer than its time (the file is written after its header), so
the base is lowered by a tick: a start's time is then never after the clock's (a completion's
reading), and lags it by less than three ticks (12 ms at HZ=250).
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable
from dataclasses import dataclass

TIMER_LIST = "/proc/timer_list"
# the HZ values Linux builds with (kernel/Kconfig.hz)
KERNEL_HZ = (100, 250, 300, 1000)
# the two readings' least distance: 15 ticks at 100 Hz, so that a reading a tick off still tells HZ apart
SPAN_NS = 150_000_000
U64 = (1 << 64) - 1

_NOW = re.compile(r"^now at (\d+) nsecs$", re.M)
_JIFFIES = re.compile(r"^jiffies: (\d+)$", re.M)


@dataclass(frozen=True)
class Ticks:
    """jiffies * tick_ns + base (mod 2**64) is CLOCK_MONOTONIC in ns, less than three ticks behind."""

    hz: int
    tick_ns: int
    base: int           # u64, as the programs add it

    def monotonic_ns(self, jiffies: int) -> int:
        return (jiffies * self.tick_ns + self.base) & U64


def parse(text: str) -> tuple[int, int] | None:
    """(CLOCK_MONOTONIC ns, jiffies) of one reading of /proc/timer_list, or None if it lacks either
    (a kernel without CONFIG_TICK_ONESHOT prints no tick count)."""
    now, jiffies = _NOW.search(text), _JIFFIES.search(text)
    if now is None or jiffies is None:
        return None
    return int(now.group(1)), int(jiffies.group(1))


def calibrate(read: Callable[[], str] | None = None, sleep: Callable[[float], None] = time.sleep) -> Ticks | None:
    """HZ and the base from two readings SPAN_NS apart; None where the file cannot be read or parsed, or
    its tick rate is none Linux builds with (then the start programs read the clock)."""
    def reading() -> tuple[int, int] | None:
        try:
            return parse(read() if read is not None else open(TIMER_LIST).read())
        except OSError:
            return None

    first = reading()
    if first is None:
        return None
    sleep(SPAN_NS / 1e9)
    second = reading()
    if second is None or second[0] - first[0] < SPAN_NS // 2:
        return None
    rate = (second[1] - first[1]) * 1e9 / (second[0] - first[0])
    hz = min(KERNEL_HZ, key=lambda h: abs(h - rate))
    if abs(hz - rate) > 0.1 * hz:
        return None
    tick_ns = 1_000_000_000 // hz
    now_ns, jiffies = second
    return Ticks(hz, tick_ns, (now_ns - jiffies * tick_ns - tick_ns) & U64)
