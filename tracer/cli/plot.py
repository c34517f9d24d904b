"""`iotrace plot RUN.jsonl -o FILE.png`: saved dumps drawn as charts (needs matplotlib; no root)."""

from __future__ import annotations

import argparse
from typing import TextIO

from tracer.codec.jsonl import read
from tracer.errors import UserError
from tracer.options import Parser
from tracer.views.plot import OPS, PHASES, render, require_matplotlib

EPILOG = """\
examples:
  iotrace plot run.jsonl -o io.png                  every device and op
  iotrace plot run.jsonl -o io.png --device nvme0n1 --op read

Panels: p50/p99 per device and op over time (log scale) with MiB/s; a heatmap
of requests per latency band over time, from the dumps' histograms; and, when
the dumps carry labels (markers: "epoch 1", ...), p50/p99 and MiB per label.
Needs matplotlib: pip install 'iotrace[plot]'.
"""


def run(argv: list[str], out: TextIO) -> int:

    p = Parser(prog="iotrace plot", formatter_class=argparse.RawDescriptionHelpFormatter, epilog=EPILOG,
                description="Draw saved iotrace dumps as charts in one PNG: latency over time, a latency "
                            "heatmap, and per-label bars.")
    p.add_argument("files", nargs="+", metavar="RUN.jsonl")
    p.add_argument("-o", "--output", required=True, metavar="FILE.png", help="the PNG to write")
    p.add_argument("--device", metavar="DEV", help="only this device (loop0, /dev/nvme0n1)")
    p.add_argument("--op", choices=OPS, help="only this op")
    p.add_argument("--phase", choices=PHASES, default="total",
                   help="latency phase: total (default), queue (~Q2D) or device (D2C)")
    ns = p.parse_args(argv)
    require_matplotlib()           # before reading anything: say at once when it is missing
    dumps = (d for path in ns.files for d in read(path))     # read as drawn: one pass, nothing kept but the rows
    device = ns.device.removeprefix("/dev/") if ns.device else None
    try:
        res = render(dumps, ns.output, device, ns.op, ns.phase, source=", ".join(ns.files))
    except OSError as exc:
        raise UserError(f"cannot write {ns.output}: {exc.strerror or exc}") from None
    out.write(f"iotrace: wrote {res.path} ({res.width}x{res.height}, {res.dumps} dumps, "
              f"{len(res.groups)} device/op rows): {'; '.join(t.split(':')[0] for t in res.panels)}\n")
    return 0
