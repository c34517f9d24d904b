"""The traced command: forked, held before exec until the tracer's filter has its pid, then released.

It never outlives the tracer untraced: it gets SIGTERM when the tracer dies
(PR_SET_PDEATHSIG, even on SIGKILL), and every way the tracer ends reaps it
(end(): SIGTERM, then SIGKILL after a grace).
"""

from __future__ import annotations

import os
import shutil
import signal
import time

from tracer.errors import UserError
from tracer.osutil import PR_SET_PDEATHSIG, invoking_user, libc_prctl

# the signal the command gets when the tracer dies: the one iotrace itself sends to end it
DEATH_SIGNAL = signal.SIGTERM
# seconds a command has after SIGTERM before SIGKILL, once iotrace is ending it without waiting
KILL_GRACE_S = 2.0


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
    prctl = libc_prctl()
    tracer = os.getpid()
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
        # after setuid: a change of credentials clears the parent-death signal (man 2 prctl); a set-user-ID
        # or file-capability COMMAND clears it again at exec, and nothing here can help that
        if prctl is not None:
            prctl(PR_SET_PDEATHSIG, DEATH_SIGNAL, 0, 0, 0)
        if os.getppid() != tracer:
            os._exit(125)   # the tracer died before the signal was set: nobody would trace us
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


def end(pid: int, sig: int = signal.SIGTERM, grace: float = KILL_GRACE_S) -> int | None:
    """End our child `pid` and reap it: `sig`, then SIGKILL if it is still there after `grace` seconds.

    Its exit status (exit_status), or None if it was reaped already (then it is
    not signalled: the pid may be another process's by now).
    """
    try:
        done, st = os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        return None
    if done:
        return exit_status(st)
    # not reaped: the pid is still our child's, a zombie at worst
    os.kill(pid, sig)
    until = time.monotonic() + grace
    while time.monotonic() < until:
        done, st = os.waitpid(pid, os.WNOHANG)
        if done:
            return exit_status(st)
        time.sleep(0.02)
    os.kill(pid, signal.SIGKILL)
    return exit_status(os.waitpid(pid, 0)[1])


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
        except OverflowError:
            raise UserError(f"--pid {pid}: not a process id") from None
        except OSError as exc:      # EINVAL: a thread that leads no process, or not a pid at all
            raise UserError(f"--pid {pid}: cannot watch it ({exc.strerror or exc}); give a process id, "
                            f"not a thread id") from None
    return fds
