"""Per-file rows without BPF: names and paths from mountinfo and /proc text (tracer.sources.files), the
file-latency buckets against the programs' scheme, the top-N bound and the dump's "files" section."""

from __future__ import annotations

import io
import os
from datetime import UTC, datetime

import pytest

from tracer import contract
from tracer.codec import jsonl
from tracer.model.dump import Dump, merge_dumps
from tracer.model.files import OTHER, FileRow, Files, bounded, bucket_of, bucket_range, percentile_ns
from tracer.sources import files as srcfiles
from tracer.sources.files import FileRaw, Mount, best_mount, fs_path, kernel_dev, name_paths, parse_mountinfo
from tracer.views.files import render_files

MOUNTINFO = """\
22 1 254:1 / / rw,relatime shared:1 - ext4 /dev/vda1 rw
35 22 7:3 / /tmp/pytest\\040x/mnt rw,relatime shared:9 - ext4 /dev/loop3 rw
36 22 7:3 /data /srv/data rw,relatime shared:9 - ext4 /dev/loop3 rw
37 22 0:30 / /proc rw,nosuid - proc proc rw
38 22 7:4 /sub /a rw - ext4 /dev/loop4 rw
garbage line
"""

LOOP3 = kernel_dev(7, 3)


def test_mountinfo_is_parsed_by_kernel_dev_with_escapes_undone():
    m = parse_mountinfo(MOUNTINFO)
    assert m[kernel_dev(254, 1)] == [Mount("/", "/")]
    assert m[LOOP3] == [Mount("/", "/tmp/pytest x/mnt"), Mount("/data", "/srv/data")]
    assert best_mount(m[LOOP3]) == Mount("/", "/tmp/pytest x/mnt")     # the whole filesystem first
    assert best_mount([Mount("/data", "/b"), Mount("/data", "/a/b")]) == Mount("/data", "/b")
    assert best_mount([]) is None


MNT = Mount("/", "/mnt/d")


@pytest.mark.parametrize("parts, rooted, mount, want", [
    (["shard-0.rec", "train"], True, MNT, "/mnt/d/train/shard-0.rec"),
    (["f"], True, Mount("/", "/"), "/f"),
    (["d", "c", "b", "a"], False, MNT, "/mnt/d/.../a/b/c/d"),           # deeper than the names read
    (["x", "data"], True, Mount("/data", "/srv/data"), "/srv/data/x"),  # a bind mount of a subtree
    (["x", "other"], True, Mount("/data", "/srv/data"), "[7:3]/other/x"),   # outside the mounted subtree
    (["f"], True, None, "[7:3]/f"),                                     # not mounted where the process is
    (["f", "d"], False, None, "[7:3]/.../d/f"),
    ([], False, MNT, "[7:3]"),                                          # no dentry
])
def test_paths_from_dentry_names_under_the_mount(parts, rooted, mount, want):
    assert fs_path(parts, rooted, mount, LOOP3) == want


def test_an_open_fd_names_the_file_else_its_dentry_names_under_the_mount(tmp_path):
    """A fake /proc: pid 10 has the file open (its link is the path), pid 11 does not (dentry names)."""
    real = tmp_path / "data" / "shard.rec"
    real.parent.mkdir()
    real.write_bytes(b"x")
    st = os.stat(real)
    dev = kernel_dev(os.major(st.st_dev), os.minor(st.st_dev))
    proc = tmp_path / "proc"
    (proc / "10" / "fd").mkdir(parents=True)
    (proc / "10" / "fd" / "3").symlink_to(real)
    (proc / "10" / "fd" / "4").symlink_to(tmp_path / "gone")          # a dangling link is skipped
    (proc / "11").mkdir()
    (proc / "11" / "mountinfo").write_text(
        f"40 1 {os.major(st.st_dev)}:{os.minor(st.st_dev)} / /mnt/x rw - ext4 /dev/x rw\n")
    rows = [FileRaw(dev, st.st_ino, 10), FileRaw(dev, st.st_ino, 11), FileRaw(dev, 99, 11)]
    name_paths(rows, {(dev, st.st_ino): (["shard.rec", "data"], True), (dev, 99): ([], False)}, proc=str(proc))
    # pid 11 has no fd of its own on it, but the path pid 10's fd gave names the same file
    assert [r.path for r in rows] == [str(real), str(real), f"[{srcfiles.dev_name(dev)}] inode 99"]


def test_without_any_open_fd_the_mount_point_names_it(tmp_path):
    proc = tmp_path / "proc"
    (proc / "11").mkdir(parents=True)
    (proc / "11" / "mountinfo").write_text(MOUNTINFO)
    rows = [FileRaw(LOOP3, 5, 11)]
    name_paths(rows, {(LOOP3, 5): (["ckpt.bin"], True)}, proc=str(proc))
    assert rows[0].path == "/tmp/pytest x/mnt/ckpt.bin"


def test_buckets_are_the_programs_scheme_and_cover_every_value():
    sub = contract.load().const("FILE_HIST_SUB_BITS")
    nb = contract.load().const("FILE_HIST_BUCKETS")
    for ns in [0, 1, 3, 4, 5, 7, 8, 100, 1000, 123456, 10**9, (1 << 38) - 1]:
        b = bucket_of(ns)
        lo, hi = bucket_range(b)
        assert lo <= ns < hi and b < nb, (ns, b, lo, hi)
        assert hi - lo <= max(1, lo >> sub)        # a bucket is at most 1/4 of its lower bound wide
    assert bucket_range(nb - 1)[1] == 1 << 38


def test_percentiles_from_buckets():
    h = {bucket_of(1000): 98, bucket_of(1_000_000): 2}
    assert percentile_ns({}, 0.5) is None
    p50, p99 = percentile_ns(h, 0.5), percentile_ns(h, 0.99)
    assert 875 <= p50 <= 1125 and 875_000 <= p99 <= 1_125_000


def row(path: str, disk: int, written: int = 0, pid: int = 1, cache: int | None = 0) -> FileRow:
    return FileRow("7:3", hash(path) & 0xFFFF, path, pid, "python", cache_read_bytes=cache, disk_read_bytes=disk,
                   written_bytes=written, requests=1, hist={60: 1})


def test_top_n_by_bytes_moved_and_the_rest_summed():
    rows = [row(f"/f{i}", disk=i * 100, written=7) for i in range(6)]
    out = bounded(rows, 2)
    assert [r.path for r in out] == ["/f5", "/f4", OTHER]
    other = out[-1]
    assert (other.files, other.disk_read_bytes, other.written_bytes, other.requests, other.hist) == (
        4, 600, 28, 4, {60: 4})
    assert bounded(rows, 10) == sorted(rows, key=lambda r: -r.disk_read_bytes)     # nothing to sum
    assert bounded(rows, 0)[0].files == 6
    # written bytes count as read ones: a checkpoint written once outranks a shard read from disk
    mixed = [row("/shard", disk=300), row("/ckpt", disk=0, written=400), row("/log", disk=0, written=10)]
    assert [r.path for r in bounded(mixed, 2)] == ["/ckpt", "/shard", OTHER]


def test_unknown_cache_bytes_stay_unknown_when_rows_add_up():
    a, b = row("/a", 1, cache=None), row("/a", 1, cache=None)
    a.add(b)
    assert a.cache_read_bytes is None
    a.add(row("/a", 1, cache=5))
    assert a.cache_read_bytes == 5


T0 = datetime(2026, 5, 4, 10, 0, 0, tzinfo=UTC)


def dump(rows: list[FileRow]) -> Dump:
    return Dump("interval", T0, T0, "h", "6.18", [], files=Files(rows))


def test_section_round_trips_and_merges_by_file_and_pid():
    d1 = dump(bounded([row("/a", 100), row("/b", 50), row("/c", 1)], 2))
    d2 = dump([row("/a", 10), row("/a", 10, pid=2)])
    back = jsonl.from_json(jsonl.to_json(d1))
    assert back.files == d1.files
    merged = merge_dumps([d1, d2]).files
    assert [(r.path, r.pid, r.disk_read_bytes) for r in merged.rows] == [
        ("/a", 1, 110), ("/b", 1, 50), ("/a", 2, 10), (OTHER, 0, 1)]
    old = jsonl.from_json({k: v for k, v in jsonl.to_json(d1).items() if k != "files"})
    assert old.files is None and merge_dumps([old, old]).files is None


def test_table_is_terminal_safe_and_says_what_it_cannot_know():
    out = io.StringIO()
    rows = [row("/evil\x1b[2J\nname", 100, cache=None), *[row(f"/f{i}", i) for i in range(12)]]
    render_files(dump(rows), out, rows=3)
    text = out.getvalue()
    assert "\x1b" not in text and "\\x1b[2J\\x0aname" in text
    assert "(10 other files)" in text and "CACHE n/a" in text
    assert len(text.strip().splitlines()) == 1 + 1 + 3 + 1 + 1


def test_report_by_file_ranks_a_file_written_and_never_read_first(tmp_path):
    """`report --by file` over saved dumps: the 68 MiB checkpoint the trainer wrote (not read) is the top row,
    above every file read from disk, and its written bytes are shown; the rows of two dumps add up."""
    from tracer.cli import report as cli_report

    mib = 1 << 20
    shards = [row(f"/data/shard-{i}", disk=(16 + i) * mib) for i in range(30)]
    ckpt = [row("/ckpt/model.pt", disk=0, written=34 * mib, pid=7)]
    path = tmp_path / "run.jsonl"
    with open(path, "w") as f:
        jsonl.write(f, dump(shards[:15] + ckpt))
        jsonl.write(f, dump(shards[15:] + ckpt))
    out = io.StringIO()
    assert cli_report.run([str(path), "--by", "file", "--files", "3"], out) == 0
    lines = out.getvalue().strip().splitlines()
    assert "by bytes read from disk + written" in lines[0], lines
    head = lines[1].split()
    assert head[head.index("WRITTEN") - 2:head.index("WRITTEN") + 1] == ["DISK", "READ", "WRITTEN"], head
    top = lines[2].split()
    assert top[0] == "/ckpt/model.pt" and top[1] == "7" and top[4:6] == ["0B", "68.0MiB"], lines
    assert [ln.split()[0] for ln in lines[3:5]] == ["/data/shard-29", "/data/shard-28"], lines
    assert lines[5].startswith("(28 other files)"), lines
