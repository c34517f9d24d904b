"""Bio-based disks (zram here) have no request events: iotrace times their bios instead."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import assert_count, read_dumps, run_iotrace, series_of

bpf = pytest.mark.bpf
ZRAM = Path("/sys/block/zram0")


@pytest.fixture
def zram():
    """zram0 sized 64 MiB for the test, reset afterwards; skipped where there is none free."""
    if not ZRAM.is_dir():
        pytest.skip("no zram0 on this machine (modprobe zram)")
    if (ZRAM / "disksize").read_text().strip() != "0":
        pytest.skip("zram0 is in use")
    (ZRAM / "disksize").write_text("64M")
    yield "zram0"
    (ZRAM / "reset").write_text("1")


@bpf
def test_zram_gets_rows_timed_per_bio(zram, tmp_path):
    out = tmp_path / "out.jsonl"
    job = ("dd if=/dev/zero of=/dev/zram0 bs=4k count=400 oflag=direct status=none && "
           "dd if=/dev/zram0 of=/dev/null bs=4k count=250 iflag=direct status=none")
    r = run_iotrace(["--dev", zram, "-o", str(out), "--", "sh", "-c", job])
    assert r.returncode == 0, r.stderr
    final = read_dumps(out)[-1]
    rows = {s["op"]: s for s in series_of(final, device=zram)}
    assert_count(rows["write"]["count"], 400, [final], device=zram)
    assert_count(rows["read"]["count"], 250, [final], device=zram)
    assert rows["write"]["bytes"] == rows["write"]["count"] * 4096
    assert all(s["comm"] == "dd" for s in rows.values())
    # marked as such: per bio, so the total phase only
    assert final["bio_devices"] == [zram]
    assert all(set(s["latency_us"]) == {"total"} for s in rows.values()), json.dumps(rows)[:300]
    assert "bio-based: zram0" in r.stdout
    # and what the kernel counted agrees
    c = final["coverage"]["devices"][zram]
    assert c["diskstats"] == 650
    assert_count(c["recorded"], 650, [final])
