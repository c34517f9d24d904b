"""Map capacity: the defaults hold a deep burst; a table made too small says so instead of losing silently."""

from __future__ import annotations

import pytest
from conftest import assert_count, fio_cmd, read_dumps, run_iotrace, series_of

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


@bpf
def test_a_full_home_group_spills_into_the_second(loop, tmp_path):
    # two groups of 8 slots and up to 16 requests in flight: a start whose home group is full
    # takes a slot in its second group, so none is lost (with home groups alone, a burst of 16
    # hashed into 2 groups overflows one most of the time)
    out = tmp_path / "out.jsonl"
    r = run_iotrace(["--dev", loop.name, "--inflight-slots", "16", "-o", str(out), "--",
                     *fio_cmd(loop.path, ioengine="libaio", iodepth=16, size="16M")])
    assert r.returncode == 0, r.stderr
    dumps = read_dumps(out)
    final = dumps[-1]
    # a slot left behind by a lost completion (README, Coverage) holds one of the 16 for 60 s
    assert final["dropped"]["inflight_full"] == 0 or final["dropped"]["lost_completion"], final["dropped"]
    count = sum(s["count"] for s in series_of(final, comm="fio", device=loop.name))
    assert_count(count, 4096, dumps, device=loop.name)
