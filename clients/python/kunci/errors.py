"""The errors the kunci client raises. All are KunciError but bad input,
which is refused before anything is sent with a ValueError (or TypeError)."""

from __future__ import annotations


class KunciError(Exception):
    """The base of every error the client raises about a request."""


class Timeout(KunciError):
    """The acquire's wait ran out and nothing was granted (the node answered T)."""


class Refused(KunciError):
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


class Unavailable(KunciError):
    """No node answered: no connection could carry the request within its
    window (the acquire's wait; five seconds for release, extend, inspect)."""


class Closed(Unavailable):
    """The client was closed."""


class Stale(KunciError):
    """The token is not the key's current grant: the lock was released, or its
    lease ran out (release or extend answered STALE)."""


class Lost(KunciError):
    """A kept-alive lock was lost before the block under it ended: the node
    answered an extend STALE, or the lease ran out while no node answered."""
