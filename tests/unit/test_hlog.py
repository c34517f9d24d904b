"""Tests of tracer/sinks/hlog.py and `iotrace report --hlog`: logs read back by hdrh's own HistogramLogReader."""

from __future__ import annotations

import io
from datetime import UTC, datetime, timedelta

import numpy as np
import pytest
from hdrh.histogram import HdrHistogram
from hdrh.log import HistogramLogReader

from tracer.cli import report
from tracer.codec import jsonl
from tracer.model.dump import Dump, PhaseStats, Series
from tracer.model.histogram import HDR_HIGHEST, SIGFIGS, Histogram
from tracer.sinks import hlog

T0 = datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC)
QS = (50, 90, 99, 99.9)


def _series(pid: int, comm: str, values: np.ndarray) -> Series:
    h = Histogram.from_values(values)
    return Series(pid, comm, "vda", "253:0", "read", h.total, 4096 * h.total,
                  {"total": PhaseStats(h, float(values.sum()), int(values.min()), int(values.max()))})


def _dumps() -> list[Dump]:
    rng = np.random.default_rng(7)
    out = []
    for k in range(3):
        a = rng.lognormal(11, 1.5, 5000).astype(np.int64) + 1
        b = rng.lognormal(14, 0.7, 300).astype(np.int64) + 1
        out.append(Dump("interval", T0 + timedelta(seconds=10 * k), T0 + timedelta(seconds=10 * k + 10),
                        "host", "6.18", [_series(10, "py thon,evil\n", a), _series(11, "fio", b)]))
    return out


def _read(path) -> list[HdrHistogram]:
    reader = HistogramLogReader(str(path), HdrHistogram(1, HDR_HIGHEST, SIGFIGS))
    got = []
    while (h := reader.get_next_interval_histogram()) is not None:
        got.append(h)
    reader.close()
    return got


def _check(got: list[HdrHistogram], dumps: list[Dump]) -> None:
    want = [(s, st) for d in dumps for s in d.series for st in s.phases.values()]
    assert len(got) == len(want) == 6
    for h, (s, st) in zip(got, want, strict=True):
        assert h.get_tag() == hlog.tag(s, "total")
        assert " " not in h.get_tag() and "," not in h.get_tag()
        assert h.get_total_count() == st.count
        for q, ours in zip(QS, st.hist.percentiles(QS), strict=True):
            # hdrh reports the top of the bucket holding its rank, we its middle: half a bucket apart,
            # within the histogram's precision (2**-8 of the value)
            assert abs(h.get_value_at_percentile(q) - ours) / ours < 2 ** -7
    starts = sorted({h.get_start_time_stamp() for h in got})
    assert starts == [d.start.timestamp() * 1e3 for d in dumps]


def test_tag_is_sanitized():
    s = _series(10, "py thon,evil\n", np.array([5]))
    assert hlog.tag(s, "total") == "10:py_thon_evil_:vda:read:total"


def test_report_hlog_reads_back_with_hdrh(tmp_path):
    dumps = _dumps()
    src = tmp_path / "run.jsonl"
    with open(src, "w") as f:
        for d in dumps:
            jsonl.write(f, d)
    out = tmp_path / "run.hlog"
    assert report.run([str(src), "--hlog", str(out)], out=io.StringIO()) == 0
    _check(_read(out), dumps)


def test_hlog_with_follow_is_refused(tmp_path, capsys):
    src = tmp_path / "run.jsonl"
    src.write_text("")
    with pytest.raises(Exception, match="--hlog"):
        report.run([str(src), "--follow", "--hlog", str(tmp_path / "x.hlog")])
