"""Markers from a training loop: label the tracer's dumps by epoch or phase.

    from tracer import marker

    for epoch in marker.epochs(3):        # like range(3); marks "epoch 1", "epoch 2", "epoch 3"
        train_one_epoch()

    marker.mark("warm-up")                # closes the dump since the last marker, labelled "warm-up"
    with marker.phase("checkpoint 3"):    # the I/O inside the block is the dump "checkpoint 3"
        save()

A marker *closes* a dump: the tracer drains everything recorded since the
previous marker (or the start) into one dump of kind "marker" carrying the
label.  So mark(label) belongs at the END of the stretch it names; phase()
marks f"before {label}" on entry (closing whatever ran before it into a dump
of its own) and label on exit.

This module owns the client side and the wire format; tracer/control.py is
the tracer's side.  It is imported by trainers, without root, bcc or numpy:
standard library only, and nothing from the rest of tracer.  It never raises
into the caller and never blocks (one non-blocking datagram) unless asked to
wait for the tracer's confirmation.  With no tracer listening every call is a
no-op returning False, and the first one emits a single MarkerWarning.

Finding the tracer: $IOTRACE_CONTROL (set by `iotrace -- COMMAND` for the
command it runs), else the one tracer listening in the run directory
($IOTRACE_RUN_DIR, default /run/iotrace), e.g. one started with --pid.

Wire format (one UNIX datagram, UTF-8 JSON, at most MAX_DATAGRAM bytes):
    {"v": 1, "label": "epoch 3"}
label: 1..MAX_LABEL printable characters.  Unknown keys are ignored, so later
versions can add fields.  A sender that bound its own socket (to wait) gets
{"v": 1, "ack": "epoch 3"} back once the dump is closed: its next I/O falls
in the next dump.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import socket
import sys
import time
import warnings
from collections.abc import Iterator

WIRE_VERSION = 1
MAX_DATAGRAM = 1024
MAX_LABEL = 200
ENV_CONTROL = "IOTRACE_CONTROL"
ENV_RUN_DIR = "IOTRACE_RUN_DIR"
DEFAULT_RUN_DIR = "/run/iotrace"
SOCKET_SUFFIX = ".sock"


class MarkerWarning(RuntimeWarning):
    """The marker could not reach a tracer (emitted once per process)."""


# ---- wire format -------------------------------------------------------------

def check_label(label: str) -> str | None:
    """Why `label` cannot be sent, or None if it can."""
    if not isinstance(label, str):
        return f"a label must be a string, not {type(label).__name__}"
    if not label.strip():
        return "the label is empty"
    if len(label) > MAX_LABEL:
        return f"the label has {len(label)} characters, more than {MAX_LABEL}"
    if not label.isprintable():
        # labels reach the tracer's terminal: no escape sequences, no newlines
        return "the label has control characters (newlines, tabs, escapes)"
    return None


def clean_label(label: object) -> str:
    """Any object made into a sendable label, as far as that goes: str(), unprintables to '?', cut."""
    text = label if isinstance(label, str) else str(label)
    text = "".join(c if c.isprintable() else "?" for c in text)[:MAX_LABEL]
    return text if text.strip() else "?"


def _json_string(text: str) -> str:
    # text is printable (check_label): only the quote and the backslash need escaping; this
    # spares trainers the import of json
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


def encode(label: str) -> bytes:
    why = check_label(label)
    if why:
        raise ValueError(why)
    return f'{{"v": {WIRE_VERSION}, "label": {_json_string(label)}}}'.encode()


def decode(data: bytes) -> str:
    """The label of one datagram; ValueError saying what is wrong with a bad one."""
    import json

    if len(data) > MAX_DATAGRAM:
        raise ValueError(f"longer than {MAX_DATAGRAM} bytes")
    try:
        msg = json.loads(data.decode())
    except (UnicodeDecodeError, ValueError):
        raise ValueError("not UTF-8 JSON") from None
    if not isinstance(msg, dict):
        raise ValueError("not a JSON object")
    if msg.get("v") != WIRE_VERSION:
        raise ValueError(f"unsupported version {msg.get('v')!r} (this tracer speaks {WIRE_VERSION})")
    label = msg.get("label")
    why = check_label(label)
    if why:
        raise ValueError(why)
    return label


def encode_ack(label: str) -> bytes:
    return f'{{"v": {WIRE_VERSION}, "ack": {_json_string(label)}}}'.encode()


# ---- finding the tracer ------------------------------------------------------

def run_dir() -> str:
    return os.environ.get(ENV_RUN_DIR) or DEFAULT_RUN_DIR


@contextlib.contextmanager
def _dgram() -> Iterator[socket.socket]:
    s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    try:
        yield s
    finally:
        s.close()


def probe_socket(path: str) -> str | None:
    """None if a tracer listens on `path` and we may write to it, else why not (one phrase)."""
    with _dgram() as s:
        try:
            s.connect(path)
        except FileNotFoundError:
            return "no such socket"
        except ConnectionRefusedError:
            return "stale (its tracer is gone)"
        except PermissionError:
            return "not writable by you"
        except OSError as exc:
            return exc.strerror or str(exc)
    return None


def scan(directory: str | None = None) -> list[tuple[int, str, str | None]]:
    """Tracers' sockets in the run directory: (pid, path, None or why it cannot be used)."""
    directory = directory or run_dir()
    try:
        names = os.listdir(directory)
    except OSError:
        return []
    out = []
    for name in sorted(names):
        stem = name[:-len(SOCKET_SUFFIX)]
        if name.endswith(SOCKET_SUFFIX) and stem.isdigit():
            path = os.path.join(directory, name)
            out.append((int(stem), path, probe_socket(path)))
    return out


def find_tracer() -> tuple[str | None, str]:
    """(socket path or None, where it came from or why there is none)."""
    path = os.environ.get(ENV_CONTROL)
    if path:
        return path, f"${ENV_CONTROL}"
    found = scan()
    live = [(pid, p) for pid, p, why in found if why is None]
    if len(live) == 1:
        return live[0][1], f"the tracer in {run_dir()}"
    if live:
        return None, (f"{len(live)} tracers listen in {run_dir()} (pids {', '.join(str(p) for p, _ in live)}): "
                      f"set {ENV_CONTROL} to one of their sockets")
    return None, f"{ENV_CONTROL} is not set and no tracer listens in {run_dir()}"


# ---- sending -----------------------------------------------------------------

_warned = False
_cached: tuple[int, socket.socket] | None = None   # (pid, socket): a forked child makes its own


def _warn(message: str) -> None:
    """The one MarkerWarning of this process; later problems are silent."""
    global _warned
    if _warned:
        return
    _warned = True
    text = f"iotrace marker: {message} (further marker problems in this process are not reported)"
    try:
        warnings.warn(text, MarkerWarning, stacklevel=3)
    except Exception:  # noqa: BLE001 - `-W error` makes it an exception: never into the training loop
        with contextlib.suppress(Exception):
            print(f"warning: {text}", file=sys.stderr)


def _sender() -> socket.socket:
    global _cached
    if _cached is None or _cached[0] != os.getpid():
        s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        s.setblocking(False)
        atexit.register(s.close)
        _cached = (os.getpid(), s)
    return _cached[1]


def send(label: str, path: str, wait: float = 0.0) -> bool:
    """Send one marker to the socket at `path`; with wait > 0, wait that long for the ack.

    Raises OSError if it cannot be sent; returns whether it was confirmed
    (always True without waiting, once sent).
    """
    data = encode(label)
    if wait <= 0:
        _sender().sendto(data, path)
        return True
    import json
    import select

    with _dgram() as s:
        s.bind("")          # Linux autobind: an abstract address the tracer can answer
        s.setblocking(False)
        s.sendto(data, path)
        deadline = time.monotonic() + wait
        while (left := deadline - time.monotonic()) > 0:
            if not select.select([s], [], [], left)[0]:
                break
            try:
                reply = json.loads(s.recv(MAX_DATAGRAM).decode())
            except (BlockingIOError, UnicodeDecodeError, ValueError):
                continue
            if isinstance(reply, dict) and reply.get("ack") == label:
                return True
    return False


def mark(label: object, wait: float = 0.0) -> bool:
    """Close the tracer's current dump, labelled `label`; True if the tracer got it.

    Never raises and never blocks: one non-blocking datagram.  wait > 0
    waits up to that many seconds for the tracer to confirm it has closed
    the dump, so that I/O issued after mark() returns lands in the next
    dump (a marker that is not waited for takes effect a few milliseconds
    later).  Labels are made printable and cut at MAX_LABEL characters.
    """
    try:
        text = clean_label(label)
        path, where = find_tracer()
        if path is None:
            _warn(where)
            return False
        try:
            confirmed = send(text, path, wait)
        except BlockingIOError:
            _warn(f"the tracer at {path} ({where}) is not keeping up; marker {text!r} dropped")
            return False
        except OSError as exc:
            _warn(f"cannot reach the tracer at {path} ({where}): {exc.strerror or exc}")
            return False
        if not confirmed:
            _warn(f"the tracer at {path} did not confirm marker {text!r} within {wait:g} s")
        return confirmed
    except Exception as exc:  # noqa: BLE001 - a marker must never break the training loop
        _warn(f"marker not sent: {exc!r}")
        return False


@contextlib.contextmanager
def phase(label: object, wait: float = 0.0) -> Iterator[None]:
    """The I/O inside the block becomes the dump `label`.

    On entry marks f"before {label}" (what ran since the last marker gets a
    dump of its own, not mixed into the phase); on exit, also by an
    exception, marks `label`.
    """
    text = clean_label(label)
    mark(f"before {text}", wait)
    try:
        yield
    finally:
        mark(text, wait)


def epochs(n: int, label: str = "epoch {n}", wait: float = 0.0) -> Iterator[int]:
    """range(n) that marks label.format(n=k) after the k-th body completes (k from 1, as Keras counts).

        for epoch in epochs(10):     # epoch = 0..9, as with range(10)
            train(epoch)             # each epoch's I/O is the dump "epoch 1" .. "epoch 10"

    An epoch left by break or an exception is not marked: its I/O goes to
    the next dump (the final one, if nothing follows).
    """
    for i in range(n):
        yield i
        try:
            text = label.format(n=i + 1)
        except Exception:  # noqa: BLE001 - a bad format string must not stop training
            text = f"{label} {i + 1}"
        mark(text, wait)
