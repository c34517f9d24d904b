"""Tests of `iotrace report --by label` and `iotrace diff`, on crafted dumps (no root, no BPF).

Dumps are built from planted latencies, written with tracer.codec.jsonl.write and
rendered by the CLI as a subprocess; the expected numbers come from the
planted values (exact nearest-rank percentiles), never from the code under test.
"""

from __future__ import annotations

import json
import math
import re
from datetime import UTC, datetime, timedelta
from pathlib import Path

import numpy as np
import pytest
from conftest import run_iotrace

from tracer.codec import jsonl
from tracer.model.dump import Dump, PhaseStats, Series
from tracer.model.histogram import Histogram
from tracer.model.sections import Enclosing, Loop, SenderPid, Tasks

MS, US = 1_000_000, 1_000
T0 = datetime(2026, 1, 1, 8, 0, 0, tzinfo=UTC)
STATS = ("count", "MiB", "p50", "p90", "p99", "p99.9", "max")
LAT_Q = {"p50": 50, "p90": 90, "p99": 99, "p99.9": 99.9}


# ---- building dumps -----------------------------------------------------------

def phase(values_ns: list[int]) -> PhaseStats:
    v = np.asarray(values_ns, dtype=np.int64)
    return PhaseStats(Histogram.from_values(v), float(v.sum()), int(v.min()), int(v.max()))


def series(pid: int, comm: str, device: str, op: str, total_ns: list[int], size: int = 4096,
           queue_ns: int | None = None) -> Series:
    phases = {"total": phase(total_ns)}
    if queue_ns is not None:
        phases["queue"] = phase([queue_ns] * len(total_ns))
        phases["device"] = phase([t - queue_ns for t in total_ns])
    return Series(pid, comm, device, "7:0", op, len(total_ns), size * len(total_ns), phases, tgid=pid)


def dump(label: str | None, at_s: float, seconds: float, rows: list[Series], kind: str | None = None,
         dropped: dict | None = None) -> Dump:
    return Dump(kind or ("marker" if label else "final"), T0 + timedelta(seconds=at_s),
                T0 + timedelta(seconds=at_s + seconds), "host", "6.18", rows, dropped=dropped or {}, label=label)


def write(path: Path, dumps: list[Dump]) -> Path:
    with open(path, "w") as f:
        for d in dumps:
            jsonl.write(f, d)
    return path


def nearest_rank(values: list[int], q: float) -> float:
    """Exact nearest-rank percentile, in microseconds."""
    s = sorted(values)
    return s[max(1, math.ceil(q / 100 * len(s))) - 1] / US


def expected(values_ns: list[int], size: int = 4096) -> dict[str, float]:
    out = {"count": len(values_ns), "MiB": len(values_ns) * size / 2**20, "max": max(values_ns) / US}
    out.update({k: nearest_rank(values_ns, q) for k, q in LAT_Q.items()})
    return out


# ---- reading the output -------------------------------------------------------

UNIT_US = {"ns": 1e-3, "us": 1.0, "ms": 1e3, "s": 1e6}


def value(cell: str) -> float | None:
    """A table cell as a number: counts and MiB as they are, latencies in us, percents in %."""
    if cell == "-":
        return None
    m = re.fullmatch(r"([+-]?)([\d.]+)(ns|us|ms|s|%)?", cell)
    assert m, f"not a number: {cell!r}"
    v = float(m[2]) * UNIT_US.get(m[3] or "", 1.0)
    return -v if m[1] == "-" else v


def close(got: float | None, want: float, rel: float = 0.01) -> bool:
    """Within `rel`: the histograms hold 2 significant figures and the table rounds to 3."""
    return got is not None and abs(got - want) <= rel * abs(want) + 1e-9


def cells(line: str) -> tuple[str, dict[str, float | None]]:
    """A line ending in the seven stat cells -> (the text before them, {stat: value})."""
    parts = line.split()
    return " ".join(parts[:-7]), dict(zip(STATS, map(value, parts[-7:]), strict=True))


def parse_long(stdout: str) -> tuple[list[str], dict[str, dict[str, dict]]]:
    """--by label, long layout -> (window labels in table order, {row: {label: stats}})."""
    lines = stdout.splitlines()
    start = next(i for i, x in enumerate(lines) if x.startswith("ROW / LABEL"))
    rows: dict[str, dict[str, dict]] = {}
    row = None
    for line in lines[start + 1:]:
        if not line.startswith("  "):
            row = " ".join(line.split())
            rows[row] = {}
        else:
            label, stats = cells(line)
            rows[row][label] = stats
    order = list(next(iter(rows.values()))) if rows else []
    return order, rows


def window_table(stdout: str) -> dict[str, int]:
    """The window table at the top: {label: number of dumps}, in order."""
    lines = stdout.splitlines()
    start = next(i for i, x in enumerate(lines) if x.strip().startswith("LABEL"))
    out = {}
    for line in lines[start + 1:]:
        m = re.fullmatch(r"  (.+?)\s+(\d+)\s+[\d.]+\s+\d\d:\d\d:\d\d\s+\d\d:\d\d:\d\d\s+\d+", line)
        if not m:
            break
        out[m[1]] = int(m[2])
    return out


def parse_diff(stdout: str) -> tuple[dict[str, dict[str, dict]], dict[str, dict[str, dict]]]:
    """diff output -> ({row: {"A"|"B"|"change"|"change %": stats}}, {"A"|"B": {row: stats}} of one-sided rows)."""
    matched: dict[str, dict[str, dict]] = {}
    only: dict[str, dict[str, dict]] = {}
    section = None
    row = None
    for line in stdout.splitlines():
        if not line.strip():
            section = None
            continue
        m = re.match(r"only in ([AB]) ", line)
        if m:
            section = only.setdefault(m[1], {})
        elif line.startswith("ROW "):
            section = matched
        elif section is matched:
            if line.startswith("  "):
                what, stats = cells(line)
                section[row][what] = stats
            else:
                row = " ".join(line.split())
                section[row] = {}
        elif section is not None:
            key, stats = cells(line)
            section[key] = stats
    return matched, only


def assert_error(args: list[str], *needles: str) -> None:
    r = run_iotrace(args)
    assert r.returncode == 2, (r.returncode, r.stdout, r.stderr)
    assert "Traceback" not in r.stderr and not r.stdout
    lines = r.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("iotrace: "), r.stderr
    for n in needles:
        assert n in lines[0], lines[0]


def ok(args: list[str]) -> str:
    r = run_iotrace(args)
    assert r.returncode == 0, r.stderr
    assert not r.stderr
    return r.stdout


# ---- a run traced with markers ---------------------------------------------------

# planted latencies (ns) of a training run: a cold epoch 1, a checkpoint, a warm epoch 2
E1_MAIN = [1 * MS] * 90 + [20 * MS] * 10          # trainer, pid 100
E1_WORKER = [2 * MS] * 10                          # a loader worker, pid 101, same name
CKPT = [3 * MS] * 5                                # checkpoint writes, 1 MiB each
WB1, WB2 = [5 * MS] * 3, [7 * MS] * 2              # writeback, under two different kworkers
E2_A, E2_B = [100 * US] * 4, [300 * US] * 6        # epoch 2 in two dumps: a new worker pid each time
REST = [50 * US] * 7                               # unlabelled: an interval dump, before epoch 2


@pytest.fixture
def run(tmp_path) -> Path:
    return write(tmp_path / "run.jsonl", [
        dump("epoch 1", 0, 10, [series(100, "python", "loop0", "read", E1_MAIN),
                                series(101, "python", "loop0", "read", E1_WORKER)]),
        dump("checkpoint 1", 10, 1, [series(100, "python", "loop0", "write", CKPT, size=1 << 20),
                                     series(40, "kworker/u8:1", "loop0", "write", WB1)]),
        dump(None, 11, 1, [series(300, "fio", "loop1", "read", REST)], kind="interval"),
        dump("epoch 2", 12, 2, [series(102, "python", "loop0", "read", E2_A),
                                series(41, "kworker/u8:3", "loop0", "write", WB2)]),
        dump("epoch 2", 14, 3, [series(103, "python", "loop0", "read", E2_B)]),
        dump(None, 17, 1, []),
    ])


def assert_stats(got: dict, want: dict, keys=STATS) -> None:
    for k in keys:
        if k == "count":
            assert got[k] == want[k], (k, got, want)
        elif k == "MiB":
            assert got[k] == round(want[k], 2), (k, got, want)
        else:
            assert close(got[k], want[k]), (k, got[k], want[k])


def test_by_label_windows_in_first_seen_order_merged_by_label(run):
    out = ok(["report", "--by", "label", str(run)])
    # 4 windows: more than fit side by side, so one line per window; unlabelled last although seen third
    assert window_table(out) == {"epoch 1": 1, "checkpoint 1": 1, "epoch 2": 2, "(unlabelled)": 2}
    order, rows = parse_long(out)
    assert order == ["epoch 1", "checkpoint 1", "epoch 2", "(unlabelled)"]
    # busiest row first; equal counts by name
    counts = {"python loop0 read": len(E1_MAIN + E1_WORKER + E2_A + E2_B), "kworker/* loop0 write": len(WB1 + WB2),
              "fio loop1 read": len(REST), "python loop0 write": len(CKPT)}
    assert list(rows) == sorted(counts, key=lambda r: (-counts[r], r))
    read = rows["python loop0 read"]
    # pids 100 and 101 are one row; epoch 2's two dumps (pids 102, 103) are one window
    assert_stats(read["epoch 1"], expected(E1_MAIN + E1_WORKER))
    assert_stats(read["epoch 2"], expected(E2_A + E2_B))
    assert read["checkpoint 1"] == {"count": 0, "MiB": 0.0, **dict.fromkeys(STATS[2:])}
    assert_stats(rows["python loop0 write"]["checkpoint 1"], expected(CKPT, size=1 << 20))
    # the two kworkers are one row, kworker/*
    wb = rows["kworker/* loop0 write"]
    assert [wb[k]["count"] for k in order] == [0, len(WB1), len(WB2), 0]
    assert close(wb["epoch 2"]["p50"], 7000)
    assert_stats(rows["fio loop1 read"]["(unlabelled)"], expected(REST))


def test_by_label_per_pid_splits_rows(run):
    _, rows = parse_long(ok(["report", "--by", "label", "--per-pid", str(run)]))
    assert {"100 python loop0 read", "101 python loop0 read", "102 python loop0 read", "103 python loop0 read",
            "40 kworker/u8:1 loop0 write", "41 kworker/u8:3 loop0 write"} <= set(rows)
    assert rows["101 python loop0 read"]["epoch 1"]["count"] == len(E1_WORKER)
    assert rows["103 python loop0 read"]["epoch 2"]["count"] == len(E2_B)
    assert rows["103 python loop0 read"]["epoch 1"]["count"] == 0


def parse_wide(stdout: str) -> tuple[list[str], dict[str, list[dict]]]:
    """--by label, wide layout -> (labels over the column groups, {row: [stats per group]})."""
    lines = stdout.splitlines()
    head = next(i for i, x in enumerate(lines) if x.startswith("COMM "))
    labels = re.split(r"\s{2,}", lines[head - 1].strip())
    rows = {}
    for line in lines[head + 1:]:
        parts = line.split()
        groups = [parts[i:i + 4] for i in range(3, len(parts), 4)]
        assert len(groups) == len(labels), line
        rows[" ".join(parts[:3])] = [dict(zip(("p50", "p99", "count", "MiB"), map(value, g), strict=True))
                                     for g in groups]
    return labels, rows


def test_by_label_two_windows_side_by_side(tmp_path):
    a1, a2 = [400 * US] * 50 + [9 * MS], [600 * US] * 20
    path = write(tmp_path / "two.jsonl", [
        dump("epoch 1", 0, 5, [series(7, "trainer", "nvme0n1", "read", a1)]),
        dump("epoch 2", 5, 5, [series(7, "trainer", "nvme0n1", "read", a2),
                               series(7, "trainer", "nvme0n1", "write", [1 * MS])]),
        dump(None, 10, 1, []),
    ])
    out = ok(["report", "--by", "label", str(path)])
    assert "(unlabelled): 1 dump(s) with no block I/O, not shown" in out
    labels, rows = parse_wide(out)
    assert labels == ["epoch 1", "epoch 2"]
    assert max(len(line) for line in out.splitlines()) <= 120
    first, second = rows["trainer nvme0n1 read"]
    assert_stats(first, expected(a1), ("count", "MiB", "p50", "p99"))
    assert_stats(second, expected(a2), ("count", "MiB", "p50", "p99"))
    assert rows["trainer nvme0n1 write"][0] == {"p50": None, "p99": None, "count": 0, "MiB": 0.0}
    # forcing the long layout shows the same numbers
    order, long_rows = parse_long(ok(["report", "--by", "label", "--layout", "long", str(path)]))
    assert order == labels
    assert long_rows["trainer nvme0n1 read"]["epoch 2"]["count"] == len(a2)


def test_by_label_wide_forced_with_many_windows(run):
    labels, rows = parse_wide(ok(["report", "--by", "label", "--layout", "wide", str(run)]))
    assert labels == ["epoch 1", "checkpoint 1", "epoch 2", "(unlabelled)"]
    assert [g["count"] for g in rows["python loop0 read"]] == [110, 0, 10, 0]


def test_by_label_warns_of_dropped_events(tmp_path):
    path = write(tmp_path / "drop.jsonl", [
        dump("epoch 1", 0, 1, [series(1, "x", "sda", "read", [MS])], dropped={"no_start": 3}),
        dump("epoch 2", 1, 1, [series(1, "x", "sda", "read", [MS])], dropped={"no_start": 0}),
    ])
    warnings = [x for x in ok(["report", "--by", "label", str(path)]).splitlines() if x.startswith("WARNING")]
    assert warnings == ["WARNING: epoch 1: events not recorded: no_start=3 (see README, 'Dropped events')"]


def test_by_label_shows_the_loops_data_wait_share(tmp_path):
    def looped(d: Dump, wait: float, steps: int, wall: float, enclosing: str | None = None) -> Dump:
        d.put(Enclosing(enclosing), Loop(wait, steps, wall))
        return d

    rows = [series(7, "trainer", "nvme0n1", "read", [MS])]
    path = write(tmp_path / "loop.jsonl", [
        dump("epoch 1", 0, 4, rows),                                    # before the checkpoint: no loop yet
        dump("epoch 1 / checkpoint", 4, 1, rows),
        looped(dump("epoch 1", 5, 5, rows), 3.0, 12, 10.0),             # the epoch's end: its loop
        looped(dump("epoch 2", 10, 5, rows), 1.0, 12, 5.0),
        dump(None, 15, 1, []),
    ])
    out = ok(["report", "--by", "label", str(path)])
    lines = out.splitlines()
    head = next(i for i, x in enumerate(lines) if x.strip().startswith("LABEL"))
    assert lines[head].split()[-3:] == ["STEPS", "DATA", "WAIT"]
    shares = {}
    for line in lines[head + 1:head + 4]:
        label, rest = re.split(r"\s{2,}", line.strip(), maxsplit=1)
        shares[label] = rest.split()[-2:]
    assert shares == {"epoch 1": ["12", "30.0%"], "epoch 1 / checkpoint": ["-", "-"], "epoch 2": ["12", "20.0%"]}
    # without loops the table is as it was
    plain = ok(["report", "--by", "label", str(write(tmp_path / "plain.jsonl", [dump("epoch 1", 0, 1, rows)]))])
    assert "DATA WAIT" not in plain and window_table(plain) == {"epoch 1": 1}


# ---- diff --------------------------------------------------------------------------

def pct(a: float, b: float) -> float:
    return (b - a) / a * 100


def test_diff_two_runs_matched_by_name(tmp_path):
    a_read, b_read = [1 * MS] * 40, [int(1.5 * MS)] * 10
    a_wb, b_wb = [4 * MS] * 8, [4 * MS] * 8
    a = write(tmp_path / "a.jsonl", [
        dump(None, 0, 5, [series(10, "python", "loop0", "read", a_read[:25]),
                          series(11, "kworker/u8:0", "loop0", "write", a_wb)], kind="interval"),
        dump(None, 5, 5, [series(10, "python", "loop0", "read", a_read[25:]),
                          series(12, "java", "sda", "write", [2 * MS] * 3)]),
    ])
    b = write(tmp_path / "b.jsonl", [
        dump(None, 0, 9, [series(99, "python", "loop0", "read", b_read),
                          series(98, "kworker/u8:7", "loop0", "write", b_wb),
                          series(99, "python", "loop0", "flush", [8 * MS] * 2, size=0)]),
    ])
    matched, only = parse_diff(ok(["diff", str(a), str(b)]))
    assert list(matched) == ["python loop0 read", "kworker/* loop0 write"]
    read = matched["python loop0 read"]
    assert_stats(read["A"], expected(a_read))
    assert_stats(read["B"], expected(b_read))
    assert read["change"]["count"] == -30 and read["change %"]["count"] == -75.0
    assert read["change"]["MiB"] == round((10 - 40) * 4096 / 2**20, 2) and read["change %"]["MiB"] == -75.0
    for k in ("p50", "p90", "p99", "p99.9", "max"):
        assert close(read["change"][k], 500.0), (k, read["change"][k])
        assert read["change %"][k] == pytest.approx(pct(1000, 1500), abs=0.05)
    wb = matched["kworker/* loop0 write"]
    assert wb["change"]["count"] == 0 and wb["change"]["p99"] == 0 and wb["change %"]["p99"] == 0.0
    assert set(only) == {"A", "B"}
    assert only["A"]["java sda write"]["count"] == 3
    assert_stats(only["B"]["python loop0 flush"], expected([8 * MS] * 2, size=0))


def test_diff_labels_both_syntaxes_agree(run):
    by_option = ok(["diff", str(run), "--labels", "epoch 1", "epoch 2"])
    by_suffix = ok(["diff", f"{run}:epoch 1", f"{run}:epoch 2"])
    assert by_option == by_suffix
    matched, only = parse_diff(by_option)
    read = matched["python loop0 read"]
    want_a, want_b = expected(E1_MAIN + E1_WORKER), expected(E2_A + E2_B)
    assert_stats(read["A"], want_a)
    assert_stats(read["B"], want_b)
    assert read["change"]["count"] == want_b["count"] - want_a["count"]
    for k in STATS:
        assert read["change %"][k] == pytest.approx(pct(want_a[k], want_b[k]), abs=0.5), k
    # epoch 1 had no writeback, epoch 2 had
    assert list(only) == ["B"] and only["B"]["kworker/* loop0 write"]["count"] == len(WB2)


def test_diff_unlabelled_and_labels_with_colons(tmp_path):
    path = write(tmp_path / "x:y.jsonl", [
        dump("ckpt: step 5", 0, 1, [series(1, "t", "sda", "write", [2 * MS] * 4)]),
        dump(None, 1, 1, [series(1, "t", "sda", "write", [3 * MS] * 4)]),
    ])
    matched, _ = parse_diff(ok(["diff", f"{path}:ckpt: step 5", f"{path}:(unlabelled)"]))
    row = matched["t sda write"]
    assert close(row["A"]["p50"], 2000) and close(row["B"]["p50"], 3000)
    assert row["change %"]["p50"] == pytest.approx(50.0, abs=0.05)
    # a file name with a colon, whole
    matched, _ = parse_diff(ok(["diff", str(path), str(path)]))
    assert matched["t sda write"]["change"]["count"] == 0


def test_diff_phase(tmp_path):
    path = write(tmp_path / "p.jsonl", [
        dump("a", 0, 1, [series(1, "t", "sda", "read", [1 * MS] * 5, queue_ns=200 * US),
                         series(1, "t", "sda", "flush", [6 * MS], size=0)]),
        dump("b", 1, 1, [series(1, "t", "sda", "read", [1 * MS] * 5, queue_ns=600 * US),
                         series(1, "t", "sda", "flush", [6 * MS], size=0)]),
    ])
    out = ok(["diff", str(path), "--labels", "a", "b", "--phase", "device"])
    assert "device latency" in out.splitlines()[1]
    matched, _ = parse_diff(out)
    read = matched["t sda read"]
    assert close(read["A"]["p50"], 800) and close(read["B"]["p50"], 400)
    assert read["change %"]["p50"] == pytest.approx(-50.0, abs=0.05)
    assert read["change %"]["count"] == 0.0
    # flushes have no device phase: no latency, but their count
    assert matched["t sda flush"]["A"]["p50"] is None and matched["t sda flush"]["A"]["count"] == 1
    assert matched["t sda flush"]["change %"]["p50"] is None


# ---- bad input: one line, exit 2 -------------------------------------------------------

def test_errors(run, tmp_path):
    missing = str(tmp_path / "missing.jsonl")
    empty = tmp_path / "empty.jsonl"
    empty.write_text("\n")
    garbage = tmp_path / "garbage.jsonl"
    garbage.write_text(run.read_text().splitlines()[0] + "\nnot json at all\n")
    assert_error(["report", "--by", "label", missing], "cannot read", "missing.jsonl")
    assert_error(["report", "--by", "label", str(empty)], "no dumps in", "empty.jsonl")
    assert_error(["report", "--by", "label", str(garbage)], "garbage.jsonl:2", "not an iotrace dump")
    assert_error(["report", "--by", "label", "--hist", str(run)], "--hist")
    assert_error(["report", "--by", "epoch", str(run)], "--by", "--help")
    assert_error(["diff", missing, str(run)], "cannot read", "missing.jsonl")
    assert_error(["diff", f"{missing}:epoch 1", str(run)], "cannot read", "missing.jsonl")
    assert_error(["diff", str(empty), str(run)], "no dumps in", "empty.jsonl")
    assert_error(["diff", str(run), str(garbage)], "garbage.jsonl:2", "not an iotrace dump")
    assert_error(["diff", str(run), "--labels", "epoch 1", "epoch 9"], "no dump labelled 'epoch 9'",
                 "'epoch 1', 'checkpoint 1', 'epoch 2', '(unlabelled)'")
    assert_error(["diff", f"{run}:epoch 9", str(run)], "no dump labelled 'epoch 9'")
    assert_error(["diff", f"{run}:", str(run)], "no label after ':'")
    assert_error(["diff", str(run)], "one side", "--labels")
    assert_error(["diff", str(run), str(run), str(run)], "two sides")
    assert_error(["diff", f"{run}:epoch 1", str(run), "--labels", "a", "b"], "one or the other")
    assert_error(["diff", str(run), str(run), "--phase", "disk"], "--phase")


def test_help_teaches():
    out = ok(["diff", "--help"])
    for needle in ("FILE.jsonl:LABEL", "--labels", "examples", "pid", "--phase", "(unlabelled)"):
        assert needle in out, needle
    out = ok(["report", "--help"])
    for needle in ("--by", "label", "--layout", "(unlabelled)", "examples"):
        assert needle in out, needle


# ---- waits per window and the verdict --------------------------------------------

MiB = 1 << 20


def task(pid: int, ppid: int, io_wait_s: float = 0.0, read: int = 0, disk: int = 0, fsync_s: float = 0.0) -> dict:
    return {"pid": pid, "ppid": ppid, "comm": "python", "io_wait_s": io_wait_s, "io_waits": 1, "read_bytes": read,
            "reads": 1, "disk_read_bytes": disk, "fsync_s": fsync_s, "fsyncs": 0, "throttled_s": 0.0,
            "throttles": 0, "started": False, "exited": False}


def with_tasks(d: Dump, tasks: list[dict], loop: tuple[float, int, float] | None = None,
               enclosing: str | None = None, sender: int = 100) -> Dump:
    d.put(Enclosing(enclosing), Tasks.from_json(tasks), SenderPid(sender))
    if loop:
        d.loop = Loop(*loop)
    return d


def waits_table(stdout: str) -> tuple[dict[str, list[str]], dict[str, str]]:
    """The waits block -> ({label: cells}, {label: verdict line})."""
    lines = stdout.splitlines()
    head = next(i for i, x in enumerate(lines) if x.strip().startswith("LABEL") and "DATA WAIT" in x
                and "HIT" in x)
    table, verdicts = {}, {}
    i = head + 1
    while not lines[i].startswith("verdict per window"):
        label, rest = re.split(r"\s{2,}", lines[i].strip(), maxsplit=1)
        table[label] = re.split(r"\s+(?!x)", rest.strip())
        i += 1
    for line in lines[i + 1:]:
        label, text = line.strip().split(": ", 1)
        verdicts[label] = text
    return table, verdicts


@pytest.fixture
def trained(tmp_path) -> Path:
    """A trainer (pid 100) with two loader workers (101, 102): a cold epoch 1 whose workers wait for the disk,
    its checkpoint (fsync), and a warm epoch 2 served by the page cache."""
    rd = [series(101, "python", "loop0", "read", [2 * MS] * 20)]
    cold = [task(100, 1, 0.2), task(101, 100, 6.0, 32 * MiB, 31 * MiB), task(102, 100, 7.0, 32 * MiB, 31 * MiB)]
    warm = [task(100, 1, 0.0), task(101, 100, 0.1, 32 * MiB, 0), task(102, 100, 0.1, 32 * MiB, 0)]
    return write(tmp_path / "trained.jsonl", [
        with_tasks(dump("before epoch 1", 0, 1, []), [task(100, 1, 0.1, 4096, 4096)]),
        with_tasks(dump("epoch 1", 1, 8, rd), cold),
        with_tasks(dump("epoch 1 / checkpoint", 9, 1, []), [task(100, 1, 0.8, fsync_s=0.7)], enclosing="epoch 1"),
        with_tasks(dump("epoch 1", 10, 2, []), [task(100, 1, 0.0)], (4.0, 16, 11.0)),
        with_tasks(dump("epoch 2", 12, 5, []), warm, (0.2, 16, 5.0)),
        with_tasks(dump(None, 17, 1, [], kind="final"), [task(100, 1)]),
    ])


def test_by_label_shows_waits_and_a_verdict_per_window(trained):
    out = ok(["report", "--by", "label", str(trained)])
    table, verdicts = waits_table(out)
    # the unlabelled stretch saw no block I/O: left out, as in the window table
    assert list(table) == ["before epoch 1", "epoch 1", "epoch 1 / checkpoint", "epoch 2"]
    # epoch 1: its two dumps (8 s + 2 s) merged; the loop's 4.0 of 11.0 s; workers (6 + 7) / 2 of 10 s
    seconds, data_wait, trainer_io, loaders_io, read, hit, fsync, throttled = table["epoch 1"]
    assert (value(seconds), value(data_wait), value(trainer_io)) == (10.0, round(400 / 11, 1), 2.0)
    assert loaders_io == "65.0% x2" and read == "64.0MiB" and value(hit) == round(100 * 2 / 64, 1)
    assert value(table["epoch 2"][1]) == 4.0 and value(table["epoch 2"][5]) == 100.0
    assert value(table["epoch 1 / checkpoint"][6].rstrip("s")) == 0.7
    assert verdicts["epoch 1"].startswith("I/O-bound: waited 36% of the epoch for data")
    assert "2 loaders 65% on average" in verdicts["epoch 1"] and "97% of bytes from disk" in verdicts["epoch 1"]
    assert verdicts["epoch 2"].startswith("not I/O-bound: waited 4% of the epoch for data")
    assert verdicts["epoch 1 / checkpoint"].startswith("I/O-bound: no loop timing; in I/O wait: trainer 80%")
    assert "checkpoint stalls: fsync 0.70 s" in verdicts["epoch 1 / checkpoint"]


def test_by_label_json_carries_the_verdict(trained):
    lines = [json.loads(x) for x in ok(["report", "--by", "label", "--json", str(trained)]).splitlines()]
    v = {d["label"]: d["verdict"] for d in lines}
    assert v["epoch 1"]["state"] == "I/O-bound" and v["epoch 2"]["state"] == "not I/O-bound"
    assert v["epoch 1"]["trainer_pid"] == 100 and v["epoch 1"]["loaders"] == 2
    assert v["epoch 1"]["loader_io_wait"] == pytest.approx(0.65)
    assert v["epoch 1"]["data_wait"] == pytest.approx(4 / 11, abs=1e-4)
    assert v["epoch 2"]["cache_hit"] == 1.0
    # a run without tasks or loop timing gets no verdict, and no waits block
    plain = write(trained.parent / "plain.jsonl", [dump("epoch 1", 0, 1, [series(7, "x", "sda", "read", [MS])])])
    assert "verdict" not in json.loads(ok(["report", "--by", "label", "--json", str(plain)]))
    assert "verdict per window" not in ok(["report", "--by", "label", str(plain)])


def test_report_table_sums_up_a_dumps_tasks(trained):
    out = ok(["report", str(trained)])
    line = next(x for x in out.splitlines() if x.startswith("tasks: "))
    # the whole file merged: 18 s; the trainer's 1.1 s of I/O wait, the workers' 6.1 and 7.1 s
    assert line.startswith("tasks: I/O wait trainer 6.1%, loaders 36.7% x2 of 18.0s"), line
    assert "files read 128MiB" in line and "fsync 0.70s" in line
