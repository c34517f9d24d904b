"""A marker window's slices folded into one dump: the window around the windows nested in it.

A window with a nested one (tracer.marker: "epoch 1" and its checkpoint
phase "epoch 1 / checkpoint") reaches the tracer as slices: the marker that
opens the nested window closes the stretch before it under the outer label,
and the outer window's end closes the stretch after it (often no time at
all: the parent resuming for an instant after each checkpoint) under the
same label again.  Shown one by one, each epoch was two tables and two
lines in every view, one of them empty.

This module owns the fold.  A marker that opens a nested window says so
("continues": the window it closes stays open, tracer.marker.begin); its
dump is held, the nested windows' dumps pass on as they come, and the
outer window's next slice is merged into the held one (tracer.model.dump.
merge_dumps: rows, per-process rows, loop timing, coverage and drops added
up; its time is its slices' own, not the nested windows'), until a slice
that does not continue ends it: then the one dump goes on, after the
windows nested in it.  The live tables, the JSONL file and so `report`
see the same windows.

Each training loop's windows fold apart (Dump.owner, tracer.pipeline.senders:
two ranks both in "epoch 1" are two windows).  Never lost: a held window is
handed on when a dump of its owner arrives that is neither it nor nested in
it (a sender that died mid-window), before the final dump, and at most
MAX_HELD windows are held (deeper ones pass unfolded).
Dumps from a marker that does not say "continues" (an older tracer.marker,
`iotrace mark`), interval dumps and windows with iostat rows (--csv,
--alert: those are per cut) pass on unfolded.
"""

from __future__ import annotations

from tracer.model.dump import Dump, merge_dumps

MAX_HELD = 16       # windows open around nested ones at once: the nesting depth of a training loop, and more


def inside(label: str, outer: str) -> bool:
    """Whether a window labelled `label` is `outer` or nested in it ("outer / ...")."""
    return label == outer or label.startswith(outer + " / ")


class SliceFolder:
    """Dumps in, dumps out (in the order to hand them on): a window's slices around its nested ones as one."""

    def __init__(self) -> None:
        # per owner (None: a run whose windows are not per sender): its open windows around nested ones,
        # outermost first
        self.held: dict[object, list[Dump]] = {}

    def add(self, d: Dump, continues: bool = False) -> list[Dump]:
        """`d` as it comes; `continues`: its marker opens a nested window (the window `d` closes stays open).
        Anything else than a Dump passes on as it is."""
        if not isinstance(d, Dump) or d.kind != "marker" or d.label is None or d.iostat is not None:
            return [*(self.flush() if getattr(d, "kind", None) == "final" else []), d]
        out = []
        owner = d.owner
        held = self.held.setdefault(owner, [])
        while held and not inside(d.label, held[-1].label):
            out.append(held.pop())
        if held and held[-1].label == d.label:
            d = merge_dumps([held.pop(), d], kind="marker", label=d.label)
            d.owner, d.folded = owner, True
        if continues and sum(map(len, self.held.values())) < MAX_HELD:
            held.append(d)
        else:
            out.append(d)
        if not held:
            del self.held[owner]
        return out

    def flush(self) -> list[Dump]:
        """Every held window, innermost first (the end of the run)."""
        out = [d for held in self.held.values() for d in held[::-1]]
        self.held = {}
        return out
