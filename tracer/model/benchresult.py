"""The result file of `iotrace bench`: its records, its JSON schema, and the
spread of a metric across repetitions.

`iotrace bench` writes one, `iotrace compare` reads two.  One JSON object:

    {"kind": "iotrace-bench", "schema": 1,
     "suite": {"name": "quick", "version": "v1", "id": "quick-v1"}, "repeat": 5,
     "env": {"kernel", "cpu", "nproc", "device", "iotrace", "fio", "date", ...},
     "workloads": [{"name": "randread-4k-qd1", "fio": [fio options...],
                    "reps": [{"dropped": {reason: n},
                              "ops": {"read": {"count": n, "mb": float, "iops": float | null,
                                               "latency_us": {phase: {"count", "min", "mean", "p50", "p90",
                                                                      "p99", "p99.9", "max"}}}}}, ...],
                    "summary": {op: {"iops": SPREAD, "latency_us": {phase: {metric: SPREAD}}}}}]}

    SPREAD = {"median": float, "min": float, "max": float, "n": reps}

Latencies are microseconds, as in the dump (tracer.model.dump); "iops" is fio's own
figure (null for flushes, which fio does not count as I/O).  The "summary" is
written for people reading the file; readers recompute it from "reps".
"""

from __future__ import annotations

import json
import os
import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field

from tracer import contract
from tracer.errors import UserError
from tracer.osutil import open_output, replace_as_user

KIND = "iotrace-bench"
SCHEMA = 1
PHASES = tuple(contract.load().phases)
LATENCY_METRICS = ("p50", "p90", "p99", "p99.9", "mean", "max")
IOPS = "iops"


@dataclass(frozen=True)
class Spread:
    """A metric across repetitions: its median and range."""

    median: float
    min: float
    max: float
    n: int

    @classmethod
    def of(cls, values: Sequence[float]) -> Spread:
        if not values:
            raise ValueError("no values")
        return cls(float(statistics.median(values)), float(min(values)), float(max(values)), len(values))

    def to_json(self) -> dict:
        return {"median": round(self.median, 3), "min": round(self.min, 3), "max": round(self.max, 3), "n": self.n}


@dataclass
class OpRun:
    """One op (read, write, flush, ...) of one repetition, as iotrace and fio saw it."""

    count: int
    mb: float
    iops: float | None
    latency_us: dict[str, dict[str, float]]     # phase -> PhaseStats.summary_us()


@dataclass
class Rep:
    """One repetition of a workload."""

    ops: dict[str, OpRun]
    dropped: dict[str, int] = field(default_factory=dict)


@dataclass
class WorkloadResult:
    name: str
    fio: list[str]          # the fio options that define the workload
    reps: list[Rep]

    def ops(self) -> list[str]:
        """Ops seen in any repetition, in first-seen order."""
        return list(dict.fromkeys(op for r in self.reps for op in r.ops))

    def phases(self, op: str) -> list[str]:
        seen = {p for r in self.reps if op in r.ops for p, st in r.ops[op].latency_us.items() if st.get("count")}
        return [p for p in PHASES if p in seen]

    def values(self, op: str, metric: str, phase: str = "total") -> list[float]:
        """The metric in each repetition that has it ("iops" ignores the phase)."""
        out = []
        for r in self.reps:
            o = r.ops.get(op)
            if o is None:
                continue
            v = o.iops if metric == IOPS else o.latency_us.get(phase, {}).get(metric)
            if v is not None:
                out.append(float(v))
        return out

    def spread(self, op: str, metric: str, phase: str = "total") -> Spread | None:
        v = self.values(op, metric, phase)
        return Spread.of(v) if v else None


@dataclass
class BenchResult:
    suite: str
    version: str
    workloads: list[WorkloadResult]
    env: dict = field(default_factory=dict)
    repeat: int = 0

    @property
    def suite_id(self) -> str:
        return f"{self.suite}-{self.version}"

    def workload(self, name: str) -> WorkloadResult | None:
        return next((w for w in self.workloads if w.name == name), None)


# ---- JSON --------------------------------------------------------------------

def _summary(w: WorkloadResult) -> dict:
    out = {}
    for op in w.ops():
        iops = w.spread(op, IOPS)
        out[op] = {"iops": iops.to_json() if iops else None,
                   "latency_us": {ph: {m: s.to_json() for m in LATENCY_METRICS if (s := w.spread(op, m, ph))}
                                  for ph in w.phases(op)}}
    return out


def to_json(r: BenchResult) -> dict:
    return {
        "kind": KIND, "schema": SCHEMA,
        "suite": {"name": r.suite, "version": r.version, "id": r.suite_id},
        "repeat": r.repeat, "env": r.env,
        "workloads": [{
            "name": w.name, "fio": w.fio,
            "reps": [{"dropped": rep.dropped,
                      "ops": {op: {"count": o.count, "mb": round(o.mb, 3),
                                   "iops": None if o.iops is None else round(o.iops, 1),
                                   "latency_us": o.latency_us}
                              for op, o in rep.ops.items()}}
                     for rep in w.reps],
            "summary": _summary(w),
        } for w in r.workloads],
    }


def from_json(obj) -> BenchResult:
    """A BenchResult from parsed JSON; ValueError (or KeyError/TypeError) on anything else."""
    if not isinstance(obj, dict) or obj.get("kind") != KIND:
        raise ValueError("not an iotrace bench result (no \"kind\": \"iotrace-bench\")")
    if obj.get("schema") != SCHEMA:
        raise ValueError(f"result schema {obj.get('schema')!r}, this iotrace reads schema {SCHEMA}")
    workloads = []
    for w in obj["workloads"]:
        reps = [Rep(ops={str(op): OpRun(_count(o["count"]), _number(o["mb"]),
                                        None if o.get("iops") is None else _number(o["iops"]),
                                        {str(ph): {str(k): _number(v) for k, v in st.items()}
                                         for ph, st in o["latency_us"].items()})
                         for op, o in rep["ops"].items()},
                    dropped={str(k): _count(v) for k, v in rep.get("dropped", {}).items()})
                for rep in w["reps"]]
        workloads.append(WorkloadResult(str(w["name"]), [str(a) for a in w.get("fio", [])], reps))
    suite = obj["suite"]
    return BenchResult(str(suite["name"]), str(suite["version"]), workloads, dict(obj.get("env", {})),
                       _count(obj.get("repeat", 0)))


MAX_NUMBER = 2.0**53     # counts, bytes, microseconds: anything larger is no measurement


def _number(v) -> float:
    """A finite number >= 0 of the file; ValueError for anything else (NaN, Infinity, 1e400, a string)."""
    if isinstance(v, bool) or not isinstance(v, int | float):
        raise ValueError(f"{v!r:.40} is not a number")
    if not 0 <= v <= MAX_NUMBER:     # also NaN
        raise ValueError(f"{v!r:.40} is not a number from 0 to 2**53")
    return float(v)


def _count(v) -> int:
    if not isinstance(v, int) or isinstance(v, bool):
        raise ValueError(f"{v!r:.40} is not a whole number")
    _number(v)
    return v


def write(path: str, r: BenchResult) -> None:
    """Write atomically, so an interrupted bench never leaves half a baseline behind; as the sudo user
    (tracer.osutil: never through a link, never into a directory the user could not write)."""
    tmp = f"{path}.tmp{os.getpid()}"
    f = open_output(tmp, "x")
    try:
        try:
            with f:
                json.dump(to_json(r), f, indent=1)
                f.write("\n")
        except OSError as exc:
            raise UserError(f"cannot write {path}: {exc.strerror}") from None
        replace_as_user(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


MAX_RESULT_BYTES = 16 << 20    # a suite's result is a few KB: /dev/zero must not be read until memory runs out


def read(path: str) -> BenchResult:
    """A result file; UserError naming the file on bad input (one longer than MAX_RESULT_BYTES too)."""
    try:
        with open(path, "rb") as f:
            text = f.read(MAX_RESULT_BYTES + 1)
    except (OSError, ValueError) as exc:     # ValueError: a NUL in the path
        raise UserError(f"cannot read {path}: {getattr(exc, 'strerror', None) or exc}") from None
    if len(text) > MAX_RESULT_BYTES:
        raise UserError(f"{path}: longer than {MAX_RESULT_BYTES >> 20} MiB: not an iotrace bench result")
    try:
        obj = json.loads(text)
    except ValueError:
        raise UserError(f"{path}: not JSON; give a result file written by 'iotrace bench -o FILE'") from None
    try:
        return from_json(obj)
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        why = f"no {exc}" if isinstance(exc, KeyError) else str(exc)
        raise UserError(f"{path}: not an iotrace bench result ({why}); give a file written by "
                        f"'iotrace bench -o FILE'") from None
