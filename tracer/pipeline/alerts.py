"""Alert thresholds: `--alert 'p99>50ms'` parsed into a Rule, checked against each dump.

A rule is `[SCOPE:]METRIC CMP VALUE[UNIT]`:

    p99>50ms                  total latency p99 of any device and op
    device.p99.9>=5ms         the device phase (D2C); also queue.*, total.*
    loop0:read:mean>2ms       scoped to a device and/or an op (either order)
    util>90%                  %util from /proc/diskstats (also r_await, w_await in ms, aqu-sz)

Latency metrics are checked per device and op with every process merged,
as the CSV shows them; diskstats metrics per device.  An alert fires when
the value is above the line (`>`) or at or above it (`>=`).  Pure
functions of Dump data and tracer.model.diskstats rows: no root, no I/O.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable
from dataclasses import dataclass

from tracer import contract
from tracer.errors import UserError
from tracer.model.sections import Alerts
from tracer.text import safe

PHASES = tuple(contract.load().shown_phases)
LATENCY_STATS = ("p50", "p90", "p99", "p99.9", "max", "mean", "min")
# diskstats metric -> (unit, attribute of tracer.model.diskstats.IostatRow)
DISK_METRICS = {"util": ("%", "util"), "r_await": ("ms", "r_await"), "w_await": ("ms", "w_await"),
                "aqu-sz": ("", "aqu_sz")}
OPS = tuple(contract.load().ops)
TIME_UNITS_US = {"ns": 1e-3, "us": 1.0, "µs": 1.0, "ms": 1e3, "s": 1e6}
EXAMPLES = "e.g. 'p99>50ms', 'device.p99.9>=5ms', 'loop0:read:p99>2ms', 'util>90%'"

_NUMBER = re.compile(r"^\s*((?:\d+(?:\.\d*)?|\.\d+)(?:[eE][-+]?\d+)?)\s*(\S*)\s*$")


@dataclass(frozen=True)
class Rule:
    text: str               # as the user wrote it, for messages and the JSON
    metric: str             # a LATENCY_STATS or DISK_METRICS name
    phase: str | None       # latency metrics only
    cmp: str                # ">" or ">="
    threshold: float        # us for latency, DISK_METRICS' unit otherwise
    device: str | None = None
    op: str | None = None

    @property
    def unit(self) -> str:
        return "us" if self.phase else DISK_METRICS[self.metric][0]

    @property
    def needs_bpf(self) -> bool:
        return self.phase is not None

    def crosses(self, value: float) -> bool:
        return value > self.threshold if self.cmp == ">" else value >= self.threshold


@dataclass(frozen=True)
class Alert:
    """One rule crossed by one device (and op) in one dump."""

    rule: str
    metric: str             # "total.p99", "util", ...
    device: str
    op: str | None
    value: float
    threshold: float
    unit: str

    def to_json(self) -> dict:
        return {"rule": self.rule, "metric": self.metric, "device": self.device, "op": self.op, "value": self.value,
                "threshold": self.threshold, "unit": self.unit}

    def describe(self) -> str:
        where = f"{self.device} {self.op}" if self.op else self.device
        return f"{where} {self.metric} {_fmt(self.value, self.unit)} (rule {self.rule})"


def _fmt(value: float, unit: str) -> str:
    if unit == "us":
        from tracer.units import fmt_latency
        return fmt_latency(value)
    return f"{value:.2f}{unit}"


def _bad(text: str, why: str) -> UserError:
    return UserError(f"--alert {text!r}: {why}; {EXAMPLES}")


def parse_rule(text: str) -> Rule:
    """A Rule from `--alert` text; UserError (one line, with examples) on anything else."""
    if re.search(r"<|==|!=", text):
        raise _bad(text, "alerts fire above a line: use '>' or '>='")
    m = re.match(r"^(.*?)(>=|>)(.*)$", text)
    if not m:
        raise _bad(text, "no comparison; write METRIC>VALUE")
    left, cmp, right = m.groups()
    *scope, metric = [p.strip() for p in left.split(":")]
    device = op = None
    for part in scope:
        if not part:
            raise _bad(text, "empty scope before ':'")
        if part in OPS:
            if op:
                raise _bad(text, "two ops in the scope")
            op = part
        elif device:
            raise _bad(text, f"two devices in the scope ({device!r}, {part!r}), or an unknown op "
                             f"(ops: {', '.join(OPS)})")
        else:
            device = part.removeprefix("/dev/")
    if metric in DISK_METRICS:
        if op:
            raise _bad(text, f"{metric} is per device, from /proc/diskstats: drop {op + ':'!r}")
        unit = DISK_METRICS[metric][0]
        threshold = _value(text, right, unit)
        return Rule(text, metric, None, cmp, threshold, device, None)
    # phase names have no dot, stats may (p99.9): the first dot splits
    phase, stat = ("total", metric) if metric in LATENCY_STATS else (metric.split(".", 1) + [""])[:2]
    if phase not in PHASES or stat not in LATENCY_STATS:
        raise _bad(text, f"unknown metric {metric!r}: latency is [PHASE.]STAT with PHASE one of "
                         f"{', '.join(PHASES)} and STAT one of {', '.join(LATENCY_STATS)}; or one of "
                         f"{', '.join(DISK_METRICS)}")
    return Rule(text, stat, phase, cmp, _value(text, right, "us"), device, op)


def _value(text: str, right: str, unit: str) -> float:
    m = _NUMBER.match(right)
    if not m:
        raise _bad(text, f"{right.strip()!r} is not a number")
    number, given = float(m.group(1)), m.group(2)
    value = _scaled(text, number, given, unit)
    if not math.isfinite(value) or value > MAX_THRESHOLD[unit]:
        # 1e400ms is inf, and a line above an hour of latency (or a queue of a billion) is never crossed
        raise _bad(text, f"{right.strip()!r} is beyond any value it could be compared with "
                         f"(at most {_fmt(MAX_THRESHOLD[unit], unit)})")
    return value


MAX_THRESHOLD = {"us": 3600e6, "ms": 3600e3, "%": 100.0, "": 1e9}    # an hour of latency; a queue of 1e9


def _scaled(text: str, number: float, given: str, unit: str) -> float:
    """`number` with the unit the user gave, in the rule's unit."""
    if unit == "us":
        if not given:
            raise _bad(text, "give the latency a unit (ns, us, ms, s)")
        if given not in TIME_UNITS_US:
            raise _bad(text, f"unknown time unit {given!r} (ns, us, ms, s)")
        return number * TIME_UNITS_US[given]
    if unit == "ms":        # the awaits: iostat's milliseconds unless told otherwise
        if given and given not in TIME_UNITS_US:
            raise _bad(text, f"unknown time unit {given!r} (ns, us, ms, s)")
        return number * TIME_UNITS_US.get(given or "ms", 1e3) / 1e3
    if given != unit and not (unit == "%" and not given):
        raise _bad(text, f"unit {given!r} does not fit; use {unit or 'a plain number'}")
    if unit == "%" and number > 100:
        raise _bad(text, "util is at most 100%")
    return number


def parse_rules(texts: Iterable[str]) -> list[Rule]:
    return [parse_rule(t) for t in texts]


def _latency_value(rule: Rule, s) -> float | None:
    st = s.phases.get(rule.phase)
    if st is None or not st.count:
        return None
    return st.summary_us().get(rule.metric)


def check(rules: Iterable[Rule], dump=None, disk: Iterable = ()) -> list[Alert]:
    """The alerts `dump` (a Dump, or None) and `disk` (IostatRow or DiskRow of tracer.model.diskstats) set off.

    Rows with no requests in the window never fire: there is no latency to compare.
    """
    from tracer.model.dump import merge_by_device_op

    rules = list(rules)
    groups = merge_by_device_op(dump.series) if dump is not None and any(r.needs_bpf for r in rules) else []
    disk = list(disk)
    fired = []
    for rule in rules:
        if rule.needs_bpf:
            for s in groups:
                if (rule.device and rule.device != s.device) or (rule.op and rule.op != s.op):
                    continue
                value = _latency_value(rule, s)
                if value is not None and rule.crosses(value):
                    fired.append(Alert(rule.text, f"{rule.phase}.{rule.metric}", s.device, s.op, value,
                                       rule.threshold, "us"))
            continue
        attr = DISK_METRICS[rule.metric][1]
        for row in disk:
            if rule.device and rule.device != row.device:
                continue
            value = round(getattr(row, attr), 6)
            if row.active and rule.crosses(value):
                fired.append(Alert(rule.text, rule.metric, row.device, None, value, rule.threshold, rule.unit))
    return fired


class AlertCheck:
    """The pipeline stage of --alert: each window's alerts, told on stderr and recorded in it ("alerts").

    The diskstats metrics (util, awaits, aqu-sz) come from the window's rows:
    a BPF dump's `iostat` (sampled by the pipeline, the same rows --csv
    writes), a --diskstats window's `disks`.  tracer.sinks.alerts turns the counts into the exit
    status.
    """

    def __init__(self, rules: list[Rule], err=None):
        import sys

        self.rules = rules
        self.err = err or sys.stderr
        self.fired = 0
        self.alerted_windows = 0
        self.windows = 0

    def apply(self, d) -> None:
        """Check the window `d` (a Dump) and record its alerts in it."""
        disk = d.disks.devices if d.disks is not None else (d.iostat or [])
        d.alerts = Alerts([a.to_json() for a in self._check(d, disk)])

    def _check(self, d, disk) -> list[Alert]:
        what = f"{d.kind}{' ' + repr(d.label) if d.label else ''} ending {d.end:%H:%M:%S}"
        fired = check(self.rules, d, disk)
        for a in fired:
            print(safe(f"iotrace: alert: {what}: {a.describe()}"), file=self.err)   # a label, a device
        self.windows += 1
        self.fired += len(fired)
        self.alerted_windows += bool(fired)
        self.err.flush()
        return fired
