"""Argument types and the parser every iotrace command uses (base layer: sinks add their own options too).

Parser turns argparse's usage errors into UserError (one line, exit 2).
"""

from __future__ import annotations

import argparse

from tracer.errors import UserError


def positive(text: str) -> float:
    try:
        v = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds") from None
    if v <= 0:
        raise argparse.ArgumentTypeError(f"{text!r} must be more than 0 seconds")
    return v


def at_least(least: int):
    """An argparse type: a whole number no smaller than `least`."""
    def parse(text: str) -> int:
        try:
            n = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
        if n < least:
            raise argparse.ArgumentTypeError(f"{text!r} must be {least} or more")
        return n
    return parse


class Parser(argparse.ArgumentParser):
    """argparse that raises UserError (one line, exit 2) instead of printing usage."""

    def error(self, message: str):
        raise UserError(f"{message} (see '{self.prog} --help')")
