"""The client's machinery: connections, routing, retries, failover, on one
asyncio event loop. AsyncClient runs it on the caller's loop. Client (the
thread client) runs it on a loop of its own in one I/O thread, and its
callers run their requests themselves, on their own threads, under the
client's mutex, Core.mu, which the loop thread holds but while it sleeps
(_link.ArmedSelector): a caller alone writes its request and reads its
answer without crossing to another thread.

The design is clientlib's (the Go client); each module names the Go file it
follows:

- One _Conn per address (two when given one address), each kept up by its
  keeper coroutine (_Conn.run): dial (TLS), authenticate, and, when the node
  it reached knows no live active, ask it with I every 50 ms (seek). An
  address that does not answer is dialled again every reconnect_interval,
  unless another connection finds the active elsewhere, where it goes at once
  (_conn.py, _outage.py).
- Requests go round-robin over the usable connections a write at a time: the
  requests made together share the current connection and go out in one
  write, which makes the next connection current (_link.py).
- Answers are matched to the oldest outstanding request with the same op and
  key (_conn.py). The client has one acquire of a key in progress at a time,
  whatever the connection: later acquirers of the key wait their turn, in
  order, and a try of it meanwhile is answered "held" unsent (_session.py).
- The client's session is named first on every connection ("S session"); the
  node's listing of the session's grants is reconciled with what the client
  holds and acquires (_Conn.reconcile), while the connection serves; acquires
  sent again carry seen= (_session.py).
- Every operation goes through one route with a retry policy: a broken
  connection fails the request over to the next, a redirect follows the
  connection, no usable connection waits for one to come up while the
  policy's window lasts (_route.py). Each operation below is written once as
  its request and the reading of its answer, and run by either driver: the
  loop's (the async methods) or a caller thread's (the *_thread methods).
"""

from __future__ import annotations

import asyncio
import logging
import ssl
import threading
from dataclasses import dataclass
from typing import Any, Awaitable, Callable, Coroutine

from . import _wire as wire
from ._call import _NOT_UP, CoreLock, Result, Waiter, _Call
from ._conn import _Conn
from ._link import ArmedSelector
from ._lock import LockState
from ._outage import Outage
from ._route import Policy, route, route_thread
from ._session import Keys, Turn, new_session
from .errors import (
    AuthError, ClosedError, KunciError, NoActiveError, RefusedError, StaleError, TimeoutError, UnavailableError,
)

log = logging.getLogger("kunci")
log.addHandler(logging.NullHandler())


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


def _noop() -> None:
    pass


class _Core:
    """The client's connections, keys and operations. Every field is the
    event loop's; in the thread client, mu's."""

    def __init__(self, cfg: Config, loop: asyncio.AbstractEventLoop,
                 mu: CoreLock | None = None, selector: ArmedSelector | None = None) -> None:
        self.cfg = cfg
        self.loop = loop
        # The thread client's mutex (the loop thread holds it but while it
        # sleeps) and its loop's selector, which lets callers read a
        # connection themselves (None: the loop reads). None for
        # AsyncClient: then nothing here runs off the loop.
        self.threaded = mu is not None
        self.mu = mu if mu is not None else CoreLock()
        self.selector = selector
        self.loop_thread = threading.get_ident()  # made on the loop's thread
        self.closed = False
        self.auth_err: AuthError | None = None
        self.last_dial_error = ""
        self.outage = Outage(loop, min(cfg.reconnect_interval, 1.0))
        self.ups: asyncio.Future[None] = loop.create_future()
        # Caller threads waiting for a connection to come up (wait_up).
        self.up_waiters: list[Waiter] = []
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

    def poke(self) -> None:
        """Wake the loop for work a caller thread gave it (mu held), once mu
        is released: its selector sleeps past what it did not see coming.
        (A wake-up under mu would hand the interpreter to threads that then
        wait for mu.)"""
        if self.threaded and self.mu.poke is None and threading.get_ident() != self.loop_thread:
            self.mu.poke = self._wake_loop

    def _wake_loop(self) -> None:
        try:
            self.loop.call_soon_threadsafe(_noop)
        except RuntimeError:
            pass  # closed: nothing is left to do there

    def spawn(self, coro: Coroutine[Any, Any, object]) -> None:
        t: asyncio.Task[object] = self.loop.create_task(coro)
        self.tasks.add(t)
        t.add_done_callback(self._reap)
        self.poke()

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
                cn.link.fail(ClosedError("kunci: client closed"))
        me = asyncio.current_task()
        ts = [t for t in self.tasks if t is not me]
        for t in ts:
            t.cancel()
        self.fire_ups()
        return ts

    def fire_ups(self) -> None:
        old, self.ups = self.ups, self.loop.create_future()
        old.set_result(None)
        ws, self.up_waiters = self.up_waiters, []
        for w in ws:
            w.ready = True
            w.wake()

    def wait_up(self, w: Waiter, timeout: float | None) -> None:
        """A caller thread waits for a connection to come up, at most timeout
        seconds (None: no bound; mu held)."""
        w.ready = False
        self.up_waiters.append(w)
        try:
            w.block(timeout)
        finally:
            if w in self.up_waiters:
                self.up_waiters.remove(w)

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

    def no_connection(self, cause: object) -> UnavailableError:
        msg = "kunci: no node answered"
        if cause is not None and cause is not _NOT_UP.cause:
            msg += f" ({cause})"
        if self.auth_err is not None:
            msg += f"; the credentials were refused: {self.auth_err.reason}"
        elif self.last_dial_error:
            msg += f"; last dial error: {self.last_dial_error}"
        return UnavailableError(msg)

    async def route(self, p: Policy, send: Callable[[_Conn], Awaitable[Result]]) -> wire.Answer:
        """Send a request by policy p until a connection answers it."""
        return await route(self, p, send)

    def refusal(self, a: wire.Answer, key: str) -> KunciError:
        if a.reason == "auth required":
            return AuthError(self.cfg.addrs[0], a.reason)
        return RefusedError(a.op, key, a.reason)

    # -- the operations: each one's request, the reading of its answer, and
    # its two drivers --

    def _acquire_policy(self, key: str, wait: float, wms: int, try_: bool, deadline: float | None) -> Policy:
        p = Policy()
        if wms > 0:
            p.deadline = self.loop.time() + wms / 1000 if deadline is None else deadline
            p.over = lambda last: (
                TimeoutError(f"kunci: wait for {key} ran out")
                if last is None
                else self.no_connection(f"no active node answered within the wait of {wait} s; last: {last}")
            )
        elif not try_:
            p.unbounded = True
        return p

    async def acquire(
        self, key: str, lease: float, wait: float, try_: bool, deadline: float | None = None,
        *, limit: int | None = None, shared: bool = False, turn: Turn | None = None,
    ) -> LockState | None:
        """Acquire key; as a semaphore of limit holders, or a shared grant of
        a read-write lock (wire.kind_field). One acquire of a key is in
        progress at a time (Keys.take, Keys.wait_turn): the others wait
        their turn, and a try meanwhile is None at once. deadline, when
        given, is when the wait ends, and turn the key's turn: an acquire
        that began elsewhere (_handover.py)."""
        kb = wire.check_key(key)
        lms = wire.lease_ms(lease)
        wms = 0 if try_ else wire.wait_ms(wait)
        kind = wire.kind_field(limit, shared)
        p = self._acquire_policy(key, wait, wms, try_, deadline)
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

    def acquire_thread(
        self, w: Waiter, key: str, lease: float, wait: float, try_: bool, limit: int | None, shared: bool,
    ) -> LockState | None:
        """acquire, on a caller thread (mu held)."""
        kb = wire.check_key(key)
        lms = wire.lease_ms(lease)
        wms = 0 if try_ else wire.wait_ms(wait)
        kind = wire.kind_field(limit, shared)
        if self.closed:
            raise ClosedError("kunci: client closed")
        p = self._acquire_policy(key, wait, wms, try_, None)
        until = p.deadline
        turn = self.keys.take(kb)
        if turn is None:
            if try_:
                return None  # an acquire of key is in progress: held
            turn = self.keys.wait_turn_thread(w, kb, until, key)
        t = turn
        try:
            a = route_thread(self, w, p, lambda cn: cn.acquire_thread(w, kb, lms, until, try_, kind, t))
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
            raise TimeoutError(f"kunci: wait for {key} ran out")
        if a.kind == "E":
            raise self.refusal(a, key)
        raise KunciError(f"kunci: unexpected answer {a.kind} to an acquire")

    def _retrying(self, ends: Callable[[], float] | None = None) -> Policy:
        return Policy(span=self.cfg.release_retry, ends=ends)

    def _ask(self, w: Waiter, op: str, kb: bytes, line: bytes, p: Policy) -> wire.Answer:
        """One request by policy p, on a caller thread (mu held)."""
        if self.closed:
            raise ClosedError("kunci: client closed")

        def send(cn: _Conn) -> Result:
            call = _Call(op, kb, None)
            if op == "L":
                call.holders = []
            return cn.ask(w, call, line)

        return route_thread(self, w, p, send)

    async def _do(self, op: str, kb: bytes, line: bytes, p: Policy) -> wire.Answer:
        """One request by policy p, on the loop."""

        async def send(cn: _Conn) -> Result:
            return await cn.do(op, kb, line)

        return await self.route(p, send)

    def _released(self, a: wire.Answer, kb: bytes) -> bool:
        if a.kind == "E":
            raise self.refusal(a, kb.decode("utf-8", "surrogateescape"))
        return a.ok

    async def release(self, kb: bytes, token: int) -> bool:
        """Release; True for OK (released now, or by this client's session
        before), False for STALE (the grant is not the client's any more)."""
        a = await self._do("R", kb, wire.release_line(kb, token), self._retrying())
        return self._released(a, kb)

    async def release_lock(self, ls: LockState) -> None:
        self.stop_keep_alive(ls)
        self.released(ls, await self.release(ls.kb, ls.token))

    def release_lock_thread(self, w: Waiter, ls: LockState) -> None:
        """release_lock, on a caller thread (mu held)."""
        self.stop_keep_alive(ls)
        a = self._ask(w, "R", ls.kb, wire.release_line(ls.kb, ls.token), self._retrying())
        self.released(ls, self._released(a, ls.kb))

    async def release_quietly(self, ls: LockState) -> None:
        """Release a grant nobody will hold (its caller gave up as it came)."""
        try:
            await self.release_lock(ls)
        except KunciError as e:
            log.debug("kunci: release of %s, which nobody holds: %s", ls.key, e)

    def released(self, ls: LockState, ok: bool) -> None:
        """The node answered ls's release: the client holds it no more."""
        ls.end()
        self.keys.drop(ls)
        if not ok:
            raise StaleError(f"kunci: release of {ls.key}: token {ls.token} is not yours any more "
                             "(the lease ran out, another released it, or a failover lost it)")

    def _extended(self, a: wire.Answer, ls: LockState, lms: int, sent: float) -> None:
        if a.kind == "E":
            raise self.refusal(a, ls.key)
        if not a.ok:
            ls.ended = True
            self.keys.drop(ls)
            raise StaleError(f"kunci: extend of {ls.key}: token {ls.token} is not yours any more "
                             "(the lease ran out, another released it, or a failover lost it)")
        ls.lease = lms / 1000
        ls.ends = sent + ls.lease

    async def extend(self, ls: LockState, lease: float) -> None:
        lms = wire.lease_ms(lease)
        line = wire.extend_line(ls.kb, ls.token, lms)
        sent = 0.0

        async def send(cn: _Conn) -> Result:
            nonlocal sent
            sent = self.loop.time()
            return await cn.do("X", ls.kb, line)

        a = await self.route(self._retrying(lambda: ls.ends), send)
        self._extended(a, ls, lms, sent)

    def extend_thread(self, w: Waiter, ls: LockState, lease: float) -> None:
        """extend, on a caller thread (mu held)."""
        lms = wire.lease_ms(lease)
        line = wire.extend_line(ls.kb, ls.token, lms)
        if self.closed:
            raise ClosedError("kunci: client closed")
        sent = 0.0

        def send(cn: _Conn) -> Result:
            nonlocal sent
            sent = self.loop.time()
            return cn.ask(w, _Call("X", ls.kb, None), line)

        a = route_thread(self, w, self._retrying(lambda: ls.ends), send)
        self._extended(a, ls, lms, sent)

    def _inspected(self, a: wire.Answer, key: str) -> wire.Holder | None:
        if a.kind == "E":
            raise self.refusal(a, key)
        assert a.holder is not None
        return a.holder if a.holder.held else None

    async def inspect(self, key: str) -> wire.Holder | None:
        """Who holds key, None when nobody does (the node answered FREE)."""
        kb = wire.check_key(key)
        return self._inspected(await self._do("Q", kb, wire.inspect_line(kb), self._retrying()), key)

    def inspect_thread(self, w: Waiter, key: str) -> wire.Holder | None:
        kb = wire.check_key(key)
        return self._inspected(self._ask(w, "Q", kb, wire.inspect_line(kb), self._retrying()), key)

    # -- listings and the cluster (list.go) --

    def _list_line(self, prefix: str | None, limit: int) -> bytes:
        pb = wire.check_key(prefix, "prefix") if prefix else None
        return wire.list_line(wire.check_limit(limit), pb)

    def _listed(self, a: wire.Answer) -> tuple[list[wire.Holder], bool]:
        if a.kind == "E":
            raise self.refusal(a, "")
        return list(a.holders or []), a.more

    async def locks(self, prefix: str | None, limit: int) -> tuple[list[wire.Holder], bool]:
        return self._listed(await self._do("L", b"", self._list_line(prefix, limit), self._retrying()))

    def locks_thread(self, w: Waiter, prefix: str | None, limit: int) -> tuple[list[wire.Holder], bool]:
        return self._listed(self._ask(w, "L", b"", self._list_line(prefix, limit), self._retrying()))

    def _node(self, a: wire.Answer) -> wire.Node:
        if a.kind != "I":
            raise KunciError(f"kunci: unexpected answer {a.kind} to I")
        return wire.Node(a.self_addr, a.role, a.active)

    async def info(self) -> wire.Node:
        """What the node a connection goes to says of itself (I): its
        address, role, and the active it knows. Every node answers."""
        return self._node(await self._do("I", b"", wire.INFO_LINE, self._retrying()))

    def info_thread(self, w: Waiter) -> wire.Node:
        return self._node(self._ask(w, "I", b"", wire.INFO_LINE, self._retrying()))

    @staticmethod
    def active_of(n: wire.Node) -> str:
        """The active's address, as node n knows it; NoActiveError when it knows
        none (an election is under way). A single node is its own active."""
        if not n.active:
            raise NoActiveError(f"kunci: no active node known (asked {n.addr})")
        return n.active

    async def active(self) -> str:
        return self.active_of(await self.info())

    # -- keep-alive (keepalive.go) --

    def keep_alive(self, ls: LockState) -> None:
        self.stop_keep_alive(ls)
        if ls.ended:
            return  # released, or known lost: nothing to keep
        t: asyncio.Task[object] = self.loop.create_task(self._keep_alive(ls))
        ls.keeper = t
        self.tasks.add(t)
        t.add_done_callback(self._reap)
        self.poke()

    def stop_keep_alive(self, ls: LockState) -> None:
        t, ls.keeper = ls.keeper, None
        if t is not None and t is not asyncio.current_task(self.loop):
            t.cancel()
            self.poke()

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
            except (StaleError, RefusedError, AuthError) as e:
                log.info("kunci: lock %s lost: %s", ls.key, e)
                self.keys.drop(ls)
                ls.lose()
                return
            except (UnavailableError, asyncio.TimeoutError):
                if self.closed:
                    return
                nxt = max(min(retry, valid_until - loop.time() + 0.001), 0)
