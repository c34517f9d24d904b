"""Per-file rows ("files", bpf/files.bpf.h, tracer.sources.files): real processes, a real ext4 on a loop
device, real BPF on the raw-tracepoint path (the perf-event path has no file rows: it reads no kernel
struct, and says so by carrying none).

- a writer of 64 MiB without fsync, alive until the flusher has written it back (`sync -f`): its file's
  row names the file and has the 64 MiB written, as many as the writer's write-back series;
- two loaders reading 4 shards each, cold then warm: bytes from disk per file are the file's size cold
  (less at most a readahead window) and warm the pages the kernel added back (~0), bytes read through the
  page cache the size both times;
  `iotrace report --by file` lists them by name;
- with --dev, a reader of files on two disks: only the traced disk's file is in the dumps and the table
  at the end, and only that disk in the coverage.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import PYTHON, evict, make_ext4, read_dumps, reaped, run_iotrace, traced_event, umount
from unit.test_core import finish, start_tracer

from privileged.test_writeback import exact_bytes, nothing_lost, traced_unsynced_writer, wb_bytes
from tracer.sources import kernel
from tracer.sources.files import kernel_dev

bpf = pytest.mark.bpf
MIB = 1 << 20
ROOT = Path(__file__).resolve().parent.parent.parent
SHARD_MIB = 6
PAGE = os.sysconf("SC_PAGESIZE")
READAHEAD = 2 * MIB             # at most what one readahead window may bring beyond what was asked

LOADER = """
import sys
for path in sys.argv[1:]:
    with open(path, "rb", buffering=0) as f:
        while f.read(1 << 20):
            pass
"""


def file_rows(dumps: list[dict]) -> list[dict]:
    return [r for d in dumps for r in d.get("files") or []]


def per_file(dumps: list[dict], key: str, pid: int | None = None) -> dict[str, int]:
    out: dict[str, int] = {}
    for r in file_rows(dumps):
        if pid is None or r["pid"] == pid:
            out[r["path"]] = out.get(r["path"], 0) + (r[key] or 0)
    return out


@bpf
def test_unsynced_writer_file_row_has_its_write_back(ext4_mnt, tmp_path):
    """64 MiB written without fsync, written back by the flusher: the file's row is the writer's, names the
    file and holds the 64 MiB written, the writer's write-back bytes exactly."""
    loop, mnt = ext4_mnt
    target, out = mnt / "ckpt.bin", tmp_path / "out.jsonl"
    r, pid = traced_unsynced_writer(["--attach", "raw_tp", "--dev", loop.name, "-o", str(out)], target, tmp_path)
    dumps = read_dumps(out)
    for d in dumps:
        nothing_lost(d)
    rows = [row for row in file_rows(dumps) if row["path"] == str(target)]
    assert rows and all(row["pid"] == pid for row in rows), file_rows(dumps)
    got = sum(row["written_bytes"] for row in rows)
    exact_bytes(got, 64 * MIB, dumps, loop.name)
    assert got == wb_bytes(dumps, loop.name, pid), (got, wb_bytes(dumps, loop.name, pid))
    assert sum(row["requests"] for row in rows) > 0 and rows[0]["p99_us"] is not None
    assert "files: top" in r.stdout and "ckpt.bin" in r.stdout, r.stdout


def kernel_has(event: str) -> bool:
    """Whether this kernel has the tracepoint CATEGORY/NAME (Debian 12's 6.1 lacks filemap's get_pages and iomap's
    dio events: the rows then say "unavailable", docs/training.md, 'Files: which files the I/O was for')."""
    return any((Path(d) / "events" / event).is_dir() for d in ("/sys/kernel/tracing", "/sys/kernel/debug/tracing"))


def traced_loaders(shards: list[list[Path]], out: Path) -> tuple[list[int], str]:
    """Two loader processes reading their shards under a tracer: (their pids, the tracer's table)."""
    loaders = [subprocess.Popen([PYTHON, "-c", "import sys; sys.stdin.read(1)\n" + LOADER, *map(str, s)],
                                stdin=subprocess.PIPE) for s in shards]
    with reaped(*loaders):
        pids = [a for p in loaders for a in ("--pid", str(p.pid))]
        tracer = start_tracer(["--attach", "raw_tp", "-o", str(out), *pids])
        with reaped(tracer):
            for p in loaders:
                p.stdin.write(b"g")
                p.stdin.close()
            for p in loaders:
                assert p.wait(60) == 0
            table, _ = finish(tracer)
    return [p.pid for p in loaders], table


@bpf
def test_two_loaders_cold_then_warm(ext4_mnt, tmp_path):
    """8 shards, 4 per loader: cold, each file's bytes from disk are its size (less at most a readahead
    window) and under its reader; warm, only the pages the kernel had to add back (none on a quiet machine);
    the page cache served the size both times."""
    loop, mnt = ext4_mnt
    cache_reads = kernel_has("filemap/mm_filemap_get_pages")     # else the rows say null: no such event
    shards = [[mnt / f"shard-{i}-{j}.rec" for j in range(4)] for i in range(2)]
    for s in shards:
        for f in s:
            f.write_bytes(bytes([len(f.name)]) * (SHARD_MIB * MIB - 4096 * len(f.name)))   # sizes differ
    evict(mnt)
    sizes = {str(f): f.stat().st_size for s in shards for f in s}
    cold_out, warm_out = tmp_path / "cold.jsonl", tmp_path / "warm.jsonl"
    pids, table = traced_loaders(shards, cold_out)
    cold = read_dumps(cold_out)
    for d in cold:
        nothing_lost(d)
    # a request is its first page's file's: where the block layer merged two files' neighbouring reads into
    # one request (docs/training.md, files), bytes move between them, so each file is within a window, the sum exact-ish
    total = 0
    for pid, s in zip(pids, shards, strict=True):
        disk, cache = per_file(cold, "disk_read_bytes", pid), per_file(cold, "cache_read_bytes", pid)
        for f in s:
            size = sizes[str(f)]
            got = per_file(cold, "disk_read_bytes").get(str(f), 0)
            total += got
            assert size - READAHEAD <= got <= size + READAHEAD, (f, disk, size)
            assert disk.get(str(f), 0) == got, (f, disk)       # all of it under its reader
            assert cache.get(str(f)) == (size if cache_reads else 0), (f, cache, size)
    assert sum(sizes.values()) - READAHEAD <= total <= sum(sizes.values()), (total, sizes)
    assert "shard-0-0.rec" in table, table
    # warm: what the kernel had to read back is the pages it added to the cache again (this machine's DAMON
    # reclaim, kdamond, evicts idle page-cache pages within seconds: some of the cold run's are gone)
    rdev = os.stat(loop.path).st_rdev
    with traced_event("filemap/mm_filemap_add_to_page_cache", f"s_dev == {kernel_dev(os.major(rdev), os.minor(rdev))}",
                      8192) as lines:
        _, _ = traced_loaders(shards, warm_out)
    added: dict[int, int] = {}      # inode number -> pages added; "order=" since large folios, else one page
    for m in filter(None, (re.search(r" ino ([0-9a-f]+) .*?ofs=\d+(?: order=(\d+))?", ln) for ln in lines)):
        added[int(m[1], 16)] = added.get(int(m[1], 16), 0) + (1 << int(m[2] or 0))
    warm = read_dumps(warm_out)
    for d in warm:
        nothing_lost(d)
    # as cold: a request merged from two files' re-reads is its first page's file's (one request moves), and one
    # whose completion the kernel ran no program for (counted: README, Dropped events) is in no row
    unseen = sum(d["dropped"]["lost_completion"] + d["dropped"].get("skipped_complete", 0) for d in warm)
    largest = int(Path(f"/sys/block/{Path(loop.path).name}/queue/max_sectors_kb").read_text()) * 1024
    disk, cache = per_file(warm, "disk_read_bytes"), per_file(warm, "cache_read_bytes")
    print(f"warm: {sum(disk.values())} bytes from disk, {sum(added.values())} pages added back, {unseen} unseen")
    want = {path: added.get(Path(path).stat().st_ino, 0) * PAGE for path in sizes}
    for path, size in sizes.items():
        assert abs(disk.get(path, 0) - want[path]) <= largest * (1 + unseen), (path, disk, want, unseen)
        # without the page cache's read event a warm file leaves nothing to make a row of (6.1)
        assert (cache.get(path) == size) if cache_reads else not cache.get(path), (path, cache)
    got_all, want_all = sum(disk.get(path, 0) for path in sizes), sum(want.values())
    assert want_all - unseen * largest <= got_all <= want_all, (got_all, want_all, unseen)
    r = subprocess.run([sys.executable, "-m", "tracer.cli", "report", "--by", "file", str(cold_out)], cwd=ROOT,
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    listed = [line.split()[0] for line in r.stdout.splitlines() if ".rec" in line]
    assert {Path(p).name for p in listed} == {Path(p).name for p in sizes}, r.stdout


@bpf
def test_tracepoint_path_has_no_file_rows(ext4_mnt, tmp_path):
    """--attach tracepoint reads no kernel struct: its dumps carry no "files" (rather than empty rows)."""
    loop, mnt = ext4_mnt
    f = mnt / "x"
    f.write_bytes(b"x" * MIB)
    evict(f)
    out = tmp_path / "out.jsonl"
    r = run_iotrace(["--attach", "tracepoint", "--dev", loop.name, "-o", str(out), "--", "cat", str(f)])
    assert r.returncode == 0, r.stderr
    assert all("files" not in d for d in read_dumps(out))
    assert "no per-file rows: they need the raw tracepoints" in r.stderr

@bpf
def test_direct_reads_and_writes_are_the_files_bytes_as_asked(ext4_mnt, tmp_path):
    """O_DIRECT's pages are the process's memory, no file's: its bytes come from iomap_dio_rw_begin (clipped at
    EOF for reads), under direct_bytes too, with no request or latency of their own."""
    if not kernel_has("iomap/iomap_dio_rw_begin"):
        pytest.skip("this kernel has no iomap:iomap_dio_rw_begin: O_DIRECT I/O is in no file's row (docs/training.md)")
    loop, mnt = ext4_mnt
    f, out = mnt / "direct.bin", tmp_path / "out.jsonl"
    cmd = (f"dd if=/dev/zero of={f} bs=1M count=4 oflag=direct status=none && "
           f"dd if={f} of=/dev/null bs=1M iflag=direct status=none")
    r = run_iotrace(["--attach", "raw_tp", "--dev", loop.name, "-o", str(out), "--", "sh", "-c", cmd])
    assert r.returncode == 0, r.stderr
    rows = [row for row in file_rows(read_dumps(out)) if row["path"] == str(f)]
    assert sum(row["written_bytes"] for row in rows) == 4 * MIB, rows
    assert sum(row["disk_read_bytes"] for row in rows) == 4 * MIB, rows      # the read at EOF asks 1 MiB more
    assert sum(row["direct_bytes"] for row in rows) == 8 * MIB, rows


DIRECT_INTO_MAPPING = """
import mmap, os, sys
size, chunk = int(sys.argv[3]), int(sys.argv[4])
with open(sys.argv[2], "r+b") as into:
    buf = memoryview(mmap.mmap(into.fileno(), size, mmap.MAP_SHARED))
    fd = os.open(sys.argv[1], os.O_RDONLY | os.O_DIRECT)
    for at in range(0, size, chunk):
        assert os.preadv(fd, [buf[at:at + chunk]], at) == chunk
"""


@bpf
def test_a_direct_read_into_another_files_mapping_is_the_read_files_alone(ext4_mnt, tmp_path):
    """O_DIRECT into memory that is another file's shared mapping: the requests' pages are that file's page-cache
    pages, but the bytes are the read file's.  A kernel that marks the bios of pinned user pages
    (BIO_PAGE_PINNED, 6.5+) tells them apart at the completion, where the walk to the first page (the only test
    before 6.5) names the mapped file.  Reads of 64 KiB: a bio the block layer splits (more than the disk's
    max_segments pages) begins with a part split off it, which carries no mark, and is walked (docs/training.md)."""
    if not kernel_has("iomap/iomap_dio_rw_begin"):
        pytest.skip("this kernel has no iomap:iomap_dio_rw_begin: O_DIRECT I/O is in no file's row (docs/training.md)")
    if not kernel.load_shortcuts():
        pytest.skip("this kernel has no BIO_PAGE_PINNED (6.5+): its completions cannot tell pinned user pages")
    loop, mnt = ext4_mnt
    read, mapped, out = mnt / "read.bin", mnt / "mapped.bin", tmp_path / "out.jsonl"
    size = 4 * MIB
    for f in (read, mapped):
        f.write_bytes(os.urandom(size))
    subprocess.run(["sync"], check=True)    # nothing left to write back; the mapped file's pages stay cached
    r = run_iotrace(["--attach", "raw_tp", "--dev", loop.name, "-o", str(out), "--",
                     sys.executable, "-c", DIRECT_INTO_MAPPING, str(read), str(mapped), str(size), str(64 << 10)])
    assert r.returncode == 0, r.stderr
    dumps = read_dumps(out)
    from_disk = per_file(dumps, "disk_read_bytes")
    assert from_disk.get(str(mapped), 0) == 0, file_rows(dumps)
    assert from_disk[str(read)] == size, file_rows(dumps)
    assert per_file(dumps, "direct_bytes")[str(read)] == size, file_rows(dumps)


@bpf
def test_dev_keeps_other_disks_files_out_of_the_dumps_the_table_and_the_coverage(make_loop, tmp_path):
    """--dev A, one command reading a file on A and one on B (through the page cache, cold, and O_DIRECT,
    whose bytes are counted before any request and so on any disk): B's file is in no dump, not in the
    table at the end, and B is not in the coverage (the issue's "with --dev the end-of-run file table still
    lists other disks' files")."""
    mounts = []
    try:
        files = []
        for n in ("a", "b"):
            dev, mnt = make_loop(64), tmp_path / f"mnt_{n}"
            make_ext4(dev.path, mnt, "noatime")
            mounts.append((dev, mnt))
            f = mnt / f"on_{n}.bin"
            f.write_bytes(os.urandom(2 * MIB))
            files.append(f)
        evict(*files)
        (a, _), (b, _) = mounts
        out = tmp_path / "out.jsonl"
        reads = " && ".join(f"cat {f} > /dev/null && dd if={f} of=/dev/null bs=1M iflag=direct status=none"
                            for f in files)
        r = run_iotrace(["--attach", "raw_tp", "--dev", a.name, "-o", str(out), "--", "sh", "-c", reads])
        assert r.returncode == 0, r.stderr
        dumps = read_dumps(out)
        paths = {row["path"] for row in file_rows(dumps)}
        assert str(files[0]) in paths and str(files[1]) not in paths, paths
        assert {row["dev"] for row in file_rows(dumps)} == {devno_of(a.path)}
        # the table at the end (on stdout; a long path keeps its tail there)
        table = r.stdout.partition("\nfiles:")[2]
        assert files[0].name in table and files[1].name not in table, r.stdout
        assert all(set(d["coverage"]["devices"]) == {a.name} for d in dumps if d.get("coverage")), dumps
    finally:
        for _, mnt in reversed(mounts):
            umount(mnt)


def devno_of(path: str) -> str:
    """'7:3' for a block device node, as file rows name their device."""
    st = os.stat(path)
    return f"{os.major(st.st_rdev)}:{os.minor(st.st_rdev)}"
