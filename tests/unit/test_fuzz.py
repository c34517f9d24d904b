"""Property tests (hypothesis) of every input iotrace takes from outside (issue 19, item 8).

The marker wire format, the control socket's receive path, the JSONL reader, --alert rules and the
command lines of trace, report and compare: on anything, only the documented error (ValueError on the
wire, UserError, one line, elsewhere) or a valid result, never another exception.  Examples are kept
few and deadlines off: these run in CI beside the rest of tests/unit.
"""

from __future__ import annotations

import contextlib
import io
import json
import math
import os
import socket
import tempfile

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tracer import marker
from tracer.codec import jsonl
from tracer.errors import UserError
from tracer.runtime.control import ControlSocket
from unit.test_jsonl import KIND_CASES

FAST = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
SLOW = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])

HUGE = st.integers(min_value=-(10**400), max_value=10**400)
NUMBERS = st.one_of(st.integers(-(2**70), 2**70), HUGE, st.floats(allow_nan=True, allow_infinity=True),
                    st.sampled_from([0, 1, -1, 2**53, 2**53 + 1, 2**63, 1e300, 1e-300, -0.0]))
SCALARS = st.one_of(st.none(), st.booleans(), NUMBERS, st.text(max_size=20))
JSON = st.recursive(SCALARS, lambda kids: st.one_of(st.lists(kids, max_size=4),
                                                    st.dictionaries(st.text(max_size=8), kids, max_size=4)),
                    max_leaves=12)


def dumps(obj) -> str:
    """JSON as Python writes it, NaN and Infinity included (what a careless writer may leave in a file)."""
    return json.dumps(obj, allow_nan=True)


# ---- the marker wire format --------------------------------------------------

def assert_valid_message(msg: dict) -> None:
    assert marker.check_label(msg["label"]) is None
    assert msg["enclosing"] is None or marker.check_label(msg["enclosing"]) is None
    loop = msg["loop"]
    if loop is not None:
        assert marker.check_loop(loop) is None
        assert isinstance(loop["steps"], int) and 0 <= loop["steps"] <= marker.MAX_STEPS
        assert all(math.isfinite(loop[k]) for k in marker.LOOP_KEYS)


def decode_or_value_error(data: bytes) -> dict | None:
    try:
        msg = marker.decode_message(data)
    except ValueError:
        return None
    assert_valid_message(msg)
    return msg


@FAST
@given(st.binary(max_size=marker.MAX_DATAGRAM + 64))
def test_decode_of_any_bytes_is_a_marker_or_a_value_error(data):
    decode_or_value_error(data)


LOOPS = st.one_of(JSON, st.fixed_dictionaries({k: NUMBERS for k in marker.LOOP_KEYS}))
MESSAGES = st.fixed_dictionaries({}, optional={"v": st.one_of(st.just(1), SCALARS), "label": st.one_of(st.text(
    max_size=30), SCALARS), "enclosing": st.one_of(st.text(max_size=30), SCALARS), "loop": LOOPS, "x": JSON})


@FAST
@given(MESSAGES)
def test_decode_of_any_json_object_is_a_marker_or_a_value_error(obj):
    msg = decode_or_value_error(dumps(obj).encode())
    if msg is not None:
        assert msg["label"] == obj["label"]


LABELS = st.text(min_size=1, max_size=marker.MAX_LABEL).filter(lambda s: marker.check_label(s) is None)
SECONDS = st.floats(min_value=0, max_value=marker.MAX_LOOP_SECONDS)
GOOD_LOOPS = st.fixed_dictionaries({"data_wait_s": SECONDS, "steps": st.integers(0, marker.MAX_STEPS),
                                    "wall_s": SECONDS})


@FAST
@given(LABELS, st.one_of(st.none(), LABELS), st.one_of(st.none(), GOOD_LOOPS))
def test_encode_decode_round_trip(label, enclosing, loop):
    data = marker.encode(label, enclosing, loop)
    assert len(data) <= marker.MAX_DATAGRAM or (enclosing is None and loop is None)
    msg = marker.decode_message(data)
    assert msg["label"] == label and msg["ignored"] == []
    assert msg["enclosing"] in (enclosing, None)      # left out first when the datagram would be too long
    if msg["loop"] is not None:
        assert msg["loop"]["steps"] == loop["steps"]
        for k in ("data_wait_s", "wall_s"):
            assert math.isclose(msg["loop"][k], loop[k], abs_tol=1e-6)


# ---- the control socket ------------------------------------------------------

VALID = st.builds(marker.encode, LABELS, st.one_of(st.none(), LABELS), st.one_of(st.none(), GOOD_LOOPS))
DATAGRAMS = st.lists(st.one_of(st.binary(min_size=1, max_size=marker.MAX_DATAGRAM + 8),
                               st.builds(lambda o: dumps(o).encode()[:marker.MAX_DATAGRAM + 8], MESSAGES), VALID),
                     max_size=8)    # within the kernel's queue of a socketpair (net.unix.max_dgram_qlen, 10)


@SLOW
@given(DATAGRAMS)
def test_the_control_socket_takes_the_markers_and_counts_the_rest(datagrams):
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_DGRAM)
    ours.setblocking(False)
    control = ControlSocket(ours, "/nonexistent/iotrace-fuzz.sock", None)
    try:
        with contextlib.redirect_stderr(io.StringIO()):
            for d in datagrams:
                theirs.send(d)
            got = control.receive()
    finally:
        ours.close()
        theirs.close()
    want = [m["label"] for d in datagrams if (m := decode_or_value_error(d[:marker.MAX_DATAGRAM + 1]))]
    assert [m.label for m in got] == want
    assert control.received == len(want) and control.bad == len(datagrams) - len(want)


# ---- the JSONL reader --------------------------------------------------------

def read_all(lines: list[str]) -> None:
    """Read `lines` as a file, and report it as `iotrace report` would: a result or a UserError, nothing else."""
    from tracer.cli import report

    fd, path = tempfile.mkstemp(suffix=".jsonl")
    try:
        with os.fdopen(fd, "w") as f:
            f.write("".join(ln + "\n" for ln in lines))
        with contextlib.redirect_stderr(io.StringIO()):
            for argv in ([path], [path, "--by", "label"], [path, "-j"]):
                try:
                    report.run(argv, io.StringIO())
                except UserError as exc:
                    assert "\n" not in str(exc)
    finally:
        os.unlink(path)


@SLOW
@given(st.lists(JSON.map(dumps), min_size=1, max_size=3))
def test_any_json_lines_read_or_fail_in_one_line(lines):
    read_all(lines)


def paths(obj, at=()):
    """Every (path, value) inside a JSON object."""
    yield at, obj
    items = obj.items() if isinstance(obj, dict) else enumerate(obj) if isinstance(obj, list) else ()
    for k, v in items:
        yield from paths(v, (*at, k))


@st.composite
def mutated_lines(draw):
    obj = jsonl.to_json(KIND_CASES[draw(st.sampled_from(sorted(KIND_CASES)))]())
    for _ in range(draw(st.integers(1, 3))):
        where = draw(st.sampled_from([p for p, _ in paths(obj) if p]))
        parent = obj
        for k in where[:-1]:
            parent = parent[k]
        if draw(st.booleans()) and isinstance(parent, dict):
            del parent[where[-1]]
        else:
            parent[where[-1]] = draw(JSON)
    return dumps(obj)


@SLOW
@given(st.lists(mutated_lines(), min_size=1, max_size=3))
def test_mutated_dump_lines_read_or_fail_in_one_line(lines):
    read_all(lines)


# ---- --alert rules -----------------------------------------------------------

RULE_PARTS = st.lists(st.one_of(st.sampled_from(["p99", "p99.9", "device.", "queue.", "total.", "max", "util",
                                                 "r_await", "aqu-sz", ":", "read:", "loop0:", "sdz:", ">", ">=",
                                                 "<", "%", "ms", "us", "s", "ns", "e400", "1", "0.5", "nan", "inf",
                                                 " "]),
                                st.text(max_size=4)), max_size=8).map("".join)


@FAST
@given(st.one_of(RULE_PARTS, st.text(max_size=30)))
def test_an_alert_rule_parses_or_fails_in_one_line(text):
    from tracer.pipeline.alerts import MAX_THRESHOLD, parse_rule

    try:
        rule = parse_rule(text)
    except UserError as exc:
        assert "\n" not in str(exc).replace(text, "")
        return
    assert math.isfinite(rule.threshold) and 0 <= rule.threshold <= MAX_THRESHOLD[rule.unit]


# ---- command lines -----------------------------------------------------------

ARG = st.one_of(
    st.sampled_from(["-i", "-d", "-p", "--pid", "--dev", "--alert", "--fail-on-alert", "-o", "-j", "--csv",
                     "--hist", "--diskstats", "--by", "label", "--layout", "--follow", "-f", "--max-regress",
                     "p99=10%", "--phase", "all", "--json", "--", "--help", "1", "0", "-1", "nan", "inf", "1e-9",
                     "1e300", "9" * 30, "loop0", "p99>5ms", "sdz:p99>5ms"]),
    st.text(max_size=12).filter(lambda s: not s.startswith(("/", "~")) and ".." not in s))
ARGV = st.lists(ARG, max_size=6)


def usage_only(call, argv: list[str]) -> None:
    """`call(argv)` in an empty directory: it returns, or raises UserError or SystemExit (--help)."""
    here = os.getcwd()
    with tempfile.TemporaryDirectory() as empty:
        os.chdir(empty)
        try:
            with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
                call(argv)
        except (UserError, SystemExit):
            pass
        finally:
            os.chdir(here)


@FAST
@given(ARGV)
def test_trace_arguments_parse_or_fail_in_one_line(argv):
    from tracer.cli.trace import parse_trace_args

    usage_only(parse_trace_args, argv)      # parsing only: running would trace


@FAST
@given(ARGV)
def test_report_arguments_run_or_fail_in_one_line(argv):
    from tracer.cli import report

    usage_only(lambda a: report.run(a, io.StringIO()), argv)    # no file exists here: nothing follows


@FAST
@given(ARGV)
def test_compare_arguments_run_or_fail_in_one_line(argv):
    from tracer.cli import compare

    usage_only(lambda a: compare.run(a, io.StringIO()), argv)
