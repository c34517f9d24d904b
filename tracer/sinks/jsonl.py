"""-o FILE and -j: one JSON line per window, appended to a file or written to stdout (tracer.codec.jsonl)."""

from __future__ import annotations

from typing import TextIO

from tracer.codec import jsonl
from tracer.osutil import open_output, quiet_close


def add_arguments(p, mode: str) -> None:
    if mode == "top":
        return
    p.add_argument("-o", "--output", metavar="FILE.jsonl",
                   help="append one JSON line per report to FILE" if mode != "serve" else
                   "also append each folded dump to FILE (one JSON line per interval)")
    if mode in ("trace", "diskstats"):
        p.add_argument("-j", "--json", action="store_true",
                       help="each report as one JSON line on stdout (as -o writes it), for jq or a notebook; no "
                            "table. A COMMAND's own stdout goes to stderr")


class JsonlSink:
    """Each window as a JSON line on `stream`; `own`: close the stream at the end.  `what` names the output
    in a write error's line (the loop's Sinks drops an output whose write fails, and calls abandon())."""

    def __init__(self, stream: TextIO, own: bool, what: str = "-j (stdout)"):
        self.stream = stream
        self.own = own
        self.what = what

    def on_dump(self, window) -> None:
        jsonl.write(self.stream, window)     # a BPF dump, or a --diskstats window: each kind as registered
        self.stream.flush()

    def close(self, status: int) -> int:
        if self.own:
            self.stream.close()
        return status

    def abandon(self) -> None:
        """A write failed: let go of the file without writing more (what is still buffered is lost)."""
        if self.own:
            quiet_close(self.stream)


def from_args(ns, ctx) -> list[JsonlSink]:
    out = []
    if getattr(ns, "output", None):
        out.append(JsonlSink(open_output(ns.output), own=True, what=f"-o {ns.output}"))
    if getattr(ns, "json", False):
        out.append(JsonlSink(ctx.out, own=False))
    return out
