"""The client's machinery, on one asyncio event loop: connections, routing,
retries, failover. AsyncClient runs it on the caller's loop; Client on a loop
of its own, in one I/O thread.

Nothing here is safe to call from another thread than the loop's. The design
is clientlib's (the Go client); the comments name the Go file each part
follows.

- One _Conn per address (two when given one address), each kept up by its
  keeper coroutine (_Conn.run): dial (TLS), authenticate, and, when the node
  it reached knows no live active, ask it with I every 50 ms (seek). An
  address that does not answer is dialled again every reconnect_interval,
  unless another connection finds the active elsewhere, where it goes at once
  (outage.go).
- Requests go round-robin over the usable connections a write at a time: the
  requests made in one turn of the loop share the current connection and go
  out in one write, which makes the next connection current (client.go).
- Answers are matched to the oldest outstanding request with the same op and
  key (conn.go). The client has one acquire of a key in progress at a time,
  whatever the connection: later acquirers of the key wait their turn, in
  order, and a try of it meanwhile is answered "held" unsent (_session.py).
- The client's session is named first on every connection ("S session"); the
  node's listing of the session's grants is reconciled with what the client
  holds and acquires (_Conn.reconcile), while the connection serves; acquires
  sent again carry seen= (_session.py, session.go).
- Every operation goes through _Core.route with a retry policy: a broken
  connection fails the request over to the next, a redirect follows the
  connection, no usable connection waits for one to come up while the
  policy's window lasts (route.go).
"""

from __future__ import annotations

import asyncio
import collections
import logging
import math
import ssl
from dataclasses import dataclass
from typing import Any, Awaitable, Callable, Coroutine, Deque, Union

from . import _wire as wire
from ._session import Keys, Turn, new_session
from .errors import AuthError, Closed, KunciError, Lost, NoActive, Refused, Stale, Timeout, Unavailable

log = logging.getLogger("kunci")
log.addHandler(logging.NullHandler())

SEEK_INTERVAL = 0.05
MAX_REDIRECTS = 8
AUTH_TIMEOUT = 3.0
# Reconciling releases the session's stale grants this many at a time (each
# batch once the one before is answered): the node closes a connection that
# sends far more than it has read.
RECONCILE_BATCH = 256


@dataclass
class Config:
    """What the client was given, checked (see Client)."""

    addrs: list[str]
    owner: bytes | None = None
    credentials: tuple[bytes, bytes, str] | None = None  # name, secret, name as str
    tls: ssl.SSLContext | None = None
    dial_timeout: float = 2.0
    reconnect_interval: float = 3.0
    probe_interval: float = 5.0
    probe_timeout: float = 3.0
    release_retry: float = 5.0
    release_interval: float = 0.2


class _Broken:
    """A call's outcome when its connection broke (or was not up) first."""

    __slots__ = ("cause",)

    def __init__(self, cause: BaseException | str) -> None:
        self.cause = cause


_REDIRECTED = "redirected"  # the node redirected the connection under the call
_NOT_UP = _Broken("connection not up")
_WAIT_OVER = _Broken("the wait ran out before the acquire could be sent")

Result = Union[wire.Answer, _Broken, str]


class _Call:
    """One request waiting for its answer. It stays outstanding on its
    connection until answered or the connection breaks, even when its caller
    gave up: answers are matched in send order. The answer goes to cb when
    set (the thread client's fast path), else to fut."""

    __slots__ = ("op", "key", "fut", "cb", "holders", "late")

    def __init__(self, op: str, key: bytes, fut: asyncio.Future[Result] | None) -> None:
        self.op = op
        self.key = key
        self.fut = fut
        self.cb: Callable[[Result], None] | None = None
        self.holders: list[wire.Holder] | None = None  # L, S: the H lines so far
        self.late: Callable[[Result], None] | None = None  # the answer after the caller left

    def resolve(self, r: Result) -> None:
        cb = self.cb
        if cb is not None:
            self.cb = None
            cb(r)
        elif self.fut is not None and not self.fut.done():
            self.fut.set_result(r)
        elif self.late is not None:
            self.late(r)


class _Link(asyncio.Protocol):
    """One network connection of a _Conn. Before it is attached, answers go to
    early (the keeper reads them: authentication, seek); after, to the
    connection's dispatch. closed gets (redirect, served, error) when it
    ends."""

    def __init__(self, conn: _Conn, loop: asyncio.AbstractEventLoop) -> None:
        self.conn = conn
        self.loop = loop
        self.transport: asyncio.Transport | None = None
        self.buf = b""
        self.attached = False
        self.served = False
        self.early: Deque[wire.Answer] = collections.deque()
        self.early_waiter: asyncio.Future[None] | None = None
        self.closed: asyncio.Future[tuple[str | None, bool, BaseException | None]] = loop.create_future()
        self.last_read = loop.time()
        self.probe_sent = 0.0
        self.probe_timer: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport

    def write(self, data: bytes) -> None:
        if self.transport is not None and not self.closed.done():
            self.transport.write(data)

    def data_received(self, data: bytes) -> None:
        if self.closed.done():
            return
        self.last_read = self.loop.time()
        buf = self.buf + data if self.buf else data
        start = 0
        conn = self.conn
        while True:
            end = buf.find(b"\n", start)
            if end < 0:
                break
            line = buf[start:end]
            start = end + 1
            if line.endswith(b"\r"):
                line = line[:-1]
            if len(line) >= wire.MAX_LINE:
                self.fail(wire.BadAnswer("answer line too long"))
                return
            try:
                a = wire.parse_answer(line)
            except wire.BadAnswer as e:
                self.fail(e)
                return
            if not self.attached:
                self.early.append(a)
                w = self.early_waiter
                if w is not None and not w.done():
                    w.set_result(None)
                continue
            if a.kind == "M":
                self.end(a.addr or None, None if a.addr else _NoActive("the node knows no active node"))
                return
            if conn.dispatch(a, self):
                self.served = True
            if self.closed.done():
                return
        self.buf = buf[start:]
        if len(self.buf) >= wire.MAX_LINE:
            self.fail(wire.BadAnswer("answer line too long"))

    def connection_lost(self, exc: Exception | None) -> None:
        self.end(None, exc or ConnectionResetError("connection closed by the node"))

    def fail(self, err: BaseException) -> None:
        self.end(None, err)

    def end(self, redirect: str | None, err: BaseException | None) -> None:
        if self.closed.done():
            return
        self.closed.set_result((redirect, self.served, err))
        if self.probe_timer is not None:
            self.probe_timer.cancel()
        w = self.early_waiter
        if w is not None and not w.done():
            w.set_result(None)
        if self.transport is not None:
            self.transport.close()
        self.conn.detach(self, redirect, err)

    async def read_answer(self, timeout: float) -> wire.Answer:
        """The next answer before the link is attached (authentication, seek)."""
        deadline = self.loop.time() + timeout
        while not self.early:
            if self.closed.done():
                _, _, err = self.closed.result()
                raise ConnectionError(f"connection closed: {err}")
            left = deadline - self.loop.time()
            if left <= 0:
                raise TimeoutError("no answer in time")
            self.early_waiter = self.loop.create_future()
            try:
                await asyncio.wait_for(asyncio.shield(self.early_waiter), left)
            except asyncio.TimeoutError:
                raise TimeoutError("no answer in time") from None
        return self.early.popleft()

    def probe_tick(self) -> None:
        """Send I on a connection that read nothing for probe_interval; close
        it when nothing comes back within probe_timeout (half-open)."""
        self.probe_timer = None
        if self.closed.done():
            return
        cfg = self.conn.core.cfg
        now = self.loop.time()
        if self.probe_sent and self.last_read < self.probe_sent:
            if now - self.probe_sent >= cfg.probe_timeout:
                self.fail(TimeoutError("the node stopped answering"))
                return
            delay = self.probe_sent + cfg.probe_timeout - now
        elif now - self.last_read >= cfg.probe_interval:
            self.probe_sent = now
            self.conn.probe()
            delay = cfg.probe_timeout
        else:
            self.probe_sent = 0.0
            delay = self.last_read + cfg.probe_interval - now
        self.probe_timer = self.loop.call_later(max(delay, 0.01), self.probe_tick)


class _NoActive(Exception):
    """The node redirected with "M -": it knows no active node."""


class _Conn:
    """One managed connection. Its keeper (run) dials, attaches and re-dials
    it; dispatch and detach are called by its current _Link."""

    def __init__(self, core: _Core, home: str, idx: int) -> None:
        self.core = core
        self.loop = core.loop
        self.home = home
        self.idx = idx
        self.link: _Link | None = None
        self.gen = 0
        self.usable = False
        self.redirecting = False
        self.first_err: BaseException | None = None
        self.acq: dict[bytes, _Call] = {}
        self.sent: dict[tuple[str, bytes], Deque[_Call]] = {}
        # The S and L calls outstanding, in send order: H lines belong to
        # the oldest (the node reads nothing after an S or L until its
        # listing has ended).
        self.lists: Deque[_Call] = collections.deque()
        # The I requests outstanding, in send order: None for a probe.
        self.infos: Deque[_Call | None] = collections.deque()
        self.wbuf: list[bytes] = []
        self.flush_pending = False
        # sessions: the node of the connection knows sessions (True: it
        # answered the client's S), predates them (False: "unknown op"), or
        # has not answered yet (None); named is done once it answered, or
        # the link ended.
        self.sessions: bool | None = None
        self.named: asyncio.Future[None] | None = None

    # -- sending and answers (conn.go) --

    def send(self, call: _Call, line: bytes) -> None:
        """Register call as outstanding and buffer its line; the buffer is
        written once this turn of the loop ends. The link must be up."""
        if call.op == "A":
            assert call.key not in self.acq, "two acquires of a key outstanding on a connection"
            self.acq[call.key] = call
        elif call.op == "L" or call.op == "S":
            self.lists.append(call)
        elif call.op == "I":
            self.infos.append(call)
        else:
            k = (call.op, call.key)
            q = self.sent.get(k)
            if q is None:
                q = self.sent[k] = collections.deque()
            q.append(call)
        self.wbuf.append(line)
        if not self.flush_pending:
            self.flush_pending = True
            self.loop.call_soon(self.flush)

    def flush(self) -> None:
        self.flush_pending = False
        if self.wbuf and self.link is not None:
            data = b"".join(self.wbuf) if len(self.wbuf) > 1 else self.wbuf[0]
            self.wbuf.clear()
            self.link.write(data)
            self.core.rotate(self)
        else:
            self.wbuf.clear()

    def probe(self) -> None:
        if self.link is None:
            return
        self.infos.append(None)
        self.wbuf.append(wire.INFO_LINE)
        if not self.flush_pending:
            self.flush_pending = True
            self.loop.call_soon(self.flush)

    def dispatch(self, a: wire.Answer, link: _Link) -> bool:
        """Hand a to the oldest outstanding call it answers; report whether
        there was one."""
        kind = a.kind
        if kind == "T":
            op = "A"
        elif kind == "E":
            if len(a.op) != 1:
                log.warning("kunci: node error: %s", a.reason)
                return False
            op = a.op
        elif kind == "H":
            if self.lists and a.holder is not None:
                hs = self.lists[0].holders
                if hs is not None:
                    hs.append(a.holder)
            return False
        else:
            op = kind
        call: _Call | None
        if op == "A":
            call = self.acq.pop(a.key, None)
        elif op == "L" or op == "S":
            call = self._take_listing(op)
            if call is not None and kind == op:
                a.holders = call.holders
        elif op == "I":
            call = self.infos.popleft() if self.infos else None
            if call is None:
                return False  # a probe's answer
        else:
            k = (op, a.key)
            q = self.sent.get(k)
            call = None
            if q:
                call = q.popleft()
                if not q:
                    del self.sent[k]
        if call is None:
            log.debug("kunci: answer with no request: %s", a)
            return False
        call.resolve(a)
        return True

    def _take_listing(self, op: str) -> _Call | None:
        """Remove and return the oldest outstanding S or L call (op): an
        answer to either names no key (a refusal's echo names S's session,
        L's limit)."""
        for i, c in enumerate(self.lists):
            if c.op == op:
                del self.lists[i]
                return c
        return None

    # -- the connection's life (conn.go run, attach, detach) --

    def attach(self, link: _Link, addr: str, named: bool) -> None:
        self.link = link
        self.addr = addr
        self.gen += 1
        self.wbuf.clear()
        self.usable = True
        self.redirecting = False
        link.attached = True
        cfg = self.core.cfg
        link.probe_timer = self.loop.call_later(cfg.probe_interval, link.probe_tick)
        # The session goes first: the node lists what it holds for it, and
        # reconcile releases what the client no longer holds.
        self.name_session()
        if named:
            self.core.outage.active = addr
        self.core.fire_ups()

    def detach(self, link: _Link, redirect: str | None, err: BaseException | None) -> None:
        """End link: every outstanding call learns that it broke or was
        redirected."""
        if link is not self.link:
            return
        self.link = None
        self.usable = False
        self.redirecting = redirect is not None
        r: Result = _REDIRECTED if redirect is not None else _Broken(err or "connection lost")
        calls: list[_Call] = list(self.acq.values())
        for q in self.sent.values():
            calls.extend(q)
        calls.extend(self.lists)
        calls.extend(c for c in self.infos if c is not None)
        self.acq.clear()
        self.sent.clear()
        self.lists.clear()
        self.infos.clear()
        self.wbuf.clear()
        for c in calls:
            c.resolve(r)
        self.sessions = None
        named, self.named = self.named, None
        if named is not None and not named.done():
            named.set_result(None)

    async def dial(self, addr: str) -> _Link:
        cfg = self.core.cfg
        host, port = wire.split_addr(addr)
        link: _Link | None = None

        def factory() -> _Link:
            nonlocal link
            link = _Link(self, self.loop)
            return link

        if cfg.tls is not None:
            dial = self.loop.create_connection(
                factory, host, port, ssl=cfg.tls, server_hostname=host, ssl_handshake_timeout=cfg.dial_timeout
            )
        else:
            dial = self.loop.create_connection(factory, host, port)
        try:
            await asyncio.wait_for(dial, cfg.dial_timeout)
        except asyncio.TimeoutError:
            raise TimeoutError(f"dial {addr}: no answer within {cfg.dial_timeout} s") from None
        assert link is not None
        return link

    async def authenticate(self, link: _Link, addr: str) -> None:
        cr = self.core.cfg.credentials
        if cr is None:
            return
        link.write(wire.auth_line(cr[0], cr[1]))
        try:
            a = await link.read_answer(self.core.cfg.dial_timeout + AUTH_TIMEOUT)
        except (TimeoutError, ConnectionError) as e:
            raise ConnectionError(f"kunci: {addr}: no answer to the credentials: {e}") from None
        if a.kind == "U":
            return
        if a.kind == "E" and a.op == "U" and a.reason == "already authenticated":
            # The node took the client certificate, which names a
            # credential, for the connection's: it is authenticated.
            return
        if a.kind == "E" and a.op == "U":
            raise AuthError(addr, a.reason)
        if a.kind == "E":
            raise ConnectionError(f"kunci: {addr} refused the connection: {a.reason}")
        raise ConnectionError(f"kunci: {addr}: unexpected answer to the credentials: {a.kind}")

    async def seek(self, link: _Link, addr: str) -> tuple[bool, str]:
        """Ask the node on link which node is the active, every 50 ms, until
        it says it is (True) or names another that is not down (its address);
        another connection finding the active meanwhile ends it too."""
        core = self.core
        while True:
            link.write(wire.INFO_LINE)
            a = await link.read_answer(core.cfg.probe_timeout)
            if a.kind != "I":
                raise ConnectionError(f"kunci: {addr}: answered I with {a.kind}")
            if a.role == "active":
                return True, ""
            if a.active and not core.outage.is_down(a.active):
                return False, a.active
            up = core.ups
            to = core.outage.active_but(addr)
            if to:
                return False, to
            await asyncio.wait((up,), timeout=SEEK_INTERVAL)

    async def pause(self, d: float, addr: str) -> str:
        """Wait d before dialling again after a failure at addr; return early
        with the active's address when one is known elsewhere."""
        core = self.core
        deadline = self.loop.time() + d
        while True:
            up = core.ups
            a = core.outage.active_but(addr)
            if a:
                return a
            left = deadline - self.loop.time()
            if left <= 0:
                return ""
            await asyncio.wait((up,), timeout=left)

    async def run(self, first: asyncio.Future[None]) -> None:
        core = self.core
        cfg = core.cfg
        addr = self.home
        named = seek = False
        bounces = 0
        attempt = -1
        while not core.closed:
            attempt += 1
            link: _Link | None = None
            err: BaseException | None = None
            try:
                link = await self.dial(addr)
            except (OSError, ssl.SSLError, ValueError) as e:
                err = e
            core.outage.dialed(addr, err)
            if err is not None:
                core.last_dial_error = f"{addr}: {err}"
            if link is not None:
                try:
                    await self.authenticate(link, addr)
                    if seek:
                        active, to = await self.seek(link, addr)
                        if not active:
                            link.fail(ConnectionError("moving to the active"))
                            log.debug("kunci: %s names the active %s", addr, to)
                            addr, named, seek = to, True, False
                            continue
                        named = True
                except (OSError, AuthError, wire.BadAnswer) as e:
                    err = e
                    link.fail(e)
                except BaseException:
                    link.fail(Closed("kunci: client closed"))  # not attached: close() cannot see it
                    raise
            if err is not None:
                if attempt == 0:
                    self.first_err = err
                    if not first.done():
                        first.set_result(None)
                if isinstance(err, AuthError):
                    core.auth_err = err
                    log.warning("kunci: credentials refused: %s", err)
                else:
                    log.debug("kunci: dial %s failed: %s", addr, err)
                if addr != self.home:
                    addr, named, seek = self.home, False, True
                    continue
                to = await self.pause(cfg.reconnect_interval, addr)
                if to:
                    addr, named, seek = to, True, False
                continue
            assert link is not None
            if cfg.credentials is not None:
                core.auth_err = None
            sought = seek
            if core.closed:
                # Closed while the dial finished: asyncio.wait_for before
                # Python 3.12 returns the connection and drops the
                # cancellation when both come in one turn, and nobody would
                # close this link.
                link.fail(Closed("kunci: client closed"))
                return
            if link.closed.done():
                continue
            self.attach(link, addr, named)
            if attempt == 0 and not first.done():
                first.set_result(None)
            since = self.loop.time()
            redirect, served, err = await asyncio.shield(link.closed)
            if redirect is None and isinstance(err, _NoActive):
                seek = True
            elif redirect is not None and core.outage.is_down(redirect):
                err = ConnectionError(f"the node names an active that does not answer: {redirect}")
                redirect, seek = None, True
            else:
                seek = False
            if served:
                bounces = 0
            quick = not served and self.loop.time() - since < cfg.reconnect_interval
            if core.closed:
                return
            if redirect is not None:
                log.debug("kunci: redirected from %s to %s", addr, redirect)
                addr, named = redirect, True
                bounces += 1
                if bounces > MAX_REDIRECTS:
                    await asyncio.sleep(cfg.reconnect_interval)
            elif seek:
                log.debug("kunci: %s knows no active that answers: %s", addr, err)
                if quick and sought:
                    await asyncio.sleep(cfg.reconnect_interval)
            else:
                log.debug("kunci: connection to %s lost: %s", addr, err)
                lost = addr
                addr, named = self.home, False
                if quick:
                    core.outage.mark_down(lost)
                    if lost == self.home:
                        to = await self.pause(cfg.reconnect_interval, lost)
                        if to:
                            addr, named, seek = to, True, False

    # -- the session (session.go: nameSession, reconcile) --

    def name_session(self) -> None:
        """Put the client's session first on the connection just attached
        ("S session"); its answer goes to reconcile."""
        self.sessions = None
        self.named = self.loop.create_future()
        call = _Call("S", b"", None)
        call.holders = []
        gen = self.gen
        call.cb = lambda r: self.reconcile(r, gen)
        self.send(call, wire.session_line(self.core.session))

    def reconcile(self, r: Result, gen: int) -> None:
        """The node's answer to the session named on the connection of gen:
        release the grants it lists for the session that the client does
        not keep (Keys.keeps): their releases were lost (an active crashed
        after it answered them), or their acquires were given up before
        their answers came. A node from before sessions answers "unknown
        op": then nothing is sent with seen= on the connection; one that
        answers "auth required" wants credentials the client was not given.
        It runs as the answer is read: the connection serves meanwhile."""
        if not isinstance(r, wire.Answer) or gen != self.gen:
            return  # the connection broke or moved: the next one names it again
        core = self.core
        if r.kind == "S":
            self.sessions = True
            core.auth_answered()
            listed = r.holders or []
            keys = core.keys
            kbs = set()
            stale: list[tuple[bytes, int]] = []
            for h in listed:
                kb = h.key.encode("utf-8", "surrogateescape")
                kbs.add(kb)
                if not keys.keeps(kb, h.token):
                    stale.append((kb, h.token))
            keys.resolve(kbs)
            if stale:
                log.debug("kunci: %s lists %d grants of the session the client no longer holds: releasing them",
                          self.addr, len(stale))
                self._release_stale(gen, stale)
        else:
            self.sessions = False
            if r.kind == "E" and r.reason == "auth required":
                core.auth_required(self.addr)
            elif r.kind == "E" and r.reason == "unknown op":
                log.debug("kunci: %s predates sessions: no seen= on its connection", self.addr)
                core.auth_answered()
            else:
                log.warning("kunci: %s refused the session: %s", self.addr, r.reason or r.kind)
        named, self.named = self.named, None
        if named is not None and not named.done():
            named.set_result(None)

    def _release_stale(self, gen: int, stale: list[tuple[bytes, int]]) -> None:
        """Release stale grants on the connection of gen, a batch at a time:
        the next batch once the answers to this one are in (OK or STALE,
        they need nothing more)."""
        if gen != self.gen or self.link is None:
            return
        batch, rest = stale[:RECONCILE_BATCH], stale[RECONCILE_BATCH:]
        left = len(batch)

        def answered(r: Result) -> None:
            nonlocal left
            left -= 1
            if left == 0 and rest:
                self._release_stale(gen, rest)

        for kb, token in batch:
            call = _Call("R", kb, None)
            call.cb = answered
            self.send(call, wire.release_line(kb, token))

    # -- one request on this connection --

    async def do(self, op: str, key: bytes, line: bytes) -> Result:
        if self.link is None:
            return _NOT_UP
        call = _Call(op, key, self.loop.create_future())
        if op == "L":
            call.holders = []
        self.send(call, line)
        assert call.fut is not None
        return await call.fut

    async def acquire(
        self, key: bytes, lease_ms: int, deadline: float | None, try_: bool, kind: bytes, turn: Turn
    ) -> Result:
        """Send one attempt of the acquire of turn on this connection, with
        the wait left until deadline (None: no bound), or as a try; kind is
        wire.kind_field's. An attempt that follows one whose answer did not
        come (or an unresolved acquire of the key) carries seen= when the
        node knows sessions: it first waits for the node's answer to the
        session, the connection's first answer."""
        if self.link is None:
            return _NOT_UP
        seen: int | None = None
        if turn.resend:
            if self.sessions is None and self.named is not None:
                gen = self.gen
                timeout = None if deadline is None else max(deadline - self.loop.time(), 0)
                await asyncio.wait((self.named,), timeout=timeout)
                if self.gen != gen or self.link is None:
                    return _REDIRECTED if self.redirecting else _NOT_UP
                if self.sessions is None:
                    return _WAIT_OVER
            if self.sessions:
                seen = turn.seen
        wait: int | None = None
        if not try_:
            wait = 0
            if deadline is not None:
                left = deadline - self.loop.time()
                if left <= 0:
                    return _WAIT_OVER
                wait = max(math.ceil(left * 1000), 1)
        call = _Call("A", key, self.loop.create_future())
        turn.mark_sent()
        self.send(call, wire.acquire_line(key, lease_ms, wait, self.core.cfg.owner, kind, seen))
        try:
            assert call.fut is not None
            r = await call.fut
        except asyncio.CancelledError:
            self._withdraw(call, turn)
            raise
        if not isinstance(r, wire.Answer):
            turn.unknown = True  # it may have reached the node
        return r

    def _withdraw(self, call: _Call, turn: Turn) -> None:
        """The caller of the outstanding acquire call gave up: cancel it on
        the node (C key), and release a grant that won the race. The turn
        ends with the acquire's answer: no other acquire of the key goes out
        while this one may still be granted."""
        core = self.core
        turn.withdrawing = True

        def late(r: Result) -> None:
            if isinstance(r, wire.Answer):
                if r.kind == "A":
                    core.keys.raise_seen(r.token)
                    core.spawn(core.release(call.key, r.token))
                turn.leave(None, True)
            else:
                turn.unknown = True
                turn.leave(None, False)

        fut = call.fut
        if fut is not None and fut.done() and not fut.cancelled():
            # Answered in the turn the caller gave up (a timeout's timer
            # ran after the answer was read, before the caller's task did):
            # asyncio cancels the task anyway, so the grant is ours to end.
            late(fut.result())
            return
        call.late = late
        if self.link is not None and self.acq.get(call.key) is call:
            cc = _Call("C", call.key, self.loop.create_future())
            self.send(cc, wire.cancel_line(call.key))


class _Outage:
    """What the connections learned of nodes down and of the active
    (outage.go)."""

    def __init__(self, loop: asyncio.AbstractEventLoop, forget: float) -> None:
        self.loop = loop
        self.down: dict[str, float] = {}
        self.active = ""
        self.forget = forget

    def dialed(self, addr: str, err: BaseException | None) -> None:
        if err is None:
            self.down.pop(addr, None)
        elif not isinstance(err, AuthError):
            self.mark_down(addr)

    def mark_down(self, addr: str) -> None:
        self.down[addr] = self.loop.time()

    def is_down(self, addr: str) -> bool:
        at = self.down.get(addr)
        if at is None:
            return False
        if self.loop.time() - at >= self.forget:
            del self.down[addr]
            return False
        return True

    def active_but(self, not_addr: str) -> str:
        a = self.active
        if not a or a == not_addr or self.is_down(a):
            return ""
        return a


@dataclass
class _Policy:
    """How long a request is tried again (route.go): until deadline (an
    acquire's wait); or for span from the first failure (release, extend,
    inspect), not past ends(); or without bound (an acquire with wait 0)."""

    deadline: float | None = None
    span: float = 0.0
    unbounded: bool = False
    ends: Callable[[], float] | None = None
    over: Callable[[object], KunciError] | None = None


class _TryAgainLater(Exception):
    pass


class LockState:
    """A grant, shared by the sync and async Lock handles. Loop thread only."""

    def __init__(self, core: _Core, key: str, kb: bytes, token: int, lease: float, ends: float) -> None:
        self.core = core
        self.key = key
        self.kb = kb
        self.token = token
        self.lease = lease
        self.ends = ends  # loop time when the grant ends on the node (at the latest)
        self.ended = False
        self.lost = False
        self.keeper: asyncio.Task[object] | None = None
        self.on_lost: list[Callable[[], None]] = []

    def lose(self) -> None:
        self.ended = True
        if not self.lost:
            self.lost = True
            for f in self.on_lost:
                f()


class LockHandle:
    """What a sync Lock and an AsyncLock show alike: the grant's key,
    fencing token and lease."""

    __slots__ = ("_ls",)

    def __init__(self, ls: LockState) -> None:
        self._ls = ls

    @property
    def key(self) -> str:
        return self._ls.key

    @property
    def token(self) -> int:
        """The grant's fencing token, an unsigned 64-bit int: larger than
        every token the cluster issued before it."""
        return self._ls.token

    @property
    def lease(self) -> float:
        return self._ls.lease

    def __repr__(self) -> str:
        return f"{type(self).__name__}(key={self.key!r}, token={self.token})"


def end_lock_block(ls: LockState, lost: bool, block_raised: bool, release_err: Exception | None) -> None:
    """Raise what the end of a "with c.lock(...)" block (sync or async)
    raises, given whether the lock was lost before its release, whether the
    block raised, and what the release raised (None: it released). A block
    that raised keeps its own exception; otherwise a release that found the
    grant gone, or a lock lost meanwhile, is kunci.Lost, and any other
    failure of the release is raised as it is."""
    if block_raised:
        return
    if isinstance(release_err, Stale):
        raise lost_error(ls) from release_err
    if release_err is not None:
        raise release_err
    if lost:
        raise lost_error(ls)


class _Core:
    def __init__(self, cfg: Config, loop: asyncio.AbstractEventLoop) -> None:
        self.cfg = cfg
        self.loop = loop
        self.closed = False
        self.auth_err: AuthError | None = None
        self.last_dial_error = ""
        self.outage = _Outage(loop, min(cfg.reconnect_interval, 1.0))
        self.ups: asyncio.Future[None] = loop.create_future()
        addrs = cfg.addrs if len(cfg.addrs) > 1 else [cfg.addrs[0], cfg.addrs[0]]
        self.conns = [_Conn(self, a, i) for i, a in enumerate(addrs)]
        self.cur = 0
        self.tasks: set[asyncio.Task[object]] = set()
        # The client's session, and what it knows of the keys it holds and
        # acquires (_session.py).
        self.session = new_session()
        self.keys = Keys(loop, cfg.release_retry)

    async def start(self) -> None:
        firsts = []
        for cn in self.conns:
            f: asyncio.Future[None] = self.loop.create_future()
            firsts.append(f)
            self.spawn(cn.run(f))
        try:
            await asyncio.gather(*firsts)
        except BaseException:
            self.shut()  # given up (cancelled): nothing may go on dialling
            raise
        errs = [cn.first_err for cn in self.conns]
        if all(isinstance(e, AuthError) for e in errs):
            await self.close()
            e0 = errs[0]
            assert isinstance(e0, AuthError)
            raise AuthError(e0.addr, e0.reason)

    def spawn(self, coro: Coroutine[Any, Any, object]) -> None:
        t: asyncio.Task[object] = self.loop.create_task(coro)
        self.tasks.add(t)
        t.add_done_callback(self._reap)

    def _reap(self, t: asyncio.Task[object]) -> None:
        self.tasks.discard(t)
        if not t.cancelled() and t.exception() is not None:
            log.error("kunci: background task failed", exc_info=t.exception())

    async def close(self) -> None:
        if self.closed:
            return
        ts = self.shut()
        if ts:
            await asyncio.gather(*ts, return_exceptions=True)

    def shut(self) -> list[asyncio.Task[object]]:
        """Close every connection and cancel every background task (close
        without waiting for them to end); return the tasks."""
        self.closed = True
        for cn in self.conns:
            if cn.link is not None:
                cn.link.fail(Closed("kunci: client closed"))
        me = asyncio.current_task()
        ts = [t for t in self.tasks if t is not me]
        for t in ts:
            t.cancel()
        self.fire_ups()
        return ts

    def fire_ups(self) -> None:
        old, self.ups = self.ups, self.loop.create_future()
        old.set_result(None)

    def rotate(self, cn: _Conn) -> None:
        self.cur = (cn.idx + 1) % len(self.conns)

    def next(self, after: _Conn | None) -> _Conn | None:
        n = len(self.conns)
        start = self.cur if after is None else after.idx + 1
        for i in range(n):
            cn = self.conns[(start + i) % n]
            if cn.usable:
                return cn
        return None

    def auth_required(self, addr: str) -> None:
        """A node answered the session "auth required": it wants credentials.
        Without any, the requests that find no connection say so at once
        (AuthError), as the node's refusal of them did before sessions."""
        if self.cfg.credentials is None:
            self.auth_err = AuthError(addr, "auth required")
        log.warning("kunci: %s requires credentials, and the client has none", addr)

    def auth_answered(self) -> None:
        """A node served a connection without credentials: forget that one
        asked for them."""
        if self.cfg.credentials is None:
            self.auth_err = None

    def check_auth(self) -> None:
        """Raise the AuthError of a client without credentials that a node
        asked for some."""
        e = self.auth_err
        if e is not None and self.cfg.credentials is None:
            raise AuthError(e.addr, e.reason)

    def no_connection(self, cause: object) -> Unavailable:
        msg = "kunci: no node answered"
        if cause is not None and cause is not _NOT_UP.cause:
            msg += f" ({cause})"
        if self.auth_err is not None:
            msg += f"; the credentials were refused: {self.auth_err.reason}"
        elif self.last_dial_error:
            msg += f"; last dial error: {self.last_dial_error}"
        return Unavailable(msg)

    async def route(self, p: _Policy, send: Callable[[_Conn], Awaitable[Result]]) -> wire.Answer:
        """Send a request by policy p until a connection answers it."""
        loop = self.loop
        attempts = redirects = 0
        last: object = None
        failed: _Conn | None = None
        until = p.deadline
        windowless = p.deadline is None and not p.unbounded and p.span <= 0

        def failure() -> None:
            nonlocal until
            if until is None and p.span > 0:
                until = loop.time() + p.span
                if p.ends is not None:
                    until = min(until, p.ends())

        def fail() -> KunciError:
            if p.over is not None:
                return p.over(last)
            return self.no_connection(last)

        while True:
            if self.closed:
                raise Closed("kunci: client closed")
            if until is not None and loop.time() >= until:
                raise fail()
            cn = self.next(failed)
            if cn is not None:
                try:
                    r = await send(cn)
                except _TryAgainLater:
                    raise fail() from None
                if isinstance(r, wire.Answer):
                    return r
                if r is _REDIRECTED:
                    last, failed = "redirected: the active moved", cn
                    redirects += 1
                    if redirects > MAX_REDIRECTS:
                        raise self.no_connection("too many redirects")
                    if windowless and until is None:
                        until = loop.time() + self.cfg.dial_timeout
                    failure()
                    continue
                assert isinstance(r, _Broken)
                if r is _WAIT_OVER:
                    raise fail()
                self.check_auth()
                last, failed = r.cause, cn
                attempts += 1
                if windowless and attempts >= len(self.conns):
                    raise fail()
                failure()
                continue
            # No connection is usable: wait for one to come up.
            self.check_auth()
            if last is None:
                last = _NOT_UP.cause
            if windowless and until is None:
                raise fail()
            failure()
            up = self.ups
            timeout = None if until is None else max(until - loop.time(), 0)
            if p.span > 0:
                # Releases and their kind look again every release_interval too.
                timeout = self.cfg.release_interval if timeout is None else min(timeout, self.cfg.release_interval)
            await asyncio.wait((up,), timeout=timeout)

    def refusal(self, a: wire.Answer, key: str) -> KunciError:
        if a.reason == "auth required":
            return AuthError(self.cfg.addrs[0], a.reason)
        return Refused(a.op, key, a.reason)

    # -- the operations --

    async def acquire(
        self, key: str, lease: float, wait: float, try_: bool, deadline: float | None = None,
        *, limit: int | None = None, shared: bool = False, turn: Turn | None = None,
    ) -> LockState | None:
        """Acquire key (deadline, when given, is when the wait ends: an
        acquire that began elsewhere); as a semaphore of limit holders, or a
        shared grant of a read-write lock (wire.kind_field). One acquire of
        a key is in progress at a time (Keys.take, Keys.wait_turn): the
        others wait their turn, and a try meanwhile is None at once. turn,
        when given, is the turn of an acquire that began elsewhere (the
        thread client's first attempt)."""
        kb = wire.check_key(key)
        lms = wire.lease_ms(lease)
        wms = 0 if try_ else wire.wait_ms(wait)
        kind = wire.kind_field(limit, shared)
        loop = self.loop
        p = _Policy()
        if wms > 0:
            p.deadline = loop.time() + wms / 1000 if deadline is None else deadline
            p.over = lambda last: (
                Timeout(f"kunci: wait for {key} ran out")
                if last is None
                else self.no_connection(f"no active node answered within the wait of {wait} s; last: {last}")
            )
        elif not try_:
            p.unbounded = True
        until = p.deadline
        if turn is None:
            turn = self.keys.take(kb)
            if turn is None:
                if try_:
                    return None  # an acquire of key is in progress: held
                turn = await self.keys.wait_turn(kb, until, key)
        t = turn

        async def send(cn: _Conn) -> Result:
            return await cn.acquire(kb, lms, until, try_, kind, t)

        try:
            a = await self.route(p, send)
        except BaseException:
            if not t.withdrawing:
                t.leave(None, False)
            raise
        return self.granted(a, key, kb, lms, try_, t)

    def granted(self, a: wire.Answer, key: str, kb: bytes, lms: int, try_: bool, turn: Turn) -> LockState | None:
        """The outcome of an acquire's answer, which ends its turn: a grant,
        None for a try that found the key held, or the error."""
        if a.kind == "A":
            ls = LockState(self, key, kb, a.token, lms / 1000, self.loop.time() + lms / 1000)
            self.keys.raise_seen(a.token)
            turn.leave(ls, True)
            return ls
        turn.leave(None, True)
        if a.kind == "T":
            if try_:
                return None
            raise Timeout(f"kunci: wait for {key} ran out")
        if a.kind == "E":
            raise self.refusal(a, key)
        raise KunciError(f"kunci: unexpected answer {a.kind} to an acquire")

    def _retrying(self, ends: Callable[[], float] | None = None) -> _Policy:
        return _Policy(span=self.cfg.release_retry, ends=ends)

    async def release(self, kb: bytes, token: int) -> bool:
        """Release; True for OK (released now, or by this client's session
        before), False for STALE (the grant is not the client's any more)."""
        line = wire.release_line(kb, token)

        async def send(cn: _Conn) -> Result:
            return await cn.do("R", kb, line)

        a = await self.route(self._retrying(), send)
        if a.kind == "E":
            raise self.refusal(a, kb.decode("utf-8", "surrogateescape"))
        return a.ok

    async def release_lock(self, ls: LockState) -> None:
        self.stop_keep_alive(ls)
        self.released(ls, await self.release(ls.kb, ls.token))

    async def release_quietly(self, ls: LockState) -> None:
        """Release a grant nobody will hold (its caller gave up as it came)."""
        try:
            await self.release_lock(ls)
        except KunciError as e:
            log.debug("kunci: release of %s, which nobody holds: %s", ls.key, e)

    def released(self, ls: LockState, ok: bool) -> None:
        """The node answered ls's release: the client holds it no more."""
        ls.ended = True
        self.keys.drop(ls)
        if not ok:
            raise Stale(f"kunci: release of {ls.key}: token {ls.token} is not yours any more "
                        "(the lease ran out, another released it, or a failover lost it)")

    async def extend(self, ls: LockState, lease: float) -> None:
        lms = wire.lease_ms(lease)
        line = wire.extend_line(ls.kb, ls.token, lms)
        sent = 0.0

        async def send(cn: _Conn) -> Result:
            nonlocal sent
            sent = self.loop.time()
            return await cn.do("X", ls.kb, line)

        a = await self.route(self._retrying(lambda: ls.ends), send)
        if a.kind == "E":
            raise self.refusal(a, ls.key)
        if not a.ok:
            ls.ended = True
            self.keys.drop(ls)
            raise Stale(f"kunci: extend of {ls.key}: token {ls.token} is not yours any more "
                        "(the lease ran out, another released it, or a failover lost it)")
        ls.lease = lms / 1000
        ls.ends = sent + ls.lease

    async def inspect(self, key: str) -> wire.Holder | None:
        """Who holds key, None when nobody does (the node answered FREE)."""
        kb = wire.check_key(key)
        line = wire.inspect_line(kb)

        async def send(cn: _Conn) -> Result:
            return await cn.do("Q", kb, line)

        a = await self.route(self._retrying(), send)
        if a.kind == "E":
            raise self.refusal(a, key)
        assert a.holder is not None
        return a.holder if a.holder.held else None

    # -- listings and the cluster (list.go) --

    async def locks(self, prefix: str | None, limit: int) -> tuple[list[wire.Holder], bool]:
        pb = wire.check_key(prefix, "prefix") if prefix else None
        line = wire.list_line(wire.check_limit(limit), pb)

        async def send(cn: _Conn) -> Result:
            return await cn.do("L", b"", line)

        a = await self.route(self._retrying(), send)
        if a.kind == "E":
            raise self.refusal(a, "")
        return list(a.holders or []), a.more

    async def info(self) -> wire.Node:
        """What the node a connection goes to says of itself (I): its
        address, role, and the active it knows. Every node answers."""

        async def send(cn: _Conn) -> Result:
            return await cn.do("I", b"", wire.INFO_LINE)

        a = await self.route(self._retrying(), send)
        if a.kind != "I":
            raise KunciError(f"kunci: unexpected answer {a.kind} to I")
        return wire.Node(a.self_addr, a.role, a.active)

    async def active(self) -> str:
        """The active's address, as a node knows it; NoActive when it knows
        none (an election is under way). A single node is its own active."""
        n = await self.info()
        if not n.active:
            raise NoActive(f"kunci: no active node known (asked {n.addr})")
        return n.active

    # -- keep-alive (keepalive.go) --

    def keep_alive(self, ls: LockState) -> None:
        self.stop_keep_alive(ls)
        if ls.ended:
            return  # released, or known lost: nothing to keep
        t: asyncio.Task[object] = self.loop.create_task(self._keep_alive(ls))
        ls.keeper = t
        self.tasks.add(t)
        t.add_done_callback(self._reap)

    def stop_keep_alive(self, ls: LockState) -> None:
        t, ls.keeper = ls.keeper, None
        if t is not None and t is not asyncio.current_task():
            t.cancel()

    async def _keep_alive(self, ls: LockState) -> None:
        """Extend the lease by its length every third of it; the lock is lost
        when the node answers STALE (or refuses), or the lease runs out while
        no node answers."""
        loop = self.loop
        lease = ls.lease
        period = max(lease / 3, 0.001)
        retry = min(self.cfg.release_interval, period)
        valid_until = ls.ends
        nxt = max(valid_until - lease + period - loop.time(), 0)
        while True:
            await asyncio.sleep(nxt)
            if loop.time() > valid_until:
                log.info("kunci: lease of %s ran out while no node answered", ls.key)
                self.keys.drop(ls)
                ls.lose()
                return
            sent = loop.time()
            try:
                await asyncio.wait_for(self.extend(ls, lease), max(valid_until - sent, 0.001))
                valid_until = sent + lease
                nxt = period
            except (Stale, Refused, AuthError) as e:
                log.info("kunci: lock %s lost: %s", ls.key, e)
                self.keys.drop(ls)
                ls.lose()
                return
            except (Unavailable, asyncio.TimeoutError):
                if self.closed:
                    return
                nxt = max(min(retry, valid_until - loop.time() + 0.001), 0)


class Waiter:
    """A thread client's caller waiting for the loop: finish(value, error)
    is called once, in the loop's thread. cancel, when set, withdraws what
    the caller waits for (it gave up)."""

    cancel: Callable[[], None] | None

    def finish(self, value: object, err: BaseException | None) -> None:
        raise NotImplementedError


def fast_acquire(
    core: _Core, w: Waiter, key: str, lease: float, wait: float, try_: bool,
    limit: int | None = None, shared: bool = False,
) -> None:
    """An acquire for the thread client, in the loop's thread: sent at once on
    the current connection, answered to w by a callback, without a task,
    when the key's turn is free (a try while it is not: None at once,
    unsent); otherwise, or when a connection breaks under it, or none is
    usable, the full route (a task) with the wait it has left."""
    try:
        kb = wire.check_key(key)
        lms = wire.lease_ms(lease)
        wms = 0 if try_ else wire.wait_ms(wait)
        kind = wire.kind_field(limit, shared)
    except (ValueError, TypeError) as e:
        w.finish(None, e)
        return
    loop = core.loop
    deadline = loop.time() + wms / 1000 if wms > 0 else None

    def full(turn: Turn | None) -> None:
        slow(core, w, core.acquire(key, lease, wait, try_, deadline, limit=limit, shared=shared, turn=turn), turn)

    if core.closed:
        full(None)
        return
    taken = core.keys.take(kb)
    if taken is None:
        if try_:
            w.finish(None, None)  # an acquire of key is in progress: held
        else:
            full(None)  # waits its turn
        return
    turn = taken
    first = core.next(None)
    if first is None or (turn.resend and first.sessions is None):
        full(turn)
        return
    cn = first
    seen = turn.seen if turn.resend and cn.sessions else None
    call = _Call("A", kb, None)

    def answered(r: Result) -> None:
        if isinstance(r, wire.Answer):
            try:
                w.finish(core.granted(r, key, kb, lms, try_, turn), None)
            except KunciError as e:
                w.finish(None, e)
        else:
            turn.unknown = True  # it may have reached the node
            full(turn)

    def cancel() -> None:
        if call.cb is answered:
            call.cb = None
            cn._withdraw(call, turn)

    call.cb = answered
    w.cancel = cancel
    turn.mark_sent()
    cn.send(call, wire.acquire_line(kb, lms, None if try_ else wms, core.cfg.owner, kind, seen))


def fast_release(core: _Core, w: Waiter, ls: LockState) -> None:
    """A release for the thread client, as fast_acquire: the full route (a
    task, retrying for 5 s) only when the first connection fails it."""
    core.stop_keep_alive(ls)
    cn = core.next(None)
    if core.closed or cn is None:
        slow(core, w, core.release_lock(ls))
        return
    call = _Call("R", ls.kb, None)

    def answered(r: Result) -> None:
        if isinstance(r, wire.Answer):
            try:
                if r.kind == "E":
                    raise core.refusal(r, ls.key)
                core.released(ls, r.ok)
                w.finish(None, None)
            except KunciError as e:
                w.finish(None, e)
        else:
            slow(core, w, core.release_lock(ls))

    call.cb = answered
    cn.send(call, wire.release_line(ls.kb, ls.token))


def slow(core: _Core, w: Waiter, coro: Coroutine[Any, Any, object], turn: Turn | None = None) -> None:
    """Run coro as a task of the loop and tell w its outcome. turn, when
    given, is an acquire's turn that coro takes over: it ends with the task
    at the latest (a task cancelled before it ran never saw it)."""
    t: asyncio.Task[object] = core.loop.create_task(coro)
    core.tasks.add(t)

    def done(t: asyncio.Task[object]) -> None:
        core.tasks.discard(t)
        if turn is not None and not turn.withdrawing:
            turn.leave(None, False)
        if t.cancelled():
            w.finish(None, Closed("kunci: cancelled"))
        elif t.exception() is not None:
            w.finish(None, t.exception())
        else:
            w.finish(t.result(), None)

    def cancel() -> None:
        t.cancel()

    t.add_done_callback(done)
    w.cancel = cancel


def lost_error(ls: LockState) -> Lost:
    return Lost(f"kunci: lock {ls.key} (token {ls.token}) was lost")
