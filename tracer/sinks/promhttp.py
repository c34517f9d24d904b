"""The server process of `iotrace serve`'s /metrics, its side: one selector thread answering every
connection from cached bodies, one render thread making them with prometheus_client's encoders, the
snapshot the tracer sent and the bodies rendered from it (ScrapeCache), and the wire between the two
(length-prefixed marshal over a socketpair).  How and why it is a process, and how it ends with the
tracer: tracer/sinks/promserver.py, the tracer's side.
"""

from __future__ import annotations

import contextlib
import marshal
import os
import signal
import socket
import struct
import sys
import threading
import time

from tracer.osutil import PR_SET_PDEATHSIG
from tracer.sinks import taskmetrics
from tracer.sinks.exposition import READY_PATH, Snapshot, families

# the server's threads: the one that renders a new snapshot yields the GIL to those answering scrapes this often
SWITCH_INTERVAL_S = 0.0005
FINISH_S = 1.0              # scrapes in flight when the tracer ends get this long to finish

# The formats a client names come from its Accept header (OpenMetrics' version and escaping are its to
# choose), so they are bounded: at most MAX_BODIES bodies are kept (the least recently made go), and the
# server renders anew at every snapshot only the first MAX_WANTED formats asked for (plain text first)
MAX_BODIES = 8
MAX_WANTED = 4

_LEN = struct.Struct("<I")


class SnapshotCollector:
    """prometheus_client's Collector over a snapshot (`source()`, asked once per collect): the exporter's
    families, then with --tasks the task counters'."""

    def __init__(self, source, tasks: bool):
        self.source = source
        self.tasks = tasks

    def collect(self):
        snap = self.source()
        yield from families(snap)
        if self.tasks:
            yield from taskmetrics.families(snap.tasks or [])


class ScrapeCache:
    """The snapshot the server serves, with its /metrics bodies: each format a client asks for (the text
    format 0.0.4, OpenMetrics, ...) and its gzip, written by prometheus_client's encoder for it (its
    choose_encoder's) from the snapshot's families at most once per snapshot, and served as bytes to every
    scrape until the next one.

    The bodies are kept beside the snapshot, under its key (the tracer's
    generations, new with every snapshot): `update` puts a new snapshot in,
    and every body rendered before it is stale from then on.  Rendering is
    under a lock, so that concurrent scrapes after a snapshot wait for one
    rendering, not do eight; while one is being rendered, or is due (the
    server renders the formats asked for so far at every snapshot), a scrape
    gets the previous snapshot's body at once rather than waiting for it.
    """

    def __init__(self, key: tuple[int, int], snap: Snapshot, tasks: bool = False):
        self.state = (tuple(key), snap)     # one attribute: a reader gets a key and its own snapshot
        self.tasks = tasks                  # the snapshot's task counters are in the bodies
        self._lock = threading.Lock()          # guards _bodies, _due and a new state
        self._render = threading.Lock()        # held while rendering
        self._bodies: dict[tuple[str, bool], tuple[tuple, bytes]] = {}    # (format, gzip) -> (key, body)
        self._due: set[tuple[str, bool]] = set()   # (format, gzip) to be rendered for this snapshot, soon
        self.renders = 0        # bodies an encoder wrote (the tests read it)

    @property
    def snapshot(self) -> Snapshot:
        return self.state[1]

    def update(self, key: tuple[int, int], snap: Snapshot, due=()) -> None:
        """The tracer's new snapshot: served from now on; the bodies of the one before, only while its own are
        being rendered, or are `due` ((format, gzip) pairs the caller has queued for rendering)."""
        with self._lock:
            self.state = (tuple(key), snap)
            self._due = set(due)

    def body(self, content_type: str, encoder, gzipped: bool = False) -> bytes:
        """The body `encoder` (from prometheus_client's choose_encoder) writes for the snapshot, gzipped or
        not: the cached bytes, or rendered if this snapshot has none yet (`peek` first, for a scrape that need
        not wait for it)."""
        want = (content_type, gzipped)
        with self._render:         # one rendering at a time; scrapes serve what there is meanwhile (peek)
            with self._lock:
                key, snap = self.state
                self._due -= {want, (content_type, False)}      # no longer due: being rendered (or failing)
                got = self._bodies.get(want)
                if got is not None and got[0] == key:
                    return got[1]
                plain = self._bodies.get((content_type, False))
            if plain is None or plain[0] != key:
                self.renders += 1
                plain = (key, encoder(SnapshotCollector(lambda: snap, self.tasks)))
            body = plain if not gzipped else (key, self._gzip(plain[1]))
            with self._lock:
                for k, v in (((content_type, False), plain), (want, body)):
                    self._bodies.pop(k, None)       # the most recent last: the first are evicted
                    self._bodies[k] = v
                while len(self._bodies) > MAX_BODIES:
                    del self._bodies[next(iter(self._bodies))]
            return body[1]

    def peek(self, content_type: str, gzipped: bool = False) -> bytes | None:
        """The body if it need not be rendered: it is the snapshot's, or a newer one is due or being rendered."""
        want = (content_type, gzipped)
        with self._lock:
            got = self._bodies.get(want)
            if got is not None and (got[0] == self.state[0] or want in self._due or self._render.locked()):
                return got[1]
        return None

    @staticmethod
    def _gzip(data: bytes) -> bytes:
        import gzip

        return gzip.compress(data, compresslevel=1)


# ---- the wire: length-prefixed marshal over a socketpair ---------------------------------------------

def send(sock: socket.socket, obj) -> None:
    data = marshal.dumps(obj)
    sock.sendall(_LEN.pack(len(data)) + data)


def recv(sock: socket.socket):
    """One message, or None at end of file."""
    head = _recv_exactly(sock, _LEN.size)
    if head is None:
        return None
    data = _recv_exactly(sock, _LEN.unpack(head)[0])
    if data is None:
        return None
    return marshal.loads(data)


def _recv_exactly(sock: socket.socket, n: int) -> bytes | None:
    buf = bytearray()
    while len(buf) < n:
        chunk = sock.recv(min(n - len(buf), 1 << 20))
        if not chunk:
            return None
        buf += chunk
    return bytes(buf)


# ---- the server's side ---------------------------------------------------------------------------------

# What one client can hold, so that whatever the others do a scrape is answered at once (issue 32: 300 idle
# connections, opened again every 8 s, held every slot, and each new connection was closed unanswered: a reset).
# A client is an address, or an IPv6 /64 (one host's share).  A new connection is always let in, and never
# because of its own client's connections does it displace another client's: beyond MAX_PER_CLIENT, it takes
# the place of its client's oldest connection still sending its request (else its oldest) that has had
# EVICT_GRACE_S to send it; beyond MAX_CONNECTIONS in all, of the biggest client's.  A scraper sends its request
# at once and is answered in milliseconds, so it is never the oldest: a flood from its own address only
# displaces itself, and idle or slow connections give up their slots to IDLE_TIMEOUT_S and HEADER_TIMEOUT_S.
MAX_CONNECTIONS = 256       # at once, of every client
MAX_PER_CLIENT = 32         # at once, of one client (those younger than EVICT_GRACE_S aside)
EVICT_GRACE_S = 0.25        # a connection this young is not closed for its own client's new ones
IDLE_TIMEOUT_S = 2.0        # a connection sending nothing for this long (also before its first byte) is closed ...
HEADER_TIMEOUT_S = 5.0      # ... and one whose request line and headers are not all in this long after connecting
MAX_REQUEST_BYTES = 16384   # a request's line and headers
SEND_TIMEOUT_S = 30.0       # for a client to take the answer
# After the answer, the server half-closes and reads what the client may still send until it closes (at most
# LINGER_S, for at most MAX_LINGERING connections besides the others): closing with its bytes unread would
# reset the connection, and a reset can discard the answer before the client has read it.
LINGER_S = 1.0
MAX_LINGERING = 256
ACCEPT_BATCH = 64           # connections accepted per wakeup; the others wait in the backlog for the next


def client_of(addr) -> str:
    """Whom a connection from `addr` (accept's) counts against: its IPv4 address (also mapped into IPv6), or
    the /64 of its IPv6 address (a host picks addresses in its /64 at will)."""
    import ipaddress

    host = addr[0] if isinstance(addr, tuple) and addr else str(addr)
    try:
        ip = ipaddress.ip_address(host.partition("%")[0])
    except ValueError:
        return host
    if ip.version == 6:
        if ip.ipv4_mapped is not None:
            return str(ip.ipv4_mapped)
        return str(ipaddress.ip_network((ip, 64), strict=False))
    return str(ip)


class _Conn:
    __slots__ = ("sock", "client", "started", "buf", "out", "deadline", "waiting", "lingering")

    def __init__(self, sock: socket.socket, client: str, now: float):
        self.sock = sock
        self.client = client
        self.started = now
        self.buf = bytearray()
        self.out: memoryview | None = None
        self.deadline = now + IDLE_TIMEOUT_S
        self.waiting = False        # for the renderer thread
        self.lingering = False      # answered: reading until the client closes

    @property
    def reading(self) -> bool:
        """Still sending its request."""
        return self.out is None and not self.waiting and not self.lingering


class Admission:
    """Which connections hold the slots: at most `total` at once, `per_client` of one client (see
    MAX_PER_CLIENT).  It only keeps the books (each client's connections, oldest first); the server closes
    whom it names."""

    def __init__(self, total: int, per_client: int, grace_s: float):
        self.total, self.per_client, self.grace_s = total, per_client, grace_s
        self.clients: dict[str, list] = {}      # client -> its connections, oldest first
        self.count = 0

    def make_room(self, client: str, now: float):
        """The connection to close to let a new one of `client` in, or None (there is room)."""
        mine = self.clients.get(client, [])
        if len(mine) >= self.per_client:
            victim = self._victim(mine, now, self.grace_s)
            if victim is not None:
                return victim
        if self.count >= self.total:
            return self._victim(max(self.clients.values(), key=len), now, 0.0)
        return None

    @staticmethod
    def _victim(conns: list, now: float, grace_s: float):
        """The oldest connection still sending its request, else the oldest, of those at least `grace_s` old."""
        old = [c for c in conns if now - c.started >= grace_s]
        return next((c for c in old if c.reading), old[0] if old else None)

    def add(self, c) -> None:
        self.clients.setdefault(c.client, []).append(c)
        self.count += 1

    def remove(self, c) -> None:
        mine = self.clients.get(c.client)
        if mine is None or c not in mine:
            return
        mine.remove(c)
        self.count -= 1
        if not mine:
            del self.clients[c.client]


class _Renderer(threading.Thread):
    """The one thread that renders: bodies the cache does not have yet, and what prometheus_client's own app
    answers.  Jobs are callables; each result is handed back to the loop with a byte on `wake`."""

    def __init__(self, wake: socket.socket):
        super().__init__(name="render", daemon=True)
        self.wake = wake
        self.jobs: list = []
        self.done: list = []
        self.cond = threading.Condition()

    def submit(self, job, then) -> None:
        with self.cond:
            self.jobs.append((job, then))
            self.cond.notify()

    def run(self) -> None:
        while True:
            with self.cond:
                while not self.jobs:
                    self.cond.wait()
                job, then = self.jobs.pop(0)
            try:
                result = job()
            except Exception as exc:  # noqa: BLE001 - one failed rendering is that request's 500, not the server's end
                result = exc
            with self.cond:
                self.done.append((then, result))
            with contextlib.suppress(OSError):
                self.wake.send(b"x")

    def take_done(self) -> list:
        with self.cond:
            out, self.done = self.done, []
        return out


# the methods answered, in every Allow header (prometheus_client's app names OPTIONS and GET; HEAD is
# answered as GET is, without the body)
ALLOW = "GET, HEAD, OPTIONS"


def _response(status: str, headers: list[tuple[str, str]], body: bytes, head: bool = False) -> bytes:
    """The bytes of an answer; of HEAD's (`head`), without the body, but with the length GET's has."""
    lines = [f"HTTP/1.1 {status}"] + [f"{k}: {ALLOW if k.lower() == 'allow' else v}" for k, v in headers
                                      if k.lower() not in ("content-length", "connection")]
    lines += [f"Content-Length: {len(body)}", "Connection: close", "", ""]
    return "\r\n".join(lines).encode("latin-1") + (b"" if head else body)


class _Server:
    """One thread serving every connection from a selector: it parses requests and sends bytes the cache
    already has; whatever must be rendered goes to the _Renderer, and the connection waits for it while the
    others are served.  A request is answered and its connection closed (as HTTP/1.0 servers do), once the
    client has closed its end (see LINGER_S).  Who holds a connection: Admission (see MAX_PER_CLIENT)."""

    def __init__(self, listener: socket.socket, chan: socket.socket, cache: ScrapeCache):
        import selectors

        from prometheus_client import CollectorRegistry
        from prometheus_client.exposition import choose_encoder, make_wsgi_app

        self.choose_encoder = choose_encoder
        self.listener = listener
        self.chan = chan
        self.cache = cache
        registry = CollectorRegistry(auto_describe=False)
        registry.register(SnapshotCollector(lambda: cache.snapshot, cache.tasks))
        self.app = make_wsgi_app(registry)      # rendering per request: name[] filters, other methods
        encoder, content_type = choose_encoder("")
        self.wanted = {(content_type, False): encoder}     # the bodies asked for: rendered anew at each change
        self.answers: dict[tuple[str, bool], tuple[bytes, bytes]] = {}     # (format, gzip) -> (body, its answer)
        wake_r, wake_w = socket.socketpair()
        self.wake = wake_r
        self.renderer = _Renderer(wake_w)
        self.sel = selectors.DefaultSelector()
        self.READ, self.WRITE = selectors.EVENT_READ, selectors.EVENT_WRITE
        for s in (listener, chan, wake_r):
            s.setblocking(False)
            self.sel.register(s, self.READ, None)
        self.conns: dict[int, _Conn] = {}
        self.admission = Admission(MAX_CONNECTIONS, MAX_PER_CLIENT, EVICT_GRACE_S)
        self.lingering = 0
        self.next_sweep = 0.0
        self.chan_buf = bytearray()
        self.ending = False

    def run(self) -> None:
        self.renderer.start()
        self._refresh(ack=False)
        while not self.ending or self.conns:
            events = self.sel.select(timeout=0.1 if self.conns else 1.0)
            now = time.monotonic()      # after the wait: a connection's age is measured from when it came
            for key, _ in events:
                s = key.fileobj
                if s is self.listener:
                    self._accept(now)
                elif s is self.chan:
                    self._from_tracer()
                elif s is self.wake:
                    self._rendered()
                else:
                    self._io(self.conns.get(s.fileno()), now)
            if now >= self.next_sweep:
                self.next_sweep = now + 0.1
                for c in [c for c in self.conns.values() if now > c.deadline]:
                    if c.reading:       # its bytes may be in flight: closing now would reset the connection
                        self._linger(c, now + LINGER_S)
                    else:
                        self._close(c)

    # ---- the tracer's snapshots

    def _from_tracer(self) -> None:
        try:
            data = self.chan.recv(1 << 20)
        except BlockingIOError:
            return
        except OSError:
            data = b""
        if not data:
            self._end()
            return
        self.chan_buf += data
        while len(self.chan_buf) >= _LEN.size:
            n = _LEN.unpack_from(self.chan_buf)[0]
            if len(self.chan_buf) < _LEN.size + n:
                break
            msg = marshal.loads(bytes(self.chan_buf[_LEN.size:_LEN.size + n]))
            del self.chan_buf[:_LEN.size + n]
            if msg[0] == "state":
                self.cache.update(msg[1], Snapshot.from_wire(msg[2]), due=self.wanted)
                self._refresh(ack=True)
            elif msg[0] == "stats":     # after the renderings queued before it
                self.renderer.submit(lambda: self.cache.renders, ("stats",))

    def _refresh(self, ack: bool) -> None:
        """Render again every body asked for so far, the plain text format first; ack the tracer once that
        one is ready (a scrape after its on_dump sees this snapshot), then the others (OpenMetrics, as
        Prometheus asks); scrapes meanwhile get the bodies of the snapshot before.  prometheus_client
        takes 23 ms for the text format and 38 ms for OpenMetrics with 192 histograms, 165 and 270 ms with
        1200 (docs/serve.md)."""
        first, *others = list(self.wanted.items())

        def render(which):
            def job():
                for (content_type, gzipped), encoder in which:
                    self.cache.body(content_type, encoder, gzipped)
            return job
        self.renderer.submit(render([first]), ("ack",) if ack else ("nothing",))
        if others:
            self.renderer.submit(render(others), ("nothing",))

    def _to_tracer(self, msg) -> None:
        if self.ending:
            return
        self.chan.setblocking(True)
        try:
            send(self.chan, msg)
        except OSError:
            self._end()         # the tracer is gone
            return
        self.chan.setblocking(False)

    def _end(self) -> None:
        """The tracer is gone or ends us: no new connections; those open get FINISH_S."""
        if self.ending:
            return
        self.ending = True
        for s in (self.listener, self.chan):
            self.sel.unregister(s)
            s.close()
        until = time.monotonic() + FINISH_S
        for c in self.conns.values():
            c.deadline = min(c.deadline, until)

    # ---- connections

    def _accept(self, now: float) -> None:
        for _ in range(ACCEPT_BATCH):
            try:
                sock, addr = self.listener.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError:
                return      # e.g. EMFILE: the backlog keeps it for the next round
            sock.setblocking(False)
            c = _Conn(sock, client_of(addr), now)
            victim = self.admission.make_room(c.client, now)
            if victim is not None:
                self._close(victim)
            self.admission.add(c)
            self.conns[sock.fileno()] = c
            self.sel.register(sock, self.READ, None)

    def _close(self, c: _Conn) -> None:
        self.conns.pop(c.sock.fileno(), None)
        self.admission.remove(c)
        if c.lingering:
            self.lingering -= 1
        with contextlib.suppress(KeyError, ValueError):
            self.sel.unregister(c.sock)
        c.sock.close()

    def _linger(self, c: _Conn, until: float | None = None) -> None:
        """The answer is sent, or the request was not in time: half-close, and read until the client closes
        (see LINGER_S), at most until `until` (the connection's own deadline by default)."""
        self.admission.remove(c)        # its slot is free: what is left costs only a socket
        if self.lingering >= MAX_LINGERING or self.ending:
            self._close(c)
            return
        try:
            c.sock.shutdown(socket.SHUT_WR)
        except OSError:
            self._close(c)
            return
        c.lingering = True
        self.lingering += 1
        c.out = None
        c.deadline = min(c.deadline if until is None else until, time.monotonic() + LINGER_S)
        with contextlib.suppress(KeyError, ValueError):
            self.sel.unregister(c.sock)
        self.sel.register(c.sock, self.READ, None)

    def _io(self, c: _Conn | None, now: float) -> None:
        if c is None:
            return
        if c.out is not None:
            self._send_some(c)
            return
        try:
            data = c.sock.recv(65536)
        except BlockingIOError:
            return
        except OSError:
            data = b""
        if not data or c.lingering:     # what a client sends after its answer is read and dropped
            if not data:
                self._close(c)
            return
        c.deadline = min(c.started + HEADER_TIMEOUT_S, now + IDLE_TIMEOUT_S)
        c.buf += data
        end = c.buf.find(b"\r\n\r\n")
        if end < 0:
            if len(c.buf) > MAX_REQUEST_BYTES:
                self._answer(c, _response("431 Request Header Fields Too Large", [], b""))
            return
        self.sel.unregister(c.sock)     # the request is read: what comes next is our answer
        c.deadline = now + SEND_TIMEOUT_S
        self._request(c, bytes(c.buf[:end]).decode("latin-1"))

    def _request(self, c: _Conn, head: str) -> None:
        lines = head.split("\r\n")
        parts = lines[0].split(" ")
        if len(parts) != 3 or not parts[2].startswith("HTTP/"):
            self._answer(c, _response("400 Bad Request", [], b""))
            return
        method, target = parts[0], parts[1]
        head = method == "HEAD"     # answered as GET is, without the body
        if head:
            method = "GET"
        headers = {}
        for line in lines[1:]:
            name, sep, value = line.partition(":")
            if sep:
                headers[name.strip().lower()] = value.strip()
        path, _, query = target.partition("?")
        if path == READY_PATH:
            ready = bool(self.cache.snapshot.attached)
            self._answer(c, _response("200 OK" if ready else "503 Service Unavailable",
                                      [("Content-Type", "text/plain")],
                                      b"ready: tracing\n" if ready else b"not ready: loading the BPF programs\n",
                                      head))
            return
        if method != "GET" or path == "/favicon.ico" or "name[]" in query:
            environ = {"REQUEST_METHOD": method, "PATH_INFO": path, "QUERY_STRING": query,
                       "HTTP_ACCEPT": headers.get("accept", ""),
                       "HTTP_ACCEPT_ENCODING": headers.get("accept-encoding", "")}
            self._wait(c, lambda: self._app(environ, head))
            return
        encoder, content_type = self.choose_encoder(headers.get("accept", ""))
        gzipped = "gzip" in headers.get("accept-encoding", "")
        key = (content_type, gzipped)
        body = self.cache.peek(content_type, gzipped)
        if body is not None:
            self._answer(c, self._metrics(key, body, head))
            return
        if len(self.wanted) < MAX_WANTED:
            self.wanted.setdefault(key, encoder)
        self._wait(c, lambda: self._metrics(key, self.cache.body(content_type, encoder, gzipped), head))

    def _metrics(self, key: tuple[str, bool], body: bytes, head: bool) -> bytes:
        """The answer carrying a cached body: made once per body and format (a body is hundreds of KB, and
        joining it to its head for every scrape was most of a scrape's CPU), then the same bytes each time."""
        headers = [("Content-Type", key[0])] + ([("Content-Encoding", "gzip")] if key[1] else [])
        if head:
            return _response("200 OK", headers, body, head)
        made = self.answers.get(key)
        if made is None or made[0] is not body:
            made = (body, _response("200 OK", headers, body))
            self.answers[key] = made        # written by this thread or the renderer's: one dict store
        return made[1]

    def _app(self, environ, head: bool) -> bytes:
        got = {}

        def start_response(status, headers):
            got["status"], got["headers"] = status, headers
        body = b"".join(self.app(environ, start_response))
        return _response(got["status"], got["headers"], body, head)

    def _wait(self, c: _Conn, job) -> None:
        c.waiting = True
        self.renderer.submit(job, ("conn", c))

    def _rendered(self) -> None:
        with contextlib.suppress(BlockingIOError):
            self.wake.recv(4096)
        for then, result in self.renderer.take_done():
            if then[0] == "ack":
                self._to_tracer(("ack",))
            elif then[0] == "stats":
                self._to_tracer(("stats", result))
            elif then[0] == "conn":
                c = then[1]
                c.waiting = False
                if c.sock.fileno() not in self.conns:
                    continue
                if isinstance(result, BaseException):
                    result = _response("500 Internal Server Error", [("Content-Type", "text/plain")],
                                       f"iotrace: {type(result).__name__}\n".encode())
                self._answer(c, result)

    def _answer(self, c: _Conn, response: bytes) -> None:
        c.out = memoryview(response)
        with contextlib.suppress(KeyError, ValueError):
            self.sel.unregister(c.sock)
        self.sel.register(c.sock, self.WRITE, None)
        self._send_some(c)

    def _send_some(self, c: _Conn) -> None:
        try:
            n = c.sock.send(c.out)
        except BlockingIOError:
            return
        except OSError:
            self._close(c)
            return
        c.out = c.out[n:]
        if not len(c.out):
            self._linger(c)


def serve(listener: socket.socket, chan: socket.socket, tracer: int, prctl, key: tuple[int, int], snap: Snapshot,
          tasks: bool) -> None:
    """The server process's life: serve `listener` from `snap` (with its `key`), then from the snapshots `chan`
    brings, until its end."""
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGUSR1, signal.SIGHUP):
        signal.signal(sig, signal.SIG_IGN)
    if prctl is not None:
        prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    if os.getppid() != tracer:
        return      # the tracer died before the signal was set
    null = os.open(os.devnull, os.O_RDWR)
    os.dup2(null, 0)
    os.dup2(null, 1)        # stderr stays: the one line of a failure
    os.close(null)
    os.chdir("/")
    sys.setswitchinterval(SWITCH_INTERVAL_S)
    _Server(listener, chan, ScrapeCache(key, snap, tasks)).run()
