"""Map capacity: the defaults hold a deep burst; a table made too small says so instead of losing silently."""

from __future__ import annotations

import pytest
from conftest import fio_cmd, read_dumps, run_iotrace, series_of

bpf = pytest.mark.bpf
ROOM = ("inflight_full", "hist_full", "series_full")


def _burst(path: str, seconds: int = 3) -> list[str]:
    # 4 jobs x 128 deep: up to 512 requests in flight at once, as fast as the machine goes
    return fio_cmd(path, ioengine="libaio", iodepth=128, numjobs=4, time_based=1, runtime=seconds,
                   size="64M", norandommap=1, group_reporting=1)


@bpf
def test_default_maps_hold_a_deep_burst(loop, tmp_path):
    out = tmp_path / "out.jsonl"
    r = run_iotrace(["--dev", loop.name, "-o", str(out), "--", *_burst(loop.path)])
    assert r.returncode == 0, r.stderr
    dumps = read_dumps(out)
    final = dumps[-1]
    count = sum(s["count"] for s in series_of(final, device=loop.name))
    assert count > 20000, count                       # a real burst, not a trickle
    assert {k: final["dropped"][k] for k in ROOM} == dict.fromkeys(ROOM, 0)


@bpf
def test_a_table_too_small_counts_what_it_loses(loop, tmp_path):
    out = tmp_path / "out.jsonl"
    r = run_iotrace(["--dev", loop.name, "--inflight-slots", "8", "-o", str(out), "--", *_burst(loop.path, 2)])
    assert r.returncode == 0, r.stderr
    final = read_dumps(out)[-1]
    lost = final["dropped"]["inflight_full"]
    assert lost > 0
    assert "inflight_full=" in r.stdout and "WARNING" in r.stdout
    # the coverage shows the same shortfall: fewer recorded than the kernel completed, but not none
    c = final["coverage"]["devices"][loop.name]
    assert 0 < c["recorded"] < c["diskstats"]
