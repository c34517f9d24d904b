"""Argument types and the parser every iotrace command uses (base layer: sinks add their own options too).

Parser turns argparse's usage errors into UserError (one line, exit 2).
Every number of seconds an option takes is finite and within sane bounds
(MIN_INTERVAL_S .. MAX_SECONDS): a report every nanosecond cannot be kept up
with, and a run of 1e300 s overflows the clocks.
"""

from __future__ import annotations

import argparse
import math

from tracer.errors import UserError

MAX_SECONDS = 366 * 24 * 3600.0     # a year: the longest duration, interval or wait an option takes
MIN_INTERVAL_S = 1e-3               # the shortest report interval: one a millisecond
MAX_COUNT = 10**9                   # the most reports [interval [count]] asks for
MAX_PID = 2**22                     # the kernel's PID_MAX_LIMIT


def _seconds(text: str) -> float:
    try:
        v = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds") from None
    if not math.isfinite(v):
        raise argparse.ArgumentTypeError(f"{text!r} is not a finite number of seconds")
    if v > MAX_SECONDS:
        raise argparse.ArgumentTypeError(f"{text!r} is more than a year ({MAX_SECONDS:g} seconds)")
    return v


def positive(text: str) -> float:
    """Seconds, more than 0 and at most a year."""
    v = _seconds(text)
    if v <= 0:
        raise argparse.ArgumentTypeError(f"{text!r} must be more than 0 seconds")
    return v


def interval_seconds(text: str) -> float:
    """A report interval: seconds, at least MIN_INTERVAL_S and at most a year."""
    v = positive(text)
    if v < MIN_INTERVAL_S:
        raise argparse.ArgumentTypeError(f"{text!r} is shorter than the shortest interval, "
                                         f"{MIN_INTERVAL_S * 1e3:g} ms ({MIN_INTERVAL_S:g} s)")
    return v


def wait_seconds(text: str) -> float:
    """A time to wait: seconds, 0 (do not wait) to a year."""
    v = _seconds(text)
    if v < 0:
        raise argparse.ArgumentTypeError(f"{text!r} must be 0 seconds or more")
    return v


def pid(text: str) -> int:
    """A process id: a whole number from 1 to the kernel's limit."""
    try:
        n = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a process id (a whole number)") from None
    if not 0 < n <= MAX_PID:
        raise argparse.ArgumentTypeError(f"{text!r} is not a process id: a pid is 1 to {MAX_PID}")
    return n


def at_least(least: int, most: int | None = None):
    """An argparse type: a whole number no smaller than `least` (and, if given, no larger than `most`)."""
    def parse(text: str) -> int:
        try:
            n = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
        if n < least:
            raise argparse.ArgumentTypeError(f"{text!r} must be {least} or more")
        if most is not None and n > most:
            raise argparse.ArgumentTypeError(f"{text!r} must be {most} or less")
        return n
    return parse


class Parser(argparse.ArgumentParser):
    """argparse that raises UserError (one line, exit 2) instead of printing usage."""

    def error(self, message: str):
        raise UserError(f"{message} (see '{self.prog} --help')")
