"""Bounds on what users give: seconds, pids, alert rules, compare's inputs (issue 19, items 5 and 11).

Each bad value is one line on stderr and exit 2, before anything is traced; none hangs the loop.
No root needed: every case fails while the arguments are parsed.
"""

from __future__ import annotations

import math

import pytest

from tracer import cli
from tracer.model import benchresult as br
from tracer.runtime.loop import next_tick_after


def one_line_rc2(argv: list[str], capsys) -> str:
    code = cli.main(argv)
    out, err = capsys.readouterr()
    assert code == 2, (argv, out, err)
    assert len(err.splitlines()) == 1 and err.startswith("iotrace: ") and "Traceback" not in err, err
    return err


@pytest.mark.parametrize(("argv", "expect"), [
    (["-i", "1e-9"], "shortest interval"),
    (["-i", "1e-20"], "shortest interval"),
    (["-i", "0"], "more than 0"),
    (["-i", "nan"], "not a finite number"),
    (["-i", "inf"], "not a finite number"),
    (["-i", "1e300"], "more than a year"),
    (["-d", "nan"], "not a finite number"),
    (["-d", "inf"], "not a finite number"),
    (["-d", "1e300"], "more than a year"),
    (["-d", "-1"], "more than 0"),
    (["1e-9"], "shortest interval"),
    (["nan"], "not a finite number"),
    (["1", "10000000000000"], "or less"),
    (["-p", "0"], "not a process id"),
    (["-p", "-5"], "not a process id"),
    (["-p", "99999999999999999999999"], "not a process id"),
    (["--diskstats", "-i", "1e-9"], "shortest interval"),
    (["--diskstats", "-d", "nan"], "not a finite number"),
    (["top", "-i", "1e-9"], "shortest interval"),
    (["top", "-i", "nan"], "not a finite number"),
    (["serve", "-i", "1e-20"], "shortest interval"),
    (["serve", "--idle", "inf"], "not a finite number"),
    (["mark", "--wait", "nan", "x"], "not a finite number"),
    (["mark", "--wait", "1e300", "x"], "more than a year"),
])
def test_bad_seconds_and_pids_are_one_line_and_exit_2(argv, expect, capsys):
    assert expect in one_line_rc2(argv, capsys)


def test_a_tiny_interval_is_refused_as_a_process():
    """End to end: `iotrace -i 1e-9` spun at 100% CPU, ignoring -d and SIGTERM; now it is refused at once."""
    from conftest import run_iotrace

    r = run_iotrace(["-i", "1e-9", "-d", "1"], timeout=30)
    assert r.returncode == 2, r.stderr
    assert len(r.stderr.splitlines()) == 1 and "shortest interval" in r.stderr, r.stderr


def test_a_thread_id_is_one_line():
    import os
    import threading

    from tracer.errors import UserError
    from tracer.runtime.child import check_pids

    stop = threading.Event()
    t = threading.Thread(target=stop.wait)
    t.start()
    try:
        tid = next(int(x) for x in os.listdir("/proc/self/task") if int(x) != os.getpid())
        with pytest.raises(UserError):
            check_pids([tid])
    finally:
        stop.set()
        t.join()


# ---- the loop's ticks --------------------------------------------------------

def test_next_tick_is_the_next_one_on_the_grid():
    assert next_tick_after(10.0, 10.0, 1.0) == 11.0
    assert next_tick_after(10.0, 10.5, 1.0) == 11.0
    assert next_tick_after(10.0, 9.0, 1.0) == 11.0      # not due yet: still one step on
    assert next_tick_after(10.0, 13.2, 1.0) == 14.0     # fell behind: skipped, not burst


@pytest.mark.parametrize(("tick", "now", "interval"), [
    (0.0, 1e9, 1e-3),           # a billion seconds behind at the shortest interval: one step
    (1e6, 1e6 + 5, 1e-20),      # an interval below the clock's resolution: no spinning
    (1e6, 1e6, 1e-300),
    (5.0, 5.0, 1e300),
])
def test_next_tick_is_computed_in_one_step_and_after_now(tick, now, interval):
    nxt = next_tick_after(tick, now, interval)
    assert nxt > now and math.isfinite(nxt)


@pytest.mark.parametrize("interval", [0.0, -1.0, math.nan, math.inf])
def test_next_tick_refuses_a_bad_interval(interval):
    with pytest.raises(ValueError):
        next_tick_after(0.0, 1.0, interval)


# ---- --alert -----------------------------------------------------------------

def a_disk() -> str:
    from tracer.sources.devices import whole_disks

    disks = sorted(whole_disks())
    if not disks:
        pytest.skip("no block device on this machine")
    return disks[0]


@pytest.mark.parametrize(("rule", "expect"), [
    ("p99>1e400ms", "beyond any value"),
    ("p99>5000s", "beyond any value"),
    ("device.max>99999999999999999999s", "beyond any value"),
    ("aqu-sz>1e20", "beyond any value"),
    ("r_await>1e300", "beyond any value"),
    ("util>1e400", "at most 100%"),
    ("p99>nan ms", "not a number"),
    ("p99>infms", "not a number"),
])
def test_absurd_thresholds_are_refused(rule, expect, capsys):
    from tracer.errors import UserError
    from tracer.pipeline.alerts import parse_rule

    with pytest.raises(UserError, match=expect):
        parse_rule(rule)
    assert expect in one_line_rc2(["-d", "0.1", "--alert", rule], capsys)


@pytest.mark.parametrize("argv", [
    ["--diskstats", "-d", "0.1", "--alert", "sdz:util>5%"],
    ["--diskstats", "-d", "0.1", "--alert", "nosuchdisk:w_await>5"],
    ["-d", "0.1", "--alert", "sdz:p99>5ms"],
    ["-d", "0.1", "--alert", "sdz:read:p99>5ms"],
])
def test_an_alert_on_a_disk_that_does_not_exist_is_refused(argv, capsys):
    err = one_line_rc2(argv, capsys)
    assert "could never fire" in err and "no disk" in err, err


def test_an_alert_on_a_disk_not_traced_is_refused(capsys):
    from tracer.sources.devices import whole_disks

    disks = sorted(whole_disks())
    if len(disks) < 2:
        pytest.skip("needs two block devices")
    err = one_line_rc2(["--diskstats", "-d", "0.1", "--dev", disks[0], "--alert", f"{disks[1]}:util>5%"], capsys)
    assert "is not traced" in err and "could never fire" in err, err


def test_an_alert_on_a_disk_that_exists_is_taken(capsys):
    disk = a_disk()
    code = cli.main(["--diskstats", "-d", "0.1", "--alert", f"{disk}:util>100%"])
    out, err = capsys.readouterr()
    assert code == 0, err


# ---- compare -----------------------------------------------------------------

def _phase() -> dict:
    return {"count": 1000, "min": 5.0, "mean": 30.0, "p50": 20.0, "p90": 40.0, "p99": 100.0, "p99.9": 150.0,
            "max": 200.0}


def _result(op: str = "read", reps: int = 3, repeat: int | None = None) -> br.BenchResult:
    rep = br.Rep({op: br.OpRun(1000, 4.0, 20000.0, {"total": _phase()})})
    w = br.WorkloadResult("wl", ["--name=wl"], [rep] * reps)
    return br.BenchResult("quick", "v1", [w], {}, reps if repeat is None else repeat)


def _compare(tmp_path, base: br.BenchResult, new: br.BenchResult, *args: str) -> list[str]:
    br.write(str(tmp_path / "b.json"), base)
    br.write(str(tmp_path / "n.json"), new)
    return ["compare", str(tmp_path / "b.json"), str(tmp_path / "n.json"), *args]


def test_compare_of_different_ops_fails_rather_than_passing_on_nothing(tmp_path, capsys):
    err = one_line_rc2(_compare(tmp_path, _result("read"), _result("write")), capsys)
    assert "nothing to compare" in err


def test_compare_of_a_phase_neither_has_fails(tmp_path, capsys):
    err = one_line_rc2(_compare(tmp_path, _result(), _result(), "--phase", "device"), capsys)
    assert "nothing to compare" in err


@pytest.mark.parametrize("side", ["base", "new"])
def test_compare_with_no_repetition_fails(tmp_path, capsys, side):
    empty = _result(reps=0)
    base, new = (empty, _result()) if side == "base" else (_result(), empty)
    err = one_line_rc2(_compare(tmp_path, base, new), capsys)
    assert f"the {side} result has no repetition" in err


def test_compare_of_a_result_that_says_0_repetitions_fails(tmp_path, capsys):
    err = one_line_rc2(_compare(tmp_path, _result(), _result(repeat=0)), capsys)
    assert "no repetition" in err


def test_compare_of_comparable_results_still_passes(tmp_path, capsys):
    code = cli.main(_compare(tmp_path, _result(), _result()))
    out, _ = capsys.readouterr()
    assert code == 0 and "OK: no regression in 2 gated comparison(s)" in out, out


@pytest.mark.parametrize("value", ["NaN", "Infinity", "-Infinity", "1e400", "9" * 400, "-5", '"abc"', "[1]", "true"])
def test_compare_of_a_result_with_a_bad_number_is_one_line(tmp_path, capsys, value):
    import json

    good = tmp_path / "good.json"
    br.write(str(good), _result())
    text = json.dumps(br.to_json(_result())).replace('"p99": 100.0', f'"p99": {value}', 1)
    bad = tmp_path / "bad.json"
    bad.write_text(text)
    err = one_line_rc2(["compare", str(good), str(bad)], capsys)
    assert "not an iotrace bench result" in err


def test_the_loop_never_sleeps_longer_than_select_can_take():
    import os
    import select

    from tracer.runtime.loop import MAX_WAIT_S, Schedule, wait_until

    end = Schedule(interval=366 * 86400.0, count=10**9).deadline(0.0)      # `iotrace 31622400 1000000000`
    assert wait_until(0.0, None, end) == MAX_WAIT_S
    assert wait_until(5.0, 7.0, end) == 2.0 and wait_until(5.0, 4.0) == 0.0 and wait_until(5.0) is None
    r, w = os.pipe()
    try:
        os.write(w, b"x")
        assert select.select([r], [], [], MAX_WAIT_S)[0] == [r]      # no OverflowError
    finally:
        os.close(r)
        os.close(w)


@pytest.mark.parametrize("argv", [["--files", "-1", "-d", "1"],
                                  ["report", "run.jsonl", "--by", "file", "--files", "-1"]])
def test_a_negative_number_of_file_rows_is_refused(argv, capsys):
    """--files -1 was taken (issue 32): trace mode read it as 0 rows kept, report as 0 rows shown."""
    assert "must be 0 or more" in one_line_rc2(argv, capsys)
