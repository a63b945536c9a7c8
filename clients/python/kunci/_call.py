"""One request waiting for its answer, and a caller thread waiting for it
(clientlib's call.go)."""

from __future__ import annotations

import asyncio
import collections
import threading
from typing import Any, Callable, Deque, Union

from . import _wire as wire


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
    set (a caller thread's Waiter, or the loop's own bookkeeping), else to
    fut; late takes it after the caller left."""

    __slots__ = ("op", "key", "fut", "cb", "holders", "late", "answered")

    def __init__(self, op: str, key: bytes, fut: asyncio.Future[Result] | None) -> None:
        self.op = op
        self.key = key
        self.fut = fut
        self.cb: Callable[[Result], None] | None = None
        self.holders: list[wire.Holder] | None = None  # L, S: the H lines so far
        self.late: Callable[[Result], None] | None = None  # the answer after the caller left
        self.answered = False

    def resolve(self, r: Result) -> None:
        """Hand r to whoever waits for the answer, once: a second answer (the
        end of a link whose reading was interrupted as it answered the call)
        is ignored."""
        if self.answered:
            return
        cb = self.cb
        if cb is not None:
            cb(r)
            self.cb = None
        elif self.fut is not None and not self.fut.done():
            self.fut.set_result(r)
        elif self.late is not None:
            self.late(r)
        self.answered = True


class CoreLock:
    """The thread client's mutex (Core.mu). The threads it wakes while it is
    held (Waiter.wake) go one at a time, each as mu is next released: a
    thread woken while mu is held would only wait for it, and many woken at
    once would wait for the interpreter in turn, each wait a switch. Every
    woken thread takes mu again before it goes on, and so lets the next
    one go when it releases it."""

    __slots__ = ("_lock", "woken", "poke")

    def __init__(self) -> None:
        # An RLock for its owner check (relock), never taken twice.
        self._lock: Any = threading.RLock()
        self.woken: Deque[Waiter] = collections.deque()
        # poke: wakes the event loop, once mu is released, for work a caller
        # thread gave it (Core.poke); None while there is none.
        self.poke: Callable[[], None] | None = None

    def acquire(self, blocking: bool = True, timeout: float = -1) -> bool:
        return bool(self._lock.acquire(blocking, timeout))

    def owned(self) -> bool:
        """Whether this thread holds mu."""
        owned: bool = self._lock._is_owned()
        return owned

    def relock(self) -> None:
        """Take mu, surely: a signal's exception (in the main thread) that
        comes while this thread waits for it, or just after it took it, is
        raised once mu is held, so that whoever catches it finds mu held,
        as the code it leaves expects. Use it wherever mu is taken again
        after a wait without it."""
        err: BaseException | None = None
        lock = self._lock
        while True:
            try:
                if lock._is_owned():
                    break
                lock.acquire()
            except BaseException as e:  # noqa: BLE001 - raised below, mu held
                err = e
        if err is not None:
            raise err

    def release(self) -> None:
        ws = self.woken
        poke = self.poke
        if not ws and poke is None:
            self._lock.release()
            return
        w = ws.popleft() if ws else None
        self.poke = None
        self._lock.release()
        if w is not None:
            w.lock.release()
        if poke is not None:
            poke()

    def __enter__(self) -> CoreLock:
        self._lock.acquire()
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


class Waiter:
    """A caller thread waiting, in the thread client: for its call's answer,
    for its turn at a key, for a connection to come up, or for the node's
    answer to the session. Each thread has one; it waits for one thing at a
    time. Every field but lock is the client's mutex's (Core.mu).

    The thread blocks on lock (held while it is not blocked: wake releases
    it once). A thread interrupted while blocked (a signal's exception) may
    still be woken: it takes a new Waiter."""

    __slots__ = ("lock", "mu", "blocked", "result", "ready")

    def __init__(self, mu: CoreLock) -> None:
        self.mu = mu
        self.lock = threading.Lock()
        self.lock.acquire()
        self.blocked = False
        # result: the answer to the call it waits for (None: not yet);
        # ready: what it waits for other than an answer came (a turn, a
        # connection up, a session answered).
        self.result: Result | None = None
        self.ready = False

    def answer(self, r: Result) -> None:
        """Its call's answer (a _Call's cb)."""
        self.result = r
        self.wake()

    def wake(self) -> None:
        """Let the thread go once mu is released (mu held)."""
        if self.blocked:
            self.blocked = False
            self.mu.woken.append(self)

    def block(self, timeout: float | None = None) -> None:
        """Wait to be woken, or timeout seconds (None: no bound), with mu
        released meanwhile; mu is held again on return, and on a raise."""
        mu = self.mu
        self.blocked = True
        got = False
        mu.release()
        try:
            if timeout is None:
                got = self.lock.acquire()
            elif timeout > 0:
                got = self.lock.acquire(True, timeout)
        finally:
            mu.relock()
        if not got:
            if self.blocked:  # the timeout: nobody woke it
                self.blocked = False
            elif self in mu.woken:  # woken since, not let go yet
                mu.woken.remove(self)
            else:  # let go between the timeout and mu: take the wake-up
                self.lock.acquire()
