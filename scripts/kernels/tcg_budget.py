"""pytest plugin for the kernel-matrix guest (loaded with `-p tcg_budget`): a time limit per test and
for the whole session, and one JSON line per test result, written as it happens.

Under TCG a guest runs 5-20x slower than the host, so a test can take longer than anyone waits.  A test
that overruns IOTRACE_TEST_TIMEOUT seconds is stopped (SIGALRM raises TooSlowUnderTCG in it, after its
child processes are killed) and reported "too slow"; once IOTRACE_SESSION_BUDGET seconds are spent,
the tests left are reported "not run" rather than dropped.  pytest-timeout is not in Debian's image,
and this is all the matrix needs.

Each line of $IOTRACE_RESULTS (fsync'ed, so a guest killed later still leaves it on the disk):
  {"nodeid": ..., "outcome": "passed|failed|timed out|skipped|too slow|not run", "seconds": ..., "detail": ...}

"timed out" is a failure by the test's own subprocess timeout, set for the host's speed: under TCG that
may be slowness rather than a bug, so the table says so instead of a plain FAILED.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time

import pytest

TEST_TIMEOUT = float(os.environ.get("IOTRACE_TEST_TIMEOUT", "300"))
SESSION_BUDGET = float(os.environ.get("IOTRACE_SESSION_BUDGET", "3600"))
RESULTS = os.environ.get("IOTRACE_RESULTS", "results.jsonl")
_START = time.monotonic()


class TooSlowUnderTCG(BaseException):
    """A BaseException, so that a test's own `except Exception` does not swallow it."""


def _kill_children() -> None:
    """SIGKILL every process below this one (iotrace, fio, loads a test started): a stopped test must
    not leave a tracer attached while the next test runs."""
    me = os.getpid()
    parent: dict[int, int] = {}
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                with open(f"/proc/{d}/stat") as f:
                    parent[int(d)] = int(f.read().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                pass
    below, frontier = set(), {me}
    while frontier:
        frontier = {p for p, pp in parent.items() if pp in frontier and p not in below}
        below |= frontier
    for p in below:
        try:
            os.kill(p, signal.SIGKILL)
        except OSError:
            pass


def _on_alarm(signum, frame):
    _kill_children()
    raise TooSlowUnderTCG(f"over {TEST_TIMEOUT:.0f} s under TCG")


def _write(record: dict) -> None:
    with open(RESULTS, "a") as f:
        f.write(json.dumps(record) + "\n")
        f.flush()
        os.fsync(f.fileno())
    progress = os.environ.get("IOTRACE_PROGRESS")
    if progress:        # the guest's console: the host echoes these lines as the run goes
        try:
            with open(progress, "w") as f:
                f.write(f"tcg_budget: {record['outcome']:<8} {record['seconds']:6.1f} s  {record['nodeid']}\n")
        except OSError:
            pass


_outcomes: dict[str, dict] = {}


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    _outcomes[item.nodeid] = {"nodeid": item.nodeid, "outcome": None, "seconds": 0.0, "detail": ""}
    if time.monotonic() - _START > SESSION_BUDGET:
        item.add_marker(pytest.mark.skip(reason="kernel-matrix session budget spent"))
        _outcomes[item.nodeid]["outcome"] = "not run"
        _outcomes[item.nodeid]["detail"] = f"session budget of {SESSION_BUDGET:.0f} s spent"
    old = signal.signal(signal.SIGALRM, _on_alarm)
    signal.setitimer(signal.ITIMER_REAL, TEST_TIMEOUT)
    t0 = time.monotonic()
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)
        rec = _outcomes.pop(item.nodeid)
        rec["seconds"] = round(time.monotonic() - t0, 1)
        rec["outcome"] = rec["outcome"] or "passed"
        _write(rec)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    rec = _outcomes.get(item.nodeid)
    if rec is None or rec["outcome"] == "not run":
        return
    if call.excinfo is not None and call.excinfo.errisinstance(TooSlowUnderTCG):
        rec["outcome"] = "too slow"
        rec["detail"] = f"{call.when}: over {TEST_TIMEOUT:.0f} s"
    elif report.failed and call.excinfo is not None and call.excinfo.errisinstance(subprocess.TimeoutExpired):
        # the test's own time limit (written for the host's speed) ran out: maybe TCG, maybe a hang
        rec["outcome"] = "timed out"
        rec["detail"] = f"{call.when}: {_first_line(report)}"
    elif report.failed and rec["outcome"] not in ("too slow", "timed out"):
        rec["outcome"] = "failed"
        rec["detail"] = f"{call.when}: {_first_line(report)}"
    elif report.skipped and rec["outcome"] is None:
        rec["outcome"] = "skipped"
        rec["detail"] = _first_line(report)


def _first_line(report) -> str:
    """The assertion or error that failed the test, in one line (the full text is in the console log)."""
    if isinstance(report.longrepr, tuple):      # a skip: (file, line, reason)
        return str(report.longrepr[2])[:300]
    crash = getattr(report.longrepr, "reprcrash", None)
    text = crash.message if crash is not None else str(report.longrepr)
    return " ".join(text.split())[:300]
