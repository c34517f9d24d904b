"""The traced command: forked, held before exec until the tracer's filter has its pid, then released.

It never outlives the tracer untraced: it gets SIGKILL when the tracer dies
(PR_SET_PDEATHSIG, even on SIGKILL), and every way the tracer ends reaps it
(end(): SIGTERM, then SIGKILL after a grace).  What it starts is the
business of tracer.runtime.cmdtree.  A COMMAND that cannot run is refused
before anything is forked, as a shell would: 127 not found, 126 not runnable.
"""

from __future__ import annotations

import errno
import os
import signal
import stat
import time

from tracer.errors import UserError
from tracer.osutil import PR_SET_PDEATHSIG, invoking_user, libc_prctl

# the signal the command gets when the tracer dies: from then on nothing traces it, and a command
# that ignores SIGTERM would run on
DEATH_SIGNAL = signal.SIGKILL
# seconds a command has after SIGTERM before SIGKILL, once iotrace is ending it without waiting
KILL_GRACE_S = 2.0
# a shell's exit statuses for a command it cannot run
NOT_FOUND, NOT_RUNNABLE = 127, 126


def check_command(name: str, path: list[str] | None = None) -> None:
    """UserError, with a shell's status, if `name` cannot be run: not found (127), a directory or not
    executable (126).  A name without "/" is looked up in `path` (default: our PATH) as execvp does."""
    if "/" in name:
        try:
            st = os.stat(name)
        except OSError as exc:
            raise UserError(f"cannot run {name}: {_why(exc)}", NOT_FOUND if exc.errno == errno.ENOENT
                            else NOT_RUNNABLE) from None
        if stat.S_ISDIR(st.st_mode):
            raise UserError(f"cannot run {name}: it is a directory", NOT_RUNNABLE)
        if not os.access(name, os.X_OK) or not stat.S_ISREG(st.st_mode):
            raise UserError(f"cannot run {name}: it is not executable", NOT_RUNNABLE)
        return
    found = None        # a file of that name that is not executable: a shell says "Permission denied"
    for d in os.get_exec_path() if path is None else path:
        candidate = os.path.join(d or ".", name)
        try:
            st = os.stat(candidate)
        except OSError:
            continue
        if not stat.S_ISREG(st.st_mode):
            continue
        if os.access(candidate, os.X_OK):
            return
        found = found or candidate
    if found:
        raise UserError(f"cannot run {name}: {found} is not executable", NOT_RUNNABLE)
    raise UserError(f"command not found: {name}", NOT_FOUND)


def _why(exc: OSError) -> str:
    return "no such file" if exc.errno == errno.ENOENT else (exc.strerror or str(exc)).lower()


def spawn_held(command: list[str], env: dict[str, str] | None = None, stdout_to_stderr: bool = False
               ) -> tuple[int, int]:
    """Fork the command (with `env` added), held before exec until the returned fd is written "g".

    `stdout_to_stderr`: the command writes its stdout to our stderr (-j keeps stdout JSON only).

    Holding it lets the tracer put the child's pid in the in-kernel filter
    before the command runs, so its very first I/O is traced.  Closing the fd
    unwritten makes the child exit 125.
    """
    check_command(command[0])
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
            # as a shell: 127 when it is not there (any more), 126 when it is but cannot run (EACCES as
            # the sudo user, ENOEXEC, ...)
            os._exit(NOT_FOUND if isinstance(exc, FileNotFoundError) else NOT_RUNNABLE)


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
