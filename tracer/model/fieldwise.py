"""Sections whose JSON and merge follow from their dataclass fields: the one reader and writer driven by each
field's type annotation, the options a field may add, and the named merge policies.

A class that subclasses Fieldwise (and is a dataclass) reads and writes as its
fields say, compiled once per class from the annotations:

  str -> a string      int -> a whole number    float -> a finite number >= 0
  bool -> its truth (never refused: the first writers' readers were as lenient)
  X | None -> null or X             tuple[X, ...], list[X] -> a list of X
  dict[str, X] -> an object of X    dict, Any -> an object / any value, unchecked
  tuple[tuple[str, X], ...] -> an object (a frozen dataclass's hashable dict)
  a dataclass -> an object of its fields, in their order

A key a line lacks reads as its field's default; a field without one is
required, and a missing key is refused as its null would be.  `json_bare`:
the section's JSON is its one field's value, not an object.  Errors name the
value by its path: "start_event.blind", "coverage.devices.sda.recorded"
(`json_sep` between the parts: TaskRow's "tasks pid"); a list's elements are
named as the list unless the field's `item` says otherwise, and their own
fields from the list's name (the readers this replaced counted no rows).

The merge: `json_merge` is None (a merged dump has none), AGREED (the one value
every dump that has it agrees on) or BY_FIELD (each field by the policy its
opt(merge=...) names: joined, union, either, largest, summed_per_key).
"""

from __future__ import annotations

import types
import typing
from collections.abc import Callable
from dataclasses import MISSING, dataclass, field, fields, is_dataclass, replace
from functools import cache, lru_cache
from typing import Any, ClassVar

from tracer.model.jsoncheck import array, number, obj, text, whole
from tracer.model.sectionbase import Merger, Section

# (value, its name[, the name its parts are named from: a list's element's are named from the list]) -> the
# checked value; the scalars' are jsoncheck's own checks, called with no wrapper (a row has many fields)
Reader = Callable[..., Any]
Writer = Callable[[Any], Any]


# ---- a field's options ---------------------------------------------------------------------------------

def opt(default: Any = MISSING, *, factory: Any = MISSING, omit_empty: bool = False, digits: int | None = None,
        check: Callable[[Any, str], None] | None = None, item: str | None = None, merge: Policy | None = None):
    """A dataclass field with the JSON options: `omit_empty`, written only when it is not empty or 0 (files
    older than the field have none of it); `digits`, rounded to on writing; `check(value, name)`, a further
    check that raises ValueError; `item`, an element's name in errors ({name}: the list's, {i}: its index);
    `merge`, its policy under BY_FIELD."""
    meta = {"omit_empty": omit_empty, "digits": digits, "check": check, "item": item, "merge": merge}
    return field(default=default, default_factory=factory, metadata=meta)


def at_most(most: int) -> Callable[[Any, str], None]:
    def check(v, name: str) -> None:
        if v is not None and v > most:
            raise ValueError(f"{name} is {v}, more than {most}")
    return check


def one_of(words: tuple[str, ...]) -> Callable[[Any, str], None]:
    def check(v, name: str) -> None:
        if v not in words:
            raise ValueError(f"{name} is {v!r}, not one of {', '.join(words)}")
    return check


# ---- the reader and the writer, compiled from the annotations --------------------------------------------

def _is_pairs(tp) -> bool:
    args = typing.get_args(tp)
    return (typing.get_origin(tp) is tuple and len(args) == 2 and args[1] is Ellipsis
            and typing.get_origin(args[0]) is tuple and typing.get_args(args[0])[0] is str)


def _truth(v, name: str) -> bool:
    return bool(v)


def _unchecked(v, name: str):
    return v


_SCALARS = {str: text, int: whole, float: number, bool: _truth, Any: _unchecked, dict: obj}


def _reader(tp, sep: str, item: str | None) -> Reader:
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if tp in _SCALARS:
        return _SCALARS[tp]
    if origin in (types.UnionType, typing.Union) and len(args) == 2 and type(None) in args:
        inner = _reader(next(a for a in args if a is not type(None)), sep, item)
        if inner in _SCALARS.values():
            return lambda v, name: None if v is None else inner(v, name)
        return lambda v, name, parent=None: None if v is None else inner(v, name, parent)
    if _is_pairs(tp):
        value = _reader(typing.get_args(args[0])[1], sep, None)
        return lambda v, name, parent=None: tuple((k, value(x, f"{name}{sep}{k}")) for k, x in obj(v, name).items())
    if origin is dict:
        value = _reader(args[1], sep, None)
        return lambda v, name, parent=None: {k: value(x, f"{name}{sep}{k}") for k, x in obj(v, name).items()}
    if origin in (tuple, list) and (origin is list or args[1:] == (Ellipsis,)):
        elem, form = _reader(args[0], sep, None), item or "{name}"
        if elem in _SCALARS.values():
            return lambda v, name: origin(elem(x, form.format(name=name, i=i)) for i, x in enumerate(array(v, name)))
        return lambda v, name, parent=None: origin(elem(x, form.format(name=name, i=i), name)
                                                   for i, x in enumerate(array(v, name)))
    if is_dataclass(tp):
        return _object_reader(tp)
    raise TypeError(f"no JSON reader for {tp!r}")


@dataclass(frozen=True)
class _Field:
    name: str
    read: Reader
    write: Writer
    default: Any            # MISSING: required
    factory: Any
    check: Callable[[Any, str], None] | None
    omit_empty: bool
    digits: int | None


@cache
def _plan(cls) -> tuple[_Field, ...]:
    hints = typing.get_type_hints(cls)
    sep = getattr(cls, "json_sep", ".")
    return tuple(_Field(f.name, _reader(hints[f.name], sep, f.metadata.get("item")), _writer(hints[f.name]),
                        f.default, f.default_factory, f.metadata.get("check"), f.metadata.get("omit_empty", False),
                        f.metadata.get("digits"))
                 for f in fields(cls))


@lru_cache(maxsize=256)     # a list's rows share their names; device names are few (and the cache is bounded)
def _parts(cls, parent: str) -> tuple[tuple, ...]:
    sep = getattr(cls, "json_sep", ".")
    return tuple((f.name, f"{parent}{sep}{f.name}", f.read, f.default, f.factory, f.check) for f in _plan(cls))


def _object_reader(cls) -> Reader:
    def read(v, name: str, parent: str | None = None):
        v = obj(v, name)
        kw = {}
        for key, part, check_read, default, factory, check in _parts(cls, parent or name):
            if key in v:
                x = check_read(v[key], part)
            elif default is not MISSING:
                x = default
            elif factory is not MISSING:
                x = factory()
            else:
                x = check_read(None, part)      # required: refused as its null
            if check is not None:
                check(x, part)
            kw[key] = x
        return cls(**kw)
    return read


def _writer(tp) -> Writer:
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin in (types.UnionType, typing.Union) and len(args) == 2 and type(None) in args:
        inner = _writer(next(a for a in args if a is not type(None)))
        return lambda x: None if x is None else inner(x)
    if _is_pairs(tp):
        value = _writer(typing.get_args(args[0])[1])
        return lambda x: {k: value(e) for k, e in x}
    if origin is dict:
        value = _writer(args[1])
        return lambda x: {k: value(e) for k, e in x.items()}
    if origin in (tuple, list):
        elem = _writer(args[0])
        return lambda x: [elem(e) for e in x]
    if is_dataclass(tp):
        return write_object
    return _as_is


def _as_is(x):
    return x        # str, int, float, bool; dict and Any: the value as read


def write_object(x) -> dict:
    """A dataclass's JSON object, its fields in their order."""
    out = {}
    for f in _plan(type(x)):
        v = getattr(x, f.name)
        if f.omit_empty and not v:
            continue
        if f.digits is not None:
            v = round(v, f.digits)
        out[f.name] = v if f.write is _as_is else f.write(v)
    return out


def read_object(cls, v, name: str):
    """A dataclass from its JSON object `v`, each field checked (ValueError names the bad one)."""
    return _object_reader(cls)(v, name)


# ---- the merge policies --------------------------------------------------------------------------------

@dataclass(frozen=True)
class Policy:
    """How one field of the merged section comes from that field of each dump's: acc = fold(acc, value) over
    them in order from start(), then done(acc) (NONE: the merged dump has no section)."""

    name: str
    start: Callable[[], Any]
    fold: Callable[[Any, Any], Any]
    done: Callable[[Any], Any] = lambda acc: acc


NONE = object()


def _added(acc: set, v) -> set:
    acc.add(v)
    return acc


def _updated(acc: set, v) -> set:
    acc.update(v)
    return acc


def _larger(acc, v):
    return v if acc is None else acc if v is None else max(acc, v)


def _summed(acc: dict, v: dict) -> dict:
    for k, x in v.items():
        a = acc.get(k)
        acc[k] = x if a is None else replace(a, **{f.name: getattr(a, f.name) + getattr(x, f.name) for f in fields(a)})
    return acc


def joined() -> Policy:
    """The distinct strings, sorted, joined by "+" ("raw_tp+tracepoint": runs of both kinds)."""
    return Policy("joined", set, _added, lambda acc: "+".join(sorted(acc)))


def union(none_if_empty: bool = False) -> Policy:
    """Every name any dump has, sorted (`none_if_empty`: no section when there is none)."""
    return Policy("union", set, _updated, lambda acc: tuple(sorted(acc)) if acc or not none_if_empty else NONE)


def either() -> Policy:
    """True if any dump's is."""
    return Policy("either", lambda: False, lambda acc, v: acc or v)


def largest() -> Policy:
    """The largest of the values that are not None (None: all are)."""
    return Policy("largest", lambda: None, _larger)


def summed_per_key() -> Policy:
    """{name: dataclass}: each name's entries added up field by field, names in the order first seen."""
    return Policy("summed_per_key", dict, _summed)


AGREED = "agreed"
BY_FIELD = "by_field"


class Agreed:
    """The merged section is the one every dump that has it agrees on (up to 2 distinct ones are kept)."""

    def __init__(self, key: str) -> None:
        self.key = key
        self.seen: set = set()

    def add(self, d) -> None:
        s = getattr(d, self.key)
        if s is not None and len(self.seen) < 2:
            self.seen.add(s)

    def result(self) -> Section | None:
        return next(iter(self.seen)) if len(self.seen) == 1 else None


class ByField:
    """The merged section's fields, each by its policy over the dumps that have the section."""

    def __init__(self, cls) -> None:
        self.cls = cls
        self.policies = [(f.name, f.metadata["merge"]) for f in fields(cls)]
        self.accs: list | None = None

    def add(self, d) -> None:
        s = getattr(d, self.cls.key)
        if s is not None:
            self.add_section(s)

    def add_section(self, s) -> None:
        if self.accs is None:
            self.accs = [p.start() for _, p in self.policies]
        self.accs = [p.fold(acc, getattr(s, name)) for acc, (name, p) in zip(self.accs, self.policies, strict=True)]

    def result(self) -> Section | None:
        if self.accs is None:
            return None
        values = [p.done(acc) for acc, (_, p) in zip(self.accs, self.policies, strict=True)]
        return None if any(v is NONE for v in values) else self.cls(*values)


# ---- the base ------------------------------------------------------------------------------------------

class Record:
    """A dataclass held in a section (a row, a device's counts): it writes as its fields say too."""

    def to_json(self) -> dict:
        return write_object(self)


class Fieldwise(Section):
    """A section read, written and merged as its dataclass fields say (see the module docstring)."""

    json_bare: ClassVar[bool] = False
    json_sep: ClassVar[str] = "."
    json_merge: ClassVar[str | None] = None

    @classmethod
    def from_json(cls, v) -> Section:
        if not cls.json_bare:
            return read_object(cls, v, cls.key)
        (f,) = _plan(cls)
        x = f.read(v, cls.key)
        if f.check is not None:
            f.check(x, cls.key)
        return cls(x)

    def to_json(self) -> Any:
        if not self.json_bare:
            return write_object(self)
        (f,) = _plan(type(self))
        return f.write(getattr(self, f.name))

    @classmethod
    def merger(cls) -> Merger | None:
        if cls.json_merge == AGREED:
            return Agreed(cls.key)
        if cls.json_merge == BY_FIELD:
            return ByField(cls)
        return None
