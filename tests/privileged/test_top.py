"""test_top: the tests that load BPF programs (need root).

The rest, and the helpers both share, are in tests/unit/test_top.py.
"""

from __future__ import annotations

import itertools
import os
import re
import shutil
import subprocess
import time
from pathlib import Path

import pytest
from conftest import PYTHON, REQUIRE_BPF, ROOT

TESTS = Path(__file__).resolve().parent.parent


_sessions = itertools.count()


LOAD = """\
import os, sys, time
sys.path.insert(0, {tests!r})
from ioload import read_blocks
end = time.monotonic() + 20
while time.monotonic() < end and not os.path.exists(sys.argv[2]):
    read_blocks(sys.argv[1], 200, 0)
    time.sleep(0.02)
"""


PROMPT = "iotrace-test$ "


class Tmux:
    """A private tmux server (its own socket name) with one shell in a 150x40 window."""

    def __init__(self) -> None:
        self.name = f"iotrace-test-{os.getpid()}-{next(_sessions)}"
        env = dict(os.environ, TERM=os.environ.get("TERM") or "xterm")
        subprocess.run(["tmux", "-L", self.name, "-f", "/dev/null", "new-session", "-d", "-x", "150", "-y", "40",
                        "bash --norc --noprofile"], check=True, env=env, cwd=ROOT, timeout=30)
        self.type(f"PS1='{PROMPT}'; clear")
        self.wait_for(lambda screen: screen.rstrip().endswith(PROMPT.rstrip()), "the shell prompt")

    def __call__(self, *args: str) -> str:
        return subprocess.run(["tmux", "-L", self.name, *args], check=True, capture_output=True, text=True,
                              timeout=30).stdout

    def screen(self) -> str:
        return self("capture-pane", "-p")

    def var(self, name: str) -> str:
        return self("display-message", "-p", f"#{{{name}}}").strip()

    def type(self, text: str) -> None:
        self("send-keys", "-l", text)
        self("send-keys", "Enter")

    def wait_for(self, ok, what: str, timeout: float = 60) -> str:
        end = time.monotonic() + timeout
        while True:
            screen = self.screen()
            if ok(screen):
                return screen
            if time.monotonic() > end:
                pytest.fail(f"no {what} within {timeout}s; the screen:\n{screen}")
            time.sleep(0.2)

    def close(self) -> None:
        subprocess.run(["tmux", "-L", self.name, "kill-server"], capture_output=True, timeout=30)


@pytest.fixture
def tmux():
    if shutil.which("tmux") is None:
        if REQUIRE_BPF:
            pytest.fail("tmux is not installed (make setup installs it)")
        pytest.skip("tmux is not installed")
    t = Tmux()
    yield t
    t.close()


def _start_top(tmux: Tmux, loop) -> None:
    tmux.type(f"{PYTHON} -m tracer.cli top -i 0.5 --dev {loop.name}; echo top-exit=$?")
    tmux.wait_for(lambda s: "iotrace top  every 0.5s" in s, "iotrace top screen")
    assert tmux.var("alternate_on") == "1"      # curses took the screen over


def _assert_restored(tmux: Tmux) -> None:
    screen = tmux.wait_for(lambda s: "top-exit=" in s and s.rstrip().endswith(PROMPT.rstrip()), "exit and prompt")
    assert "top-exit=0" in screen and "Traceback" not in screen, screen
    assert tmux.var("alternate_on") == "0" and tmux.var("pane_current_command") == "bash"
    # cooked mode again: curses gave the line discipline back
    tmux.type("echo \"modes: $(stty -a | tr ' ;' '\\n\\n' | grep -xE -- '-?(icanon|echo)' | sort | tr '\\n' ' ')end\"")
    screen = tmux.wait_for(lambda s: re.search(r"^modes: .*end$", s, re.M), "stty output")
    assert re.search(r"^modes: echo icanon end$", screen, re.M), screen


@pytest.mark.bpf
def test_top_in_tmux_shows_the_device_and_quits_on_q(tmux, loop, tmp_path):
    _start_top(tmux, loop)
    stop = tmp_path / "stop"
    load = subprocess.Popen([PYTHON, "-c", LOAD.format(tests=str(TESTS)), loop.path, str(stop)])
    try:
        row = re.compile(rf"^\s*(\d+) (\S+)\s+{loop.name}\s+read\s+(\d+)\s+([\d.]+)\s+4\.0KiB\s+(\S+)\s+(\S+)\s+(\S+)",
                         re.M)
        lat = re.compile(r"^[\d.]+(ns|us|ms|s)$")

        def busy(screen: str) -> bool:
            return any(m.group(1) == str(load.pid) and int(m.group(3)) > 0 and float(m.group(4)) > 0
                       and all(lat.match(m.group(i)) for i in (5, 6, 7)) for m in row.finditer(screen))

        screen = tmux.wait_for(busy, f"a row for pid {load.pid} on {loop.name} with numbers", timeout=30)
        assert "sort: p99" in screen
        tmux("send-keys", "s")      # the sort key changes the header at once
        tmux.wait_for(lambda s: "sort: bytes" in s, "sort: bytes")
    finally:
        stop.touch()
        load.wait(timeout=60)
    tmux("send-keys", "q")
    _assert_restored(tmux)


@pytest.mark.bpf
def test_top_in_tmux_ends_on_ctrl_c(tmux, loop):
    _start_top(tmux, loop)
    tmux("send-keys", "C-c")
    _assert_restored(tmux)


@pytest.mark.bpf
def test_top_interval_count_ends_by_itself_and_leaves_the_last_screen(tmux, loop):
    tmux.type(f"clear; {PYTHON} -m tracer.cli top 0.5 2 --dev {loop.name}; echo top-exit=$?")
    _assert_restored(tmux)
    screen = tmux.screen()
    # printed after curses gave the terminal back: the second screen, an interval's own
    assert "iotrace top  every 0.5s" in screen and "PID COMM" in screen, screen
    assert screen.index("iotrace top") < screen.index("top-exit=0")


@pytest.mark.bpf
def test_top_ends_on_ctrl_c_when_started_with_sigint_ignored(tmux, loop):
    # as from a script's background job: SIGINT ignored from the start, so Python gives no KeyboardInterrupt
    tmux.type(f"(trap '' INT; exec {PYTHON} -m tracer.cli top -i 0.5 --dev {loop.name}); echo top-exit=$?")
    tmux.wait_for(lambda s: "iotrace top  every 0.5s" in s, "iotrace top screen")
    tmux("send-keys", "C-c")
    _assert_restored(tmux)


PARENT_OF_LOAD = """\
import os, sys, time
child = os.fork()
if child == 0:
    os.execv(sys.executable, [sys.executable, "-c", {load!r}, *sys.argv[1:]])
print(child, flush=True)
os.waitpid(child, 0)
"""


@pytest.mark.bpf
def test_top_p_shows_a_child_forked_before_it_started(tmux, loop, tmp_path):
    stop = tmp_path / "stop"
    parent = subprocess.Popen([PYTHON, "-c", PARENT_OF_LOAD.format(load=LOAD.format(tests=str(TESTS))), loop.path,
                               str(stop)], stdout=subprocess.PIPE, text=True)
    try:
        child = int(parent.stdout.readline())
        tmux.type(f"clear; {PYTHON} -m tracer.cli top 0.5 3 -p {parent.pid} --dev {loop.name}; echo top-exit=$?")
        _assert_restored(tmux)
        screen = tmux.screen()
    finally:
        stop.touch()
        parent.wait(timeout=60)
    assert f"pid {parent.pid} (python" in screen and f"and 1 descendant: {child} python" in screen, screen
    assert re.search(rf"^\s*{child} python\s+{loop.name}\s+read\s+[1-9]", screen, re.M), screen
