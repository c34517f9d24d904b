"""A bench result on a terminal: medians per workload and op, with p99's range across repetitions."""

from __future__ import annotations

from typing import TextIO

from tracer.model import benchresult as br
from tracer.text import safe
from tracer.units import fmt_latency


def render(result: br.BenchResult, out: TextIO) -> None:
    """The medians of a result, one row per workload and op, with p99's range across repetitions."""
    head = f"{'WORKLOAD':<22} {'OP':<7} {'COUNT':>8} {'IOPS':>9} {'p50':>7} {'p90':>7} {'p99':>7} " \
           f"{'p99 range':>17} {'p99.9':>7} {'Q:p50':>7} {'D:p50':>7}"
    print(f"suite {safe(result.suite_id)}, {result.repeat} repetition(s); total latency, medians across repetitions",
          file=out)
    print(head, file=out)

    def med(w: br.WorkloadResult, op: str, metric: str, phase: str = "total") -> str:
        s = w.spread(op, metric, phase)
        return fmt_latency(s.median) if s else "-"

    for w in result.workloads:
        for op in w.ops():
            count = w.spread(op, "count")
            iops = w.spread(op, br.IOPS)
            p99 = w.spread(op, "p99")
            rng = f"{fmt_latency(p99.min)}..{fmt_latency(p99.max)}" if p99 else "-"
            print(f"{safe(w.name):<22} {safe(op):<7} {count.median if count else 0:>8.0f} "
                  f"{f'{iops.median:.0f}' if iops else '-':>9} {med(w, op, 'p50'):>7} {med(w, op, 'p90'):>7} "
                  f"{med(w, op, 'p99'):>7} {rng:>17} {med(w, op, 'p99.9'):>7} {med(w, op, 'p50', 'queue'):>7} "
                  f"{med(w, op, 'p50', 'device'):>7}", file=out)
