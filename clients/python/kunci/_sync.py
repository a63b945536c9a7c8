"""Client: the client for threads, with its own event loop in one I/O thread."""

from __future__ import annotations

import asyncio
import collections
import threading
from types import TracebackType
from typing import Any, Callable, Coroutine, Deque, TypeVar, cast

from ._async import Locks
from ._config import ClientBase
from ._core import Config, LockHandle, LockState, Waiter, _Core, end_lock_block, fast_acquire, fast_release, slow
from ._wire import Holder, Node
from .errors import Closed, Stale

T = TypeVar("T")
_lost_mu = threading.Lock()


class _ThreadWaiter(Waiter):
    """A caller thread waiting for the I/O thread: a lock it blocks on until
    the loop releases it. Each thread keeps one (it waits for one request at
    a time)."""

    __slots__ = ("lock", "value", "err", "cancel", "abandoned")

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.lock.acquire()
        self.value: object = None
        self.err: BaseException | None = None
        self.cancel = None
        self.abandoned = False  # its thread gave up (loop thread only)

    def finish(self, value: object, err: BaseException | None) -> None:
        if self.abandoned:
            _drop(value)
            return
        self.value, self.err = value, err
        self.lock.release()

    def abandon(self) -> None:
        """Its thread gave up waiting (a signal's exception): withdraw what
        it waits for, and end a grant that was answered meanwhile, which
        the thread will never see. Loop thread only."""
        self.abandoned = True
        v, self.value = self.value, None
        _drop(v)
        if self.cancel is not None:
            self.cancel()


def _start_keep_alive(core: _Core, w: Waiter, ls: LockState) -> None:
    core.keep_alive(ls)
    w.finish(None, None)


def _drop(value: object) -> None:
    """Release a grant nobody will hold (loop thread only)."""
    if isinstance(value, LockState):
        core = value.core
        core.spawn(core.release_quietly(value))


class Lock(LockHandle):
    """A granted lock (see Client.acquire). Safe to use from any thread. lost
    is set the moment the lock is known lost: its keep-alive, an extend or the
    release found the grant gone, or its lease ran out while no node
    answered."""

    __slots__ = ("_client", "_lost")

    def __init__(self, client: Client, ls: LockState) -> None:
        super().__init__(ls)
        self._client = client
        self._lost: threading.Event | None = None

    @property
    def lost(self) -> threading.Event:
        """Set the moment the lock is known lost (made on first use: most
        locks are never asked)."""
        ev = self._lost
        if ev is None:
            with _lost_mu:
                ev = self._lost
                if ev is None:
                    ev = self._lost = threading.Event()
                    # Registered first, then checked: a loss in the I/O
                    # thread meanwhile is seen one way or the other.
                    self._ls.on_lost.append(ev.set)
                    if self._ls.lost:
                        ev.set()
        return ev

    def extend(self, lease: float) -> None:
        """Make the grant end lease seconds from now. kunci.Stale when it had
        already ended (lost is then set)."""
        try:
            self._client._run(self._client._core.extend(self._ls, lease))
        except Stale:
            self._ls.lose()
            raise

    def release(self) -> None:
        """End the grant, trying again through connection failures for 5 s.
        Released before by this client (a release sent again, say): done, as
        the node answers. kunci.Stale when the grant is not yours any more:
        its lease ran out, another released it with its token, or a crash
        failover lost it."""
        try:
            self._client._call(fast_release, self._ls)
        except Stale:
            self._ls.lose()
            raise

    def keep_alive(self) -> None:
        """Extend the lease by its length every third of it, in the client's
        I/O thread, until released; lost is set if the lock is lost."""
        # Handed over like every request, so it keeps its place before
        # this thread's next one (a release, which stops it).
        self._client._call(_start_keep_alive, self._ls)


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
        lost = lock.lost.is_set()
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
        # _mu orders calls against close(): a call checks _closed and hands
        # its request over (_pending, _draining, the wake-up of the I/O
        # thread) under it, and close() sets _closed under it before it
        # stops the I/O thread, so no request is handed to a stopped loop.
        self._mu = threading.Lock()
        self._closed = False
        self._closing: threading.Event | None = None
        self._local = threading.local()
        self._pending: Deque[tuple[Callable[..., None], tuple[Any, ...], _ThreadWaiter]] = collections.deque()
        self._draining = False
        self._core_or_none: _Core | None = None
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="kunci-io", daemon=True)
        self._thread.start()

        async def start() -> _Core:
            core = _Core(cfg, self._loop)
            await core.start()
            return core

        fut = asyncio.run_coroutine_threadsafe(start(), self._loop)
        try:
            self._core: _Core = fut.result()
        except BaseException:
            self._stop_loop()
            raise
        self._core_or_none = self._core

    def _run(self, coro: Coroutine[Any, Any, T]) -> T:
        """Run coro on the I/O thread's loop and return its outcome."""
        if self._closed or threading.current_thread() is self._thread:
            coro.close()
        return cast(T, self._call(slow, coro))

    def _call(self, fn: Callable[..., None], *args: Any) -> Any:
        """Have the I/O thread run fn(core, waiter, *args), which answers the
        waiter, and wait for the answer. Requests made by many threads at
        once are handed over together: one wake-up of the I/O thread."""
        if threading.current_thread() is self._thread:
            raise RuntimeError("kunci: a Client's methods cannot be called from its own I/O thread")
        w: _ThreadWaiter | None = getattr(self._local, "w", None)
        if w is None:
            w = self._local.w = _ThreadWaiter()
        w.cancel = None
        with self._mu:
            if self._closed:
                raise Closed("kunci: client closed")
            self._pending.append((fn, args, w))
            if not self._draining:
                self._draining = True
                self._loop.call_soon_threadsafe(self._drain)
        try:
            w.lock.acquire()
        except BaseException:
            # Given up (KeyboardInterrupt): withdraw it; this thread's waiter
            # may still be answered, so it gets a new one.
            self._local.w = None
            self._loop.call_soon_threadsafe(w.abandon)
            raise
        if w.err is not None:
            err, w.err = w.err, None
            raise err
        v, w.value = w.value, None
        return v

    def _drain(self) -> None:
        with self._mu:
            self._draining = False
        core, pending = self._core_or_none, self._pending
        while pending:
            fn, args, w = pending.popleft()
            if core is None or core.closed:
                w.finish(None, Closed("kunci: client closed"))
                continue
            try:
                fn(core, w, *args)
            except BaseException as e:  # noqa: BLE001 - the caller gets it
                w.finish(None, e)

    def _stop_loop(self) -> None:
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join()
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
            with self._mu:
                self._closed = True
            self._stop_loop()
            # What was handed over too late for the loop to run it.
            while self._pending:
                _, _, w = self._pending.popleft()
                w.finish(None, Closed("kunci: client closed"))
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
        it). kunci.Timeout when the wait runs out; kunci.Unavailable when no
        node answered within it.

        limit=N takes one of at most N grants of key, a semaphore; shared=True
        a shared (read) grant of key, a read-write lock whose exclusive
        (write) grant is the plain acquire. Not both (ValueError). A key held
        as another kind, or a semaphore of another limit: kunci.Refused with
        the node's reason ("key held as a lock", "semaphore limit differs").
        """
        ls = self._call(fast_acquire, key, lease, wait, False, limit, shared)
        assert ls is not None
        return Lock(self, ls)

    def try_acquire(self, key: str, lease: float, *, limit: int | None = None, shared: bool = False) -> Lock | None:
        """Take key if nobody holds it, at once (wait "-"): a Lock, or None
        when it is held. limit and shared as acquire's: a Lock when one
        would be granted at once. While another acquire of key by this
        client is in progress, None at once, unsent (the client has one
        acquire of a key in progress at a time: see README.md, Sessions)."""
        ls = self._call(fast_acquire, key, lease, 0.0, True, limit, shared)
        return None if ls is None else Lock(self, ls)

    def lock(
        self, key: str, lease: float, wait: float = 0.0, *, limit: int | None = None, shared: bool = False
    ) -> _LockBlock:
        """"with c.lock(key, lease=30, wait=10) as lock:" acquires key, keeps
        it alive while the block runs, and releases it after. When the lock
        is lost meanwhile, lock.lost is set at once, and the block's end
        raises kunci.Lost (unless the block raised). limit and shared as
        acquire's."""
        return _LockBlock(lambda: self.acquire(key, lease, wait, limit=limit, shared=shared))

    def inspect(self, key: str) -> Holder | None:
        """Who holds key: its Holder, or None when nobody holds it."""
        return self._run(self._core.inspect(key))

    def locks(self, prefix: str | None = None, limit: int = 0) -> Locks:
        """The held keys starting with prefix, at most limit of them (0: all)."""
        hs, more = self._run(self._core.locks(prefix, limit))
        out = Locks(hs)
        out.more = more
        return out

    def info(self) -> Node:
        """What a node the client is connected to says of itself (I): its
        address, its role, and the active it knows ("" for none)."""
        return self._run(self._core.info())

    def active(self) -> str:
        """The address of the cluster's active node (a single node is its
        own). kunci.NoActive when the node asked knows none (an election is
        under way)."""
        return self._run(self._core.active())
