"""What a saved file's values may be: each check returns the value or raises ValueError naming it.

A saved file may have been cut, hand-edited or written by anything: every
value is checked as it is read (tracer.codec.jsonl, the dump sections'
from_json in tracer.model.sections), so that a bad one is that line's error,
never an exception in the report that merges or renders it later.
"""

from __future__ import annotations

MAX_INT = 2**63 - 1     # counts, bytes, pids, ids: what the kernel's u64/s64 can hold
MAX_NUMBER = 1e18       # seconds, microseconds, kB: finite, and far beyond any run


def what(v) -> str:
    text = repr(v)
    return text if len(text) <= 40 else text[:37] + "..."


def whole(v, name: str) -> int:
    if isinstance(v, bool) or not isinstance(v, int) or not 0 <= v <= MAX_INT:
        raise ValueError(f"{name} is {what(v)}, not a whole number from 0 to 2**63-1")
    return v


def number(v, name: str) -> float:
    if isinstance(v, bool) or not isinstance(v, int | float) or not 0 <= v <= MAX_NUMBER:   # also NaN, inf
        raise ValueError(f"{name} is {what(v)}, not a finite number >= 0")
    return float(v)


def text(v, name: str) -> str:
    if not isinstance(v, str):
        raise ValueError(f"{name} is {what(v)}, not a string")
    return v


def boolean(v, name: str) -> bool:
    if not isinstance(v, bool):
        raise ValueError(f"{name} is {what(v)}, not true or false")
    return v


def obj(v, name: str) -> dict:
    if not isinstance(v, dict):
        raise ValueError(f"{name} is {what(v)}, not an object")
    return v


def array(v, name: str) -> list:
    if not isinstance(v, list):
        raise ValueError(f"{name} is {what(v)}, not a list")
    return v
