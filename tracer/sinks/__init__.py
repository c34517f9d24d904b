"""Sinks: where every window of a live mode goes (a table, JSON lines, CSV, alerts, Prometheus, top's screen).

A sink is an object with `on_dump(window)`, called with each window (a
tracer.model.dump.Dump; in the diskstats mode one whose `disks` holds the
window), and `close(status) -> status`, called once at the end with the
run's exit status (a sink may change it: --fail-on-alert's exit 3).

A sink module registers with one line in SINKS and provides two functions:

    add_arguments(parser, mode)   its options, for the live modes it serves
    from_args(ns, ctx)            its sink(s) for these options (ctx: a Context): one, a list, or None

Each live mode (trace, serve, top, diskstats) builds its parser and its
sinks by walking SINKS, so a new output is one new module plus one line
here; windows reach the sinks in this order.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TextIO

SINKS = ("jsonl", "table", "csv", "alerts", "prometheus", "screen")

MODES = ("trace", "serve", "top", "diskstats")


@dataclass
class Context:
    """What a sink may need besides its own options."""

    mode: str                                   # one of MODES
    out: TextIO                                 # standard output
    devices: list[str] | None = None            # --dev, as device names (None: every disk)
    alerts: Any = None                          # the pipeline's tracer.pipeline.alerts.AlertCheck, if any
    whole: Callable[[], Any] | None = None      # diskstats: the whole run's window, for the last table
    extra: dict | None = None                   # mode-specific objects (serve: the exporter and its server)


def modules() -> list:
    """The sink modules, in SINKS order."""
    return [importlib.import_module(f"tracer.sinks.{name}") for name in SINKS]


def add_arguments(parser, mode: str) -> None:
    for m in modules():
        m.add_arguments(parser, mode)


def from_args(ns, ctx: Context) -> list:
    """Every sink the options ask for, in order (files are opened here: a bad path fails before tracing)."""
    sinks = []
    try:
        for m in modules():
            made = m.from_args(ns, ctx)
            sinks += made if isinstance(made, list) else [made] if made is not None else []
    except BaseException:
        for s in sinks:
            try:
                s.close(0)
            except Exception:  # noqa: BLE001, S110 - the error being raised is the one to say
                pass
        raise
    return sinks
