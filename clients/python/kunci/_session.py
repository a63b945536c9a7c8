"""The client's session (docs/PROTOCOL.md, Sessions; clientlib's session.go).

A session is a random number the client names first on every connection it
makes ("S session"), so that the grants made for its acquires are known as
its own on every node, across broken connections and failovers. Three things
use it:

- Reconciling (_Conn.reconcile, in _core.py): a new connection names the
  session and reads the grants the node holds for it; those the client
  neither holds nor waits for are released at once. A release the old active
  answered and crashed before its standbys had, or a grant the client gave up
  on before its answer came, no longer keeps a key held until its lease ends.
- Acquires sent again: an acquire whose connection broke, or was redirected,
  before its answer came is sent again with "seen=TOKEN", the highest token
  the client had been answered when the acquire got its turn: the node
  answers it the grant of its earlier attempt, rather than queue it behind
  that grant.
- Releases sent again: the node answers OK, not STALE, to the session's
  release of a grant it released before, so a release whose first answer was
  lost succeeds; STALE means the grant ended otherwise (not yours any more).

For "seen=" to name only an earlier attempt's grant, the client has one
acquire of a key in progress at a time, whatever the connection (Keys: the
others wait their turn, in order; a try is answered busy unsent), and it keeps
the grants its callers hold, so that reconciling releases only what nobody
holds.

Everything here runs on the client's event loop (the thread client's: under
its mutex, Core.mu).
"""

from __future__ import annotations

import asyncio
import collections
import secrets
from typing import TYPE_CHECKING, Deque, Union

from ._call import Waiter
from .errors import TimeoutError

if TYPE_CHECKING:
    from ._lock import LockState

# How many grants are recorded between two sweeps for locks whose callers let
# them run out rather than release them (Keys.sweep).
SWEEP_EVERY = 1024


def new_session() -> int:
    """Draw a session: 63 random bits, never 0."""
    while True:
        s = secrets.randbits(63)
        if s:
            return s


class _ThreadTurn:
    """A caller thread's place in a key's line (KeyState.turns), as an
    asyncio future is a task's: set_result lets it go."""

    __slots__ = ("w", "state")

    def __init__(self, w: Waiter) -> None:
        self.w = w
        self.state = 0  # 1: its turn came; 2: it gave up

    def done(self) -> bool:
        return self.state != 0

    def cancelled(self) -> bool:
        return self.state == 2

    def cancel(self) -> None:
        if self.state == 0:
            self.state = 2

    def set_result(self, _: None) -> None:
        self.state = 1
        self.w.ready = True
        self.w.wake()


_Turnstile = Union["asyncio.Future[None]", _ThreadTurn]


class KeyState:
    """What the client knows of a key it holds or acquires, kept while a
    caller holds a grant of it, acquires it, or its last acquire was left
    unresolved."""

    __slots__ = ("held", "acquiring", "turns", "seen", "sent", "unresolved")

    def __init__(self) -> None:
        # The grants callers hold: not released (or being released), not
        # known lost.
        self.held: list[LockState] = []
        # The acquire of the key in progress (one at a time), and those
        # waiting for their turn, oldest first.
        self.acquiring = False
        self.turns: Deque[_Turnstile] = collections.deque()
        # seen: the client's highest token when the acquire in progress got
        # its turn; sent: it went out at least once.
        self.seen = 0
        self.sent = False
        # unresolved: an acquire of the key ended without its outcome known
        # (the caller gave up while its attempt's answer was lost): a grant
        # may have been made for it. The next acquire of the key is sent with
        # seen= from its first attempt on.
        self.unresolved = False

    def idle(self) -> bool:
        return not self.held and not self.acquiring and not self.turns and not self.unresolved


class Turn:
    """An acquire's turn at its key, from Keys.take (or wait_turn) to leave."""

    __slots__ = ("keys", "kb", "ks", "unknown", "withdrawing", "left")

    def __init__(self, keys: Keys, kb: bytes, ks: KeyState) -> None:
        self.keys = keys
        self.kb = kb
        self.ks = ks
        # unknown: an attempt went out and no answer came (its connection
        # broke, or was redirected): a grant may have been made for it.
        self.unknown = False
        # withdrawing: the caller gave up while an attempt was outstanding;
        # the turn ends with that attempt's answer (see _Conn._withdraw),
        # so that no other acquire of the key goes out meanwhile.
        self.withdrawing = False
        self.left = False

    @property
    def resend(self) -> bool:
        """Whether the acquire goes out with seen=: it went out before (this
        attempt follows one whose answer did not come), or an earlier
        acquire of the key was left unresolved."""
        return self.ks.sent or self.ks.unresolved

    @property
    def seen(self) -> int:
        return self.ks.seen

    def mark_sent(self) -> None:
        self.ks.sent = True

    def leave(self, ls: LockState | None, answered: bool) -> None:
        """End the turn, once: ls is the grant the acquire got (None: none);
        answered whether the node's answer to it came (granted, timed out,
        refused). An acquire that ended with an attempt unanswered leaves
        the key unresolved."""
        if self.left:
            return
        self.left = True
        ks = self.ks
        if ls is not None:
            self.keys.record(ks, ls)
        if answered:
            ks.unresolved = False
        elif self.unknown:
            ks.unresolved = True
        self.keys.pass_turn(self.kb, ks)


class Keys:
    """The keys the client holds or acquires (KeyState each), and seen, the
    highest token it has been answered. forget is how long past its lease
    a lock nobody released or extended is forgotten (sweep)."""

    def __init__(self, loop: asyncio.AbstractEventLoop, forget: float) -> None:
        self.loop = loop
        self.forget = forget
        self.m: dict[bytes, KeyState] = {}
        self.seen = 0
        self.recorded = 0  # grants recorded since the last sweep

    def raise_seen(self, token: int) -> None:
        if token > self.seen:
            self.seen = token

    def _get(self, kb: bytes) -> KeyState:
        ks = self.m.get(kb)
        if ks is None:
            ks = self.m[kb] = KeyState()
        return ks

    def tidy(self, kb: bytes, ks: KeyState) -> None:
        """Forget kb's state once nothing is left in it."""
        if ks.idle() and self.m.get(kb) is ks:
            del self.m[kb]

    def _begin(self, kb: bytes, ks: KeyState) -> Turn:
        ks.acquiring = True
        ks.seen, ks.sent = self.seen, False
        return Turn(self, kb, ks)

    def take(self, kb: bytes) -> Turn | None:
        """The turn at kb at once, or None while another acquire of it is in
        progress (a try is then answered "held"; others wait_turn)."""
        ks = self._get(kb)
        if ks.acquiring:
            return None
        return self._begin(kb, ks)

    async def wait_turn(self, kb: bytes, deadline: float | None, key: str) -> Turn:
        """Wait for an acquire's turn at kb while another acquire of it is in
        progress (take returned None): until that one and those that came
        first are done. kunci.TimeoutError when deadline (loop time; None: no
        bound) passes first."""
        ks = self._get(kb)
        if not ks.acquiring:
            return self._begin(kb, ks)
        fut: asyncio.Future[None] = self.loop.create_future()
        ks.turns.append(fut)
        try:
            timeout = None if deadline is None else max(deadline - self.loop.time(), 0)
            await asyncio.wait((fut,), timeout=timeout)
        except BaseException:
            self._give_up(kb, ks, fut)
            raise
        if not fut.done():
            self._give_up(kb, ks, fut)
            raise TimeoutError(f"kunci: wait for {key} ran out in the client")
        return self._begin(kb, ks)

    def wait_turn_thread(self, w: Waiter, kb: bytes, deadline: float | None, key: str) -> Turn:
        """wait_turn, for a caller thread of the thread client (mu held)."""
        ks = self._get(kb)
        if not ks.acquiring:
            return self._begin(kb, ks)
        t = _ThreadTurn(w)
        ks.turns.append(t)
        w.ready = False
        try:
            while not w.ready:
                left = None if deadline is None else deadline - self.loop.time()
                if left is not None and left <= 0:
                    break
                w.block(left)
        except BaseException:
            self._give_up(kb, ks, t)
            raise
        if not t.done():
            self._give_up(kb, ks, t)
            raise TimeoutError(f"kunci: wait for {key} ran out in the client")
        return self._begin(kb, ks)

    def _give_up(self, kb: bytes, ks: KeyState, fut: _Turnstile) -> None:
        """An acquirer gave up waiting for its turn: out of the line, or, if
        its turn came meanwhile, the turn passed on."""
        if fut.done() and not fut.cancelled():
            self.pass_turn(kb, ks)
            return
        fut.cancel()
        try:
            ks.turns.remove(fut)
        except ValueError:
            pass
        self.tidy(kb, ks)

    def pass_turn(self, kb: bytes, ks: KeyState) -> None:
        """End the acquire in progress of kb and let the next in, if any."""
        ks.acquiring = False
        while ks.turns:
            fut = ks.turns.popleft()
            if not fut.done():
                ks.acquiring = True  # theirs now: wait_turn sets it up
                fut.set_result(None)
                return
        self.tidy(kb, ks)

    def record(self, ks: KeyState, ls: LockState) -> None:
        """Record that a caller holds ls, a grant of ks's key."""
        ks.held.append(ls)
        self.recorded += 1
        if self.recorded >= SWEEP_EVERY:
            self.recorded = 0
            self.sweep(self.loop.time())

    def drop(self, ls: LockState) -> None:
        """Record that ls ended: released, or known lost."""
        ks = self.m.get(ls.kb)
        if ks is None:
            return
        try:
            ks.held.remove(ls)
        except ValueError:
            return
        self.tidy(ls.kb, ks)

    def sweep(self, now: float) -> None:
        """Forget the locks whose lease ran out in the client more than
        forget ago without an extend: a caller that lets its locks run out
        rather than release them (a lease as a time to live) would otherwise
        leave one here for each. Their grants ended on the node long since."""
        for kb, ks in list(self.m.items()):
            if ks.held:
                ks.held = [ls for ls in ks.held if not ls.ended and now <= ls.ends + self.forget]
                self.tidy(kb, ks)

    def keeps(self, kb: bytes, token: int) -> bool:
        """Whether a grant the node lists for the session, token of kb, is
        the client's to keep: a caller holds it (or is releasing it), or the
        acquire of kb in progress may be answered it (made after that
        acquire's seen, which it is sent with). Every other grant of the
        session is released: its release was lost, or its acquire given up."""
        ks = self.m.get(kb)
        if ks is None:
            return False
        for ls in ks.held:
            if ls.token == token:
                return True
        return ks.acquiring and token > ks.seen and (ks.sent or ks.unresolved)

    def resolve(self, listed: set[bytes]) -> None:
        """Forget that the acquires of keys the node listed no grant of were
        unresolved: the node holds nothing for them."""
        for kb, ks in list(self.m.items()):
            if ks.unresolved and not ks.acquiring and kb not in listed:
                ks.unresolved = False
                self.tidy(kb, ks)
