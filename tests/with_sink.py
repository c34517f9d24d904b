"""iotrace with one more sink registered, as a new output module would be: tests/privileged/test_sink_registry.py.

    with_sink.py ARGS...      `iotrace ARGS...` with the sink "tally" (option --tally FILE) in SINKS

The sink writes, at close, one JSON object to FILE: the mode it was built
for and the kind of every window it was handed.  Registering it takes what
docs/development.md says a new sink takes: a module under tracer.sinks with
add_arguments() and from_args(), and its name in SINKS.
"""

from __future__ import annotations

import json
import sys
import types

import tracer.sinks as sinkreg


class Tally:
    def __init__(self, path: str, mode: str):
        self.path, self.mode, self.kinds = path, mode, []

    def on_dump(self, window) -> None:
        self.kinds.append(getattr(window, "kind", type(window).__name__))

    def close(self, status: int) -> int:
        with open(self.path, "w") as f:
            json.dump({"mode": self.mode, "kinds": self.kinds}, f)
        return status


def add_arguments(p, mode: str) -> None:
    p.add_argument("--tally", metavar="FILE", help="test sink: the kinds of the windows, to FILE")


def from_args(ns, ctx):
    return Tally(ns.tally, ctx.mode) if getattr(ns, "tally", None) else None


module = types.ModuleType("tracer.sinks.tally")
module.add_arguments, module.from_args = add_arguments, from_args
sys.modules["tracer.sinks.tally"] = module
sinkreg.SINKS = (*sinkreg.SINKS, "tally")

if __name__ == "__main__":
    from tracer.cli import main

    sys.exit(main(sys.argv[1:]))
