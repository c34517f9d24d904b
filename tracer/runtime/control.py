"""The tracer's control socket (`iotrace mark`, tracer.cli.mark, and tracer.marker write to it).

While tracing, iotrace listens on a UNIX datagram socket,
$IOTRACE_RUN_DIR/PID.sock (default /run/iotrace/PID.sock; a private temp dir
when that cannot be used), prints its path, and exports it to a traced
COMMAND as $IOTRACE_CONTROL.  Each datagram is a marker (wire format in
tracer/marker.py); the trace loop turns each one into a dump of kind
"marker" carrying its label, the label of the window enclosing it
("enclosing", null for a plain `iotrace mark`) and the training loop's
timing ("loop") when the marker brought one.

Who may write: the socket is mode 0600, owned by the user who ran sudo
(SUDO_UID, the user a traced COMMAND runs as), else by the tracer's own
user; root can always write.  Other users on the box cannot add markers to
a root tracer (each marker makes a dump, a table and a line in the output
file, so an open socket would let anyone flood them).  A trainer running as
yet another user needs the tracer started by sudo from that user's account.

Whose markers: a marker closes windows, so one sent by an unrelated job
must not cut this one's.  SenderGate is the rule, by the sender's pid the
kernel gives (SCM_CREDENTIALS): a tracer with --pid or a COMMAND takes a
training loop's markers only from a process it traces (its pid filter); a
system-wide tracer takes every sender's.  Several senders (ranks under one
launcher, two jobs under a system-wide tracer) each get windows of their own
processes (tracer.pipeline.senders), so none cuts another's.  `iotrace mark`
(a person's, "manual") is always taken and cuts every window.  A refused
sender that waits is told so ({"refused": label, "why": ...}): it does not
wait for a confirmation that will not come.  A sender that is gone by the
time its marker is read cannot be checked; it is taken.

Imports nothing heavy: `iotrace mark` must start fast and without bcc or numpy.
"""

from __future__ import annotations

import os
import pwd
import shutil
import socket
import stat
import struct
import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass

from tracer import marker
from tracer.model.sections import Enclosing, Loop, Owner, Section, SenderPid
from tracer.sources.proctree import stat_of
from tracer.text import safe

BAD_MESSAGES_SHOWN = 3     # then bad messages are only counted
_CRED = struct.Struct("iII")                # struct ucred: pid, uid, gid
_CRED_SPACE = socket.CMSG_SPACE(_CRED.size)


def _sender_pid(ancillary: list) -> int | None:
    """The sending process's pid from SCM_CREDENTIALS, if the kernel attached it."""
    for level, kind, data in ancillary:
        if level == socket.SOL_SOCKET and kind == socket.SCM_CREDENTIALS and len(data) >= _CRED.size:
            pid = _CRED.unpack_from(data)[0]
            return pid if pid > 0 else None
    return None


@dataclass
class Marker:
    """One marker as received: its label, and the sender's address if it waits for an ack;
    the enclosing window's label and the loop's timing if the sender gave them."""

    label: str
    reply_to: bytes | str | None = None
    enclosing: str | None = None
    loop: dict | None = None
    sender_pid: int | None = None   # from the kernel (SCM_CREDENTIALS), in the tracer's pid namespace
    began: float | None = None      # when the sender's window opened (CLOCK_MONOTONIC s), if it said
    manual: bool = False            # sent by `iotrace mark` (a person), not a training loop
    rank: int | None = None         # the rank the sender said it is (tracer.marker.set_rank, $RANK)
    continues: bool = False         # the window it closes stays open around a nested one (tracer.model.slices)

    def owner(self) -> Owner | None:
        """The training loop whose windows this marker closes (None: a person's `iotrace mark`, or no pid)."""
        return None if self.manual or not self.sender_pid else Owner(self.sender_pid, self.rank)

    def sections(self) -> tuple[Section, ...]:
        """What the marker adds to its dump, beside the label (tracer.model.sections)."""
        return (Enclosing(self.enclosing), *((Loop.from_json(self.loop),) if self.loop else ()),
                *((SenderPid(self.sender_pid),) if self.sender_pid else ()))

    def dump_fields(self) -> dict:
        """The same as its dump's JSON line holds them."""
        return {s.key: s.to_json() for s in self.sections()}


def _started(pid: int) -> int | None:
    """When process `pid` started (clock ticks after boot: with the pid, it tells processes apart), None if gone."""
    try:
        return stat_of(pid).start_ticks
    except (OSError, ValueError):
        return None


class SenderGate:
    """Whose markers a tracer takes (see the module docstring); `traced()`: the pids the tracer traces, or
    None for a tracer of every process."""

    SAID = 3        # senders whose refusal is said on stderr; later ones only counted

    def __init__(self, traced: Callable[[], set[int]] | None = None):
        self.traced = traced
        self.refused: dict[int, int] = {}              # sender pid -> markers refused

    def refuses(self, m: Marker) -> str | None:
        """Why `m` is not taken, or None."""
        pid = m.sender_pid
        if m.manual or pid is None or self.traced is None:
            return None
        if _started(pid) is not None and pid not in self.traced():
            return f"pid {pid} is not in the process tree this tracer traces"
        return None

    def note(self, m: Marker, why: str) -> None:
        """One line on stderr the first time a sender is refused (for the first SAID senders)."""
        pid = m.sender_pid or 0
        self.refused[pid] = self.refused.get(pid, 0) + 1
        if self.refused[pid] == 1 and len(self.refused) <= self.SAID:
            more = "; further refused senders are not named" if len(self.refused) == self.SAID else ""
            print(safe(f"iotrace: marker {m.label!r} refused: {why}{more}"), file=sys.stderr, flush=True)


def _usable_run_dir(directory: str) -> bool:
    """Our own (or root's) real directory that nobody else can write to.

    Made if missing, but under sudo only the default one: a $IOTRACE_RUN_DIR that sudo kept would have
    root create whatever directories the invoking user named (an existing one is used only if root's)."""
    try:
        if not os.path.lexists(directory):
            if os.environ.get("SUDO_UID") and os.path.abspath(directory) != marker.DEFAULT_RUN_DIR:
                return False
            os.makedirs(directory, exist_ok=True)
            os.chmod(directory, 0o755)      # whatever our umask: the sudo user must reach the socket
        st = os.lstat(directory)
    except OSError:
        return False
    return (stat.S_ISDIR(st.st_mode) and st.st_uid in (0, os.geteuid())
            and not st.st_mode & (stat.S_IWGRP | stat.S_IWOTH) and os.access(directory, os.W_OK | os.X_OK))


def remove_stale(directory: str, owner: pwd.struct_passwd | None = None) -> list[str]:
    """Remove the sockets of tracers that died without removing them (SIGKILL, a crash); returns their paths.

    Only in the run directory iotrace uses, only PID.sock entries that are
    sockets themselves (lstat: a symlink is left alone), owned by root, by
    us or by `owner` (a sudo tracer gives its socket to the sudo user), and
    only when nothing listens on them any more: connecting is refused.
    """
    removed = []
    uids = {0, os.geteuid()} | ({owner.pw_uid} if owner else set())
    for _pid, path, why in marker.scan(directory):
        if why != marker.STALE:
            continue
        try:
            st = os.lstat(path)
            if stat.S_ISSOCK(st.st_mode) and st.st_uid in uids:
                os.unlink(path)
                removed.append(path)
        except OSError:
            continue        # gone meanwhile, or not ours to remove
    return removed


class ControlSocket:
    """The tracer's end: bound, non-blocking, removed by close()."""

    def __init__(self, sock: socket.socket, path: str, private_dir: str | None):
        self.gate: SenderGate | None = None     # whose markers are taken; None: anyone's
        self.sock = sock
        self.path = path
        self.private_dir = private_dir
        self.bad = 0            # malformed datagrams, ignored
        self.bad_fields = 0     # markers taken with a bad optional field (enclosing, loop) left out
        self.complaints = 0     # lines said on stderr about either
        self.received = 0

    @classmethod
    def open(cls, owner: pwd.struct_passwd | None = None, directory: str | None = None) -> ControlSocket:
        """Bind PID.sock in the run directory (or a private temp dir), writable by root and `owner` only."""
        directory = directory or marker.run_dir()
        private = None
        if _usable_run_dir(directory):
            remove_stale(directory, owner)
        else:
            private = directory = tempfile.mkdtemp(prefix="iotrace-")
            if owner:
                os.chmod(directory, 0o711)   # the owner may reach the socket, not list the dir
        path = os.path.join(directory, f"{os.getpid()}{marker.SOCKET_SUFFIX}")
        if os.path.lexists(path) and marker.probe_socket(path) is not None:
            os.unlink(path)     # left by a tracer that was killed and had our pid
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        old = os.umask(0o177)   # the socket file is 0600 from the moment it exists
        try:
            sock.bind(path)
        except OSError:
            sock.close()
            if private:
                shutil.rmtree(private, ignore_errors=True)
            raise
        finally:
            os.umask(old)
        try:
            if owner:
                os.chown(path, owner.pw_uid, owner.pw_gid)
            sock.setblocking(False)
            # the kernel tells each datagram's sender: the trainer, whose rows the verdict tells apart
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_PASSCRED, 1)
        except OSError:
            sock.close()
            os.unlink(path)
            raise
        return cls(sock, path, private)

    def fileno(self) -> int:
        return self.sock.fileno()

    def receive(self, limit: int = 256) -> list[Marker]:
        """Every marker queued now (at most `limit`), in order; bad datagrams are counted and skipped."""
        out: list[Marker] = []
        while len(out) < limit:
            try:
                data, ancillary, _flags, addr = self.sock.recvmsg(marker.MAX_DATAGRAM + 1, _CRED_SPACE)
            except (BlockingIOError, InterruptedError):
                break
            except OSError as exc:      # never let the socket end the trace
                self._complain(f"cannot read the control socket: {exc.strerror or exc}")
                break
            try:
                msg = marker.decode_message(data)
            except ValueError as exc:
                self._complain(f"ignored a bad control message ({exc})")
                continue
            except Exception as exc:  # noqa: BLE001 - a datagram, whatever it holds, never ends the trace
                self._complain(f"ignored a control message that could not be read ({type(exc).__name__})")
                continue
            m = Marker(msg["label"], addr or None, msg["enclosing"], msg["loop"], _sender_pid(ancillary),
                       msg["began"], msg["manual"], msg["rank"], msg["continues"])
            why = self.gate.refuses(m) if self.gate is not None else None
            if why:
                self.gate.note(m, why)
                self.refuse(m, why)
                continue
            out.append(m)
            self.received += 1
            if msg["ignored"]:
                self.bad_fields += 1
                self._complain(f"marker {msg['label']!r}: left out {'; '.join(msg['ignored'])}", count=False)
        return out

    def _complain(self, message: str, count: bool = True) -> None:
        """One line on stderr for the first BAD_MESSAGES_SHOWN problems; `count`: a datagram ignored."""
        self.bad += count
        self.complaints += 1
        if self.complaints <= BAD_MESSAGES_SHOWN:
            last = self.complaints == BAD_MESSAGES_SHOWN
            more = "; further bad messages are ignored silently" if last else ""
            print(f"iotrace: {safe(message)}{more}", file=sys.stderr, flush=True)   # a sender's bytes

    def ack(self, m: Marker) -> None:
        """Tell a waiting sender its dump is closed (best effort, never blocks)."""
        if not m.reply_to:
            return
        try:
            self.sock.sendto(marker.encode_ack(m.label), m.reply_to)
        except OSError:
            pass    # the sender gave up waiting, or its queue is full: it only loses the confirmation

    def refuse(self, m: Marker, why: str) -> None:
        """Tell a waiting sender its marker was not taken, and why (best effort, never blocks)."""
        if not m.reply_to:
            return
        try:
            self.sock.sendto(marker.encode_refusal(m.label, why), m.reply_to)
        except OSError:
            pass

    def close(self) -> None:
        self.sock.close()
        try:
            os.unlink(self.path)
        except FileNotFoundError:
            pass
        if self.private_dir:
            shutil.rmtree(self.private_dir, ignore_errors=True)


