"""Who the user behind sudo is, and files written on their behalf.

Base layer: no iotrace imports but errors.  Every file iotrace writes at a
path the user gave (-o, --csv, bench -o, plot -o) goes through open_output()
(or replace_as_user() for a finished temporary file): under sudo it is
opened with the invoking user's own rights, in a short-lived child that has
become the user and passes the descriptor back, so root never writes into a
file or directory the user could not write themselves.  A symbolic link, a
file with another hard link, or anything but a regular file is refused; no
file is ever chowned (a new one is created by the user, so it is theirs; an
existing one keeps its owner).
"""

from __future__ import annotations

import ctypes
import errno
import os
import pwd
import socket
import stat
from collections.abc import Callable
from typing import IO

from tracer.errors import UserError

_MODES = {"a": os.O_WRONLY | os.O_CREAT | os.O_APPEND,
          "w": os.O_WRONLY | os.O_CREAT,            # truncated only after the checks
          "x": os.O_WRONLY | os.O_CREAT | os.O_EXCL}


PR_SET_PDEATHSIG = 1     # prctl(2): the signal a child gets when the process that forked it dies


def libc_prctl():
    """libc's prctl, looked up before a fork (the child must not import or load anything); None without one."""
    try:
        f = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None
    f.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong]
    f.restype = ctypes.c_int
    return f


def invoking_user() -> pwd.struct_passwd | None:
    """The user behind sudo, when we are root because of sudo."""
    uid = os.environ.get("SUDO_UID")
    if os.geteuid() != 0 or not uid:
        return None
    try:
        return pwd.getpwuid(int(uid))
    except (KeyError, ValueError):
        return None


def _sudo_ids() -> tuple[int, int, list[int]] | None:
    """(uid, gid, groups) of the user behind sudo, when we are root because of sudo (SUDO_UID, SUDO_GID;
    a uid with no passwd entry still counts: its rights are the uid's and gid's alone)."""
    if os.geteuid() != 0:
        return None
    try:
        uid = int(os.environ["SUDO_UID"])
    except (KeyError, ValueError):
        return None
    try:
        user: pwd.struct_passwd | None = pwd.getpwuid(uid)
    except KeyError:
        user = None
    try:
        gid = int(os.environ["SUDO_GID"])
    except (KeyError, ValueError):
        gid = user.pw_gid if user else uid
    try:
        groups = os.getgrouplist(user.pw_name, gid) if user else [gid]
    except OSError:
        groups = [gid]
    return uid, gid, groups


def _become(uid: int, gid: int, groups: list[int]) -> None:
    """Drop every root right for good (in a child only): the user's groups, gid and uid."""
    os.setgroups(groups)
    os.setresgid(gid, gid, gid)
    os.setresuid(uid, uid, uid)


def _as_user(op: Callable[[], int | None]) -> int | None:
    """op() run with the sudo user's rights (in a forked child) when there is one, else here.

    op returns a file descriptor (handed back to us) or None; an OSError it
    raises is raised here with the same errno.
    """
    ids = _sudo_ids()
    if ids is None or ids[0] == 0:
        return op()
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        pid = os.fork()
        if pid == 0:                    # the child: never returns, whatever happens
            code = 1
            try:
                ours.close()
                try:
                    _become(*ids)
                    fd = op()
                    msg, fds = b"ok", ([] if fd is None else [fd])
                except OSError as exc:
                    msg, fds = f"E{exc.errno or 0}:{exc.strerror or exc}".encode(errors="replace"), []
                socket.send_fds(theirs, [msg], fds)
                code = 0
            finally:
                os._exit(code)
        theirs.close()
        try:
            msg, fds, _flags, _addr = socket.recv_fds(ours, 4096, 1)
        finally:
            try:
                os.waitpid(pid, 0)
            except ChildProcessError:
                pass            # reaped by someone else's waitpid(-1): it is gone either way
    finally:
        ours.close()
        theirs.close()
    if msg.startswith(b"E"):
        number, _, text = msg[1:].decode(errors="replace").partition(":")
        raise OSError(int(number), text)
    if msg != b"ok":
        raise OSError(0, "the helper that opens files as the sudo user failed")
    return fds[0] if fds else None


def _refusal(st: os.stat_result) -> str | None:
    if not stat.S_ISREG(st.st_mode):
        return "not a regular file"
    if st.st_nlink > 1:
        return f"it has {st.st_nlink} hard links (refusing to write through one)"
    return None


def _why(path: str, exc: OSError) -> str:
    if exc.errno == errno.ELOOP:
        return f"cannot write {path}: it is a symbolic link (refusing to follow it)"
    return f"cannot write {path}: {exc.strerror or exc}"


def open_output(path: str, mode: str = "a") -> IO:
    """`path` opened for writing as the user behind sudo (or as ourselves); UserError if it cannot be.

    mode: "a" append (-o, --csv), "w" truncate, "x" a new file only; "b"
    added for bytes.  Never through a symbolic link (the last component),
    never a file with another hard link or anything but a regular file.
    """
    binary = "b" in mode
    flags = _MODES[mode.replace("b", "")] | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NOCTTY | os.O_NONBLOCK

    def op() -> int:
        return os.open(path, flags, 0o666)     # the umask (the user's, through sudo) applies

    try:
        fd = _as_user(op)
    except OSError as exc:
        raise UserError(_why(path, exc)) from None
    assert fd is not None
    try:
        st = os.fstat(fd)
        why = _refusal(st)
        if why:
            raise UserError(f"cannot write {path}: {why}")
        os.set_blocking(fd, True)
        if mode.startswith("w"):
            os.ftruncate(fd, 0)
    except OSError as exc:
        os.close(fd)
        raise UserError(_why(path, exc)) from None
    except BaseException:
        os.close(fd)
        raise
    return open(fd, ("a" if mode.startswith("a") else "w") + ("b" if binary else ""), closefd=True)


def _check_replaceable(path: str) -> None:
    """OSError unless `path` is absent or a regular file with one link (what replace_as_user may replace)."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return
    if stat.S_ISLNK(st.st_mode):
        raise OSError(errno.ELOOP, "symbolic link")
    why = _refusal(st)
    if why:
        raise OSError(0, why)


def replace_as_user(tmp: str, path: str) -> None:
    """Rename `tmp` (written through open_output(tmp, "x")) over `path`, with the sudo user's rights.

    `path` may be absent or a regular file with one link; anything else is
    refused (UserError), as open_output refuses it.
    """
    def op() -> None:
        _check_replaceable(path)
        os.replace(tmp, path)

    try:
        _as_user(op)
    except OSError as exc:
        raise UserError(_why(path, exc)) from None


def check_output(path: str) -> None:
    """UserError now if `path` could not be written later (by open_output or replace_as_user) by the user
    behind sudo: its directory closed to them, or `path` a link or not a regular file.  Before long work."""
    def op() -> None:
        if not os.access(os.path.dirname(os.path.abspath(path)), os.W_OK | os.X_OK):
            raise OSError(errno.EACCES, "Permission denied")
        _check_replaceable(path)

    try:
        _as_user(op)
    except OSError as exc:
        raise UserError(_why(path, exc)) from None


def quiet_close(f) -> None:
    """Close a file whose writes failed (a full disk): its buffer is dropped, the descriptor closed, nothing raised."""
    try:
        f.close()       # flushes first: that fails again, but the descriptor is closed all the same
    except OSError:
        pass
