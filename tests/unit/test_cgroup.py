"""--cgroup: the kernel keeps only I/O submitted from a cgroup v2 or below it."""

from __future__ import annotations


def test_cgroup_errors_are_one_line(tmp_path):
    from conftest import run_iotrace

    for arg, words in (("/no/such/group", "no such cgroup"), ("/..", "not under the cgroup v2 mount")):
        r = run_iotrace(["--cgroup", arg, "-d", "1"])
        lines = r.stderr.strip().splitlines()
        assert r.returncode == 2 and len(lines) == 1 and words in lines[0], r.stderr
