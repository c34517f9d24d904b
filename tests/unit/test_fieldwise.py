"""The generic section reader/writer (tracer.model.fieldwise) on a made-up section: every annotation it knows,
the names its errors give, what a missing key reads as, and the merge policies."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from types import SimpleNamespace
from typing import Any, ClassVar

import pytest

from tracer.model.fieldwise import (
    BY_FIELD,
    Fieldwise,
    Record,
    at_most,
    either,
    joined,
    largest,
    one_of,
    opt,
    summed_per_key,
    union,
)
from tracer.model.sections import Coverage


@dataclass(frozen=True)
class Part(Record):
    n: int = 0
    s: float = 0.0


@dataclass(frozen=True)
class Toy(Fieldwise):
    key: ClassVar[str] = "toy"
    word: str = opt(check=one_of(("a", "b")))
    n: int = opt(5, check=at_most(9))
    x: float | None = None
    flag: bool = False
    names: tuple[str, ...] = opt((), omit_empty=True)
    pairs: tuple[tuple[str, int], ...] = ()
    parts: tuple[Part, ...] = opt((), item="{name}[{i}]")
    by: dict[str, Part] = opt(factory=dict)
    raw: Any = None
    sec: float = opt(0.0, digits=2)


FULL = {"word": "a", "n": 9, "x": 1.5, "flag": True, "names": ["p", "q"], "pairs": {"k": 1, "j": 2},
        "parts": [{"n": 1, "s": 0.5}], "by": {"sda": {"n": 2, "s": 0.0}}, "raw": {"any": [1, None]}, "sec": 0.25}


def test_every_annotation_reads_and_writes_back_in_field_order():
    t = Toy.from_json(FULL)
    assert t.pairs == (("k", 1), ("j", 2)) and t.parts == (Part(1, 0.5),) and t.by == {"sda": Part(2, 0.0)}
    assert list(t.to_json().items()) == list(FULL.items())


def test_missing_keys_read_as_the_defaults_and_empty_options_are_not_written():
    t = Toy.from_json({"word": "b", "sec": 0.123456})
    assert t == Toy("b", sec=0.123456)
    assert t.to_json() == {"word": "b", "n": 5, "x": None, "flag": False, "pairs": {}, "parts": [], "by": {},
                           "raw": None, "sec": 0.12}


@pytest.mark.parametrize("value, message", [
    ({}, "toy.word is None, not a string"),                       # required: refused as its null
    ({"word": "c"}, "toy.word is 'c', not one of a, b"),
    ({"word": "a", "n": 10}, "toy.n is 10, more than 9"),
    ({"word": "a", "x": "1"}, "toy.x is '1', not a finite number >= 0"),
    ({"word": "a", "names": ["p", 3]}, "toy.names is 3, not a string"),
    ({"word": "a", "pairs": {"k": -1}}, "toy.pairs.k is -1, not a whole number"),
    ({"word": "a", "parts": [{}, 7]}, "toy.parts[1] is 7, not an object"),
    ({"word": "a", "parts": [{"s": -1}]}, "toy.parts.s is -1, not a finite number"),
    ({"word": "a", "by": {"sdb": {"n": "2"}}}, "toy.by.sdb.n is '2', not a whole number"),
    ([], "toy is [], not an object"),
])
def test_a_bad_value_is_refused_by_its_path(value, message):
    with pytest.raises(ValueError, match="^" + message.replace("[", r"\[").replace("]", r"\]")):
        Toy.from_json(value)


def test_an_annotation_it_does_not_know_is_a_programming_error_at_first_use():
    @dataclass(frozen=True)
    class Odd(Fieldwise):
        key: ClassVar[str] = "odd"
        when: datetime

    with pytest.raises(TypeError, match="no JSON reader"):
        Odd.from_json({"when": "now"})


def test_a_file_with_many_devices_reads_whole_and_names_the_bad_one():
    """Names are cached per device (bounded): thousands of them, as a hostile line may hold, read the same."""
    devices = {f"d{i}": {"recorded": i, "diskstats": i} for i in range(3000)}
    c = Coverage.from_json({"devices": devices})
    assert len(c.devices) == 3000 and c.devices["d2999"].recorded == 2999
    devices["d1500"] = {"recorded": 1.5}
    with pytest.raises(ValueError, match=r"^coverage\.devices\.d1500\.recorded is 1\.5"):
        Coverage.from_json({"devices": devices})


@dataclass(frozen=True)
class Merged(Fieldwise):
    key: ClassVar[str] = "merged"
    json_merge: ClassVar[str] = BY_FIELD
    kind: str = opt("", merge=joined())
    names: tuple[str, ...] = opt((), merge=union(none_if_empty=True))
    any_: bool = opt(False, merge=either())
    most: float | None = opt(None, merge=largest())
    per: dict[str, Part] = opt(factory=dict, merge=summed_per_key())


def merged(*parts: Merged):
    acc = Merged.merger()
    for p in parts:
        acc.add(SimpleNamespace(merged=p))
    acc.add(SimpleNamespace(merged=None))       # a dump without it changes nothing
    return acc.result()


def test_the_field_policies():
    a = Merged("y", ("b",), False, None, {"sdb": Part(1, 0.5)})
    b = Merged("x", ("a", "b"), True, 2.0, {"sda": Part(2), "sdb": Part(3, 0.25)})
    c = Merged("y", (), False, 1.0, {})
    m = merged(a, b, c)
    assert m == Merged("x+y", ("a", "b"), True, 2.0, {"sdb": Part(4, 0.75), "sda": Part(2)})
    assert list(m.per) == ["sdb", "sda"]            # in the order first seen
    assert merged(c, c) is None                     # union(none_if_empty): no names, no section
    assert merged(Merged(names=("a",))).most is None
    assert merged() is None and Toy.merger() is None
