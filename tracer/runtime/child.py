"""The traced command: forked, held before exec until the tracer's filter has its pid, then released."""

from __future__ import annotations

import os
import shutil
import signal

from tracer.errors import UserError
from tracer.osutil import invoking_user


def spawn_held(command: list[str], env: dict[str, str] | None = None, stdout_to_stderr: bool = False
               ) -> tuple[int, int]:
    """Fork the command (with `env` added), held before exec until the returned fd is written "g".

    `stdout_to_stderr`: the command writes its stdout to our stderr (-j keeps stdout JSON only).

    Holding it lets the tracer put the child's pid in the in-kernel filter
    before the command runs, so its very first I/O is traced.  Closing the fd
    unwritten makes the child exit 125.
    """
    if shutil.which(command[0]) is None:
        raise UserError(f"command not found: {command[0]}")
    user = invoking_user()
    r, w = os.pipe()
    pid = os.fork()
    if pid:
        os.close(r)
        return pid, w
    # the child: no Python-level cleanup may run here, only exec or _exit
    try:
        os.close(w)
        for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGUSR1):
            signal.signal(sig, signal.SIG_DFL)
        if os.read(r, 1) != b"g":
            os._exit(125)   # the tracer gave up before releasing us
        os.close(r)
        if user:
            os.setgroups(os.getgrouplist(user.pw_name, user.pw_gid))
            os.setgid(user.pw_gid)
            os.setuid(user.pw_uid)
            os.environ.update(HOME=user.pw_dir, USER=user.pw_name, LOGNAME=user.pw_name)
        os.environ.update(env or {})
        if stdout_to_stderr:
            os.dup2(2, 1)
        os.execvp(command[0], command)
    except BaseException as exc:  # noqa: BLE001 - must never return into the tracer's code
        try:
            from tracer.text import safe

            os.write(2, f"iotrace: cannot run {safe(command[0])}: {safe(exc)}\n".encode(errors="replace"))
        finally:
            os._exit(127)


def release(fd: int) -> None:
    """Let the held command exec (it may have died already: the loop reaps it)."""
    try:
        os.write(fd, b"g")
    except BrokenPipeError:
        pass
    os.close(fd)


def exit_status(status: int) -> int:
    """A wait status as a shell would report it: the exit code, or 128+N for signal N."""
    code = os.waitstatus_to_exitcode(status)
    return 128 - code if code < 0 else code


def check_pids(pids: list[int]) -> list[int]:
    """A pidfd per --pid (the loop polls them to end when every target has exited); UserError for a gone pid."""
    fds = []
    for pid in pids:
        try:
            fds.append(os.pidfd_open(pid))
        except ProcessLookupError:
            raise UserError(f"--pid {pid}: no such process") from None
    return fds
