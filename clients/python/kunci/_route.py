"""How a request is tried until a connection answers it (clientlib's
route.go): one policy, steps, and two drivers that take them, the event
loop's (AsyncClient, and the thread client's background work) and a caller
thread's (the thread client)."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import TYPE_CHECKING, Awaitable, Callable, Generator, Union

from . import _wire as wire
from ._call import _NOT_UP, _REDIRECTED, _WAIT_OVER, Result, Waiter, _Broken
from .errors import ClosedError, KunciError

if TYPE_CHECKING:
    from ._conn import _Conn
    from ._core import _Core

MAX_REDIRECTS = 8


@dataclass
class Policy:
    """How long a request is tried again: until deadline (an acquire's
    wait); or for span from the first failure (release, extend, inspect),
    not past ends(); or without bound (an acquire with wait 0)."""

    deadline: float | None = None
    span: float = 0.0
    unbounded: bool = False
    ends: Callable[[], float] | None = None
    over: Callable[[object], KunciError] | None = None


# A step of a route: send the request on a connection (and give the steps
# its Result), or wait for a connection to come up, at most so many seconds
# (None: no bound), and go on.
Step = Union["_Conn", float, None]


def steps(core: _Core, p: Policy, first: tuple[_Conn, Result] | None = None
          ) -> Generator[Step, Result | None, wire.Answer]:
    """The steps of sending a request by policy p until a connection answers
    it; they end with the answer, or raise why they gave up. The driver
    takes each step and sends the steps its outcome: a connection's Result,
    None after a wait. first is an attempt the driver made already, on the
    connection core.next gave, and its failed Result."""
    loop = core.loop
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
        return core.no_connection(last)

    while True:
        if first is not None:
            cn, r = first
            first = None
        else:
            if core.closed:
                raise ClosedError("kunci: client closed")
            if until is not None and loop.time() >= until:
                raise fail()
            got = core.next(failed)
            if got is None:
                # No connection is usable: wait for one to come up.
                core.check_auth()
                if last is None:
                    last = _NOT_UP.cause
                if windowless and until is None:
                    raise fail()
                failure()
                timeout = None if until is None else max(until - loop.time(), 0.0)
                if p.span > 0:
                    # Releases and their kind look again every release_interval too.
                    interval = core.cfg.release_interval
                    timeout = interval if timeout is None else min(timeout, interval)
                yield timeout
                continue
            cn = got
            sent = yield cn
            assert sent is not None
            r = sent
        if isinstance(r, wire.Answer):
            return r
        if r is _REDIRECTED:
            last, failed = "redirected: the active moved", cn
            redirects += 1
            if redirects > MAX_REDIRECTS:
                raise core.no_connection("too many redirects")
            if windowless and until is None:
                until = loop.time() + core.cfg.dial_timeout
            failure()
            continue
        assert isinstance(r, _Broken)
        if r is _WAIT_OVER:
            raise fail()
        core.check_auth()
        last, failed = r.cause, cn
        attempts += 1
        if windowless and attempts >= len(core.conns):
            raise fail()
        failure()


def _first(core: _Core, p: Policy) -> _Conn | None:
    """The connection a request's first attempt goes out on, before its
    steps are made (None: let the steps say what to do)."""
    if core.closed or (p.deadline is not None and core.loop.time() >= p.deadline):
        return None
    return core.next(None)


async def route(core: _Core, p: Policy, send: Callable[[_Conn], Awaitable[Result]]) -> wire.Answer:
    """Send a request by policy p until a connection answers it, on the
    event loop. The first attempt goes out before the steps are made: most
    are answered."""
    first: tuple[_Conn, Result] | None = None
    cn = _first(core, p)
    if cn is not None:
        r1 = await send(cn)
        if type(r1) is wire.Answer:
            return r1
        first = (cn, r1)
    g = steps(core, p, first)
    r: Result | None = None
    while True:
        try:
            step = g.send(r)
        except StopIteration as e:
            return e.value  # type: ignore[no-any-return]
        if step is None or isinstance(step, float):
            await asyncio.wait((core.ups,), timeout=step)
            r = None
        else:
            r = await send(step)


def route_thread(core: _Core, w: Waiter, p: Policy, send: Callable[[_Conn], Result]) -> wire.Answer:
    """Send a request by policy p until a connection answers it, on the
    caller's thread (Core.mu held, and released while it waits). The first
    attempt goes out before the steps are made: most are answered."""
    first: tuple[_Conn, Result] | None = None
    cn = _first(core, p)
    if cn is not None:
        r = send(cn)
        if type(r) is wire.Answer:
            return r
        first = (cn, r)
    g = steps(core, p, first)
    r2: Result | None = None
    while True:
        try:
            step = g.send(r2)
        except StopIteration as e:
            return e.value  # type: ignore[no-any-return]
        if step is None or isinstance(step, float):
            core.wait_up(w, step)
            r2 = None
        else:
            r2 = send(step)
