"""What the connections learned of nodes down and of the active
(clientlib's outage.go)."""

from __future__ import annotations

import asyncio

from .errors import AuthError


class Outage:
    """What the connections learned of nodes down and of the active
    (outage.go)."""

    def __init__(self, loop: asyncio.AbstractEventLoop, forget: float) -> None:
        self.loop = loop
        self.down: dict[str, float] = {}
        self.active = ""
        self.forget = forget

    def dialed(self, addr: str, err: BaseException | None) -> None:
        if err is None:
            self.down.pop(addr, None)
        elif not isinstance(err, AuthError):
            self.mark_down(addr)

    def mark_down(self, addr: str) -> None:
        self.down[addr] = self.loop.time()

    def is_down(self, addr: str) -> bool:
        at = self.down.get(addr)
        if at is None:
            return False
        if self.loop.time() - at >= self.forget:
            del self.down[addr]
            return False
        return True

    def active_but(self, not_addr: str) -> str:
        a = self.active
        if not a or a == not_addr or self.is_down(a):
            return ""
        return a
