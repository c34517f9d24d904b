"""Markers from a training loop: label the tracer's dumps by epoch or phase.

    from tracer import marker

    for epoch in marker.epochs(3):            # like range(3): the windows "epoch 1" .. "epoch 3"
        train_one_epoch()
        with marker.phase("checkpoint"):      # inside "epoch 2": the window "epoch 2 / checkpoint"
            save()

    marker.mark("warm-up")                    # closes the dump since the last marker, labelled "warm-up"

A marker *closes* a dump: the tracer drains everything recorded since the
previous marker (or the start) into one dump of kind "marker" carrying the
label.  On top of that this module keeps a stack of open *windows*, so that
they nest as training loops do: begin(label) closes the stretch before it
under the enclosing window's label (f"before {label}" at the top level) and
opens the window; end() closes it under its label.  A window opened inside
another is labelled "outer / inner"; the outer window's I/O before and after
it is dumped under the outer label both times (`iotrace report --by label`
merges dumps that share a label).  epochs() and phase() are made of begin()
and end().  mark(label) is the plain boundary, as `iotrace mark` sends it.

Exact boundaries: every marker waits, by default, for the tracer to confirm
it has closed the dump (a few milliseconds; at most DEFAULT_WAIT seconds), so
I/O issued after the call cannot fall in the dump before it.  Once a tracer
fails to confirm in time, later markers of the process no longer wait unless
asked to (a wedged tracer costs one timeout, not one per epoch); wait=0
sends without waiting.  With no tracer listening nothing waits.

Loop timing: loop_step(seconds) (called by the integrations' batch timers)
adds one step and the time it waited for its batch to every open window;
end() sends them with the window's marker, with the window's wall time.

This module owns the client side and the wire format; tracer/runtime/control.py is
the tracer's side.  It is imported by trainers, without root, bcc or numpy:
standard library only, and nothing from the rest of tracer.  It never raises
into the caller.  With no tracer listening every call is a no-op returning
False, and the first one emits a single MarkerWarning.

Finding the tracer: $IOTRACE_CONTROL (set by `iotrace -- COMMAND` for the
command it runs), else every tracer listening in the run directory
($IOTRACE_RUN_DIR, default /run/iotrace), e.g. one started with --pid: each
marker goes to each of them, and each tracer takes it or refuses it by who
sent it (tracer/runtime/control.py: a --pid or COMMAND tracer only from its
traced tree; a system-wide one from every sender, each sender's windows kept
apart: tracer/pipeline/senders.py), so the markers reach the tracers that
trace the sender and no other.

Wire format (one UNIX datagram, UTF-8 JSON, at most MAX_DATAGRAM bytes):
    {"v": 1, "label": "epoch 3"}
    {"v": 1, "label": "epoch 2 / checkpoint", "enclosing": "epoch 2", "began": 8123.456789,
     "loop": {"data_wait_s": 1.25, "steps": 400, "wall_s": 30.5}}
label: 1..MAX_LABEL printable characters.  enclosing (the label of the
window the closed stretch lies in), began (when the window the stretch
belongs to opened; for a plain mark, when the stretch began: the process's
last marker, or the import of this module; the sender's time.monotonic(),
the machine's CLOCK_MONOTONIC, the tracer's clock too, so that a tracer
attached after it opened knows by how much) and loop are optional: version-1 tracers that
predate them ignore them, as they ignore any unknown key, and a bad one is
left out without losing the marker.  "manual": true says a person sent it
(`iotrace mark`), not a training loop.  "rank" (a whole number, at most
MAX_RANK) says which of several trainers under one launcher sent it:
set_rank(n), else $RANK (torchrun sets it); a tracer then keeps that
sender's windows apart from the other ranks' ("rank 1: epoch 2").
"continues": true (begin() inside an open window) says the window the marker
closes stays open: a window nested in it begins, and the tracer folds the
window's slices before and after it into one dump (tracer.model.slices).
A sender that bound its own socket (to wait) gets {"v": 1, "ack": "epoch 3"} back once the dump is closed: its
next I/O falls in the next dump; or {"v": 1, "refused": "epoch 3", "why":
...} from a tracer that does not take it (an older tracer says nothing).
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
ENV_RANK = "RANK"           # torchrun's, and torch.distributed's env:// rendezvous's
MAX_RANK = 2**20
DEFAULT_RUN_DIR = "/run/iotrace"
SOCKET_SUFFIX = ".sock"
STALE = "stale (its tracer is gone)"      # probe_socket: nothing listens on the socket any more


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


LOOP_KEYS = ("data_wait_s", "steps", "wall_s")


def _loop_json(loop: dict) -> str:
    return (f'{{"data_wait_s": {float(loop["data_wait_s"]):.6f}, "steps": {int(loop["steps"])}, '
            f'"wall_s": {float(loop["wall_s"]):.6f}}}')


def encode(label: str, enclosing: str | None = None, loop: dict | None = None, began: float | None = None,
           manual: bool = False, rank: int | None = None, continues: bool = False) -> bytes:
    """One marker datagram; the optional fields are left out (enclosing first) to keep it in MAX_DATAGRAM;
    `manual`: sent by a person (`iotrace mark`), not by a training loop; `rank`: the sender's, if it has one;
    `continues`: the window it closes stays open (a window nested in it begins)."""
    why = check_label(label)
    if why:
        raise ValueError(why)
    if loop is not None and check_loop(loop):
        raise ValueError(check_loop(loop))
    if rank is not None and check_rank(rank):
        raise ValueError(check_rank(rank))
    head = (f'{{"v": {WIRE_VERSION}, "label": {_json_string(label)}' + (', "manual": true' if manual else "")
            + (f', "rank": {int(rank)}' if rank is not None else "") + (', "continues": true' if continues else ""))
    extras = []
    if enclosing is not None and not check_label(enclosing):
        extras.append(f', "enclosing": {_json_string(enclosing)}')
    if began is not None and not check_began(began):
        extras.append(f', "began": {float(began):.6f}')
    if loop is not None:
        extras.append(f', "loop": {_loop_json(loop)}')
    while True:
        data = (head + "".join(extras) + "}").encode()
        if len(data) <= MAX_DATAGRAM or not extras:
            return data
        extras.pop(0)


MAX_STEPS = 2**53              # a loop's steps: exact as a float, and far beyond any training run
MAX_LOOP_SECONDS = 366 * 86400.0    # a window's wall time or data wait: at most a year


def check_loop(loop: object) -> str | None:
    """Why `loop` is not a {"data_wait_s", "steps", "wall_s"} of numbers in range, or None.

    steps: a whole number 0..MAX_STEPS; the seconds: finite, 0..MAX_LOOP_SECONDS.  Whatever a datagram or a
    file holds (a 900-digit int, NaN, a string), the answer is a reason or None, never an exception.
    """
    if not isinstance(loop, dict):
        return "loop is not an object"
    for key in LOOP_KEYS:
        v = loop.get(key)
        most = MAX_STEPS if key == "steps" else MAX_LOOP_SECONDS
        # int compared with float is exact in Python, whatever the int's size; NaN fails every comparison
        if isinstance(v, bool) or not isinstance(v, int | float) or not 0 <= v <= most:
            return f"loop.{key} is not a number from 0 to {most:g}"
    steps = loop["steps"]
    if not isinstance(steps, int) and not float(steps).is_integer():
        return "loop.steps is not a whole number"
    return None


MAX_BEGAN = float(2**40)      # seconds of CLOCK_MONOTONIC: far beyond any uptime


def check_began(began: object) -> str | None:
    """Why `began` is not a CLOCK_MONOTONIC time in seconds (finite, 0..MAX_BEGAN), or None."""
    if isinstance(began, bool) or not isinstance(began, int | float) or not 0 <= began <= MAX_BEGAN:
        return f"began is not a number of seconds from 0 to {MAX_BEGAN:g}"
    return None


def check_rank(rank: object) -> str | None:
    """Why `rank` is not a whole number 0..MAX_RANK, or None."""
    if isinstance(rank, bool) or not isinstance(rank, int) or not 0 <= rank <= MAX_RANK:
        return f"rank is not a whole number from 0 to {MAX_RANK}"
    return None


def decode_message(data: bytes) -> dict:
    """One datagram as {"label", "enclosing", "began", "loop", "manual", "rank", "continues", "ignored"} (the
    optional ones None (manual, continues: False) when absent or
    bad, "ignored" saying which bad ones were left out and why); ValueError saying what is wrong with a
    datagram that is no marker at all.  Nothing else is raised, whatever `data` holds."""
    import json

    if not isinstance(data, bytes | bytearray):
        raise ValueError("not bytes")
    if len(data) > MAX_DATAGRAM:
        raise ValueError(f"longer than {MAX_DATAGRAM} bytes")
    try:
        msg = json.loads(bytes(data).decode())
    except (UnicodeDecodeError, ValueError, RecursionError):
        raise ValueError("not UTF-8 JSON") from None
    if not isinstance(msg, dict):
        raise ValueError("not a JSON object")
    version = msg.get("v")
    if type(version) is not int or version != WIRE_VERSION:     # not true, not 1.0
        raise ValueError(f"unsupported version {str(version)[:20]!r} (this tracer speaks {WIRE_VERSION})")
    label = msg.get("label")
    why = check_label(label)
    if why:
        raise ValueError(why)
    ignored = []        # the optional fields left out, and why: the marker itself still counts
    enclosing = msg.get("enclosing")
    if enclosing is not None and (why := check_label(enclosing)):
        ignored.append(f"enclosing: {why}")
        enclosing = None
    began = msg.get("began")
    if began is not None and (why := check_began(began)):
        ignored.append(why)
        began = None
    loop = msg.get("loop")
    if loop is not None and (why := check_loop(loop)):
        ignored.append(why)
        loop = None
    rank = msg.get("rank")
    if rank is not None and (why := check_rank(rank)):
        ignored.append(why)
        rank = None
    return {"rank": rank, "label": label, "enclosing": enclosing, "began": None if began is None else float(began),
            "continues": msg.get("continues") is True,
            "loop": None if loop is None else {"data_wait_s": float(loop["data_wait_s"]), "steps": int(loop["steps"]),
                                               "wall_s": float(loop["wall_s"])},
            "manual": msg.get("manual") is True, "ignored": ignored}


def decode(data: bytes) -> str:
    """The label of one datagram; ValueError saying what is wrong with a bad one."""
    return decode_message(data)["label"]


def encode_ack(label: str) -> bytes:
    return f'{{"v": {WIRE_VERSION}, "ack": {_json_string(label)}}}'.encode()


def encode_refusal(label: str, why: str) -> bytes:
    why = _json_string(clean_label(why))
    return f'{{"v": {WIRE_VERSION}, "refused": {_json_string(label)}, "why": {why}}}'.encode()


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
            return STALE
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


def find_tracers() -> tuple[list[str], str]:
    """(the socket paths to send to, where they came from or why there are none): $IOTRACE_CONTROL's, else
    every tracer listening in the run directory (each takes or refuses a marker by its sender)."""
    path = os.environ.get(ENV_CONTROL)
    if path:
        return [path], f"${ENV_CONTROL}"
    live = [p for _pid, p, why in scan() if why is None]
    if live:
        return live, f"the tracer{'s' if len(live) > 1 else ''} in {run_dir()}"
    return [], f"{ENV_CONTROL} is not set and no tracer listens in {run_dir()}"


class Refused(Exception):
    """The tracer does not take markers from this process (its reason is the message)."""


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


def send(label: str, path: str, wait: float = 0.0, enclosing: str | None = None, loop: dict | None = None,
         began: float | None = None, manual: bool = False, rank: int | None = None,
         continues: bool = False) -> bool:
    """Send one marker to the socket at `path`; with wait > 0, wait that long for the ack.

    Raises OSError if it cannot be sent, Refused if the tracer answered that it does not take it;
    returns whether it was confirmed (always True without waiting, once sent).
    """
    data = encode(label, enclosing, loop, began, manual, rank, continues)
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
            if isinstance(reply, dict) and reply.get("refused") == label:
                raise Refused(clean_label(reply.get("why", "refused")))
    return False


DEFAULT_WAIT = 2.0      # seconds a marker waits for the tracer's confirmation unless told otherwise
_unconfirmed = False    # a tracer failed to confirm in time: default waits are off for this process
# when this process's last marker was sent (CLOCK_MONOTONIC; at first, when this module was imported): where the
# stretch a plain marker closes began, sent as its "began"
_last_sent = time.monotonic()


def _wait_for(wait: float | None) -> float:
    if wait is not None:
        return wait
    return 0.0 if _unconfirmed else DEFAULT_WAIT


def mark(label: object, wait: float | None = None) -> bool:
    """Close the tracer's current dump, labelled `label`; True if the tracer got it (and confirmed it).

    The dump says which window encloses it (current()).  Never raises.  By
    default waits for the tracer to confirm it has closed the dump
    (milliseconds; at most DEFAULT_WAIT s, and after one time-out no more by
    default), so that I/O issued after mark() returns lands in the next dump.
    wait=0: one non-blocking datagram, which the tracer acts on a few
    milliseconds later.  Labels are made printable and cut at MAX_LABEL
    characters.
    """
    try:
        return _send_marker(label, wait, current())
    except Exception as exc:  # noqa: BLE001 - a marker must never break the training loop
        _warn(f"marker not sent: {exc!r}")
        return False


def _send_marker(label: object, wait: float | None, enclosing: str | None, loop: dict | None = None,
                 began: float | None = None, continues: bool = False) -> bool:
    """To every tracer found (find_tracers); True if one took it (and confirmed it, when waited for).
    `began`: when the window it closes opened; None: it closes the stretch since this process's last marker."""
    global _last_sent
    try:
        text = clean_label(label)
        now = time.monotonic()
        began, _last_sent = (_last_sent if began is None else began), now
        paths, where = find_tracers()
        if not paths:
            _warn(where)
            return False
        wait = _wait_for(wait)
        results = [_send_one(text, path, where, wait, enclosing, loop, began, continues) for path in paths]
        refused = [r for r in results if isinstance(r, str)]
        if refused and len(refused) == len(results):    # none takes it: say why, once
            _warn(f"no tracer takes markers from this process ({'; '.join(refused)}); marker {text!r} dropped")
        return any(r is True for r in results)
    except Exception as exc:  # noqa: BLE001 - a marker must never break the training loop
        _warn(f"marker not sent: {exc!r}")
        return False


def _send_one(text: str, path: str, where: str, wait: float, enclosing: str | None, loop: dict | None,
              began: float | None, continues: bool = False) -> bool | str:
    """True: taken (confirmed, when waited for); False: lost or unconfirmed (said); a str: refused, why."""
    global _unconfirmed
    try:
        confirmed = send(text, path, wait, enclosing, loop, began, rank=get_rank(), continues=continues)
    except Refused as exc:
        return str(exc)
    except BlockingIOError:
        _warn(f"the tracer at {path} ({where}) is not keeping up; marker {text!r} dropped")
        return False
    except OSError as exc:
        _warn(f"cannot reach the tracer at {path} ({where}): {exc.strerror or exc}")
        return False
    if not confirmed:
        _unconfirmed = True
        _warn(f"the tracer at {path} did not confirm marker {text!r} within {wait:g} s; "
              f"later markers do not wait for it")
    return confirmed


# ---- which trainer this is, under a launcher ---------------------------------

_rank: int | None = None      # set_rank's; a forked child (a loader) keeps it, and sends as that rank


def set_rank(rank: int) -> None:
    """Say which rank this process is (torch.multiprocessing.spawn passes it as an argument; torchrun sets
    $RANK, read without this): its markers carry it, and the tracer names its windows "rank N: ..."."""
    global _rank
    if check_rank(rank) is None:
        _rank = int(rank)
    else:
        _warn(f"set_rank({rank!r}) ignored: {check_rank(rank)}")


def get_rank() -> int | None:
    """This process's rank: set_rank's, else $RANK's if it is a whole number, else None."""
    if _rank is not None:
        return _rank
    env = os.environ.get(ENV_RANK, "")
    if env.isascii() and env.isdigit() and int(env) <= MAX_RANK:
        return int(env)
    return None


# ---- windows that nest -------------------------------------------------------

class _Window:
    """An open window: its full label ("epoch 2 / checkpoint"), when it opened (the loop's clock, and
    CLOCK_MONOTONIC for the tracer: "began"), and the loop's steps in it."""

    __slots__ = ("label", "opened", "began", "data_wait_s", "steps")

    def __init__(self, label: str):
        self.label = label
        self.opened = time.perf_counter()
        self.began = time.monotonic()
        self.data_wait_s = 0.0
        self.steps = 0

    def loop(self) -> dict | None:
        if not self.steps:
            return None
        # held within what check_loop takes, so that a window open for more than a year still sends its marker
        return {"data_wait_s": min(self.data_wait_s, MAX_LOOP_SECONDS), "steps": min(self.steps, MAX_STEPS),
                "wall_s": min(max(0.0, time.perf_counter() - self.opened), MAX_LOOP_SECONDS)}


_windows: tuple[int, list[_Window]] = (0, [])    # (pid, stack): a forked child starts with none open


def _stack() -> list[_Window]:
    global _windows
    if _windows[0] != os.getpid():
        _windows = (os.getpid(), [])
    return _windows[1]


def current() -> str | None:
    """The label of the innermost open window, or None at the top level."""
    stack = _stack()
    return stack[-1].label if stack else None


def depth() -> int:
    """How many windows are open (end(depth=...) closes down to that many)."""
    return len(_stack())


def nested_label(label: object, enclosing: str | None) -> str:
    """The full label of a window named `label` opened inside `enclosing` (None: the top level)."""
    text = clean_label(label)
    return text if enclosing is None else clean_label(f"{enclosing} / {text}")


def begin(label: object, wait: float | None = None, split: bool = True) -> bool:
    """Open the window `label` inside the current one (its full label is "outer / label").

    split: first close the stretch since the last marker, under the enclosing
    window's label (f"before {label}" at the top level), so that it is not
    counted in the new window; split=False lets the new window take it (for a
    window that follows a sibling at once, as epochs do).
    """
    try:
        stack = _stack()
        enclosing = stack[-1].label if stack else None
        full = nested_label(label, enclosing)
        sent = True
        if split:
            outer = enclosing if enclosing is not None else clean_label(f"before {full}")
            # inside a window, that window stays open around the new one: "continues" lets the tracer fold
            # its slices before and after into one dump (tracer.model.slices)
            sent = _send_marker(outer, wait, stack[-2].label if len(stack) > 1 else None,
                                began=stack[-1].began if stack else None, continues=bool(stack))
        stack.append(_Window(full))
        return sent
    except Exception as exc:  # noqa: BLE001 - a marker must never break the training loop
        _warn(f"marker not sent: {exc!r}")
        return False


def end(wait: float | None = None, depth: int | None = None) -> bool:
    """Close the innermost open window: its stretch since the last marker is dumped under its label,
    with the loop's steps in it (loop_step) if there were any.  False (and nothing sent) if none is open.

    depth: close windows until only that many are open (inner ones a caller left open first), as
    phase() and epochs() do for the window they opened.
    """
    try:
        stack = _stack()
        if not stack:
            return False
        ok = True
        keep = len(stack) - 1 if depth is None else max(0, depth)
        while len(stack) > keep:
            w = stack.pop()
            ok = _send_marker(w.label, wait, stack[-1].label if stack else None, w.loop(), w.began) and ok
        return ok
    except Exception as exc:  # noqa: BLE001 - a marker must never break the training loop
        _warn(f"marker not sent: {exc!r}")
        return False


def loop_step(data_wait_s: float) -> None:
    """One step of the training loop, which waited `data_wait_s` seconds for its batch: counted in every
    open window (sent with each window's end marker as "loop")."""
    if not data_wait_s >= 0:
        return
    for w in _stack():
        w.data_wait_s += data_wait_s
        w.steps += 1


@contextlib.contextmanager
def phase(label: object, wait: float | None = None) -> Iterator[None]:
    """The I/O inside the block is the window `label`, nested in the current one.

    On entry closes what ran since the last marker under the enclosing
    window's label (f"before {label}" at the top level); on exit, also by an
    exception, closes the phase under its full label ("epoch 2 / checkpoint"
    inside "epoch 2").  The enclosing window's I/O after the block is
    dumped under its label again when it ends.
    """
    outer = depth()
    begin(label, wait)
    try:
        yield
    finally:
        end(wait, outer)


def epochs(n: int, label: str = "epoch {n}", wait: float | None = None) -> Iterator[int]:
    """range(n) whose k-th body is the window label.format(n=k) (k from 1, as Keras counts).

        for epoch in epochs(10):     # epoch = 0..9, as with range(10)
            train(epoch)             # each epoch's I/O is the dump "epoch 1" .. "epoch 10"

    What ran before the loop is closed first (as "before epoch 1" at the top
    level); each epoch's window then takes everything up to the end of its
    body, phases inside it being windows of their own.  An epoch left by
    break or an exception is closed there, under its own label.
    """
    for i in range(n):
        try:
            text = label.format(n=i + 1)
        except Exception:  # noqa: BLE001 - a bad format string must not stop training
            text = f"{label} {i + 1}"
        outer = depth()
        begin(text, wait, split=i == 0)
        try:
            yield i
        finally:
            end(wait, outer)
