"""The errors the kunci client raises. All are KunciError but bad input,
which is refused before anything is sent with a ValueError (or TypeError).

The names follow PEP 8 (and the TypeScript client's): ...Error. The names
before 0.11 (Timeout, Refused, Unavailable, Closed, Stale, NoActive, Lost)
are the same classes, kept for a release; they go in 0.12. kunci.TimeoutError
is not the built-in TimeoutError (an OSError): catch it by its module."""

from __future__ import annotations


class KunciError(Exception):
    """The base of every error the client raises about a request."""


class TimeoutError(KunciError):  # noqa: A001 - kunci.TimeoutError, as TypeScript's
    """The acquire's wait ran out and nothing was granted (the node answered T)."""


class RefusedError(KunciError):
    """The node refused the request (E), with its reason."""

    def __init__(self, op: str, key: str, reason: str) -> None:
        super().__init__(f"kunci: {op} {key or '-'} refused: {reason}")
        self.op = op
        self.key = key
        self.reason = reason


class AuthError(KunciError):
    """A node refused the client's credentials, or asked for credentials the
    client was not given ("auth required")."""

    def __init__(self, addr: str, reason: str) -> None:
        super().__init__(f"kunci: authentication at {addr} failed: {reason}")
        self.addr = addr
        self.reason = reason


class UnavailableError(KunciError):
    """No node answered: no connection could carry the request within its
    window (the acquire's wait; five seconds for release, extend, inspect)."""


class ClosedError(UnavailableError):
    """The client was closed."""


class StaleError(KunciError):
    """The grant is not yours any more (release or extend answered STALE): its
    lease ran out, someone else released it with its token, or a crash
    failover lost it (asynchronous replication: the old active answered it
    and never copied it). A release this client's session made before is not
    stale: the node answers it OK again."""


class NoActiveError(KunciError):
    """The node asked knows no active node: the cluster is electing one
    (Client.active)."""


class LostError(KunciError):
    """A kept-alive lock was lost before the block under it ended: the node
    answered an extend STALE, or the lease ran out while no node answered."""


# The names before 0.11, the same classes: they go in 0.12.
Timeout = TimeoutError
Refused = RefusedError
Unavailable = UnavailableError
Closed = ClosedError
Stale = StaleError
NoActive = NoActiveError
Lost = LostError
