"""Alerts: rules parsed from --alert, checked on crafted dumps and diskstats rows, and one real run."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta

import pytest
from conftest import run_iotrace

from tracer.codec.jsonl import from_json, to_json
from tracer.errors import UserError
from tracer.model.diskstats import IostatRow
from tracer.model.dump import Dump, PhaseStats, Series
from tracer.model.histogram import Histogram
from tracer.model.sections import Alerts
from tracer.pipeline import alerts

T0 = datetime(2026, 1, 1, tzinfo=UTC)
MS = 1_000_000


def phase(values_ns: list[int]) -> PhaseStats:
    return PhaseStats(Histogram.from_values(values_ns), float(sum(values_ns)), min(values_ns), max(values_ns))


def series(device: str, op: str, total: list[int], device_phase: list[int] | None = None, pid: int = 1) -> Series:
    phases = {"total": phase(total)}
    if device_phase:
        phases["device"] = phase(device_phase)
    return Series(pid, f"app{pid}", device, "7:0" if device == "loop0" else "7:1", op, len(total), 4096 * len(total),
                  phases)


def dump(*rows: Series) -> Dump:
    return Dump("interval", T0, T0 + timedelta(seconds=1), "host", "6.18", list(rows))


def fired(rule: str, d: Dump | None = None, disk=()) -> list[alerts.Alert]:
    return alerts.check([alerts.parse_rule(rule)], d, disk)


# ---- parsing -----------------------------------------------------------------

@pytest.mark.parametrize("text, want", [
    ("p99>50ms", ("p99", "total", ">", 50_000.0, None, None)),
    ("p99.9 >= 250us", ("p99.9", "total", ">=", 250.0, None, None)),
    ("device.p99.9>5ms", ("p99.9", "device", ">", 5_000.0, None, None)),
    ("queue.mean>1.5e3ns", ("mean", "queue", ">", 1.5, None, None)),
    ("loop0:read:max>2s", ("max", "total", ">", 2e6, "loop0", "read")),
    ("write:/dev/nvme0n1:p50>1ms", ("p50", "total", ">", 1000.0, "nvme0n1", "write")),
    ("util>90%", ("util", None, ">", 90.0, None, None)),
    ("loop0:util>=50", ("util", None, ">=", 50.0, "loop0", None)),
    ("r_await>20", ("r_await", None, ">", 20.0, None, None)),
    ("w_await>500us", ("w_await", None, ">", 0.5, None, None)),
    ("aqu-sz>4", ("aqu-sz", None, ">", 4.0, None, None)),
])
def test_parse(text, want):
    r = alerts.parse_rule(text)
    assert (r.metric, r.phase, r.cmp, pytest.approx(r.threshold), r.device, r.op) == want
    assert r.text == text


@pytest.mark.parametrize("text, needle", [
    ("p99<50ms", "'>' or '>='"),
    ("p99==50ms", "'>' or '>='"),
    ("p99", "no comparison"),
    ("p99>50", "unit"),
    ("p99>50parsecs", "unknown time unit"),
    ("p99>fast", "not a number"),
    ("p99>-5ms", "not a number"),
    ("p98>5ms", "unknown metric"),
    ("disk.p99>5ms", "unknown metric"),
    ("util>90ms", "does not fit"),
    ("util>150%", "at most 100%"),
    ("read:util>90%", "per device"),
    ("loop0:loop1:p99>1ms", "two devices"),
    ("read:write:p99>1ms", "two ops"),
    (":p99>1ms", "empty scope"),
])
def test_bad_rules_are_one_clear_line(text, needle):
    with pytest.raises(UserError) as e:
        alerts.parse_rule(text)
    msg = str(e.value)
    assert needle in msg and "\n" not in msg and "e.g. 'p99>50ms'" in msg, msg


@pytest.mark.parametrize("argv, needle", [
    (["--alert", "p99<5ms", "-d", "1"], "'>' or '>='"),
    (["--alert", "p99>5", "-d", "1"], "unit"),
    (["--fail-on-alert", "-d", "1"], "needs at least one --alert"),
])
def test_bad_rules_on_the_command_line(argv, needle):
    r = run_iotrace(argv, timeout=60)
    lines = [x for x in r.stderr.splitlines() if x.strip()]
    assert r.returncode == 2 and len(lines) == 1 and lines[0].startswith("iotrace: "), r.stderr
    assert needle in lines[0] and "Traceback" not in r.stderr



def test_an_error_while_starting_is_one_line_with_alerts_on(tmp_path):
    """The alert summary is said at the end of a run that made reports, not after a start-up error."""
    r = run_iotrace(["--alert", "p99>1ms", "--csv", str(tmp_path / "x.csv"), "--", "no-such-command-for-iotrace"],
                    timeout=60)
    lines = [x for x in r.stderr.splitlines() if x.strip()]
    assert r.returncode == 127 and lines == ["iotrace: command not found: no-such-command-for-iotrace"], r.stderr

# ---- checking crafted dumps ------------------------------------------------------

def test_fires_above_and_not_below():
    d = dump(series("loop0", "read", [1 * MS] * 90 + [80 * MS] * 10))     # p99 = 80 ms, p50 = 1 ms
    [a] = fired("p99>50ms", d)
    assert (a.device, a.op, a.metric, a.unit) == ("loop0", "read", "total.p99", "us")
    assert a.value == pytest.approx(80_000, rel=0.01) and a.threshold == 50_000
    assert fired("p99>100ms", d) == []
    assert fired("p50>2ms", d) == []
    assert len(fired("p50>0.5ms", d)) == 1


def test_edge_equal_fires_only_with_ge():
    d = dump(series("loop0", "read", [50 * MS] * 20))    # min = max = 50 ms: the percentiles are exactly 50 ms
    for stat in ("p50", "p99", "max", "mean"):
        assert fired(f"{stat}>50ms", d) == [], stat
        assert [a.value for a in fired(f"{stat}>=50ms", d)] == [50_000.0], stat
    assert fired("p99>49.999ms", d)


def test_processes_are_merged_per_device_and_op():
    # neither process alone has a p99 above 10 ms, together they do: 5 slow of 100 requests is above the 1%
    fast = series("loop0", "read", [1 * MS] * 95, pid=1)
    slow = series("loop0", "read", [20 * MS] * 5, pid=2)
    assert fired("p99>10ms", dump(fast)) == []
    [a] = fired("p99>10ms", dump(fast, slow))
    assert a.device == "loop0" and a.op == "read"


def test_scope_and_phase():
    d = dump(series("loop0", "read", [30 * MS] * 10, device_phase=[1 * MS] * 10),
             series("loop1", "write", [30 * MS] * 10, device_phase=[25 * MS] * 10))
    assert {(a.device, a.op) for a in fired("p99>20ms", d)} == {("loop0", "read"), ("loop1", "write")}
    assert {(a.device, a.op) for a in fired("loop0:p99>20ms", d)} == {("loop0", "read")}
    assert {(a.device, a.op) for a in fired("write:p99>20ms", d)} == {("loop1", "write")}
    assert fired("loop0:write:p99>20ms", d) == []
    assert {(a.device, a.metric) for a in fired("device.p99>20ms", d)} == {("loop1", "device.p99")}
    assert fired("queue.p99>1ns", d) == []          # no queue phase recorded: nothing to compare


def test_empty_dump_and_no_dump_never_fire():
    assert fired("p99>0ns", dump()) == []
    assert fired("p99>0ns", None) == []


def test_util_and_awaits_from_diskstats_rows():
    busy = IostatRow("loop0", 2.0, reads=100, read_ms=400, writes=10, write_ms=10, io_ms=1900, weighted_ms=4000)
    idle = IostatRow("loop1", 2.0)
    assert busy.util == pytest.approx(95.0) and busy.r_await == pytest.approx(4.0) and busy.aqu_sz == 2.0
    assert [a.device for a in fired("util>90%", None, [busy, idle])] == ["loop0"]
    assert fired("util>95%", None, [busy]) == [] and fired("util>=95%", None, [busy])
    assert fired("loop1:util>=0%", None, [busy, idle]) == []       # an idle device has nothing to say
    assert [a.value for a in fired("r_await>3", None, [busy])] == [4.0]
    assert fired("w_await>1ms", None, [busy]) == [] and fired("w_await>=1ms", None, [busy])
    assert fired("aqu-sz>1.5", None, [busy])[0].unit == ""


def test_alerts_land_in_the_json():
    d = dump(series("loop0", "read", [80 * MS] * 10))
    d.alerts = Alerts([a.to_json() for a in fired("p99>50ms", d)])
    back = from_json(json.loads(json.dumps(to_json(d))))
    assert back.alerts is not None
    assert back.alerts.items == [{"rule": "p99>50ms", "metric": "total.p99", "device": "loop0", "op": "read",
                                  "value": pytest.approx(80_000, rel=0.01), "threshold": 50_000.0, "unit": "us"}]


# ---- a real run --------------------------------------------------------------------
