"""A real process that names itself with escape sequences (prctl PR_SET_NAME), traced end to end.

The table iotrace prints shows the name escaped (tracer.text.safe) and
carries no control character; the JSON keeps the exact name.  The command's
own path holds an escape too: the start line shows it escaped.
"""

from __future__ import annotations

import json

from conftest import PYTHON, read_dumps, run_iotrace

EVIL = b"\x1b[2J\x1b[31mPWN\n"          # 14 bytes: within TASK_COMM_LEN
SHOWN = "\\x1b[2J\\x1b[31"             # its safe() form, as far as the 15-wide COMM column shows it
READS = 64

CHILD = f"""\
import ctypes, mmap, os, sys
PR_SET_NAME = 15
if ctypes.CDLL(None, use_errno=True).prctl(PR_SET_NAME, ctypes.c_char_p({EVIL!r}), 0, 0, 0) != 0:
    sys.exit("prctl failed")
fd = os.open(sys.argv[1], os.O_RDONLY | os.O_DIRECT)
buf = mmap.mmap(-1, 4096)                 # page-aligned, as O_DIRECT wants
for i in range({READS}):
    if os.preadv(fd, [buf], i * 4096) != 4096:
        sys.exit("short read")
"""


def test_a_process_named_with_escapes(loop, tmp_path):
    child = tmp_path / "child\x1b]0;owned\x07.py"
    child.write_text(CHILD)
    out = tmp_path / "out.jsonl"
    r = run_iotrace(["--dev", loop.name, "-o", str(out), "--", PYTHON, str(child), loop.path])
    assert r.returncode == 0, r.stderr
    for line in (r.stdout + r.stderr).split("\n"):
        assert line.isprintable(), repr(line)
    final = r.stdout[r.stdout.rindex("\nfinal"):]
    rows = [ln for ln in final.splitlines() if SHOWN in ln]
    assert len(rows) == 1 and f" {loop.name} " in rows[0] and " read " in rows[0], final
    assert "child\\x1b]0;owned\\x07.py" in r.stderr          # the start line names the command
    # the JSON keeps the exact name, JSON-escaped
    [dump] = [d for d in read_dumps(out) if d["kind"] == "final"]
    evil = [s for s in dump["series"] if s["comm"] == EVIL.decode()]
    assert len(evil) == 1 and evil[0]["device"] == loop.name and evil[0]["count"] >= READS - 2, dump["series"]
    assert "\\u001b[2J" in out.read_text() and "\x1b" not in out.read_text()
    # -j: the same, on stdout
    r = run_iotrace(["--dev", loop.name, "-j", "--", PYTHON, str(child), loop.path])
    assert r.returncode == 0, r.stderr
    comms = {s["comm"] for ln in r.stdout.splitlines() if ln.startswith("{") for s in json.loads(ln)["series"]}
    assert EVIL.decode() in comms, comms
