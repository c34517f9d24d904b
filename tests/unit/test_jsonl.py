"""tracer.codec.jsonl: the registry of line kinds, and `iotrace report` on what `--diskstats -o` wrote.

The diskstats lines are made as the diskstats mode makes them (tracer.pipeline.windows.disk_dump from
sampler rows, written by the -o sink) and read back through the real reader.  No root, no BPF.
"""

from __future__ import annotations

import io
import json
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from tracer.cli import report as reportcli
from tracer.codec import jsonl
from tracer.errors import UserError
from tracer.model.diskstats import DiskRow, Diskstats, IostatRow, ProcBytes
from tracer.model.dump import Dump, merge_dumps
from tracer.pipeline import windows as pipeline
from tracer.sinks.jsonl import JsonlSink
from unit.test_report_views import MS, dump, series, write

T0 = datetime(2026, 1, 1, 9, 0, 0, tzinfo=UTC)


def disk_window(kind: str, at_s: float, seconds: float, reads: int, busy_ms: int) -> Dump:
    rows = [IostatRow("vda", seconds, reads=reads, writes=reads // 2, read_sectors=8 * reads,
                      write_sectors=16 * (reads // 2), read_ms=2 * reads, write_ms=3 * (reads // 2), io_ms=busy_ms,
                      weighted_ms=busy_ms * 2, flushes=1),
            IostatRow("vdb", seconds, reads=1, read_sectors=8, read_ms=5, io_ms=5, weighted_ms=5)]
    return pipeline.disk_dump(kind, T0 + timedelta(seconds=at_s), T0 + timedelta(seconds=at_s + seconds), seconds, rows,
                              [ProcBytes(42, "fio", 4096 * reads, 0)], unreadable=3)


def write_diskstats(path: Path, windows: list[Dump]) -> Path:
    sink = JsonlSink(open(path, "w"), own=True)     # what --diskstats -o writes
    for w in windows:
        sink.on_dump(w)
    sink.close(0)
    return path


def report(argv: list[str], capsys) -> tuple[int, str, str]:
    out = io.StringIO()
    try:
        rc = reportcli.run(argv, out)
    except UserError as exc:
        return exc.exit_code, out.getvalue(), str(exc)
    return rc, out.getvalue(), capsys.readouterr().err


def disk_dump(kind: str = "interval") -> Dump:
    return Dump(kind, T0, T0 + timedelta(seconds=2), "host", "6.18", [], window_s=2.0,
                disks=Diskstats([DiskRow("vda", 10, 4, 40.0, 32.0, 0, 1, 5.0, 2.0, 20.0, 16.0, 2.0, 3.0, 0.04, 1.5)],
                                [ProcBytes(7, "dd", 4096, 0)], 1))


# one line of each kind iotrace writes: a dump of that kind must read back as the same line
KIND_CASES = {
    "interval": lambda: dump(None, 0, 5, [series(1, "fio", "loop0", "read", [1 * MS, 2 * MS])], kind="interval"),
    "final": lambda: dump(None, 0, 5, [series(1, "fio", "loop0", "write", [3 * MS])], kind="final",
                          dropped={"no_start": 2}),
    "marker": lambda: dump("epoch 1", 0, 5, [series(2, "python", "loop0", "read", [1 * MS] * 3, queue_ns=MS // 2)]),
    "diskstats": disk_dump,
}


def test_the_registry_holds_every_kind_iotrace_writes():
    assert set(jsonl.KINDS) == set(KIND_CASES)


@pytest.mark.parametrize("kind", sorted(KIND_CASES))
def test_each_kind_round_trips(kind):
    d = KIND_CASES[kind]()
    obj = json.loads(json.dumps(jsonl.to_json(d)))
    assert obj["kind"] == kind and obj["schema"] == jsonl.SCHEMA
    back = jsonl.from_json(obj)
    assert jsonl.to_json(back) == obj
    assert back.kind == d.kind and back.series == d.series and back.disks == d.disks


def test_an_unknown_kind_is_one_clear_error(tmp_path):
    with pytest.raises(ValueError, match="unknown kind 'bogus'"):
        jsonl.from_json({"schema": 1, "kind": "bogus"})
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps({"schema": 1, "kind": "bogus"}) + "\n")
    with pytest.raises(UserError) as exc:
        list(jsonl.read(str(bad)))
    msg = str(exc.value)
    assert msg.startswith(f"{bad}:1: not an iotrace dump (unknown kind 'bogus'") and "\n" not in msg
    assert "diskstats" in msg       # it names the kinds it knows
    with pytest.raises(ValueError, match="no JSON line kind 'run'"):
        jsonl.to_json(dump(None, 0, 1, [], kind="run"))


def test_diskstats_lines_read_back_through_the_reader(tmp_path):
    path = write_diskstats(tmp_path / "disk.jsonl", [disk_window("interval", 0, 2.0, 100, 500),
                                                      disk_window("final", 2, 1.0, 10, 200)])
    first, last = jsonl.read(str(path))
    assert (first.kind, last.kind) == ("interval", "final") and not first.series
    vda = first.disks.devices[0]
    assert (vda.device, vda.reads, vda.writes, vda.read_kb, vda.flushes) == ("vda", 100, 50, 400.0, 1)
    assert (vda.r_s, vda.r_await, vda.util) == (50.0, 2.0, 25.0)
    assert first.disks.processes == [ProcBytes(42, "fio", 409600, 0)] and first.disks.unreadable == 3
    # what the writer wrote, the reader's dump writes again
    assert [jsonl.to_json(d) for d in (first, last)] == [json.loads(line) for line in path.read_text().splitlines()]


def test_report_shows_the_iostat_numbers_of_a_diskstats_file(tmp_path, capsys):
    path = write_diskstats(tmp_path / "disk.jsonl", [disk_window("interval", 0, 2.0, 100, 500),
                                                      disk_window("final", 2, 1.0, 10, 200)])
    rc, out, err = report([str(path)], capsys)
    assert rc == 0, err
    lines = out.splitlines()
    assert "2 dump(s) from" in lines[1] and "no BPF, so no percentiles" in lines[1] and "(3.0s)" in lines[1]
    assert lines[2].split() == ["DEVICE", "r/s", "w/s", "rkB/s", "wkB/s", "r_await", "w_await", "aqu-sz", "%util"]
    # the whole 3 s: 110 reads, 55 writes; awaits per request; busy 700 of 3000 ms
    vda = lines[3].split()
    assert vda[0] == "vda" and [float(v) for v in vda[1:]] == pytest.approx(
        [110 / 3, 55 / 3, 440 / 3, 440 / 3, 2.0, 3.0, 1400 / 3000, 700 / 30], abs=0.006)
    assert lines[4].split()[0] == "vdb"
    assert lines[5].split() == ["PID", "COMM", "READ", "WRITE", "rkB/s", "wkB/s"]
    assert lines[6].split()[:2] == ["42", "fio"]
    assert "3 processes of other users" in out


def test_report_json_of_a_diskstats_file_round_trips(tmp_path, capsys):
    path = write_diskstats(tmp_path / "disk.jsonl", [disk_window("interval", 0, 2.0, 100, 500),
                                                      disk_window("final", 2, 1.0, 10, 200)])
    rc, out, _ = report(["--json", str(path)], capsys)
    assert rc == 0
    [merged] = [json.loads(line) for line in out.splitlines()]
    assert merged["kind"] == "diskstats" and merged["window"] == "final" and merged["duration_s"] == 3.0
    assert {r["device"]: r["reads"] for r in merged["devices"]} == {"vda": 110, "vdb": 2}
    again = tmp_path / "again.jsonl"
    again.write_text(out)
    assert report(["--json", str(again)], capsys)[1] == out
    # one window alone comes out as it went in
    one = write_diskstats(tmp_path / "one.jsonl", [disk_window("final", 0, 2.0, 100, 500)])
    assert json.loads(report(["--json", str(one)], capsys)[1]) == json.loads(one.read_text())


def test_a_file_mixing_bpf_dumps_and_diskstats_windows_is_refused_in_one_line(tmp_path, capsys):
    bpf = write(tmp_path / "bpf.jsonl", [dump(None, 0, 5, [series(1, "fio", "loop0", "read", [MS])])])
    disk = write_diskstats(tmp_path / "disk.jsonl", [disk_window("final", 0, 2.0, 100, 500)])
    mixed = tmp_path / "mixed.jsonl"
    mixed.write_text(bpf.read_text() + disk.read_text())
    for argv in ([str(mixed)], [str(bpf), str(disk)]):
        rc, out, err = report(argv, capsys)
        assert rc == 2 and not out and "\n" not in err
        assert err.startswith("cannot merge BPF dumps with --diskstats windows"), err
    with pytest.raises(UserError):
        merge_dumps([disk_dump(), jsonl.from_json(jsonl.to_json(dump(None, 0, 1, [])))])
    # --follow renders each line as it is, no merging: both kinds show
    assert len(list(jsonl.read(str(mixed)))) == 2
