"""AsyncClient: the client on the caller's asyncio event loop."""

from __future__ import annotations

import asyncio
from types import TracebackType
from typing import Awaitable, Callable

from ._config import ClientBase
from ._core import Config, _Core
from ._lock import LockHandle, LockState, end_lock_block
from ._wire import Holder, Node
from .errors import ClosedError, LostError, StaleError


class Locks(list):  # type: ignore[type-arg]
    """The held keys a listing found (Holder each); more is True when the
    limit stopped it with at least one more such key held."""

    more: bool = False


class AsyncLock(LockHandle):
    """A granted lock (see AsyncClient.acquire). lost is set the moment the
    lock is known lost: its keep-alive, an extend or the release found the
    grant gone, or its lease ran out without an extend (as far as the
    client can tell)."""

    __slots__ = ("_core", "_lost")

    def __init__(self, core: _Core, ls: LockState) -> None:
        super().__init__(ls)
        self._core = core
        self._lost: asyncio.Event | None = None

    @property
    def lost(self) -> asyncio.Event:
        """Set the moment the lock is known lost (made on first use, with
        its lease's timer)."""
        ev = self._lost
        if ev is None:
            ev = self._lost = asyncio.Event()
            self._ls.on_lost.append(ev.set)
            if self._ls.lost:
                ev.set()
            elif not self._core.closed:
                self._ls.watch_lease()
        return ev

    async def extend(self, lease: float) -> None:
        """Make the grant end lease seconds from now. kunci.StaleError when it had
        already ended (lost is then set)."""
        try:
            await self._core.extend(self._ls, lease)
        except StaleError:
            self._ls.lose()
            raise

    async def release(self) -> None:
        """End the grant, trying again through connection failures for 5 s.
        Released before by this client (a release sent again, say): done, as
        the node answers. kunci.StaleError when the grant is not yours any more:
        its lease ran out, another released it with its token, or a crash
        failover lost it."""
        try:
            await self._core.release_lock(self._ls)
        except StaleError:
            self._ls.lose()
            raise

    def keep_alive(self) -> None:
        """Extend the lease by its length every third of it, in the
        background, until released; lost is set if the lock is lost."""
        self._core.keep_alive(self._ls)


class _AsyncLockBlock:
    def __init__(self, acquire: Callable[[], Awaitable[AsyncLock]]) -> None:
        self._acquire = acquire
        self._lock: AsyncLock | None = None

    async def __aenter__(self) -> AsyncLock:
        lock = await self._acquire()
        lock.keep_alive()
        self._lock = lock
        return lock

    async def __aexit__(
        self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None
    ) -> None:
        lock = self._lock
        assert lock is not None
        lost = lock._ls.lost
        err: Exception | None = None
        try:
            await asyncio.shield(lock.release())
        except Exception as e:
            err = e
        end_lock_block(lock._ls, lost, et is not None, err)


class AsyncClient(ClientBase):
    """A kunci client for asyncio: the same behaviour and methods as Client,
    as coroutines. Use it as "async with AsyncClient([...]) as c:", or await
    connect() and close(). Its connections live on the loop it connected on;
    use it from that loop only."""

    def _setup(self, cfg: Config) -> None:
        self._cfg = cfg
        self._core: _Core | None = None
        self._closed = False

    async def connect(self) -> AsyncClient:
        """Make a first attempt to connect to every address (connections that
        fail are retried in the background). kunci.AuthError when every one
        was a refusal of the credentials."""
        if self._closed:
            raise ClosedError("kunci: client closed")
        if self._core is None:
            core = _Core(self._cfg, asyncio.get_running_loop())
            self._core = core
            try:
                await core.start()
            except BaseException:
                self._core = None  # closed: a later connect starts afresh
                raise
        return self

    async def _c(self) -> _Core:
        if self._core is None:
            await self.connect()
        assert self._core is not None
        if self._closed or self._core.closed:
            raise ClosedError("kunci: client closed")
        return self._core

    async def close(self) -> None:
        """Close every connection. Locks still held stay held on the node
        until released or their leases run out."""
        self._closed = True
        if self._core is not None:
            await self._core.close()

    async def __aenter__(self) -> AsyncClient:
        return await self.connect()

    async def __aexit__(
        self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.close()

    async def acquire(
        self, key: str, lease: float, wait: float = 0.0, *, limit: int | None = None, shared: bool = False
    ) -> AsyncLock:
        """Wait at most wait seconds for key and hold it for lease seconds from
        the grant (wait 0: no bound of its own, the node's --max-wait bounds
        it). kunci.TimeoutError when the wait runs out; kunci.UnavailableError when no
        node answered within it. limit=N (a semaphore) and shared=True (a
        read-write lock's shared grant) as Client.acquire's."""
        core = await self._c()
        ls = await core.acquire(key, lease, wait, False, limit=limit, shared=shared)
        assert ls is not None
        return AsyncLock(core, ls)

    async def try_acquire(
        self, key: str, lease: float, *, limit: int | None = None, shared: bool = False
    ) -> AsyncLock | None:
        """Take key if nobody holds it, at once (wait "-"): a lock, or None
        when it is held. limit and shared as acquire's: a lock when one
        would be granted at once. While another acquire of key by this
        client is in progress, None at once, unsent."""
        core = await self._c()
        ls = await core.acquire(key, lease, 0.0, True, limit=limit, shared=shared)
        return None if ls is None else AsyncLock(core, ls)

    def lock(
        self, key: str, lease: float, wait: float = 0.0, *, limit: int | None = None, shared: bool = False
    ) -> _AsyncLockBlock:
        """"async with c.lock(key, lease=30, wait=10) as lock:" acquires key,
        keeps it alive while the block runs, and releases it after. When the
        lock is lost meanwhile, lock.lost is set at once, and the block's end
        raises kunci.LostError (unless the block raised). limit and shared as
        acquire's."""
        return _AsyncLockBlock(lambda: self.acquire(key, lease, wait, limit=limit, shared=shared))

    async def inspect(self, key: str) -> Holder | None:
        """Who holds key: its Holder, or None when nobody holds it."""
        core = await self._c()
        return await core.inspect(key)

    async def locks(self, prefix: str | None = None, limit: int = 0) -> Locks:
        """The held keys starting with prefix, at most limit of them (0: all)."""
        core = await self._c()
        hs, more = await core.locks(prefix, limit)
        out = Locks(hs)
        out.more = more
        return out

    async def info(self) -> Node:
        """What a node the client is connected to says of itself (I): its
        address, its role, and the active it knows ("" for none)."""
        core = await self._c()
        return await core.info()

    async def active(self) -> str:
        """The address of the cluster's active node (a single node is its
        own). kunci.NoActiveError when the node asked knows none (an election is
        under way)."""
        core = await self._c()
        return await core.active()


__all__ = ["AsyncClient", "AsyncLock", "Locks", "LostError"]
