"""`iotrace compare`: the gate's decisions on crafted bench results, and the result file format.

No root needed: results are built with tracer.model.benchresult's records and writer, as
`iotrace bench` builds them.
"""

from __future__ import annotations

import json

import pytest

from tracer import cli
from tracer.model import benchresult as br
from tracer.views.compare import IMPROVED, NOISE, OK, REGRESSION, judge

WL = "randread-4k-qd1"


def phase(**metrics: float) -> dict[str, float]:
    st = {"count": 1000, "min": 5.0, "mean": 30.0, "p50": 20.0, "p90": 40.0, "p99": 100.0, "p99.9": 150.0,
          "max": 200.0}
    st.update(metrics)
    return st


def rep(total: dict | None = None, queue: dict | None = None, iops: float = 20000.0, op: str = "read") -> br.Rep:
    latency = {"queue": phase(**{"p50": 1.5, "p99": 3.0, **(queue or {})}), "device": phase(),
               "total": phase(**(total or {}))}
    return br.Rep({op: br.OpRun(1000, 4.096, iops, latency)}, {"skipped_start": 1})


def result(*workloads: br.WorkloadResult, suite: str = "quick", version: str = "v1", **env) -> br.BenchResult:
    environment = {"kernel": "6.18.0", "cpu": "test cpu", "nproc": 2, "host": "ci", "fio": "fio-3.33",
                   "device": {"name": "loop0", "kind": "loop", "backing_fs": "tmpfs", "size_mb": 256}, **env}
    return br.BenchResult(suite, version, list(workloads), environment, max(len(w.reps) for w in workloads))


def workload(reps: list[br.Rep], name: str = WL) -> br.WorkloadResult:
    return br.WorkloadResult(name, [f"--name={name}", "--rw=randread"], reps)


def p99s(*values: float, name: str = WL) -> br.WorkloadResult:
    return workload([rep(total={"p99": v}) for v in values], name)


def run_compare(tmp_path, base: br.BenchResult, new: br.BenchResult, *args: str, capsys) -> tuple[int, str, str]:
    bpath, npath = tmp_path / "base.json", tmp_path / "new.json"
    br.write(str(bpath), base)
    br.write(str(npath), new)
    code = cli.main(["compare", str(bpath), str(npath), *args])
    out, err = capsys.readouterr()
    return code, out, err


def row(out: str, phase_name: str, metric: str, name: str = WL, op: str = "read") -> str:
    """The table line of one comparison; fails unless there is exactly one."""
    lines = [ln for ln in out.splitlines() if ln.split()[:4] == [name, op, phase_name, metric]]
    assert len(lines) == 1, out
    return lines[0]


# ---- the decisions -----------------------------------------------------------

def test_real_regression_fails_and_flags_the_row(tmp_path, capsys):
    code, out, err = run_compare(tmp_path, result(p99s(100, 102, 104)), result(p99s(130, 131, 135)), capsys=capsys)
    assert code == 1, out + err
    assert "REGRESSION" in row(out, "total", "p99") and "+28.4%" in row(out, "total", "p99")
    assert "REGRESSION" not in row(out, "total", "p50")          # p50 did not move
    # queue and device are shown but, with the default gate on total, cannot be what failed
    assert row(out, "device", "p99").endswith(OK)
    assert out.splitlines()[-1].startswith("FAIL: 1 regression(s)") and "read total p99 +28.4%" in out.splitlines()[-1]


def test_noise_only_passes(tmp_path, capsys):
    # the median moved by +18%, beyond the 10% threshold, but the repetitions' ranges overlap
    code, out, err = run_compare(tmp_path, result(p99s(90, 100, 140)), result(p99s(95, 118, 150)), capsys=capsys)
    assert code == 0, out + err
    line = row(out, "total", "p99")
    assert "+18.0%" in line and line.endswith(NOISE)
    assert out.splitlines()[-1].startswith("OK:") and "1 within noise" in out.splitlines()[-1]


def test_change_beyond_the_spread_but_within_the_threshold_passes(tmp_path, capsys):
    code, out, err = run_compare(tmp_path, result(p99s(100, 101, 102)), result(p99s(105, 106, 107)), capsys=capsys)
    assert code == 0, out + err
    assert row(out, "total", "p99").endswith(OK)


def test_improvement_passes_and_is_shown(tmp_path, capsys):
    code, out, err = run_compare(tmp_path, result(p99s(100, 102, 104)), result(p99s(70, 71, 72)), capsys=capsys)
    assert code == 0, out + err
    assert "-30.4%" in row(out, "total", "p99") and row(out, "total", "p99").endswith(IMPROVED)
    assert "1 improved" in out.splitlines()[-1]


def test_given_thresholds_replace_the_defaults(tmp_path, capsys):
    base, new = result(p99s(100, 102, 104)), result(p99s(130, 131, 135))
    code, out, _ = run_compare(tmp_path, base, new, "--max-regress", "p99=40%", capsys=capsys)
    assert code == 0 and row(out, "total", "p99").endswith(OK)
    code, out, _ = run_compare(tmp_path, base, new, "--max-regress", "p50=5", capsys=capsys)
    assert code == 0, out
    assert not any(ln.split()[3:4] == ["p99"] for ln in out.splitlines())   # only the metrics given
    code, out, _ = run_compare(tmp_path, base, new, "--max-regress", "p99=20%", "--max-regress", "p99.9=1%",
                               capsys=capsys)
    assert code == 1 and "REGRESSION > 20%" in row(out, "total", "p99")


def test_only_the_gated_phase_fails(tmp_path, capsys):
    base = result(workload([rep(queue={"p99": v}) for v in (3.0, 3.1, 3.2)]))
    new = result(workload([rep(queue={"p99": v}) for v in (6.0, 6.1, 6.2)]))
    code, out, _ = run_compare(tmp_path, base, new, capsys=capsys)
    assert code == 0, out
    assert row(out, "queue", "p99").endswith("worse (not gated)")
    code, out, _ = run_compare(tmp_path, base, new, "--phase", "queue", capsys=capsys)
    assert code == 1 and "REGRESSION" in row(out, "queue", "p99")
    code, out, _ = run_compare(tmp_path, base, new, "--phase", "all", capsys=capsys)
    assert code == 1


def test_iops_is_gated_when_asked_and_lower_is_worse(tmp_path, capsys):
    base = result(workload([rep(iops=v) for v in (20000, 20100, 20200)]))
    slower = result(workload([rep(iops=v) for v in (15000, 15100, 15200)]))
    faster = result(workload([rep(iops=v) for v in (25000, 25100, 25200)]))
    code, out, _ = run_compare(tmp_path, base, slower, "--max-regress", "iops=5%", capsys=capsys)
    assert code == 1 and "REGRESSION" in row(out, "-", "iops")
    code, out, _ = run_compare(tmp_path, base, faster, "--max-regress", "iops=5%", capsys=capsys)
    assert code == 0 and row(out, "-", "iops").endswith(IMPROVED)


def test_workloads_in_one_result_only_are_noted_and_the_rest_compared(tmp_path, capsys):
    base = result(p99s(100, 101, 102, name="a"), p99s(100, 101, 102, name="b"))
    new = result(p99s(150, 151, 152, name="b"), p99s(100, 101, 102, name="c"))
    code, out, _ = run_compare(tmp_path, base, new, capsys=capsys)
    assert code == 1, out
    assert "note: only in base: a" in out and "note: only in new: c" in out
    assert "REGRESSION" in row(out, "total", "p99", name="b")


def test_environment_differences_are_noted_not_failed(tmp_path, capsys):
    code, out, _ = run_compare(tmp_path, result(p99s(100, 101, 102)), result(p99s(100, 101, 102), kernel="6.19.1"),
                               capsys=capsys)
    assert code == 0
    assert "kernel (6.18.0 vs 6.19.1)" in out


@pytest.mark.parametrize(("metric", "base", "new", "limit", "want"), [
    ("p99", (100, 100, 110), (120, 125, 130), 0.10, REGRESSION),
    ("p99", (100, 100, 125), (120, 125, 130), 0.10, NOISE),        # ranges touch: 125 is in both
    ("p99", (100, 100, 110), (120, 125, 130), 0.30, OK),
    ("p99", (100, 100, 110), (70, 75, 80), 0.10, IMPROVED),
    ("p99", (100, 100, 110), (70, 75, 105), 0.10, NOISE),
    ("iops", (100, 100, 110), (120, 125, 130), 0.10, IMPROVED),   # more IOPS is better
    ("iops", (100, 100, 110), (70, 75, 80), 0.10, REGRESSION),
    ("p50", (0, 0, 0), (5, 5, 5), 0.10, OK),                     # no relative change from zero
    ("p50", (100,), (120,), 0.10, REGRESSION),                   # one repetition: threshold only
])
def test_judge(metric, base, new, limit, want):
    assert judge(metric, br.Spread.of(base), br.Spread.of(new), limit) == want


# ---- bad input: exit 2, one line, no traceback -------------------------------

def _dump_line() -> str:
    return json.dumps({"schema": 1, "kind": "final", "label": None, "start": "2026-01-01T00:00:00+00:00",
                       "end": "2026-01-01T00:00:01+00:00", "series": []}) + "\n"


def _bad_cases(tmp_path):
    good = tmp_path / "good.json"
    br.write(str(good), result(p99s(100, 101, 102)))
    files = {
        "missing": tmp_path / "nope.json",
        "text": tmp_path / "text.json",
        "dump": tmp_path / "run.jsonl",
        "schema": tmp_path / "schema.json",
        "v2": tmp_path / "v2.json",
        "other": tmp_path / "other.json",
        "truncated": tmp_path / "truncated.json",
    }
    files["text"].write_text("p99 went up\n")
    files["dump"].write_text(_dump_line())
    obj = json.loads(good.read_text())
    files["schema"].write_text(json.dumps({**obj, "schema": 99}))
    files["truncated"].write_text(json.dumps({k: v for k, v in obj.items() if k != "workloads"}))
    br.write(str(files["v2"]), result(p99s(100, 101, 102), version="v2"))
    br.write(str(files["other"]), result(p99s(100, 101, 102, name="seqread-1m")))
    return good, files


@pytest.mark.parametrize(("case", "expect"), [
    ("missing", "cannot read"),
    ("text", "not JSON"),
    ("dump", "not an iotrace bench result"),
    ("schema", "schema 99"),
    ("truncated", "no 'workloads'"),
    ("v2", "different suites (quick-v1 and quick-v2)"),
    ("other", "no workload in common"),
    ("p99", "METRIC=PERCENT"),
    ("p99=abc", "not a percentage"),
    ("p42=10%", "METRIC=PERCENT"),
    ("p99=-5%", "0 or more"),
    ("--phase=disk", "invalid choice"),
])
def test_bad_input_is_one_line_and_exit_2(tmp_path, capsys, case, expect):
    good, files = _bad_cases(tmp_path)
    if case in files:
        argv = [str(good), str(files[case])]
    elif case.startswith("--"):
        argv = [str(good), str(good), case]
    else:
        argv = [str(good), str(good), "--max-regress", case]
    code = cli.main(["compare", *argv])
    out, err = capsys.readouterr()
    assert code == 2, out + err
    assert out == ""
    assert len(err.splitlines()) == 1 and err.startswith("iotrace: ") and "Traceback" not in err, err
    assert expect in err


def test_bad_input_as_a_process_has_no_traceback(tmp_path):
    from conftest import run_iotrace

    r = run_iotrace(["compare", str(tmp_path / "a.json"), str(tmp_path / "b.json")])
    assert r.returncode == 2
    assert r.stderr.startswith("iotrace: cannot read") and len(r.stderr.splitlines()) == 1, r.stderr


# ---- the result file ---------------------------------------------------------

def test_result_file_round_trips_and_summarises(tmp_path):
    flush = br.OpRun(10, 0.0, None, {"total": phase(p50=12.5)})
    r = result(workload([rep(total={"p99": 100.0}), rep(total={"p99": 140.5}),
                         br.Rep({"read": rep().ops["read"], "flush": flush})]))
    path = tmp_path / "r.json"
    br.write(str(path), r)
    assert br.read(str(path)) == r
    summary = json.loads(path.read_text())["workloads"][0]["summary"]
    assert summary["read"]["latency_us"]["total"]["p99"] == {"median": 100.0, "min": 100.0, "max": 140.5, "n": 3}
    assert summary["read"]["iops"]["n"] == 3
    assert summary["flush"]["iops"] is None and list(summary["flush"]["latency_us"]) == ["total"]
    assert not list(tmp_path.glob("*.tmp*"))       # written through a temporary file, renamed


def test_spread():
    s = br.Spread.of([4.0, 1.0, 3.0, 2.0])
    assert (s.median, s.min, s.max, s.n) == (2.5, 1.0, 4.0, 4)
    with pytest.raises(ValueError):
        br.Spread.of([])


@pytest.mark.parametrize("new_p99s, code", [((130, 131, 135), 1), ((99, 101, 103), 0)], ids=["regression", "ok"])
def test_json_has_the_rows_and_verdict_and_keeps_the_exit_code(tmp_path, capsys, new_p99s, code):
    got, out, err = run_compare(tmp_path, result(p99s(100, 102, 104)), result(p99s(*new_p99s)), "--json",
                                capsys=capsys)
    assert got == code, out + err
    d = json.loads(out)             # stdout is the JSON object alone
    assert d["kind"] == "iotrace-compare" and d["base"]["suite"] == d["new"]["suite"] == "quick-v1"
    [p99] = [r for r in d["rows"] if (r["phase"], r["metric"]) == ("total", "p99")]
    assert p99["base"]["median"] == 102 and p99["new"]["median"] == new_p99s[1]
    assert p99["change"] == pytest.approx((new_p99s[1] - 102) / 102)
    assert p99["verdict"] == (REGRESSION if code else OK) and p99["fails"] == bool(code)
    assert d["regressions"] == code and d["pass"] == (not code)
    assert err.startswith("FAIL" if code else "OK")     # the verdict line, for the log
