"""A trainer for tests/test_tasks.py: each epoch (a tracer.marker window) forks
workers that read their share of the files in DIR with os.read, count the
bytes, and before exiting send the parent what the kernel's own accounting says of
them: delay accounting's block-I/O delay from taskstats (nanoseconds) and
/proc/self/stat field 42 (clock ticks), and /proc/self/io's read_bytes.

    python tasksload.py DIR RESULTS.jsonl [EPOCHS [WORKERS]]

Standard library only (tracer.marker is too).
"""

from __future__ import annotations

import json
import os
import socket
import struct
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from tracer import marker  # noqa: E402

CHUNK = 1 << 20

# generic netlink (linux/netlink.h, linux/genetlink.h) and taskstats (linux/taskstats.h): stable UAPI
GENL_ID_CTRL, CTRL_CMD_GETFAMILY, CTRL_ATTR_FAMILY_ID, CTRL_ATTR_FAMILY_NAME = 0x10, 3, 1, 2
TASKSTATS_CMD_GET, TASKSTATS_CMD_ATTR_TGID = 1, 2
TASKSTATS_TYPE_STATS, TASKSTATS_TYPE_AGGR_TGID = 3, 5
NLM_F_REQUEST = 1
BLKIO_DELAY_TOTAL = 40      # offset in struct taskstats: version u16, exitcode u32, flag, nice, then u64s


def _attrs(data: bytes) -> dict[int, bytes]:
    out, i = {}, 0
    while i + 4 <= len(data):
        length, kind = struct.unpack_from("HH", data, i)
        if length < 4:
            break
        out[kind & 0x3FFF] = data[i + 4:i + length]
        i += (length + 3) & ~3
    return out


def _genl(sock: socket.socket, family: int, cmd: int, attr: int, payload: bytes) -> dict[int, bytes]:
    nla = struct.pack("HH", 4 + len(payload), attr) + payload
    nla += b"\0" * (-len(nla) % 4)
    body = struct.pack("BBH", cmd, 1, 0) + nla
    sock.send(struct.pack("IHHII", 16 + len(body), family, NLM_F_REQUEST, 1, 0) + body)
    reply = sock.recv(65536)
    length, kind = struct.unpack_from("IH", reply, 0)
    if kind == 2:   # NLMSG_ERROR
        raise OSError(-struct.unpack_from("i", reply, 16)[0], "taskstats request failed")
    return _attrs(reply[20:length])


def blkio_delay_ns(tgid: int) -> int:
    """Delay accounting's block-I/O delay of process tgid (its threads summed), from taskstats."""
    with socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, 16) as sock:   # NETLINK_GENERIC
        sock.bind((0, 0))
        fam = _genl(sock, GENL_ID_CTRL, CTRL_CMD_GETFAMILY, CTRL_ATTR_FAMILY_NAME, b"TASKSTATS\0")
        family = struct.unpack_from("H", fam[CTRL_ATTR_FAMILY_ID])[0]
        got = _genl(sock, family, TASKSTATS_CMD_GET, TASKSTATS_CMD_ATTR_TGID, struct.pack("I", tgid))
    stats = _attrs(got[TASKSTATS_TYPE_AGGR_TGID])[TASKSTATS_TYPE_STATS]
    return struct.unpack_from("Q", stats, BLKIO_DELAY_TOTAL)[0]


def own_accounting() -> dict:
    stat = Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()
    io = dict(line.split(": ") for line in Path("/proc/self/io").read_text().splitlines())
    return {"blkio_ns": blkio_delay_ns(os.getpid()), "blkio_ticks": int(stat[42 - 3]),
            "proc_read_bytes": int(io["read_bytes"])}


def read_all(files: list[Path]) -> int:
    """Read each file whole with os.read, CHUNK at a time: the bytes read."""
    total = 0
    for path in files:
        fd = os.open(path, os.O_RDONLY)
        try:
            while chunk := os.read(fd, CHUNK):
                total += len(chunk)
        finally:
            os.close(fd)
    return total


def worker(files: list[Path], epoch: int, out: int) -> None:
    total = read_all(files)
    row = {"pid": os.getpid(), "epoch": epoch, "read": total, **own_accounting()}
    # to the parent through a pipe: no file I/O (and no I/O wait) after the accounting was read
    os.write(out, (json.dumps(row) + "\n").encode())


def main() -> int:
    data, results = Path(sys.argv[1]), Path(sys.argv[2])
    epochs = int(sys.argv[3]) if len(sys.argv) > 3 else 2
    workers = int(sys.argv[4]) if len(sys.argv) > 4 else 2
    files = sorted(data.iterdir())
    rows = []
    for epoch in marker.epochs(epochs):
        pids = []
        r, w_end = os.pipe()
        for w in range(workers):
            pid = os.fork()
            if pid == 0:
                code = 0
                os.close(r)
                try:
                    worker(files[w::workers], epoch + 1, w_end)
                except BaseException as exc:  # noqa: BLE001 - a worker must end here, not in the loop
                    print(f"worker: {exc!r}", file=sys.stderr)
                    code = 1
                os._exit(code)
            pids.append(pid)
        os.close(w_end)
        with os.fdopen(r) as lines:
            rows += lines.read().splitlines()
        for pid in pids:
            _, status = os.waitpid(pid, 0)
            if status:
                return 1
    results.write_text("".join(line + "\n" for line in rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
