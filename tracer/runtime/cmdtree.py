"""The traced command's whole process tree, ended with the tracer however the tracer ends.

A COMMAND forks: a shell's background jobs, fio's jobs, a trainer's
DataLoader workers.  Those are not our children, and a signal to the
command alone leaves them running, untraced.  So the tree is kept whole:

- it runs in a cgroup v2 of its own, made below the tracer's
  (`iotrace-<tracer pid>.cmd`): whatever it forks is in it, whatever is
  reparented to init stays in it, and cgroup.kill ends all of it at once,
  forks in flight included;
- a supervisor, a fork of the tracer in a session of its own (a signal to
  the tracer's process group misses it), watches the tracer's pidfd: if
  the tracer dies before it has ended the tree (SIGKILL, a crash), the
  supervisor kills the cgroup at once, waits for it to empty and removes it;
- the normal end (CommandTree.end): SIGTERM to every process of the tree,
  SIGKILL to what is left after a grace, the cgroup removed, the
  supervisor told and reaped.

Where no cgroup can be made (no cgroup v2 mounted, a read-only one, not
root) the tree is the command and its descendants as /proc shows them when
they are signalled: a process whose parent exited before is missed, and
after a SIGKILL of the tracer only the command itself ends (its
parent-death signal, tracer.runtime.child).  `note` says so, for one line
at start.  A process that moves itself into another cgroup leaves the tree.
"""

from __future__ import annotations

import errno
import gc
import os
import select
import signal
import time

from tracer.sources import cgroups, proctree

PREFIX, SUFFIX = "iotrace-", ".cmd"     # the command's cgroup: iotrace-<tracer pid>.cmd
EMPTY_WAIT_S = 5.0      # how long a killed tree may take to empty before its cgroup is left (EBUSY)
POLL_S = 0.02


class NoCgroup(Exception):
    """Why the command cannot have a cgroup of its own (the fallback's note)."""


def own_cgroup_dir(proc_cgroup: str = "/proc/self/cgroup") -> str:
    """The directory of this process's cgroup v2, under the cgroup2 mount; NoCgroup if there is none."""
    found = cgroups.cgroup2_mount()
    if found is None:
        raise NoCgroup("no cgroup v2 hierarchy is mounted")
    mount, root = found
    try:
        with open(proc_cgroup) as f:
            path = next((line.rstrip("\n")[3:] for line in f if line.startswith("0::")), None)
    except OSError as exc:
        raise NoCgroup(f"cannot read {proc_cgroup}: {exc.strerror or exc}") from None
    if path is None or not path.startswith("/"):
        raise NoCgroup("this process is in no cgroup v2")
    # a mount of a subtree (root != "/") shows the paths below its root
    root = root.rstrip("/")
    if root and path != root and not path.startswith(root + "/"):
        raise NoCgroup(f"our cgroup {path} is outside the cgroup2 mount {mount}")
    return os.path.join(mount, path[len(root):].lstrip("/"))


class CommandTree:
    """The command `pid` and everything it starts; open() puts it in a cgroup of its own if it can.

    `cgroup` is that cgroup's directory, None in the fallback (then `note`
    says why, and what is lost).
    """

    def __init__(self, pid: int, cgroup: str | None = None, note: str | None = None,
                 supervisor: int | None = None, tell: int | None = None):
        self.pid, self.cgroup, self.note = pid, cgroup, note
        self._supervisor, self._tell = supervisor, tell
        self._seen: dict[int, int] = {}     # the fallback's processes: pid -> start time (proctree)
        if cgroup is None:
            self._remember(pid)

    @classmethod
    def open(cls, pid: int, base: str | None = None) -> CommandTree:
        """The tree of `pid` (our child, held before exec: it has forked nothing yet), in a cgroup made
        under `base` (default: our own cgroup) and watched by a supervisor; or the fallback, with a note."""
        try:
            base = base or own_cgroup_dir()
        except NoCgroup as exc:
            return cls(pid, note=_fallback(str(exc)))
        remove_stale(base)
        path = os.path.join(base, f"{PREFIX}{os.getpid()}{SUFFIX}")
        try:
            os.mkdir(path, 0o755)
        except OSError as exc:
            return cls(pid, note=_fallback(f"cannot make {path}: {exc.strerror or exc}"))
        try:
            _write(os.path.join(path, "cgroup.procs"), str(pid))
        except OSError as exc:     # EBUSY, EOPNOTSUPP: our cgroup is threaded, or has controllers on
            _remove(path, 0)
            return cls(pid, note=_fallback(f"cannot move it into {path}: {exc.strerror or exc}"))
        try:
            supervisor, tell = start_supervisor(path)
        except OSError as exc:     # no fork: the normal end still ends the whole tree
            return cls(pid, path, note=f"no supervisor for the command's cgroup ({exc.strerror or exc}): if "
                                       f"iotrace is killed, only the command itself ends")
        return cls(pid, path, supervisor=supervisor, tell=tell)

    def pids(self) -> list[int]:
        """The tree's live processes now (zombies are not: they do nothing more, and are reaped elsewhere)."""
        if self.cgroup is not None:
            try:
                return [int(p) for p in _read(os.path.join(self.cgroup, "cgroup.procs")).split()]
            except OSError:
                return []
        # the fallback: every process seen in the tree that is still the same process (an orphan is
        # under init now; its start time tells it from a new process that took its pid), and their
        # descendants in /proc now
        self._forget_gone()
        for p in proctree.descendants(list(self._seen), proctree.read_tree()):
            self._remember(p)
        self._forget_gone()
        return sorted(self._seen)

    def _remember(self, pid: int) -> None:
        try:
            self._seen.setdefault(pid, proctree.stat_of(pid).start_ticks)
        except (OSError, ValueError):
            pass

    def _forget_gone(self) -> None:
        for p, started in list(self._seen.items()):
            try:
                st = proctree.stat_of(p)
                same = st.start_ticks == started and st.state not in ("Z", "X")
            except (OSError, ValueError):
                same = False
            if not same:
                del self._seen[p]

    def signal(self, sig: int, command: bool = False) -> None:
        """`sig` to every process of the tree (SIGKILL through cgroup.kill: all at once, forks included).
        `command`: the command is not reaped yet, and gets it even if it moved itself out of the cgroup."""
        if sig == signal.SIGKILL and self.cgroup is not None and kill_cgroup(self.cgroup):
            pids = []
        else:
            pids = self.pids()
        if command and self.pid > 0 and self.pid not in pids:
            pids.append(self.pid)
        for p in pids:
            try:
                os.kill(p, sig)
            except ProcessLookupError:
                pass

    def empty(self) -> bool:
        return not populated(self.cgroup) if self.cgroup is not None else not self.pids()

    def end(self, grace: float) -> None:
        """SIGTERM to the whole tree, SIGKILL to what is left after `grace` seconds; then the cgroup is
        removed and the supervisor told and reaped.  Once: a second call does nothing."""
        if self.pid < 0:
            return
        try:
            if not self.empty():
                self.signal(signal.SIGTERM)
                if not _wait(self.empty, grace):
                    self.signal(signal.SIGKILL)
                    _wait(self.empty, EMPTY_WAIT_S)
        finally:
            self.pid = -1
            cg, self.cgroup = self.cgroup, None
            try:
                if cg is not None:
                    if populated(cg) and not kill_cgroup(cg):  # cut short: what is left goes at once
                        _kill_each(cg)
                    _remove(cg, EMPTY_WAIT_S)
            finally:
                self._release_supervisor()

    def _release_supervisor(self) -> None:
        if self._tell is None:
            return
        try:
            os.write(self._tell, b"d")      # ended here: nothing for it to do
        except OSError:
            pass
        os.close(self._tell)
        self._tell = None
        try:
            os.waitpid(self._supervisor, 0)
        except ChildProcessError:
            pass


def _fallback(why: str) -> str:
    return (f"the command gets no cgroup of its own ({why}): at the end only the processes iotrace finds under "
            f"it are ended, and if iotrace is killed only the command itself")


def remove_stale(base: str) -> list[str]:
    """The cgroups under `base` of commands whose tracer and supervisor both died (`pkill -9 -f iotrace`
    kills both): what still runs there, untraced, is killed and the cgroup removed.  Their paths.

    A cgroup is stale when its tracer pid is no process, or a zombie; a pid that is
    alive (even another process's by now) keeps its cgroup: the sweep errs on leaving one.
    """
    removed = []
    try:
        names = os.listdir(base)
    except OSError:
        return removed
    for name in names:
        number = name[len(PREFIX):-len(SUFFIX)] if name.startswith(PREFIX) and name.endswith(SUFFIX) else ""
        if not number.isdigit() or _running(int(number)):
            continue
        path = os.path.join(base, name)
        try:
            if populated(path):
                if not kill_cgroup(path):
                    _kill_each(path)
                _wait(lambda p=path: not populated(p), EMPTY_WAIT_S)
            _remove(path, 0)
        except OSError:
            continue
        removed.append(path)
    return removed


def _running(pid: int) -> bool:
    try:
        return proctree.stat_of(pid).state not in ("Z", "X")
    except (OSError, ValueError):
        return False


# ---- cgroup files ---------------------------------------------------------------------

def _read(path: str) -> str:
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        return os.read(fd, 1 << 20).decode(errors="replace")
    finally:
        os.close(fd)


def _write(path: str, text: str) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CLOEXEC)
    try:
        os.write(fd, text.encode())
    finally:
        os.close(fd)


def populated(cgroup: str) -> bool:
    """The cgroup (or one below it) has a live process (an unreaped zombie is not one); False once it is gone."""
    try:
        return "populated 1" in _read(os.path.join(cgroup, "cgroup.events"))
    except FileNotFoundError:
        return False


def kill_cgroup(cgroup: str) -> bool:
    """SIGKILL to every process in the cgroup, at once (cgroup.kill, Linux 5.14); False where the kernel
    has no cgroup.kill (the caller signals each process), True too when the cgroup is gone already."""
    try:
        _write(os.path.join(cgroup, "cgroup.kill"), "1")
    except FileNotFoundError:
        return not os.path.isdir(cgroup)
    return True


def _remove(cgroup: str, wait: float) -> None:
    """rmdir the cgroup, retried for `wait` seconds while it still empties (EBUSY); gone already is fine."""
    until = time.monotonic() + wait
    while True:
        try:
            os.rmdir(cgroup)
            return
        except FileNotFoundError:
            return
        except OSError as exc:
            if exc.errno != errno.EBUSY or time.monotonic() >= until:
                raise
        time.sleep(POLL_S)


def _wait(done, seconds: float) -> bool:
    until = time.monotonic() + seconds
    while not done():
        if time.monotonic() >= until:
            return False
        time.sleep(POLL_S)
    return True


# ---- the supervisor -----------------------------------------------------------------------

def start_supervisor(cgroup: str) -> tuple[int, int]:
    """Fork the process that kills `cgroup` if we die first: (its pid, the fd that tells it we ended it)."""
    tracer = os.getpid()
    r, w = os.pipe()
    pid = os.fork()
    if pid:
        os.close(r)
        return pid, w
    # the child: no Python-level cleanup may run here, only _exit
    try:
        supervise(tracer, r, cgroup)
    finally:
        os._exit(0)


def supervise(tracer: int, r: int, cgroup: str) -> None:
    """Wait for `tracer` to die or to say (b"d" on `r`) it ended the tree; if it died, end the tree."""
    gc.disable()            # a collected object of the tracer's would close its fd, which may be one of ours now
    os.setsid()             # out of the tracer's process group and terminal: their signals are not ours
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    os.chdir("/")           # holds no mount the tracer's cwd was on
    try:
        _write("/proc/self/comm", "iotrace-watch")     # what ps shows for it, beside the tracer's command line
    except OSError:
        pass
    os.dup2(r, 3)
    null = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(null, fd)
    os.closerange(4, os.sysconf("SC_OPEN_MAX"))     # the tracer's files, sockets and the held child's pipe
    try:
        watch = os.pidfd_open(tracer)
    except OSError:
        watch = None        # it is gone already
    if watch is not None and os.getppid() == tracer:
        ready, _, _ = select.select([3, watch], [], [])
        if 3 in ready and os.read(3, 1) == b"d":
            return
    # the tracer died before it ended the tree: nothing traces it any more
    if not kill_cgroup(cgroup):
        _kill_each(cgroup)
    _wait(lambda: not populated(cgroup), EMPTY_WAIT_S)
    try:
        _remove(cgroup, EMPTY_WAIT_S)
    except OSError:
        pass


def _kill_each(cgroup: str) -> None:
    """SIGKILL to each process of the cgroup until none is left (a kernel without cgroup.kill)."""
    def gone() -> bool:
        try:
            pids = [int(p) for p in _read(os.path.join(cgroup, "cgroup.procs")).split()]
        except OSError:
            return True
        for p in pids:
            try:
                os.kill(p, signal.SIGKILL)
            except ProcessLookupError:
                pass
        return not pids
    _wait(gone, EMPTY_WAIT_S)
