"""test_containers: the tests that load BPF programs (need root).

The rest, and the helpers both share, are in tests/unit/test_containers.py.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest
from unit.test_containers import (
    CID,
    SHORT,
    _real_root,
    ino,
)


@pytest.mark.bpf
def test_traced_io_names_its_container(loop, tmp_path):
    from conftest import fio_cmd, read_dumps, run_iotrace, series_of

    root = _real_root()
    if root is None:
        pytest.skip("needs a writable cgroup2 hierarchy")
    parent = Path(root) / f"iotrace-test-{os.getpid()}.slice"
    scope = parent / f"docker-{CID}.scope"
    scope.mkdir(parents=True)
    scope_id = ino(scope)
    out = tmp_path / "out.jsonl"
    try:
        fio = " ".join(fio_cmd(loop.path, number_ios=200))
        r = run_iotrace(["--dev", loop.name, "-o", str(out), "--",
                         "sh", "-c", f"echo $$ > {scope}/cgroup.procs && exec {fio}"])
        assert r.returncode == 0, r.stderr
    finally:
        for d in (scope, parent):
            for _ in range(50):
                try:
                    d.rmdir()
                    break
                except OSError:
                    time.sleep(0.05)
    reads = [s for d in read_dumps(out) for s in series_of(d, comm="fio", device=loop.name, op="read")]
    assert reads and sum(s["count"] for s in reads) > 0
    assert {s["cgroup_id"] for s in reads} == {scope_id}
    assert {s["container"] for s in reads} == {f"docker:{SHORT}"}
    head = next(line for line in r.stdout.splitlines() if "COMM" in line)
    assert head.endswith("CONTAINER")
    assert any(" fio " in line and line.endswith(f"docker:{SHORT}") for line in r.stdout.splitlines())
