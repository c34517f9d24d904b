"""tracer.sources.drain.fold_series: per-CPU series values folded into one row, the identity from the CPU
that completed the series' latest request (no root: a numpy array laid out like the BPF value)."""

from __future__ import annotations

import numpy as np

from tracer.sources.drain import fold_series

PHASES = 3
VAL = np.dtype([("count", "u8"), ("bytes", "u8"), ("sum_ns", "u8", PHASES), ("min_ns", "u8", PHASES),
                ("max_ns", "u8", PHASES), ("phase_count", "u8", PHASES), ("last_ns", "u8"), ("cgroup", "u8"),
                ("tgid", "u4"), ("pad", "u4"), ("comm", "S16")])


def cpu(count: int, last_ns: int, comm: bytes, min_ns: int = 5) -> np.ndarray:
    v = np.zeros((), VAL)
    v["count"], v["bytes"], v["last_ns"], v["comm"], v["tgid"] = count, 4096 * count, last_ns, comm, 7
    v["min_ns"], v["max_ns"] = min_ns if count else 0, 9
    return v


def fold(*cpus: np.ndarray) -> np.ndarray:
    return fold_series(np.array([list(cpus)], dtype=VAL))[0]


def test_the_latest_request_names_the_series_whichever_cpu_completed_it():
    # bash read on both CPUs, then exec'd dd, whose requests all completed on CPU 1
    row = fold(cpu(10, 100, b"bash"), cpu(12, 250, b"dd"))
    assert row["comm"] == b"dd" and row["count"] == 22 and row["bytes"] == 22 * 4096
    row = fold(cpu(12, 250, b"dd"), cpu(10, 100, b"bash"))
    assert row["comm"] == b"dd"


def test_a_cpu_that_saw_none_is_never_the_identity():
    row = fold(cpu(0, 0, b""), cpu(3, 50, b"fio"))
    assert row["comm"] == b"fio" and row["tgid"] == 7
    assert list(row["min_ns"]) == [5] * PHASES       # a CPU with none adds no 0 minimum
