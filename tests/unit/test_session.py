"""tracer.runtime.session.LiveRun, the one way every live mode opens a run: sinks from the registry, the sinks'
hooks (attached, inputs, on_end), the loop, and the teardown order whatever fails (no root, no BPF)."""

from __future__ import annotations

import argparse
import os
import sys
import types

import pytest

import tracer.sinks as sinkreg
from tracer.errors import UserError
from tracer.runtime.loop import Schedule
from tracer.runtime.session import LiveRun


class Recorder:
    """A sink with every optional hook, writing what happens to `log`."""

    def __init__(self, log: list, mode: str, key_fd: int | None):
        self.log, self.mode, self.key_fd = log, mode, key_fd

    def attached(self):
        self.log.append("attached")

    def inputs(self):
        return {self.key_fd: self.on_key} if self.key_fd is not None else {}

    def on_key(self) -> bool:
        os.read(self.key_fd, 1)
        self.log.append("key")
        return True         # a key that quits

    def on_dump(self, window):
        self.log.append(("dump", window))

    def on_end(self, reason):
        self.log.append(("end", reason))

    def close(self, status):
        self.log.append(("close", status))
        return status + 40


@pytest.fixture
def recorder(monkeypatch):
    """The sink "recorder" registered as docs/development.md says a sink is (a module, one line in SINKS), alone: the
    others would print tables and bind ports."""
    log: list = []
    module = types.ModuleType("tracer.sinks.recorder")
    module.add_arguments = lambda p, mode: p.add_argument("--record", action="store_true")
    module.from_args = lambda ns, ctx: Recorder(log, ctx.mode, ns.key_fd) if ns.record else None
    monkeypatch.setitem(sys.modules, "tracer.sinks.recorder", module)
    monkeypatch.setattr(sinkreg, "SINKS", ("recorder",))
    return log


class Windows:
    """Sources -> windows, as the pipeline does: a window is its kind."""

    def start(self):
        pass

    def cut(self, final=False):
        return final

    def build(self, cut, kind, label=None, sections=()):
        return kind


class Closing:
    def __init__(self, log, what, fail=False):
        self.log, self.what, self.fail = log, what, fail

    def close(self):
        self.log.append(self.what)
        if self.fail:
            raise OSError("it would not")

    def restore(self):
        self.close()


def namespace(mode: str, key_fd: int | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser()
    sinkreg.add_arguments(p, mode)
    ns = p.parse_args(["--record"])
    ns.key_fd = key_fd
    return ns


@pytest.mark.parametrize("mode", sinkreg.MODES)
def test_every_mode_opens_the_registered_sink_runs_the_loop_and_says_why_it_ended(mode, recorder):
    run = LiveRun(mode, namespace(mode), devices=None)
    with run:
        outputs = run.open_sinks(extra={"scr": None, "interval": 1, "where": ""} if mode == "top" else None)
        assert [type(s).__name__ for s in outputs.sinks] == ["Recorder"] and outputs.sinks[0].mode == mode
        run.attached()
        run.catch_signals()
        assert run.loop(Windows(), Schedule(interval=0.01, count=2)) == 0
    assert run.reason == "deadline"
    assert recorder == ["attached", ("dump", "interval"), ("dump", "final"), ("end", "deadline"), ("close", 0)]
    assert run.status == 40         # a sink's close may change the exit status


def test_a_sinks_inputs_reach_the_loop_and_end_it(recorder):
    r, w = os.pipe()
    try:
        os.write(w, b"q")
        run = LiveRun("top", namespace("top", key_fd=r))
        with run:
            run.open_sinks(extra={"scr": None, "interval": 1, "where": ""})
            run.catch_signals()
            run.loop(Windows(), Schedule(interval=60), final=False)
        assert run.reason == "input" and recorder[:2] == ["key", ("end", "input")]
    finally:
        os.close(r)
        os.close(w)


def test_teardown_runs_every_step_in_order_even_when_one_fails_or_the_run_raises(recorder, capsys):
    order: list = []
    run = LiveRun("trace", namespace("trace"))
    with pytest.raises(UserError, match="the probe would not load"), run:
        run.open_sinks()
        run.end_command = lambda: order.append("command")
        run.probe = Closing(order, "probe", fail=True)
        run.tasks = Closing(order, "tasks")
        run.control = Closing(order, "control")
        run.sig = Closing(order, "signals")
        raise UserError("the probe would not load")
    assert order == ["command", "probe", "tasks", "control", "signals"]
    assert recorder == [("close", 0)]           # the outputs first; no on_end: the loop never ended
    assert "detaching the BPF programs failed: it would not" in capsys.readouterr().err
    assert run.close() == 40 and recorder == [("close", 0)]      # closed once


def test_a_failed_probe_is_reworded_by_the_mode(monkeypatch):
    import tracer.sources.probe

    def refuse(opts):
        raise UserError("no BTF")

    monkeypatch.setattr(tracer.sources.probe, "Probe", refuse)
    run = LiveRun("trace", argparse.Namespace())
    with pytest.raises(UserError, match="^no BTF; try --diskstats$"):
        run.open_probe(None, on_error=lambda e: UserError(f"{e}; try --diskstats"))
    with pytest.raises(UserError, match="^no BTF$"):
        run.open_probe(None)
    with pytest.raises(ValueError, match="no live mode"):
        LiveRun("replay", argparse.Namespace())
