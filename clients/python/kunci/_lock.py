"""A grant a caller holds, and what its handles share (clientlib's Lock,
do.go)."""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Callable

from .errors import LostError, StaleError

if TYPE_CHECKING:
    from ._core import _Core


class LockState:
    """A grant, shared by the sync and async Lock handles. Its fields are the
    loop's (the thread client's: under Core.mu)."""

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
        # The timer that tells on_lost when the lease runs out without an
        # extend (watch_lease: armed when a handle's lost is first asked).
        self.lease_timer: asyncio.TimerHandle | None = None

    def lose(self) -> None:
        self.ended = True
        if self.lease_timer is not None:
            self.lease_timer.cancel()
            self.lease_timer = None
        if not self.lost:
            self.lost = True
            for f in self.on_lost:
                f()

    def end(self) -> None:
        """The grant ended otherwise than lost: released."""
        self.ended = True
        if self.lease_timer is not None:
            self.lease_timer.cancel()
            self.lease_timer = None

    def watch_lease(self) -> None:
        """Tell on_lost when the lease runs out without an extend (counted
        from when the grant's answer was read, or an extend was sent), as
        Go's Lock.Done does: a lock not kept alive is lost then, as far as
        the client can tell. Loop thread."""
        if self.ended or self.lease_timer is not None:
            return
        self.lease_timer = self.core.loop.call_at(self.ends, self._lease_over)

    def _lease_over(self) -> None:
        self.lease_timer = None
        if self.ended:
            return
        if self.ends > self.core.loop.time():  # extended meanwhile
            self.lease_timer = self.core.loop.call_at(self.ends, self._lease_over)
            return
        self.lose()


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
    grant gone, or a lock lost meanwhile, is kunci.LostError, and any other
    failure of the release is raised as it is."""
    if block_raised:
        return
    if isinstance(release_err, StaleError):
        raise lost_error(ls) from release_err
    if release_err is not None:
        raise release_err
    if lost:
        raise lost_error(ls)


def lost_error(ls: LockState) -> LostError:
    return LostError(f"kunci: lock {ls.key} (token {ls.token}) was lost")
