"""A window's slices around its nested windows folded into one dump (tracer.model.slices), and the marker's
"continues" on the wire.  Fake dumps, no root, no BPF."""

from __future__ import annotations

from tracer import marker
from tracer.codec import jsonl
from tracer.model.dump import duration_of
from tracer.model.sections import Enclosing, Loop
from tracer.model.slices import SliceFolder
from tracer.views import report
from unit.test_report_views import dump, series


def _epoch(n: int, at: float) -> list[tuple]:
    """One epoch as the tracer gets it: (dump, continues) for its slice before the checkpoint, the checkpoint,
    and the epoch's resumed slice (no time, no I/O: the end marker right after the checkpoint)."""
    before = dump(f"epoch {n}", at, 4.0, [series(10, "loader-0", "loop6", "read", [200_000] * 3)])
    ckpt = dump(f"epoch {n} / checkpoint", at + 4.0, 0.5, [series(1, "trainer", "loop6", "write", [3_000_000])])
    after = dump(f"epoch {n}", at + 4.5, 0.0, [])
    for d in (before, after):
        d.enclosing = Enclosing(None)
    ckpt.enclosing = Enclosing(f"epoch {n}")
    after.loop = Loop(1.5, 100, 4.5)
    return [(before, True), (ckpt, False), (after, False)]


def test_a_parents_resumed_slice_is_folded_into_it_after_its_nested_window():
    folder = SliceFolder()
    out = []
    for d, continues in [*_epoch(1, 0.0), *_epoch(2, 5.0)]:
        out += folder.add(d, continues)
    out += folder.add(dump(None, 10.0, 0.0, [], kind="final"))
    assert [(d.label, round(duration_of(d), 3)) for d in out] == [
        ("epoch 1 / checkpoint", 0.5), ("epoch 1", 4.0), ("epoch 2 / checkpoint", 0.5), ("epoch 2", 4.0),
        (None, 0.0)]
    e1 = out[1]
    # its time and rows are its slices' own (not the checkpoint's); its span covers the checkpoint
    assert [(s.comm, s.count) for s in e1.series] == [("loader-0", 3)]
    assert e1.loop == Loop(1.5, 100, 4.5) and (e1.end - e1.start).total_seconds() == 4.5
    # the file keeps the window's own time: read back, report and the live table agree
    back = jsonl.from_json(jsonl.to_json(e1))
    assert duration_of(back) == 4.0 and back.series[0].count == 3
    windows = report.windows_by_label(out)
    assert [(w.label, w.dumps) for w in windows] == [
        ("epoch 1", 1), ("epoch 1 / checkpoint", 1), ("epoch 2", 1), ("epoch 2 / checkpoint", 1), (None, 1)]
    assert [round(duration_of(w.merged), 3) for w in windows] == [4.0, 0.5, 4.0, 0.5, 0.0]


def test_nothing_held_is_lost_and_old_senders_pass_unfolded():
    folder = SliceFolder()
    (before, _), (ckpt, _), _after = _epoch(1, 0.0)
    assert folder.add(before, True) == [] and folder.add(ckpt) == [ckpt]
    # the sender died: the next dump is no window of epoch 1's, which goes on first
    other = dump("warm-up", 6.0, 1.0, [])
    assert folder.add(other) == [before, other]
    assert folder.add(before, True) == [] and folder.flush() == [before] and folder.flush() == []
    # without "continues" (an older tracer.marker, iotrace mark) every dump passes as it comes
    plain = [d for d, _ in _epoch(3, 20.0)]
    assert [x for d in plain for x in SliceFolder().add(d)] == plain


def test_begin_inside_a_window_says_it_continues_on_the_wire():
    msg = marker.decode_message(marker.encode("epoch 1", continues=True))
    assert msg["continues"] is True and msg["ignored"] == []
    assert marker.decode_message(marker.encode("epoch 1"))["continues"] is False
    assert b"continues" not in marker.encode("epoch 1")     # the datagram an older tracer gets is unchanged


def test_two_ranks_in_the_same_epoch_fold_apart():
    """Two training loops under one launcher, their slices interleaved: each one's epoch is its own window,
    neither is handed on early by the other's dumps."""
    from tracer.model.sections import Owner

    folder, out = SliceFolder(), []
    ranks = {r: _epoch(1, 0.1 * r) for r in (0, 1)}
    for r, slices in ranks.items():
        for d, _ in slices:
            d.owner = Owner(4000 + r, r)
    for i in range(3):                  # rank 0's slice, then rank 1's, in turn
        for r in (0, 1):
            d, continues = ranks[r][i]
            out += folder.add(d, continues)
    assert not folder.held
    assert [(d.owner.rank, d.label) for d in out] == [
        (0, "epoch 1 / checkpoint"), (1, "epoch 1 / checkpoint"), (0, "epoch 1"), (1, "epoch 1")]
    assert all(d.folded for d in out if d.label == "epoch 1")
    assert [w.label for w in report.windows_by_label(out)] == [
        "rank 0: epoch 1", "rank 1: epoch 1", "rank 0: epoch 1 / checkpoint", "rank 1: epoch 1 / checkpoint"]
