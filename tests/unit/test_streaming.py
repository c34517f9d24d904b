"""report, diff and plot read saved dumps as a stream: the same output as merging every dump at once.

The reference is the merge as it was before the readers streamed: the whole
file read into a list, then every row merged pair by pair (Series.merge)
and the loops filtered on the complete set of labels.  Randomised files
(nested markers, loops, tasks, coverage, zero-count phases, pids changing
names, --diskstats windows) are rendered both ways; the text and the JSON
must be byte for byte the same.  Memory is checked by what is kept, not by
RSS: the reader is a generator and a merge holds none of the dumps.
"""

from __future__ import annotations

import gc
import inspect
import io
import json
import random
import weakref
from datetime import UTC, datetime, timedelta
from pathlib import Path

import numpy as np
import pytest
from conftest import put_json

from tracer.cli import diff as diffcli
from tracer.cli import report as reportcli
from tracer.codec import jsonl
from tracer.model import dump as dumpmod
from tracer.model.diskstats import DiskRow, Diskstats, ProcBytes
from tracer.model.dump import Dump, PhaseStats, Series
from tracer.model.histogram import Histogram
from tracer.model.sections import Attach, BioDevices, Coverage, Tasks, VerdictSection, merge_loops
from tracer.views import diff as diffview
from tracer.views import plot as plotview
from tracer.views.diskstats import render_dump
from tracer.views.report import Window, judged, render_windows
from tracer.views.verdict import judge_dump

T0 = datetime(2026, 3, 1, 12, 0, 0, tzinfo=UTC)
LABELS = ("epoch 1", "epoch 2", "epoch 1 / checkpoint", "ckpt:step 5", None)


# ---- the reference: every dump in a list, merged at once ----------------------------------

def reference_merge(dumps: list[Dump], kind: str = "final", label: str | None = None) -> Dump:
    series: dict[tuple, Series] = {}
    for d in dumps:
        for s in d.series:
            series[s.key] = series[s.key].merge(s) if s.key in series else s
    dropped: dict[str, int] = {}
    events: dict[str, int] = {}
    for d in dumps:
        for k, v in d.dropped.items():
            dropped[k] = dropped.get(k, 0) + v
        for k, v in d.events.items():
            events[k] = events.get(k, 0) + v
    m = Dump(kind=kind, label=label, start=min(d.start for d in dumps), end=max(d.end for d in dumps),
             host=dumps[-1].host, kernel=dumps[-1].kernel, series=list(series.values()), dropped=dropped,
             events=events)
    m.window_s = sum(dumpmod.duration_of(d) for d in dumps)
    if dumps[0].disks is not None:
        m.disks = reference_diskstats([(d.disks, dumpmod.duration_of(d)) for d in dumps])
    m.coverage = dumpmod.merge_coverage([d.coverage for d in dumps if d.coverage is not None])
    bio = sorted({n for d in dumps if d.bio_devices is not None for n in d.bio_devices.names})
    if bio:
        m.bio_devices = BioDevices(tuple(bio))
    labels = {d.label for d in dumps}
    m.loop = merge_loops([d.loop for d in dumps if d.loop is not None
                          and (d.enclosing is None or d.enclosing.label is None or d.enclosing.label not in labels)])
    enclosing = {d.enclosing for d in dumps if d.enclosing is not None}
    if len(enclosing) == 1:
        m.enclosing = enclosing.pop()
    senders = {d.sender_pid for d in dumps if d.sender_pid is not None}
    if len(senders) == 1:
        m.sender_pid = senders.pop()
    tasks = [d.tasks.rows for d in dumps if d.tasks is not None]
    if tasks:
        m.tasks = Tasks(dumpmod.merge_tasks(tasks))
    attach = sorted({d.attach.path for d in dumps if d.attach is not None})
    if attach:
        m.attach = Attach("+".join(attach))
    return m


def reference_diskstats(parts: list[tuple[Diskstats, float]]) -> Diskstats:
    if len(parts) == 1:
        return parts[0][0]
    seconds = sum(s for _, s in parts)
    rows: dict[str, list[tuple[DiskRow, float]]] = {}
    for disks, s in parts:
        for r in disks.devices:
            rows.setdefault(r.device, []).append((r, s))

    def timed(rs, attr):
        return sum(getattr(r, attr) * s for r, s in rs) / seconds if seconds > 0 else 0.0

    def per_request(rs, attr, n):
        total = sum(getattr(r, n) for r, _ in rs)
        return sum(getattr(r, attr) * getattr(r, n) for r, _ in rs) / total if total else 0.0

    devices = [DiskRow(name, *(sum(getattr(r, a) for r, _ in rs) for a in ("reads", "writes", "read_kb", "write_kb",
                                                                           "discards", "flushes")),
                       *(timed(rs, a) for a in ("r_s", "w_s", "rkb_s", "wkb_s")),
                       per_request(rs, "r_await", "reads"), per_request(rs, "w_await", "writes"),
                       timed(rs, "aqu_sz"), timed(rs, "util")) for name, rs in rows.items()]
    procs: dict[int, ProcBytes] = {}
    for disks, _ in parts:
        for p in disks.processes:
            acc = procs.get(p.pid)
            procs[p.pid] = p if acc is None else ProcBytes(p.pid, p.comm or acc.comm, acc.read_bytes + p.read_bytes,
                                                           acc.write_bytes + p.write_bytes)
    return Diskstats(devices, list(procs.values()), max(d.unreadable for d, _ in parts))


def reference_windows(dumps: list[Dump]) -> list[Window]:
    groups: dict = {}
    for d in dumps:
        groups.setdefault(d.label, []).append(d)
    # labelled windows in the order they began (a folded window follows its nested ones in a file), the rest last
    order = sorted((k for k in groups if k is not None), key=lambda k: min(d.start for d in groups[k]))
    order += [None] if None in groups else []
    out = [Window(k, len(groups[k]), reference_merge(groups[k], kind=groups[k][-1].kind, label=k)) for k in order]
    for w in out:
        if judged(w.merged):
            w.merged.verdict = VerdictSection(judge_dump(w.merged).to_json())
    return out


# ---- random files ---------------------------------------------------------------------------

def _phase(rng: np.random.Generator, empty: bool = False) -> PhaseStats:
    if empty:
        return PhaseStats(Histogram.empty())
    v = np.maximum(rng.lognormal(13, 1.0, int(rng.integers(1, 60))), 1).astype(np.int64)
    return PhaseStats(Histogram.from_values(v), float(v.sum()), int(v.min()), int(v.max()))


def random_dumps(seed: int, n: int = 120) -> list[Dump]:
    rng = np.random.default_rng(seed)
    pick = random.Random(seed)
    out = []
    for i in range(n):
        rows = []
        for _ in range(pick.randrange(0, 5)):
            pid = pick.choice((100, 101, 102, 40, 41, 300))
            comm = pick.choice(("python", "pt_worker", "kworker/u8:1", "kworker/u8:3", "fio", ""))
            phases = {"total": _phase(rng, empty=pick.random() < 0.1)}
            if pick.random() < 0.7:
                phases["queue"], phases["device"] = _phase(rng), _phase(rng, empty=pick.random() < 0.2)
            count = phases["total"].count
            rows.append(Series(pid, comm, pick.choice(("loop0", "loop1")), "7:0", pick.choice(("read", "write")),
                               count, count * pick.choice((512, 4096, 1 << 20)), phases, tgid=pid,
                               cgroup_id=pick.choice((0, 7)), container=pick.choice(("", "", "web"))))
        label = pick.choice(LABELS)
        start = T0 + timedelta(seconds=i * pick.choice((0.1, 1.0, 2.5)))
        d = Dump("marker" if label else pick.choice(("interval", "final")), start,
                 start + timedelta(seconds=pick.choice((0.1, 0.7, 3.0))), pick.choice(("h1", "h2")), "6.18", rows,
                 dropped={"map_full": pick.randrange(3)}, events={"note": pick.randrange(2)}, label=label)
        if label and pick.random() < 0.6:
            put_json(d, {"loop": {"data_wait_s": round(pick.uniform(0, 3), 6), "steps": pick.randrange(1, 50),
                                  "wall_s": round(pick.uniform(3, 9), 6)},
                         "enclosing": pick.choice((None, "epoch 1", "no such label")),
                         "sender_pid": pick.choice((100, 100, 101))})
        if pick.random() < 0.5:
            d.tasks = Tasks.from_json([{"pid": p, "ppid": 1, "comm": pick.choice(("python", "w")),
                                 "io_wait_s": round(pick.uniform(0, 2), 6), "io_waits": pick.randrange(9),
                                 "read_bytes": pick.randrange(1 << 20), "reads": 3, "disk_read_bytes": 4096,
                                 "fsync_s": 0.1, "fsyncs": 1, "throttled_s": 0.0, "throttles": 0,
                                 "started": pick.random() < 0.2, "exited": False}
                                for p in pick.sample((100, 101, 102, 103), pick.randrange(0, 3))])
        if pick.random() < 0.4:
            d.coverage = Coverage.from_json({"filtered": pick.random() < 0.1,
                                             "devices": {"loop0": {"recorded": 9, "diskstats": pick.randrange(8, 12)}}})
        if pick.random() < 0.2:
            d.bio_devices = BioDevices(("loop1",))
        d.attach = Attach(pick.choice(("raw_tp", "raw_tp", "tracepoint")))
        out.append(d)
    return out


def disk_dumps(seed: int, n: int = 30) -> list[Dump]:
    pick = random.Random(seed)
    out = []
    for i in range(n):
        names = pick.sample(("sda", "nvme0n1", "loop0"), pick.randrange(1, 4))
        devs = [DiskRow(name, pick.randrange(100), pick.randrange(100), pick.uniform(0, 900), pick.uniform(0, 900),
                        0, pick.randrange(3), pick.uniform(0, 90), pick.uniform(0, 90), pick.uniform(0, 900),
                        pick.uniform(0, 900), pick.uniform(0, 5), pick.uniform(0, 5), pick.uniform(0, 2),
                        pick.uniform(0, 100)) for name in names]
        procs = [ProcBytes(p, "python", pick.randrange(1 << 20), 0) for p in pick.sample((1, 2, 3), 2)]
        start = T0 + timedelta(seconds=i)
        d = Dump(pick.choice(("interval", "final")), start, start + timedelta(seconds=1), "h", "6.18", [],
                 label=pick.choice((None, "epoch 1")), disks=Diskstats(devs, procs, pick.randrange(3)))
        d.window_s = round(pick.uniform(0.9, 1.1), 6)
        out.append(d)
    return out


def write(path: Path, dumps: list[Dump]) -> Path:
    with open(path, "w") as f:
        for d in dumps:
            jsonl.write(f, d)
    return path


def cli(module, argv: list[str]) -> str:
    out = io.StringIO()
    assert module.run(argv, out) == 0
    return out.getvalue()


def rendered_json(dumps: list[Dump]) -> str:
    out = io.StringIO()
    for d in dumps:
        jsonl.write(out, d)
    return out.getvalue()


FILES = {"random-1": lambda: random_dumps(1), "random-2": lambda: random_dumps(2, 300),
         "one-dump": lambda: random_dumps(3, 1), "diskstats": lambda: disk_dumps(4)}


@pytest.mark.parametrize("name", sorted(FILES))
def test_streamed_report_is_byte_identical_to_merging_every_dump_at_once(tmp_path, name):
    path = write(tmp_path / f"{name}.jsonl", FILES[name]())
    dumps = list(jsonl.read(str(path)))         # as the reader gives them back: what the old code merged
    title = f"{len(dumps)} dump(s) from {path}"
    ref = io.StringIO()
    render_dump(reference_merge(dumps), ref, title=title)
    assert cli(reportcli, [str(path)]) == ref.getvalue()
    if name != "diskstats":
        ref = io.StringIO()
        render_dump(reference_merge(dumps), ref, hist=True, title=title)
        assert cli(reportcli, [str(path), "--hist"]) == ref.getvalue()
    assert cli(reportcli, [str(path), "--json"]) == rendered_json([reference_merge(dumps)])
    if name == "diskstats":
        return
    assert cli(reportcli, [str(path), "--by", "label", "--json"]) == \
        rendered_json([w.merged for w in reference_windows(dumps)])
    for extra in ([], ["--per-pid"], ["--layout", "long"]):
        ref = io.StringIO()
        render_windows(reference_windows(dumps), ref, layout=extra[-1] if "long" in extra else "auto",
                       per_pid="--per-pid" in extra, title=f"by label, from {path}")
        assert cli(reportcli, [str(path), "--by", "label", *extra]) == ref.getvalue()


def test_two_files_stream_in_order(tmp_path):
    a, b = write(tmp_path / "a.jsonl", random_dumps(5, 40)), write(tmp_path / "b.jsonl", random_dumps(6, 40))
    dumps = list(jsonl.read(str(a))) + list(jsonl.read(str(b)))
    assert cli(reportcli, [str(a), str(b), "--json"]) == rendered_json([reference_merge(dumps)])


@pytest.mark.parametrize("sides", [["{p}", "{q}"], ["{p}", "--labels", "epoch 1", "epoch 2"],
                                   ["{p}:ckpt:step 5", "{q}:(unlabelled)"]])
def test_streamed_diff_is_identical_to_merging_at_once(tmp_path, sides):
    p, q = write(tmp_path / "p.jsonl", random_dumps(7)), write(tmp_path / "q.jsonl", random_dumps(8))
    argv = [s.format(p=p, q=q) for s in sides]
    (pa, la), (pb, lb) = diffcli.parse_sides(*(([argv[0]], argv[2:]) if "--labels" in argv else (argv, None)))

    def side(tag, path, label):
        dumps = [d for d in jsonl.read(path) if label is None or diffview.window_name(d.label) == label]
        return diffview.Side(tag, path, label, len(dumps), reference_merge(dumps, kind=dumps[-1].kind, label=label))

    a, b = side("A", pa, la), side("B", pb, lb)
    assert cli(diffcli, [*argv, "--json"]) == json.dumps(diffview.diff_json(a, b)) + "\n"
    ref = io.StringIO()
    diffview.render_diff(a, b, ref)
    assert cli(diffcli, argv) == ref.getvalue()


def test_plot_reads_in_one_pass_what_the_lists_gave(tmp_path):
    dumps = random_dumps(9)
    path = write(tmp_path / "p.jsonl", dumps)
    streamed = plotview._read(jsonl.read(str(path)), None, None)
    listed = list(jsonl.read(str(path)))
    windows, t0 = plotview._windows(listed, None, None)
    assert streamed.dumps == len(listed) and streamed.t0 == t0
    assert [(w.start, w.end, w.label, sorted(w.rows)) for w in streamed.windows] == \
        [(w.start, w.end, w.label, sorted(w.rows)) for w in windows]
    # the verdicts per label, from windows merged with their series (as before) and without (as now)
    want = [(w.label, judge_dump(w.merged)) for w in reference_windows([d for d in listed if d.label is not None])
            if judged(w.merged)]
    assert [(label, v.line) for label, v in streamed.waits] == [(label, v.line) for label, v in want]


# ---- what is kept -----------------------------------------------------------------------------

def test_the_reader_is_a_generator(tmp_path):
    path = write(tmp_path / "r.jsonl", random_dumps(10, 5))
    assert inspect.isgenerator(jsonl.read(str(path)))


def test_merging_keeps_none_of_the_dumps(tmp_path):
    path = write(tmp_path / "r.jsonl", random_dumps(11, 200))
    refs = []

    def tracked():
        for d in jsonl.read(str(path)):
            refs.append(weakref.ref(d))
            yield d

    acc = dumpmod.DumpMerger()
    for d in tracked():
        acc.add(d)
    del d
    gc.collect()
    assert len(refs) == 200 and not any(r() for r in refs)
    # one accumulated row per (pid, device, op), whatever the number of dumps
    keys = {s.key for d in jsonl.read(str(path)) for s in d.series}
    assert len(acc.series.rows) == len(keys)
    assert acc.result().series == reference_merge(list(jsonl.read(str(path)))).series

    from tracer.views.report import windows_by_label

    refs.clear()
    windows = windows_by_label(tracked())
    gc.collect()
    assert len(refs) == 200 and not any(r() for r in refs) and windows


def test_histograms_wait_in_bounded_batches():
    rng = np.random.default_rng(12)
    first = _phase(rng)
    acc = dumpmod._PhaseAcc(first)
    parts = [first]
    for _ in range(500):
        st = _phase(rng)
        parts.append(st)
        acc.add(st)
        assert len(acc.hists) <= dumpmod._PhaseAcc.PENDING
    want = parts[0]
    for st in parts[1:]:
        want = want.merge(st)
    got = acc.result()
    assert got.hist == want.hist and (got.sum_ns, got.min_ns, got.max_ns) == (want.sum_ns, want.min_ns, want.max_ns)


def test_a_merge_past_max_rows_folds_rows_per_command_and_stays_bounded():
    """report's merger (DumpMerger(max_rows)): 3000 processes of 3 commands, one dump each, fold to one row
    per command once past 2000 rows; every request is still counted, and the merger says it folded."""
    rng = np.random.default_rng(5)
    acc = dumpmod.DumpMerger(max_rows=2000)
    total = 0
    for i in range(3000):
        ph = {"total": _phase(rng)}
        s = Series(1000 + i, ("a", "b", "c")[i % 3], "loop0", "7:0", "read", ph["total"].count,
                   4096 * ph["total"].count, ph, tgid=1000 + i)
        total += s.count
        start = T0 + timedelta(seconds=i)
        acc.add(Dump("interval", start, start + timedelta(seconds=1), "h", "6.18", [s]))
        assert len(acc.series.rows) <= 2001
    merged = acc.result()
    assert acc.folded == 2001
    assert sorted((s.comm, s.pid) for s in merged.series) == [("a", 0), ("b", 0), ("c", 0)]
    assert sum(s.count for s in merged.series) == total
    unbounded = dumpmod.DumpMerger()
    unbounded.add(Dump("interval", T0, T0 + timedelta(seconds=1), "h", "6.18", merged.series))
    assert not unbounded.folded
