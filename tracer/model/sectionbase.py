"""The base of a dump's optional sections and the protocol of their mergers (tracer.model.sections says what
a section provides); apart so that a section defined in a module of its own (tracer.model.files) subclasses
it without importing the table of sections."""

from __future__ import annotations

from typing import Any, ClassVar, Protocol


class Merger(Protocol):
    # d: a tracer.model.dump.Dump (not imported: dump imports this module)
    def add(self, d) -> None: ...

    def result(self) -> Section | None: ...


class Section:
    """Base of the section classes (see the module docstring)."""

    key: ClassVar[str]
    null_is_absent: ClassVar[bool] = False     # a JSON null under its key reads as no section

    @classmethod
    def from_json(cls, v: Any) -> Section:
        raise NotImplementedError

    def to_json(self) -> Any:
        raise NotImplementedError

    @classmethod
    def merger(cls) -> Merger | None:
        return None
