"""The run's end after the traced COMMAND exits with dirty pages of its own (tracer.runtime.wbwait): by
default the trace goes on until the kernel has written them back, charged to the command, within --wb-wait;
with --wb-wait 0 it stops at once and says, in one stderr line and the final dump's unwritten_at_exit, how
much the command left unwritten.

Real processes (tests/wbload.py: 32 MiB buffered, no fsync, then it exits at once), a real ext4 on a loop
device, real BPF.  When the flusher writes is vm.dirty_expire_centisecs (the age a dirty page is written
at): lowered to 3 s so that the write-back comes during the wait, raised to 120 s so that none comes before
a --wb-wait 0 run ends; restored after each test (it is the machine's, as are the other helpers' writes).
"""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path

import pytest
from conftest import PYTHON, read_dumps, run_iotrace

from privileged.test_writeback import COMM, MIB, WBLOAD, exact_bytes, nothing_lost, wb_bytes, writes

bpf = pytest.mark.bpf
EXPIRE = Path("/proc/sys/vm/dirty_expire_centisecs")
WAIT_BOUND_S = 30       # --wb-wait's default


@pytest.fixture
def dirty_expire():
    """set(centiseconds): vm.dirty_expire_centisecs for this test; the old value back at teardown."""
    old = EXPIRE.read_text().strip()

    def put(centisecs: int) -> None:
        EXPIRE.write_text(str(centisecs))

    yield put
    EXPIRE.write_text(old)


def unsynced_command(iotrace_args: list[str], target: Path, tmp_path: Path, mib: int = 32):
    """iotrace ARGS -- wbload writing `mib` MiB to `target` without fsync and exiting right away:
    (iotrace's result, the writer's pid, the dumps, the final dump's unwritten_at_exit)."""
    written, go, out = tmp_path / "written", tmp_path / "go", tmp_path / "out.jsonl"
    go.touch()      # it does not wait: it exits as soon as its writes are in the page cache
    r = run_iotrace([*iotrace_args, "-o", str(out), "--", PYTHON, WBLOAD, str(target), str(mib), str(written),
                     str(go)], timeout=180)
    assert r.returncode == 0, r.stderr
    dumps = read_dumps(out)
    finals = [d for d in dumps if d["kind"] == "final"]
    assert len(finals) == 1 and "unwritten_at_exit" in finals[0], [d.keys() for d in dumps]
    return r, int(written.read_text()), dumps, finals[0]["unwritten_at_exit"]


@bpf
@pytest.mark.parametrize("attach", ["raw_tp", "tracepoint"])
def test_the_write_back_after_the_command_exits_is_waited_for_and_charged_to_it(ext4_mnt, tmp_path, attach,
                                                                                  dirty_expire):
    """Default --wb-wait: the 32 MiB the command left dirty are written back by the flusher after it exited,
    during the wait; they are in the dumps as its write-back (exact but for requests the kernel skipped), the
    wait ended because all was written, well before its 30 s bound, and no end line says otherwise."""
    loop, mnt = ext4_mnt
    dirty_expire(300)
    r, pid, dumps, left = unsynced_command(["--attach", attach, "--dev", loop.name], mnt / "ckpt", tmp_path)
    for d in dumps:
        nothing_lost(d)
    exact_bytes(wb_bytes(dumps, loop.name, pid), 32 * MIB, dumps, loop.name)
    assert all(s["comm"] == COMM for s in writes(dumps, loop.name, pid, wb=True))
    assert left["ended"] == "written" and left["bytes"] == 0, left
    assert left["waited_s"] < WAIT_BOUND_S - 5, left       # the flusher came ~3-8 s after the writes
    assert "not written back" not in r.stderr, r.stderr


@bpf
def test_wb_wait_0_stops_at_once_and_says_how_much_was_left_unwritten(ext4_mnt, tmp_path, dirty_expire):
    """--wb-wait 0: the run ends with the command; its 32 MiB are still dirty (the flusher waits 120 s
    here), and both the end line and the final dump say so; what was collected is all there (no drop)."""
    loop, mnt = ext4_mnt
    dirty_expire(12000)
    target = mnt / "ckpt"
    started = time.monotonic()
    r, pid, dumps, left = unsynced_command(["--wb-wait", "0", "--dev", loop.name], target, tmp_path)
    took = time.monotonic() - started
    try:
        for d in dumps:
            nothing_lost(d)
        # at once: well under a second here, 0.6 s in a TCG guest; a wait would run to the 30 s bound
        assert left["ended"] == "not waited" and left["waited_s"] < 2.0, left
        # all of it, less what another process's sync may have written; not the pages the writer dirtied
        # off the traced disk (its `written` file: --dev leaves them out)
        assert 16 * MIB <= left["bytes"] <= 32 * MIB, left
        lines = [line for line in r.stderr.splitlines() if "not written back" in line]
        assert len(lines) == 1 and f"{left['bytes'] / MIB:.1f} MiB" in lines[0] and "--wb-wait 0" in lines[0], \
            r.stderr
        assert wb_bytes(dumps, loop.name, pid) <= 32 * MIB - left["bytes"] + MIB
        assert json.dumps(left)     # the field as written
        assert took < 120, took
    finally:
        subprocess.run(["sync", "-f", str(target)], check=False, timeout=60)
