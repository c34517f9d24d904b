"""`iotrace mark LABEL`: close the running tracer's dump, labelled (no root: the socket belongs to the sudo user)."""

from __future__ import annotations

import argparse
import os
import sys
from typing import TextIO

from tracer import marker
from tracer.errors import UserError
from tracer.options import Parser, wait_seconds
from tracer.text import safe


def _cmdline(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            words = f.read().split(b"\0")
    except OSError:
        return "?"
    text = " ".join(w.decode(errors="replace") for w in words if w)
    return text if len(text) <= 60 else text[:57] + "..."


def resolve(control: str | None) -> str:
    """The socket to send to: --control, $IOTRACE_CONTROL, or the one tracer running."""
    for path, what in ((control, "--control"), (os.environ.get(marker.ENV_CONTROL), f"${marker.ENV_CONTROL}")):
        if path:
            why = marker.probe_socket(path)
            if why:
                raise UserError(f"{what} {path}: {why}" + ("; is the tracer still running?" if "stale" in why
                                                            or "no such" in why else ""))
            return path
    directory = marker.run_dir()
    found = marker.scan(directory)
    live = [(pid, path) for pid, path, why in found if why is None]
    if len(live) == 1:
        return live[0][1]
    if len(live) > 1:
        names = "; ".join(f"pid {pid} ({_cmdline(pid)}) at {path}" for pid, path in live)
        raise UserError(f"{len(live)} tracers are running: {names}. Choose one with --control PATH")
    denied = [(pid, path) for pid, path, why in found if why == "not writable by you"]
    if denied:
        pid, path = denied[0]
        hint = "run 'sudo iotrace mark ...'" if os.geteuid() else "check its permissions"
        raise UserError(f"the tracer (pid {pid}) at {path} does not take markers from you: {hint}")
    raise UserError(f"no tracer is running (no control socket in {directory}): start one with "
                    "'sudo iotrace ...', or give its socket with --control PATH")


def run(argv: list[str], out: TextIO = sys.stdout) -> int:

    p = Parser(prog="iotrace mark", formatter_class=argparse.RawDescriptionHelpFormatter,
                description="Close a running tracer's current dump, labelled LABEL (kind 'marker' in the "
                            "JSONL), e.g. at the end of an epoch. No root needed: the tracer's control socket "
                            "is writable by the user who started it with sudo.",
                epilog="the tracer is found from --control, else $IOTRACE_CONTROL (set for a command run\n"
                       "as 'iotrace -- COMMAND'), else the only tracer listening in $IOTRACE_RUN_DIR\n"
                       f"(default {marker.DEFAULT_RUN_DIR}).\n\n"
                       "examples:\n"
                       "  iotrace mark 'epoch 3'\n"
                       "  iotrace mark --control /run/iotrace/1234.sock 'checkpoint 3'\n\n"
                       "from Python: tracer.marker.epochs(), marker.phase() (windows that nest), marker.mark();\n"
                       "Keras: tracer.integrations.keras.IOTraceCallback; PyTorch: tracer.integrations.torch")
    p.add_argument("label", metavar="LABEL", help=f"the dump's label (printable, up to {marker.MAX_LABEL} characters)")
    p.add_argument("--control", metavar="PATH", help="the tracer's control socket (printed when it starts)")
    p.add_argument("--wait", type=wait_seconds, default=2.0, metavar="SECONDS",
                   help="wait this long for the tracer to confirm the dump is closed, so that I/O started "
                        "afterwards falls in the next dump (default 2; 0: do not wait)")
    ns = p.parse_args(argv)
    why = marker.check_label(ns.label)
    if why:
        raise UserError(f"bad LABEL: {why}")
    path = resolve(ns.control)
    try:
        confirmed = marker.send(ns.label, path, ns.wait, manual=True)
    except BlockingIOError:
        raise UserError(f"the tracer at {path} is not keeping up (its queue is full): try again") from None
    except OSError as exc:
        raise UserError(f"cannot send to {path}: {exc.strerror or exc}") from None
    if ns.wait > 0 and not confirmed:
        print(safe(f"iotrace: marker {ns.label!r} sent to {path}, but the tracer did not confirm it within "
                   f"{ns.wait:g} s (busy?); its dump will be closed late"), file=sys.stderr)
    else:
        print(safe(f"iotrace: marked {ns.label!r} ({path})"), file=out)
    return 0
