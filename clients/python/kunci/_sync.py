"""Client: the client for threads. Its connections are kept up by an event
loop in one I/O thread; a caller alone makes its request itself, on its own
thread (_core.py), and callers that come while others' requests are under
way hand theirs to the I/O thread, which serves them together
(_handover.py)."""

from __future__ import annotations

import asyncio
import threading
from types import TracebackType
from typing import Any, Callable, Coroutine, TypeVar

from ._async import Locks
from ._call import CoreLock, Waiter
from ._config import ClientBase
from ._core import Config, _Core
from ._handover import Handover, fast_acquire, fast_release
from ._link import ArmedSelector, UnlockingSelector
from ._lock import LockHandle, LockState, end_lock_block
from ._wire import Holder, Node
from .errors import ClosedError, StaleError

T = TypeVar("T")


class Lock(LockHandle):
    """A granted lock (see Client.acquire). Safe to use from any thread. lost
    is set the moment the lock is known lost: its keep-alive, an extend or the
    release found the grant gone, or its lease ran out without an extend (as
    far as the client can tell)."""

    __slots__ = ("_client", "_lost")

    def __init__(self, client: Client, ls: LockState) -> None:
        super().__init__(ls)
        self._client = client
        self._lost: threading.Event | None = None

    @property
    def lost(self) -> threading.Event:
        """Set the moment the lock is known lost (made on first use: most
        locks are never asked, and its lease's timer is set then)."""
        ev = self._lost
        if ev is None:
            core = self._client._core
            with core.mu:
                ev = self._lost
                if ev is None:
                    ev = self._lost = threading.Event()
                    self._ls.on_lost.append(ev.set)
                    if self._ls.lost:
                        ev.set()
                    elif not core.closed:
                        self._ls.watch_lease()
                        core.poke()
        return ev

    def extend(self, lease: float) -> None:
        """Make the grant end lease seconds from now. kunci.StaleError when it had
        already ended (lost is then set)."""
        c = self._client
        try:
            c._do(c._core.extend_thread, self._ls, lease)
        except StaleError:
            with c._core.mu:
                self._ls.lose()
            raise

    def release(self) -> None:
        """End the grant, trying again through connection failures for 5 s.
        Released before by this client (a release sent again, say): done, as
        the node answers. kunci.StaleError when the grant is not yours any more:
        its lease ran out, another released it with its token, or a crash
        failover lost it."""
        c = self._client
        try:
            c._release(self._ls)
        except StaleError:
            with c._core.mu:
                self._ls.lose()
            raise

    def keep_alive(self) -> None:
        """Extend the lease by its length every third of it, in the client's
        I/O thread, until released; lost is set if the lock is lost."""
        core = self._client._core
        with core.mu:
            if not core.closed:
                core.keep_alive(self._ls)


class _LockBlock:
    def __init__(self, acquire: Callable[[], Lock]) -> None:
        self._acquire = acquire
        self._lock: Lock | None = None

    def __enter__(self) -> Lock:
        lock = self._acquire()
        lock.keep_alive()
        self._lock = lock
        return lock

    def __exit__(self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None) -> None:
        lock = self._lock
        assert lock is not None
        lost = lock._ls.lost
        err: Exception | None = None
        try:
            lock.release()
        except Exception as e:
            err = e
        end_lock_block(lock._ls, lost, et is not None, err)


class Client(ClientBase):
    """A kunci client: one persistent connection per node address (two when
    given one), pipelined, kept up in the background by one I/O thread.
    Safe for many threads at once. Use it as a context manager, or close()
    it.

    addrs: every node's "host:port" (TLS addresses with tls). owner names
    this client's grants for operators (kunci inspect, kunci locks).
    credentials: a Credentials, or the path of a credentials file ("name
    secret", mode 600). tls: an ssl.SSLContext (kunci.tls_context makes one).

    The constructor makes a first attempt to connect to every address before
    it returns (those that fail are retried in the background), and raises
    kunci.AuthError when every one was a refusal of the credentials.
    """

    def _setup(self, cfg: Config) -> None:
        # _mu is the core's: the I/O thread holds it but while its loop
        # sleeps, and every request runs under it on its caller's thread.
        self._mu = CoreLock()
        self._closing: threading.Event | None = None
        self._local = threading.local()
        if ArmedSelector.available():
            sel: Any = ArmedSelector(self._mu)
            armed: ArmedSelector | None = sel
        else:
            sel, armed = UnlockingSelector(self._mu), None
        self._loop = asyncio.SelectorEventLoop(sel)
        self._thread = threading.Thread(target=self._io, name="kunci-io", daemon=True)
        self._thread.start()

        async def start() -> _Core:
            core = _Core(cfg, self._loop, self._mu, armed)
            await core.start()
            return core

        fut = asyncio.run_coroutine_threadsafe(start(), self._loop)
        try:
            self._core: _Core = fut.result()
        except BaseException:
            self._stop_loop()
            raise
        self._handover = Handover(self._core)
        # One entry per caller thread in an acquire or a release: one that
        # finds another there hands its request over (_handover.py).
        self._inside: list[None] = []

    def _io(self) -> None:
        with self._mu:
            self._loop.run_forever()

    def _run(self, coro: Coroutine[Any, Any, T]) -> T:
        """Run coro on the I/O thread's loop and return its outcome."""
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result()

    def _do(self, op: Callable[..., T], *args: Any) -> T:
        """Run op(waiter, *args), one of the core's *_thread operations, on
        this thread, under the client's mutex."""
        w: Waiter | None = getattr(self._local, "w", None)
        if w is None:
            if threading.current_thread() is self._thread:
                raise RuntimeError("kunci: a Client's methods cannot be called from its own I/O thread")
            w = self._local.w = Waiter(self._mu)
        mu = self._mu
        try:
            mu.relock()
            if self._core.closed:
                raise ClosedError("kunci: client closed")
            return op(w, *args)
        except BaseException as e:
            if not isinstance(e, Exception):
                # Given up (a signal's exception) while it may have been
                # blocked: it may still be woken, so this thread takes a
                # new Waiter.
                self._local.w = None
            raise
        finally:
            if mu.owned():
                mu.release()

    def _stop_loop(self) -> None:
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join()
        with self._mu:  # not under a caller, which may be handing it work
            self._loop.close()

    def close(self) -> None:
        """Close every connection and stop the I/O thread. Locks still held
        stay held on the node until released or their leases run out."""
        with self._mu:
            closing = self._closing
            if closing is None:
                self._closing = threading.Event()
        if closing is not None:  # another thread closes it: wait for that
            closing.wait()
            return
        try:
            self._run(self._core.close())
        finally:
            self._stop_loop()
            self._handover.close()
            assert self._closing is not None
            self._closing.set()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None) -> None:
        self.close()

    def acquire(
        self, key: str, lease: float, wait: float = 0.0, *, limit: int | None = None, shared: bool = False
    ) -> Lock:
        """Wait at most wait seconds for key and hold it for lease seconds from
        the grant (wait 0: no bound of its own, the node's --max-wait bounds
        it). kunci.TimeoutError when the wait runs out; kunci.UnavailableError when no
        node answered within it.

        limit=N takes one of at most N grants of key, a semaphore; shared=True
        a shared (read) grant of key, a read-write lock whose exclusive
        (write) grant is the plain acquire. Not both (ValueError). A key held
        as another kind, or a semaphore of another limit: kunci.RefusedError with
        the node's reason ("key held as a lock", "semaphore limit differs").
        """
        return self._acquire(key, lease, wait, False, limit, shared)  # type: ignore[return-value]

    def try_acquire(self, key: str, lease: float, *, limit: int | None = None, shared: bool = False) -> Lock | None:
        """Take key if nobody holds it, at once (wait "-"): a Lock, or None
        when it is held. limit and shared as acquire's: a Lock when one
        would be granted at once. While another acquire of key by this
        client is in progress, None at once, unsent (the client has one
        acquire of a key in progress at a time: see README.md, Sessions)."""
        return self._acquire(key, lease, 0.0, True, limit, shared)

    def _acquire(self, key: str, lease: float, wait: float, try_: bool, limit: int | None,
                 shared: bool) -> Lock | None:
        ls: LockState | None = None
        inside = self._inside
        alone = not inside
        inside.append(None)
        try:
            if alone:
                ls = self._do(self._core.acquire_thread, key, lease, wait, try_, limit, shared)
            else:
                ls = self._handover.call(fast_acquire, key, lease, wait, try_, limit, shared)
            return None if ls is None else Lock(self, ls)
        except BaseException as e:
            if ls is not None and not isinstance(e, Exception):
                # Granted as a signal's exception came: nobody will hold it.
                self._abandon(ls)
            raise
        finally:
            inside.pop()

    def _release(self, ls: LockState) -> None:
        inside = self._inside
        alone = not inside
        inside.append(None)
        try:
            if alone:
                self._do(self._core.release_lock_thread, ls)
            else:
                self._handover.call(fast_release, ls)
        finally:
            inside.pop()

    def _abandon(self, ls: LockState) -> None:
        core = self._core
        with core.mu:
            if not core.closed:
                core.spawn(core.release_quietly(ls))

    def lock(
        self, key: str, lease: float, wait: float = 0.0, *, limit: int | None = None, shared: bool = False
    ) -> _LockBlock:
        """"with c.lock(key, lease=30, wait=10) as lock:" acquires key, keeps
        it alive while the block runs, and releases it after. When the lock
        is lost meanwhile, lock.lost is set at once, and the block's end
        raises kunci.LostError (unless the block raised). limit and shared as
        acquire's."""
        return _LockBlock(lambda: self.acquire(key, lease, wait, limit=limit, shared=shared))

    def inspect(self, key: str) -> Holder | None:
        """Who holds key: its Holder, or None when nobody holds it."""
        return self._do(self._core.inspect_thread, key)

    def locks(self, prefix: str | None = None, limit: int = 0) -> Locks:
        """The held keys starting with prefix, at most limit of them (0: all)."""
        hs, more = self._do(self._core.locks_thread, prefix, limit)
        out = Locks(hs)
        out.more = more
        return out

    def info(self) -> Node:
        """What a node the client is connected to says of itself (I): its
        address, its role, and the active it knows ("" for none)."""
        return self._do(self._core.info_thread)

    def active(self) -> str:
        """The address of the cluster's active node (a single node is its
        own). kunci.NoActiveError when the node asked knows none (an election is
        under way)."""
        return self._core.active_of(self._do(self._core.info_thread))
