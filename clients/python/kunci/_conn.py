"""One managed connection: its keeper, which dials, authenticates, seeks the
active and re-dials; the requests outstanding on it and the matching of
answers to them; the client's session on it (clientlib's conn.go, session.go).

Its fields are the event loop's; in the thread client, Core.mu's (the loop
thread holds it but while it sleeps), so that a caller thread sends and
reads on the connection itself (_link.py).
"""

from __future__ import annotations

import asyncio
import collections
import logging
import math
import socket
import ssl
from typing import TYPE_CHECKING, Deque

from . import _wire as wire
from ._call import _NOT_UP, _REDIRECTED, _WAIT_OVER, Result, Waiter, _Broken, _Call
from ._link import _Link, _LinkBase, _NoActive, _SockLink
from ._route import MAX_REDIRECTS
from ._session import Turn
from .errors import AuthError, ClosedError

if TYPE_CHECKING:
    from ._core import _Core

log = logging.getLogger("kunci")

SEEK_INTERVAL = 0.05
AUTH_TIMEOUT = 3.0
# Reconciling releases the session's stale grants this many at a time (each
# batch once the one before is answered): the node closes a connection that
# sends far more than it has read.
RECONCILE_BATCH = 256


class _Conn:
    """One managed connection. Its keeper (run) dials, attaches and re-dials
    it; dispatch and detach are called by its current _Link."""

    def __init__(self, core: _Core, home: str, idx: int) -> None:
        self.core = core
        self.loop = core.loop
        self.home = home
        self.idx = idx
        self.link: _LinkBase | None = None
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
        self.flush_pending: bool = False
        # sessions: the node of the connection knows sessions (True: it
        # answered the client's S), predates them (False: "unknown op"), or
        # has not answered yet (None); named is done once it answered, or
        # the link ended.
        self.sessions: bool | None = None
        self.named: asyncio.Future[None] | None = None
        # The caller threads waiting for the node's answer to the session
        # (the thread client's acquire sent again: acquire_thread).
        self.named_waiters: list[Waiter] = []

    # -- sending and answers (conn.go) --

    def send(self, call: _Call, line: bytes) -> None:
        """Register call as outstanding and buffer its line; the buffer is
        written once this turn of the loop ends. The link must be up."""
        self.enqueue(call, line)
        if not self.flush_pending:
            self.flush_pending = True
            self.loop.call_soon(self.flush)
            self.core.poke()

    def enqueue(self, call: _Call, line: bytes) -> None:
        """Register call as outstanding and buffer its line, for whoever
        writes the buffer next."""
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
            self.core.poke()

    def dispatch(self, a: wire.Answer, link: _LinkBase) -> bool:
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
        # Each call is answered before it leaves the tables: a signal's
        # exception in between (a caller thread reading) ends the link,
        # which answers what is left there, and an answered call ignores a
        # second answer.
        call: _Call | None
        if op == "A":
            call = self.acq.get(a.key)
            if call is not None:
                call.resolve(a)
                if self.acq.get(a.key) is call:
                    del self.acq[a.key]
                return True
        elif op == "L" or op == "S":
            call = self._first_listing(op)
            if call is not None:
                if kind == op:
                    a.holders = call.holders
                call.resolve(a)
                if call in self.lists:
                    self.lists.remove(call)
                return True
        elif op == "I":
            if self.infos:
                c = self.infos[0]
                if c is not None:
                    c.resolve(a)
                if self.infos and self.infos[0] is c:
                    self.infos.popleft()
                return c is not None
            return False
        else:
            k = (op, a.key)
            q = self.sent.get(k)
            if q:
                call = q[0]
                call.resolve(a)
                if q and q[0] is call:
                    q.popleft()
                if not q and self.sent.get(k) is q:
                    del self.sent[k]
                return True
        log.debug("kunci: answer with no request: %s", a)
        return False

    def _first_listing(self, op: str) -> _Call | None:
        """The oldest outstanding S or L call (op): an answer to either names
        no key (a refusal's echo names S's session, L's limit)."""
        for c in self.lists:
            if c.op == op:
                return c
        return None

    # -- the connection's life (conn.go run, attach, detach) --

    def attach(self, link: _LinkBase, addr: str, named: bool) -> None:
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

    def detach(self, link: _LinkBase, redirect: str | None, err: BaseException | None) -> None:
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
        self._named()

    def _named(self) -> None:
        """The node answered the session, or the link ended first: tell
        those waiting for it."""
        named, self.named = self.named, None
        if named is not None and not named.done():
            named.set_result(None)
        ws, self.named_waiters = self.named_waiters, []
        for w in ws:
            w.ready = True
            w.wake()

    async def dial(self, addr: str) -> _LinkBase:
        cfg = self.core.cfg
        host, port = wire.split_addr(addr)
        sel = self.core.selector
        if sel is not None and cfg.tls is None:
            return await self._dial_socket(addr, host, port)
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

    async def _dial_socket(self, addr: str, host: str, port: int) -> _SockLink:
        """Dial addr on a plain socket, the thread client's _SockLink."""
        cfg = self.core.cfg
        sel = self.core.selector
        assert sel is not None

        async def connect() -> socket.socket:
            infos = await self.loop.getaddrinfo(host, port, type=socket.SOCK_STREAM)
            err: OSError | None = None
            for family, type_, proto, _, sa in infos:
                s = socket.socket(family, type_, proto)
                try:
                    s.setblocking(False)
                    await self.loop.sock_connect(s, sa)
                except OSError as e:
                    s.close()
                    err = e
                    continue
                except BaseException:
                    s.close()
                    raise
                return s
            raise err or OSError(f"no address for {host}")

        try:
            sock = await asyncio.wait_for(connect(), cfg.dial_timeout)
        except asyncio.TimeoutError:
            raise TimeoutError(f"dial {addr}: no answer within {cfg.dial_timeout} s") from None
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        return _SockLink(self, self.loop, sock, sel)

    async def authenticate(self, link: _LinkBase, addr: str) -> None:
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

    async def seek(self, link: _LinkBase, addr: str) -> tuple[bool, str]:
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
            link: _LinkBase | None = None
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
                    link.fail(ClosedError("kunci: client closed"))  # not attached: close() cannot see it
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
                # ClosedError while the dial finished: asyncio.wait_for before
                # Python 3.12 returns the connection and drops the
                # cancellation when both come in one turn, and nobody would
                # close this link.
                link.fail(ClosedError("kunci: client closed"))
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
        self._named()

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
        if turn.resend:
            if self.sessions is None and self.named is not None:
                gen = self.gen
                timeout = None if deadline is None else max(deadline - self.loop.time(), 0)
                await asyncio.wait((self.named,), timeout=timeout)
                if self.gen != gen or self.link is None:
                    return _REDIRECTED if self.redirecting else _NOT_UP
        line = self._acquire_line(key, lease_ms, deadline, try_, kind, turn)
        if isinstance(line, _Broken):
            return line
        call = _Call("A", key, self.loop.create_future())
        turn.mark_sent()
        self.send(call, line)
        try:
            assert call.fut is not None
            r = await call.fut
        except asyncio.CancelledError:
            self._withdraw(call, turn)
            raise
        if not isinstance(r, wire.Answer):
            turn.unknown = True  # it may have reached the node
        return r

    def _acquire_line(
        self, key: bytes, lease_ms: int, deadline: float | None, try_: bool, kind: bytes, turn: Turn
    ) -> bytes | _Broken:
        """An attempt's line, once the node's answer to the session is in
        when the attempt is sent again (seen= only to a node that knows
        sessions); _WAIT_OVER when the wait ran out first."""
        seen: int | None = None
        if turn.resend:
            if self.sessions is None and self.named is not None:
                return _WAIT_OVER  # still unanswered
            if self.sessions:
                seen = turn.seen
        wait = self._wait_field(deadline, try_)
        if isinstance(wait, _Broken):
            return wait
        return wire.acquire_line(key, lease_ms, wait, self.core.cfg.owner, kind, seen)

    def _wait_field(self, deadline: float | None, try_: bool) -> int | None | _Broken:
        """An acquire's wait field: None for a try, 0 for no bound, else the
        milliseconds left until deadline; _WAIT_OVER when none are."""
        if try_:
            return None
        if deadline is None:
            return 0
        left = deadline - self.loop.time()
        if left <= 0:
            return _WAIT_OVER
        return max(math.ceil(left * 1000), 1)

    # -- one request on this connection, from a caller thread (the thread
    # client; Core.mu held) --

    def ask(self, w: Waiter, call: _Call, line: bytes) -> Result:
        """Send call's request at once and wait for its answer, reading the
        connection meanwhile when nobody else does (_SockLink.wait_for). A
        caller that gives up (a signal's exception) leaves call outstanding,
        answered to call.late, which the caller may set."""
        link = self.link
        if link is None:
            return _NOT_UP
        w.result = None
        call.cb = w.answer
        link.claim(w)
        try:
            self.enqueue(call, line)
            link.write_from_thread()
            link.wait_for(w, self.core.mu)
        except BaseException:
            link.unclaim(w)
            if call.cb is not None and not call.answered:
                call.cb = None
            raise
        r, w.result = w.result, None
        if r is None:  # the link ended; detach answered every call on it
            r = _Broken("connection lost")
        return r

    def acquire_thread(
        self, w: Waiter, key: bytes, lease_ms: int, deadline: float | None, try_: bool, kind: bytes, turn: Turn
    ) -> Result:
        """acquire, from a caller thread: one attempt of the acquire of turn
        on this connection. A caller that gives up while it is outstanding
        withdraws it (_withdraw)."""
        if self.link is None:
            return _NOT_UP
        if turn.resend:
            if self.sessions is None and self.named is not None:
                gen = self.gen
                w.ready = False
                self.named_waiters.append(w)
                try:
                    while not w.ready:
                        left = None if deadline is None else deadline - self.loop.time()
                        if left is not None and left <= 0:
                            break
                        w.block(left)
                finally:
                    if w in self.named_waiters:
                        self.named_waiters.remove(w)
                if self.gen != gen or self.link is None:
                    return _REDIRECTED if self.redirecting else _NOT_UP
        line = self._acquire_line(key, lease_ms, deadline, try_, kind, turn)
        if isinstance(line, _Broken):
            return line
        call = _Call("A", key, None)
        turn.mark_sent()
        try:
            r = self.ask(w, call, line)
        except BaseException:
            self._withdraw(call, turn, w.result)
            w.result = None
            raise
        if not isinstance(r, wire.Answer):
            turn.unknown = True  # it may have reached the node
        return r

    def _withdraw(self, call: _Call, turn: Turn, answer: Result | None = None) -> None:
        """The caller of the outstanding acquire call gave up: cancel it on
        the node (C key), and release a grant that won the race. The turn
        ends with the acquire's answer: no other acquire of the key goes out
        while this one may still be granted. answer is the call's, when a
        caller thread gave up just as it came."""
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

        if answer is not None:
            late(answer)
            return
        fut = call.fut
        if fut is not None and fut.done() and not fut.cancelled():
            # Answered in the turn the caller gave up (a timeout's timer
            # ran after the answer was read, before the caller's task did):
            # asyncio cancels the task anyway, so the grant is ours to end.
            late(fut.result())
            return
        call.late = late
        if call.answered:  # answered as the caller left, but not to it
            late(_Broken("the caller left as the answer came"))
            return
        if self.link is not None and self.acq.get(call.key) is call:
            cc = _Call("C", call.key, None)
            self.send(cc, wire.cancel_line(call.key))
