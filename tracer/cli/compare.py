"""`iotrace compare BASE.json NEW.json`: the regression gate over two bench results (exit 1 on a regression)."""

from __future__ import annotations

import argparse
import json
import sys
from typing import TextIO

from tracer.model import benchresult as br
from tracer.model.benchresult import PHASES
from tracer.options import Parser
from tracer.views.compare import (
    DEFAULT_LIMITS,
    DEFAULT_PHASE,
    EPILOG,
    IMPROVED,
    NOISE,
    compare,
    comparison_json,
    describe,
    parse_limit,
    render,
    side_json,
)


def run(argv: list[str], out: TextIO = sys.stdout) -> int:

    p = Parser(prog="iotrace compare", formatter_class=argparse.RawDescriptionHelpFormatter, epilog=EPILOG,
                description="Compare two 'iotrace bench' results workload by workload, and fail (exit 1) on a "
                            "regression larger than both its threshold and the run-to-run spread.")
    p.add_argument("base", metavar="BASE.json", help="the baseline result")
    p.add_argument("new", metavar="NEW.json", help="the result to judge")
    p.add_argument("--max-regress", type=parse_limit, action="append", metavar="METRIC=PERCENT",
                   help="largest allowed change for the worse, e.g. p99=10%% (repeatable; default "
                        f"{' '.join(f'{m}={v * 100:g}%%' for m, v in DEFAULT_LIMITS.items())})")
    p.add_argument("--phase", action="append", choices=(*PHASES, "all"),
                   help=f"phase whose latency is gated (repeatable; default {DEFAULT_PHASE})")
    p.add_argument("-j", "--json", action="store_true",
                   help="one JSON object on stdout instead of the table (the verdict line goes to stderr); "
                        "the same exit status")
    ns = p.parse_args(argv)
    limits = dict(ns.max_regress) if ns.max_regress else dict(DEFAULT_LIMITS)
    phases = set(PHASES) if ns.phase and "all" in ns.phase else set(ns.phase or [DEFAULT_PHASE])
    base, new = br.read(ns.base), br.read(ns.new)
    c = compare(base, new, limits, phases)
    if ns.json:
        out.write(json.dumps(comparison_json(c, side_json(ns.base, base), side_json(ns.new, new))) + "\n")
        out = sys.stderr        # the verdict line: for the CI log, off the JSON
    else:
        render(c, describe(ns.base, base), describe(ns.new, new), out)
    regs = c.regressions
    gated = sum(r.gated for r in c.rows)
    if regs:
        listed = ", ".join(f"{r.workload} {r.op} {r.phase} {r.metric} {r.change:+.1%}" for r in regs)
        print(f"FAIL: {len(regs)} regression(s) beyond both the threshold and the run-to-run spread: {listed}",
              file=out)
        return 1
    improved = sum(r.gated and r.verdict == IMPROVED for r in c.rows)
    noisy = sum(r.gated and r.verdict == NOISE for r in c.rows)
    print(f"OK: no regression in {gated} gated comparison(s) ({improved} improved, {noisy} within noise)", file=out)
    return 0
