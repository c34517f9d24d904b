"""The start event's self-check without BPF: a disk's scheduler from sysfs, the dump's "start" section through
the codec and the merges, and the warning the table prints."""

from __future__ import annotations

import io
from datetime import UTC, datetime

from tracer.codec import jsonl
from tracer.model.dump import Dump, merge_dumps
from tracer.model.sections import StartEvent
from tracer.sources import devices
from tracer.views.report import render_table

T0 = datetime(2026, 12, 1, tzinfo=UTC)


def test_scheduler_is_the_bracketed_one(tmp_path):
    for name, text in (("nvme0n1", "[none] mq-deadline kyber bfq\n"), ("sda", "none [mq-deadline] kyber\n"),
                       ("zram0", "none\n")):
        (tmp_path / name / "queue").mkdir(parents=True)
        (tmp_path / name / "queue" / "scheduler").write_text(text)
    assert devices.scheduler("nvme0n1", str(tmp_path)) == "none"
    assert devices.scheduler("sda", str(tmp_path)) == "mq-deadline"
    assert devices.scheduler("zram0", str(tmp_path)) == "none"
    assert devices.scheduler("gone", str(tmp_path)) is None


def dump(start: dict | None) -> Dump:
    d = Dump(kind="final", label=None, start=T0, end=T0, host="h", kernel="6.1.0", series=[], dropped={}, events={})
    if start is not None:
        d.start_event = StartEvent.from_json(start)
    return d


def test_the_start_section_round_trips_and_merges():
    blind = dump({"event": "block_rq_insert", "blind": ["nvme0n1"]})
    back = jsonl.from_json(jsonl.to_json(blind))
    assert back.start_event.to_json() == {"event": "block_rq_insert", "blind": ["nvme0n1"]}
    merged = merge_dumps([blind, dump({"event": "block_rq_insert", "blind": ["loop0"]})])
    assert merged.start_event.to_json() == {"event": "block_rq_insert", "blind": ["loop0", "nvme0n1"]}
    assert merge_dumps([dump({"event": "block_io_start"})] * 2).start_event.to_json() == {"event": "block_io_start"}


def test_the_table_warns_only_when_a_disk_is_blind():
    out = io.StringIO()
    render_table(dump({"event": "block_rq_insert", "blind": ["nvme0n1", "\x1b[2Jx"]}), out)
    [line] = [t for t in out.getvalue().splitlines() if t.startswith("WARNING: requests started")]
    assert "nvme0n1" in line and "\\x1b[2Jx" in line and line.isprintable()
    out = io.StringIO()
    render_table(dump({"event": "block_io_start"}), out)
    assert "WARNING" not in out.getvalue()
