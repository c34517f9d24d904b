"""The /metrics server of `iotrace serve`: a small process of its own, forked at start, ended with the tracer.

Why a process: the tracer's loop drains the kernel's maps, builds the dump
and folds it (~100-150 ms wall per interval with a few hundred series on a
2-CPU VM under load, little of it CPU: the rest is waiting for a CPU), and
HTTP threads in the same interpreter waited for the GIL meanwhile, a holder
that was itself waiting to be scheduled: a scrape that overlapped a drain
took 3-10 times as long as one that did not (scripts/bench_scrape.py).  A
separate threaded server still had the tail (its threads convoy on their
own GIL when the CPUs are contended); one thread with a selector did not.

How: the tracer binds and listens (a port in use fails at once, before the
BPF programs load), forks, and closes its copy of the socket.  After every
change of the metrics (a fold, the programs attaching) the tracer sends the
server a Snapshot (tracer.sinks.exposition: plain values, marshalled over a
socketpair) and waits for its ack.  In the server, one thread (_Server)
serves every connection from a selector and only sends bytes the cache has;
one render thread (_Renderer) makes the bodies: the cache (ScrapeCache) holds
the snapshot and what prometheus_client's encoders wrote from it, each format
and its gzip at most once per snapshot, stale once the next snapshot is in
(served only while that one's are being rendered).  On a snapshot the plain text body is rendered
first and the ack sent once it is ready, so a scrape after the tracer's
on_dump returns sees the new state; the other formats asked for so far
follow; scrapes meanwhile get the previous bodies at once.  GET of
READY_PATH answers from the snapshot's `attached`; other methods, name[]
filters and /favicon.ico go to prometheus_client's own app over the
snapshot (in the render thread), as they did in-process; HEAD is answered as
GET is, without the body.  Bounded, so that a scrape is answered whatever
other clients do: at most MAX_CONNECTIONS at once and MAX_PER_CLIENT of one
address (a new connection takes the place of its own address's oldest one
still sending its request), IDLE_TIMEOUT_S of silence, HEADER_TIMEOUT_S to
send the request line and headers, MAX_REQUEST_BYTES of them,
SEND_TIMEOUT_S to take the answer; each connection answers one request and
is closed.

The server's side (the selector, the renderer, the cache, the wire) is tracer/sinks/promhttp.py.

It never outlives the tracer: PR_SET_PDEATHSIG (SIGKILL, also when the
tracer is killed), end of file on the socketpair (the tracer closed it or
died), and ServerProcess.close (end of file, then SIGKILL after a grace, and
reaped).  It ignores the signals the tracer handles (SIGINT, SIGTERM,
SIGUSR1) and SIGHUP: Ctrl-C or a `kill` of the process group ends the tracer,
which then ends the server after writing its final dump, instead of the
server dying first under scrapes of the final state.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import sys
import time

from tracer.osutil import libc_prctl
from tracer.sinks.exposition import Snapshot
from tracer.sinks.promhttp import recv, send, serve

# connections the kernel holds for the server to accept: a burst of hundreds (a client opening them all at
# once) overflowed 128, and a scraper's SYN dropped then is sent again only a second later (the kernel caps it
# at net.core.somaxconn)
LISTEN_BACKLOG = 1024
ANSWER_TIMEOUT_S = 30.0     # the longest the tracer waits for the server to take a snapshot
EXIT_GRACE_S = 5.0          # ... and for it to exit once told to, before SIGKILL


class ServerGone(OSError):
    """The server process died or stopped answering (an OSError: the Sinks drop the output and go on)."""


# ---- the tracer's side ---------------------------------------------------------------------------------

class ServerProcess:
    """The server process, from the tracer's side: start() forks it on a listening socket; update() hands
    it a snapshot and returns once it is served; close() ends it and reaps it."""

    def __init__(self, pid: int, chan: socket.socket):
        self.pid = pid
        self.chan = chan
        self.status: int | None = None      # its wait status once reaped

    @classmethod
    def start(cls, listener: socket.socket, key: tuple[int, int], snap: Snapshot, tasks: bool) -> ServerProcess:
        """Fork the server on `listener` (closed here: the server holds the only copy) serving `snap`."""
        prctl = libc_prctl()
        tracer = os.getpid()
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        for f in (sys.stdout, sys.stderr):
            with contextlib.suppress(Exception):
                f.flush()       # nothing buffered is written twice
        pid = os.fork()
        if pid == 0:    # the server: it never returns into the tracer's code
            code = 1
            try:
                ours.close()
                serve(listener, theirs, tracer, prctl, key, snap, tasks)
                code = 0
            except BaseException as exc:  # noqa: BLE001 - whatever happens, only _exit below
                with contextlib.suppress(BaseException):
                    os.write(2, f"iotrace: the /metrics server process failed: {exc!r}\n".encode(errors="replace"))
            finally:
                os._exit(code)
        theirs.close()
        listener.close()
        ours.settimeout(ANSWER_TIMEOUT_S)
        return cls(pid, ours)

    def _ask(self, msg):
        if self.chan is None:
            raise ServerGone(f"the /metrics server process (pid {self.pid}) has ended")
        try:
            send(self.chan, msg)
            answer = recv(self.chan)
        except TimeoutError:
            self.close(kill=True)
            raise ServerGone(f"the /metrics server process did not answer in {ANSWER_TIMEOUT_S:g} s; "
                             "it was ended") from None
        except OSError as exc:
            answer, why = None, exc.strerror or str(exc)
        else:
            why = "it closed the connection"
        if answer is None:
            self.close(kill=True)
            raise ServerGone(f"the /metrics server process exited ({why}; {self.describe_status()})")
        return answer

    def update(self, key: tuple[int, int], snap: Snapshot) -> None:
        """Hand over a snapshot; returns once the server serves it (its text body rendered)."""
        self._ask(("state", key, snap.wire()))

    def renders(self) -> int:
        """How many bodies the server has rendered (those it was rendering when asked included)."""
        return self._ask(("stats",))[1]

    def close(self, kill: bool = False) -> None:
        """End the server (end of file: it finishes the scrapes in flight and exits; SIGKILL after
        EXIT_GRACE_S, or at once with `kill`) and reap it.  Never raises."""
        if self.chan is not None:
            with contextlib.suppress(OSError):
                self.chan.close()
            self.chan = None
        if self.status is not None:
            return
        until = time.monotonic() + (0 if kill else EXIT_GRACE_S)
        try:
            while True:
                done, st = os.waitpid(self.pid, os.WNOHANG)
                if done:
                    self.status = st
                    return
                if time.monotonic() >= until:
                    os.kill(self.pid, signal.SIGKILL)
                    self.status = os.waitpid(self.pid, 0)[1]
                    return
                time.sleep(0.01)
        except ChildProcessError:       # reaped by someone else's waitpid(-1): gone either way
            self.status = 0

    def describe_status(self) -> str:
        if self.status is None:
            return "running"
        code = os.waitstatus_to_exitcode(self.status)
        return f"killed by signal {-code}" if code < 0 else f"exit status {code}"
