"""`iotrace diff A B`: two runs, or two labels of one run, compared row by row (no root)."""

from __future__ import annotations

import argparse
import json
from typing import TextIO

from tracer.errors import UserError
from tracer.options import Parser
from tracer.views.diff import EPILOG, PHASES, diff_json, load_sides, render_diff, split_side


def parser() -> argparse.ArgumentParser:
    p = Parser(prog="iotrace diff", formatter_class=argparse.RawDescriptionHelpFormatter, epilog=EPILOG,
                usage='iotrace diff A B [--phase PHASE]\n       iotrace diff FILE --labels "LABEL A" "LABEL B"',
                description="Compare two runs, or two labelled windows (epochs), row by row: each percentile, "
                            "the count and the MiB of A and B, and the change. No root needed.")
    p.add_argument("sides", nargs="+", metavar="SIDE", help="FILE.jsonl or FILE.jsonl:LABEL (see below)")
    p.add_argument("--labels", nargs=2, metavar=("LA", "LB"), help="compare label LA with label LB")
    p.add_argument("--phase", choices=PHASES, default="total",
                   help="latency phase to compare: total (default), queue (~Q2D) or device (D2C)")
    p.add_argument("-j", "--json", action="store_true",
                   help="one JSON object instead of the table: the sides, and per row A, B, change and change %%")
    return p


def parse_sides(sides: list[str], labels: list[str] | None) -> list[tuple[str, str | None]]:
    """The two (path, label) pairs named by the positional sides and --labels."""
    if len(sides) > 2:
        raise UserError(f"give two sides to compare, not {len(sides)} (see 'iotrace diff --help')")
    if labels is None:
        if len(sides) == 1:
            raise UserError("one side given: name two files, or one file and --labels LA LB "
                            "(see 'iotrace diff --help')")
        return [split_side(s) for s in sides]
    if len(sides) == 1:
        sides = sides * 2
    pairs = [split_side(s) for s in sides]
    for s, (_, label) in zip(sides, pairs, strict=True):
        if label is not None:
            raise UserError(f"{s!r} names a label and so does --labels: use one or the other")
    return [(path, label) for (path, _), label in zip(pairs, labels, strict=True)]


def run(argv: list[str], out: TextIO) -> int:
    ns = parser().parse_args(argv)
    (pa, la), (pb, lb) = parse_sides(ns.sides, ns.labels)
    a, b = load_sides([("A", pa, la), ("B", pb, lb)])
    if ns.json:
        out.write(json.dumps(diff_json(a, b, phase=ns.phase)) + "\n")
    else:
        render_diff(a, b, out, phase=ns.phase)
    return 0
