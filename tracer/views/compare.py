"""`iotrace compare`: two `iotrace bench` results side by side, and the regression gate's decision.

Owns the decision rule (judge), the thresholds' syntax and the table.  A
change fails the gate only when it is larger than its threshold AND the two
runs' ranges across repetitions do not overlap, so run-to-run noise alone can
never fail a build.  Exit 0: no regression; 1: a regression; 2: bad input.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from typing import TextIO

from tracer import contract
from tracer.errors import UserError
from tracer.model.benchresult import IOPS, LATENCY_METRICS, BenchResult, Spread
from tracer.text import safe

DEFAULT_LIMITS = {"p50": 0.10, "p99": 0.10}
DEFAULT_PHASE = "total"
METRICS = (*LATENCY_METRICS, IOPS)
SHOWN_PHASES = tuple(contract.load().shown_phases)

REGRESSION = "REGRESSION"
IMPROVED = "improved"
NOISE = "within noise"
OK = "ok"

EPILOG = f"""\
the rule (per workload, op, phase and metric; latencies: higher is worse, iops: lower is worse):
  change = (new median - base median) / base median
  REGRESSION    change is worse than the threshold AND every new repetition is worse than
                every base repetition (the [min, max] ranges do not overlap)
  within noise  change beyond the threshold, but the ranges overlap: not a failure
  improved      change better than the threshold and the ranges do not overlap: reported only
  ok            change within the threshold
Only rows of the gated phases (--phase, default {DEFAULT_PHASE}) can fail; the others are shown
for diagnosis. If nothing changed, the chance that all N new repetitions land above all N
base ones is 1 in C(2N, N): 1/20 for N=3, 1/252 for N=5. With one repetition there is no
range, and only the thresholds apply: run 'iotrace bench --repeat 5'.

thresholds: --max-regress METRIC=PERCENT (repeatable), METRIC one of {', '.join(METRICS)}.
Giving any replaces the defaults ({', '.join(f'{m}={v:.0%}' for m, v in DEFAULT_LIMITS.items())});
only the metrics given are compared.

exit status: 0 no regression, 1 a regression, 2 bad input (unreadable file, not a bench result,
different suites, no workload in common, bad option).

examples:
  iotrace compare base.json new.json
  iotrace compare base.json new.json --max-regress p99=15% --max-regress p50=5% --max-regress iops=5%
  iotrace compare base.json new.json --phase device          gate on the device's share only
  iotrace compare base.json new.json --json > verdict.json    for the tools that read it in CI
"""


def parse_limit(text: str) -> tuple[str, float]:
    """'p99=10%' -> ('p99', 0.10)."""
    metric, sep, value = text.partition("=")
    metric = metric.strip()
    if not sep or metric not in METRICS:
        raise argparse.ArgumentTypeError(f"{text!r}: want METRIC=PERCENT with METRIC one of {', '.join(METRICS)}, "
                                         f"e.g. p99=10%")
    try:
        pct = float(value.strip().removesuffix("%"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: {value!r} is not a percentage, e.g. {metric}=10%") from None
    if not pct >= 0:     # also rejects nan
        raise argparse.ArgumentTypeError(f"{text!r}: the percentage must be 0 or more")
    return metric, pct / 100


def judge(metric: str, base: Spread, new: Spread, limit: float) -> str:
    """The verdict on one metric: REGRESSION, IMPROVED, NOISE or OK (see EPILOG)."""
    if base.median == 0:
        # no relative change can be computed; a move off zero is within a histogram bucket anyway
        return OK
    change = (new.median - base.median) / base.median
    higher_is_worse = metric != IOPS
    worse = change if higher_is_worse else -change
    new_above = new.min > base.max
    new_below = new.max < base.min
    if worse > limit:
        return REGRESSION if (new_above if higher_is_worse else new_below) else NOISE
    if -worse > limit:
        return IMPROVED if (new_below if higher_is_worse else new_above) else NOISE
    return OK


@dataclass(frozen=True)
class Row:
    workload: str
    op: str
    phase: str          # "-" for iops, which has none
    metric: str
    base: Spread
    new: Spread
    limit: float
    gated: bool

    @property
    def change(self) -> float | None:
        return (self.new.median - self.base.median) / self.base.median if self.base.median else None

    @property
    def verdict(self) -> str:
        return judge(self.metric, self.base, self.new, self.limit)

    @property
    def fails(self) -> bool:
        return self.gated and self.verdict == REGRESSION


@dataclass
class Comparison:
    rows: list[Row]
    notes: list[str]

    @property
    def regressions(self) -> list[Row]:
        return [r for r in self.rows if r.fails]


def _env_differences(base: BenchResult, new: BenchResult) -> list[str]:
    def flat(env: dict) -> dict:
        dev = env.get("device") or {}
        return {"host": env.get("host"), "kernel": env.get("kernel"), "cpu": env.get("cpu"), "nproc": env.get("nproc"),
                "fio": env.get("fio"), "device": (dev.get("kind"), dev.get("backing_fs"), dev.get("size_mb"))}

    a, b = flat(base.env), flat(new.env)
    return [f"{k} ({a[k]} vs {b[k]})" for k in a if a[k] != b[k]]


def compare(base: BenchResult, new: BenchResult, limits: dict[str, float], phases: set[str]) -> Comparison:
    """Rows for every workload, op, phase and limited metric that both results have."""
    if base.suite_id != new.suite_id:
        raise UserError(f"the results are of different suites ({base.suite_id} and {new.suite_id}) and do not "
                        f"compare: run the baseline with the same suite")
    notes = []
    names = [w.name for w in base.workloads if new.workload(w.name)]
    if not names:
        raise UserError(f"no workload in common: base has {', '.join(w.name for w in base.workloads) or 'none'}, "
                        f"new has {', '.join(w.name for w in new.workloads) or 'none'}")
    for side, res in (("base", base), ("new", new)):
        empty = [n for n in names if not res.workload(n).reps]
        if res.repeat < 1 or empty:
            what = f"workload {', '.join(empty)} has" if empty else f"repeat is {res.repeat}:"
            raise UserError(f"the {side} result has no repetition to compare ({what} no run): "
                            f"run 'iotrace bench --repeat N' with N of 1 or more")
    for side, res, other in (("base", base, new), ("new", new, base)):
        only = [w.name for w in res.workloads if not other.workload(w.name)]
        if only:
            notes.append(f"only in {side}: {', '.join(only)}")
    if diff := _env_differences(base, new):
        notes.append(f"the runs' environments differ: {'; '.join(diff)}")
    if min(base.repeat, new.repeat) < 2:
        notes.append("a result has one repetition, so no spread: only the thresholds apply")
    rows = []
    for name in names:
        bw, nw = base.workload(name), new.workload(name)
        if bw.fio != nw.fio:
            notes.append(f"{name}: the fio options differ between the runs")
        for op in [op for op in bw.ops() if op in nw.ops()]:
            # total first: the phase gated by default, then its parts
            for phase in sorted(set(bw.phases(op)) & set(nw.phases(op)), key=SHOWN_PHASES.index):
                for metric, limit in limits.items():
                    b, n = bw.spread(op, metric, phase), nw.spread(op, metric, phase)
                    if metric != IOPS and b and n:
                        rows.append(Row(name, op, phase, metric, b, n, limit, phase in phases))
            b, n = bw.spread(op, IOPS), nw.spread(op, IOPS)
            if IOPS in limits and b and n:
                rows.append(Row(name, op, "-", IOPS, b, n, limits[IOPS], True))
    if not any(r.gated for r in rows):
        # a gate that compared nothing must not pass: the results have no op, phase or metric in common
        def seen(res: BenchResult) -> str:
            return "; ".join(f"{w.name}: {', '.join(w.ops()) or 'no op'}" for w in res.workloads if w.name in names)

        raise UserError(f"nothing to compare: no op of a workload in common has the gated phase "
                        f"({', '.join(sorted(phases))}) and metric ({', '.join(limits) or 'none'}) on both sides "
                        f"(base: {seen(base)}; new: {seen(new)})")
    return Comparison(rows, notes)


# ---- the table ---------------------------------------------------------------

def _fmt(metric: str, v: float) -> str:
    from tracer.units import fmt_latency

    if metric != IOPS:
        return fmt_latency(v)
    return f"{v / 1e3:.1f}k" if v >= 1e4 else f"{v:.0f}"


def _cell(metric: str, s: Spread) -> str:
    return f"{_fmt(metric, s.median)} [{_fmt(metric, s.min)}..{_fmt(metric, s.max)}]"


def _shown_verdict(r: Row) -> str:
    v = r.verdict
    if v == REGRESSION:
        return f"REGRESSION > {r.limit:.0%}" if r.gated else "worse (not gated)"
    return v


def describe(path: str, r: BenchResult) -> str:
    env = r.env
    bits = [r.suite_id, f"{r.repeat} rep(s)", env.get("date"), env.get("host"), env.get("kernel"), env.get("commit")]
    return safe(f"{path}: " + ", ".join(str(b) for b in bits if b))


def render(c: Comparison, base_desc: str, new_desc: str, out: TextIO) -> None:
    print(f"base {safe(base_desc)}", file=out)
    print(f"new  {safe(new_desc)}", file=out)
    for n in c.notes:
        print(f"note: {safe(n)}", file=out)
    print("medians [min..max] across repetitions", file=out)
    w = max([len("WORKLOAD"), *(len(safe(r.workload)) for r in c.rows)])
    print(f"{'WORKLOAD':<{w}}  {'OP':<7} {'PHASE':<6} {'METRIC':<6} {'BASE':>24} {'NEW':>24} {'CHANGE':>8}  VERDICT",
          file=out)
    for r in c.rows:
        change = f"{r.change:+.1%}" if r.change is not None else "n/a"
        print(f"{safe(r.workload):<{w}}  {safe(r.op):<7} {safe(r.phase):<6} {r.metric:<6} "
              f"{_cell(r.metric, r.base):>24} {_cell(r.metric, r.new):>24} {change:>8}  {_shown_verdict(r)}", file=out)


def side_json(path: str, r: BenchResult) -> dict:
    env = r.env
    return {"path": path, "suite": r.suite_id, "repeat": r.repeat,
            **{k: env.get(k) for k in ("date", "host", "kernel", "commit")}}


def comparison_json(c: Comparison, base: dict, new: dict) -> dict:
    """What render shows and main decides, as data: latencies in microseconds, change as a fraction."""
    rows = [{"workload": r.workload, "op": r.op, "phase": r.phase, "metric": r.metric, "base": r.base.to_json(),
             "new": r.new.to_json(), "change": r.change, "limit": r.limit, "gated": r.gated, "verdict": r.verdict,
             "fails": r.fails} for r in c.rows]
    return {"kind": "iotrace-compare", "base": base, "new": new, "notes": c.notes, "rows": rows,
            "regressions": len(c.regressions), "pass": not c.regressions}
