"""The thread client's requests made while others are under way: handed to
the I/O thread, which sends them together, a write for all that came
meanwhile, and reads their answers. A caller alone makes its request itself
(Core.*_thread, _link._SockLink); many callers at once would each wait for
the client's mutex and the interpreter in turn, where one thread serving
them all is faster (clients/python/bench.py: docs/clients.md).

Acquires and releases go out at once on the current connection and are
answered by a callback, without a task; when a connection breaks under one,
or none is usable, or the key's turn is not free, the full route takes over
(a task) with the wait it has left. Everything here but Handover.call runs
on the I/O thread."""

from __future__ import annotations

import collections
import threading
from typing import TYPE_CHECKING, Any, Callable, Coroutine, Deque

from . import _wire as wire
from ._call import Result, _Call
from ._lock import LockState
from ._session import Turn
from .errors import ClosedError, KunciError

if TYPE_CHECKING:
    from ._core import _Core


class HandedWaiter:
    """A caller thread waiting for the I/O thread: a lock it blocks on until
    the loop releases it. Each thread keeps one (it waits for one request at
    a time)."""

    __slots__ = ("lock", "value", "err", "cancel", "abandoned")

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.lock.acquire()
        self.value: object = None
        self.err: BaseException | None = None
        self.cancel: Callable[[], None] | None = None
        self.abandoned = False  # its thread gave up (loop thread only)

    def finish(self, value: object, err: BaseException | None) -> None:
        if self.abandoned:
            drop(value)
            return
        self.value, self.err = value, err
        self.lock.release()

    def abandon(self) -> None:
        """Its thread gave up waiting (a signal's exception): withdraw what
        it waits for, and end a grant that was answered meanwhile, which
        the thread will never see. Loop thread only."""
        self.abandoned = True
        v, self.value = self.value, None
        drop(v)
        if self.cancel is not None:
            self.cancel()


def drop(value: object) -> None:
    """Release a grant nobody will hold (loop thread only)."""
    if isinstance(value, LockState):
        core = value.core
        core.spawn(core.release_quietly(value))


class Handover:
    """Requests handed to the I/O thread: those made by many threads at once
    go over together, with one wake-up of the I/O thread. mu is the
    client's (Core.mu): the I/O thread runs the requests under it."""

    def __init__(self, core: _Core) -> None:
        self.core = core
        self.lock = threading.Lock()  # guards pending and draining
        self.pending: Deque[tuple[Callable[..., None], tuple[Any, ...], HandedWaiter]] = collections.deque()
        self.draining = False
        self.local = threading.local()

    def call(self, fn: Callable[..., None], *args: Any) -> Any:
        """Have the I/O thread run fn(core, waiter, *args), which answers the
        waiter, and wait for the answer."""
        w: HandedWaiter | None = getattr(self.local, "w", None)
        if w is None:
            w = self.local.w = HandedWaiter()
        w.cancel = None
        core = self.core
        with self.lock:
            self.pending.append((fn, args, w))
            if not self.draining:
                self.draining = True
                try:
                    core.loop.call_soon_threadsafe(self.drain)
                except RuntimeError:  # the loop closed: the client did
                    self.pending.pop()
                    self.draining = False
                    raise ClosedError("kunci: client closed") from None
        try:
            w.lock.acquire()
        except BaseException:
            # Given up (a signal's exception): withdraw it; this thread's
            # waiter may still be answered, so it gets a new one.
            self.local.w = None
            try:
                core.loop.call_soon_threadsafe(w.abandon)
            except RuntimeError:
                pass
            raise
        if w.err is not None:
            err, w.err = w.err, None
            raise err
        v, w.value = w.value, None
        return v

    def drain(self) -> None:
        with self.lock:
            self.draining = False
            pending, self.pending = self.pending, collections.deque()
        core = self.core
        for fn, args, w in pending:
            if core.closed:
                w.finish(None, ClosedError("kunci: client closed"))
                continue
            try:
                fn(core, w, *args)
            except BaseException as e:  # noqa: BLE001 - the caller gets it
                w.finish(None, e)

    def close(self) -> None:
        """What was handed over too late for the loop to run it (the loop
        has stopped)."""
        with self.lock:
            pending, self.pending = self.pending, collections.deque()
        for _, _, w in pending:
            w.finish(None, ClosedError("kunci: client closed"))


def fast_acquire(
    core: _Core, w: HandedWaiter, key: str, lease: float, wait: float, try_: bool,
    limit: int | None = None, shared: bool = False,
) -> None:
    """An acquire handed over: sent at once on the current connection when
    the key's turn is free (a try while it is not: None at once, unsent);
    otherwise, or when a connection breaks under it, or none is usable, the
    full route (a task) with the wait it has left."""
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


def fast_release(core: _Core, w: HandedWaiter, ls: LockState) -> None:
    """A release handed over, as fast_acquire: the full route (a task,
    retrying for 5 s) only when the first connection fails it."""
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


def slow(core: _Core, w: HandedWaiter, coro: Coroutine[Any, Any, object], turn: Turn | None = None) -> None:
    """Run coro as a task of the loop and tell w its outcome. turn, when
    given, is an acquire's turn that coro takes over: it ends with the task
    at the latest (a task cancelled before it ran never saw it)."""
    t = core.loop.create_task(coro)
    core.tasks.add(t)

    def done(t: Any) -> None:
        core.tasks.discard(t)
        if turn is not None and not turn.withdrawing:
            turn.leave(None, False)
        if t.cancelled():
            w.finish(None, ClosedError("kunci: cancelled"))
        elif t.exception() is not None:
            w.finish(None, t.exception())
        else:
            w.finish(t.result(), None)

    def cancel() -> None:
        t.cancel()

    t.add_done_callback(done)
    w.cancel = cancel
