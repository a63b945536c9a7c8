"""The kunci protocol, version 1, as the client speaks it (docs/PROTOCOL.md).

Validation by the server's rules, request encoders and the answer parser.
Pure functions over str and bytes: no I/O, no clock.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

MAX_LINE = 512
MAX_KEY = 250
MAX_OWNER = 64
MAX_U64 = (1 << 64) - 1
MAX_SEMAPHORE_LIMIT = (1 << 32) - 1  # the form's; the node's --max-holders is lower
# Seconds whose count of milliseconds overflows a signed 64-bit integer
# are invalid on the wire.
_MAX_MS = (1 << 63) - 1
_BAD_KEY_BYTE = re.compile(rb"[\x00-\x20\x7f]")


def check_key(key: str, what: str = "key") -> bytes:
    """Return key as bytes, or raise ValueError by the node's rules for a key:
    1 to 250 bytes (UTF-8), no space, no control byte."""
    if not isinstance(key, str):
        raise TypeError(f"kunci: {what} must be a str, not {type(key).__name__}")
    b = key.encode("utf-8")
    if not 1 <= len(b) <= MAX_KEY:
        raise ValueError(f"kunci: {what} must be 1 to {MAX_KEY} bytes (got {len(b)})")
    if _BAD_KEY_BYTE.search(b):
        raise ValueError(f"kunci: {what} {key!r} holds a space or control byte")
    return b


def check_owner(owner: str) -> bytes:
    """Return owner as bytes, or raise ValueError: 1 to 64 bytes of printable
    ASCII (0x21-0x7E), no space."""
    if not isinstance(owner, str):
        raise TypeError(f"kunci: owner must be a str, not {type(owner).__name__}")
    b = owner.encode("utf-8")
    if not 1 <= len(b) <= MAX_OWNER or any(c < 0x21 or c > 0x7E for c in b):
        raise ValueError(
            f"kunci: bad owner {owner!r}: 1 to {MAX_OWNER} bytes of printable ASCII, no space"
        )
    return b


def _seconds(value: float, what: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"kunci: {what} must be seconds as a number, not {type(value).__name__}")
    try:
        f = float(value)
    except OverflowError:
        raise ValueError(f"kunci: {what} of {value} s overflows the protocol's milliseconds") from None
    if math.isnan(f) or math.isinf(f):
        raise ValueError(f"kunci: {what} must be a finite number of seconds (got {value})")
    return f


# Leases and waits already converted: a program asks for a few, again and again.
_ms_cache: dict[tuple[type, float], int] = {}


def lease_ms(lease: float) -> int:
    """Return lease (seconds) as whole milliseconds, rounded up so that it is
    never shorter than asked; raise ValueError unless it is more than 0."""
    ms = _ms_cache.get((type(lease), lease))
    if ms is not None and ms > 0:
        return ms
    return _remember(lease, _lease_ms(lease))


def _remember(seconds: float, ms: int) -> int:
    """Keep ms as the conversion of seconds while the cache is small; return ms."""
    if len(_ms_cache) < 256:
        _ms_cache[(type(seconds), seconds)] = ms
    return ms


def _lease_ms(lease: float) -> int:
    s = _seconds(lease, "lease")
    if s <= 0:
        raise ValueError(f"kunci: lease must be > 0 seconds (got {lease})")
    ms = math.ceil(s * 1000 - 1e-9)
    if ms > _MAX_MS:
        raise ValueError(f"kunci: lease of {lease} s overflows the protocol's milliseconds")
    return max(ms, 1)


def wait_ms(wait: float) -> int:
    """Return wait (seconds) as whole milliseconds, rounded up; raise
    ValueError unless it is 0 or more (0: no bound of its own)."""
    ms = _ms_cache.get((type(wait), wait))
    if ms is not None:
        return ms
    return _remember(wait, _wait_ms(wait))


def _wait_ms(wait: float) -> int:
    s = _seconds(wait, "wait")
    if s < 0:
        raise ValueError(f"kunci: wait must be >= 0 seconds (got {wait})")
    # A positive wait is at least 1 ms: 0 would mean no bound of its own.
    ms = max(math.ceil(s * 1000 - 1e-9), 1) if s > 0 else 0
    if ms > _MAX_MS:
        raise ValueError(f"kunci: wait of {wait} s overflows the protocol's milliseconds")
    return ms


def check_token(token: int) -> int:
    if isinstance(token, bool) or not isinstance(token, int) or not 1 <= token <= MAX_U64:
        raise ValueError(f"kunci: token must be an int from 1 to 2**64-1 (got {token!r})")
    return token


def check_limit(limit: int) -> int:
    if isinstance(limit, bool) or not isinstance(limit, int) or not 0 <= limit <= MAX_U64:
        raise ValueError(f"kunci: limit must be an int from 0 (no limit) to 2**64-1 (got {limit!r})")
    return limit


def kind_field(limit: int | None, shared: bool) -> bytes:
    """Return an acquire's kind field: b"limit=N" for a semaphore of at most
    limit holders, b"mode=shared" for a shared grant of a read-write lock,
    b"" for the plain (exclusive) lock. Raise ValueError for both at once or
    a limit out of the protocol's 1 to 2**32-1 (the node refuses one over its
    --max-holders, default 1024: "limit too high")."""
    if limit is None:
        if not isinstance(shared, bool):
            raise TypeError(f"kunci: shared must be a bool, not {type(shared).__name__}")
        return b"mode=shared" if shared else b""
    if isinstance(limit, bool) or not isinstance(limit, int):
        raise TypeError(f"kunci: limit must be an int, not {type(limit).__name__}")
    if shared:
        raise ValueError("kunci: limit= (a semaphore) and shared=True (a read-write lock) cannot go together")
    if not 1 <= limit <= MAX_SEMAPHORE_LIMIT:
        raise ValueError(f"kunci: a semaphore's limit must be from 1 to 2**32-1 (got {limit})")
    return b"limit=%d" % limit


def seconds_field(ms: int) -> bytes:
    """Format ms as the protocol's seconds: "30", "0.5", "2.125"."""
    s, frac = divmod(ms, 1000)
    if frac == 0:
        return b"%d" % s
    return (b"%d.%03d" % (s, frac)).rstrip(b"0")


def acquire_line(
    key: bytes, lease: int, wait: int | None, owner: bytes | None, kind: bytes = b"", seen: int | None = None
) -> bytes:
    """"A key lease wait [owner=OWNER] [KIND] [seen=SEEN]"; wait None is "-"
    (a try); kind is kind_field's; seen, for an acquire of a session sent
    again, the highest token the client had been answered when it first
    sent it (docs/PROTOCOL.md, Sessions)."""
    w = b"-" if wait is None else seconds_field(wait)
    if seen is not None:
        o = b" owner=" + owner if owner else b""
        k = b" " + kind if kind else b""
        return b"A %s %s %s%s%s seen=%d\n" % (key, seconds_field(lease), w, o, k, seen)
    if kind:
        o = b" owner=" + owner if owner else b""
        return b"A %s %s %s%s %s\n" % (key, seconds_field(lease), w, o, kind)
    if owner:
        return b"A %s %s %s owner=%s\n" % (key, seconds_field(lease), w, owner)
    return b"A %s %s %s\n" % (key, seconds_field(lease), w)


def release_line(key: bytes, token: int) -> bytes:
    return b"R %s %d\n" % (key, token)


def extend_line(key: bytes, token: int, lease: int) -> bytes:
    return b"X %s %d %s\n" % (key, token, seconds_field(lease))


def cancel_line(key: bytes) -> bytes:
    return b"C %s\n" % key


def inspect_line(key: bytes) -> bytes:
    return b"Q %s\n" % key


def list_line(limit: int, prefix: bytes | None) -> bytes:
    if prefix:
        return b"L %d %s\n" % (limit, prefix)
    return b"L %d\n" % limit


def session_line(session: int) -> bytes:
    """"S session": name the connection's session (1 to 2**64-1)."""
    return b"S %d\n" % session


INFO_LINE = b"I\n"


def auth_line(name: bytes, secret: bytes) -> bytes:
    return b"U %s %s\n" % (name, secret)


class BadAnswer(Exception):
    """A line from the node that is not an answer of the protocol."""


@dataclass(frozen=True)
class Holder:
    """Who holds a key, as the node answered Q (or an H line of a listing).
    Client.inspect returns one for a held key, None for a free one.

    token is the grant's fencing token (0 only in the wire's own parse of
    a Q answer FREE). left is the lease left, in seconds, when the node
    answered; waiters the acquires queued behind the grant; owner the owner
    the grant's acquire named ("" for none). holders is how many grants the
    key has (1 for a plain lock, and 1 when not given for a held key);
    limit a semaphore's limit (None for a lock); shared is True for a key
    held in shared mode. Several holders: inspect shows the oldest grant, a
    listing each one.
    """

    key: str
    token: int = 0
    left: float = 0.0
    waiters: int = 0
    owner: str = ""
    holders: int = 0
    limit: int | None = None
    shared: bool = False

    def __post_init__(self) -> None:
        if self.token and not self.holders:
            object.__setattr__(self, "holders", 1)  # a held key has a holder

    @property
    def held(self) -> bool:
        return self.token != 0


@dataclass(frozen=True)
class Node:
    """What a node says of itself and of its cluster (I): Client.info returns
    one. addr is the node's own client address; role "active" or
    "standby"; active the address of the active as the node knows it, ""
    when it knows none (an election is under way)."""

    addr: str
    role: str
    active: str


class Answer:
    """One answer line. kind is its letter; key its key (bytes, b"" when
    none). ok: R/X/C said OK (not STALE/NONE). For E: op and reason. For M:
    addr; for I: role, self_addr, active, extra. For L and S: count (and
    for L, more). For Q and H: holder. Fields an answer does not have keep
    the class's defaults (an answer is made for every line: only what it
    has is set)."""

    token = 0
    ok = False
    op = ""
    reason = ""
    addr = ""
    holder: Holder | None = None
    holders: list[Holder] | None = None  # a listing's H lines, on its L or S answer
    count = 0
    more = False
    role = ""
    self_addr = ""
    active = ""
    extra: dict[str, str] = {}

    def __init__(self, kind: str, key: bytes = b"", token: int = 0, ok: bool = False) -> None:
        self.kind = kind
        self.key = key
        if token:
            self.token = token
        if ok:
            self.ok = ok

    def __repr__(self) -> str:
        return f"Answer({self.kind!r}, {self.key!r})"


def _uint(b: bytes) -> int:
    if not b or not b.isdigit():
        raise BadAnswer(f"not a number: {b!r}")
    v = int(b)
    if v > MAX_U64:
        raise BadAnswer(f"number out of range: {b!r}")
    return v


def _secs(b: bytes) -> float:
    whole, dot, frac = b.partition(b".")
    if not whole.isdigit() or (dot and (not frac.isdigit() or len(frac) > 3)):
        raise BadAnswer(f"not seconds: {b!r}")
    return int(whole) + (int(frac) / float(10 ** len(frac)) if frac else 0.0)


def _holding(kind: str, key: bytes, rest: list[bytes]) -> Answer:
    if len(rest) < 3:
        raise BadAnswer(f"{kind} with {len(rest)} fields")
    owner = ""
    holders = 1
    limit: int | None = None
    shared = False
    for f in rest[3:]:
        if f.startswith(b"owner="):
            owner = f[6:].decode("ascii", "replace")
        elif f.startswith(b"holders="):
            holders = _uint(f[8:])
        elif f.startswith(b"limit="):
            limit = _uint(f[6:])
        elif f == b"mode=shared":
            shared = True
        # other name=value fields are skipped
    h = Holder(
        key.decode("utf-8", "surrogateescape"), _uint(rest[0]), _secs(rest[1]), _uint(rest[2]), owner,
        holders, limit, shared,
    )
    a = Answer(kind, key, token=h.token)
    a.holder = h
    return a


def parse_answer(line: bytes) -> Answer:
    """Parse one answer line, without its line ending. Raise BadAnswer."""
    if len(line) < 3 or line[1:2] != b" ":
        raise BadAnswer(f"not an answer: {line[:64]!r}")
    kind = chr(line[0])
    if kind == "E":
        parts = line[2:].split(b" ", 2)
        if len(parts) < 3 or not parts[2]:
            raise BadAnswer(f"bad refusal: {line[:64]!r}")
        op = parts[0].decode("ascii", "replace")
        a = Answer("E", b"" if parts[1] == b"-" else parts[1])
        a.op = "" if op == "-" else op
        a.reason = parts[2].decode("utf-8", "replace")
        return a
    f = line[2:].split(b" ")
    if kind in "ARXC":
        if len(f) != 2:
            raise BadAnswer(f"{kind} with {len(f)} fields")
        if kind == "A":
            return Answer("A", f[0], token=_uint(f[1]))
        if f[1] == b"OK":
            return Answer(kind, f[0], ok=True)
        if (kind == "C" and f[1] == b"NONE") or (kind != "C" and f[1] == b"STALE"):
            return Answer(kind, f[0])
        raise BadAnswer(f"bad {kind} answer: {line[:64]!r}")
    if kind == "T":
        if len(f) != 1:
            raise BadAnswer("T with more than a key")
        return Answer("T", f[0])
    if kind in "QH":
        if kind == "Q" and len(f) == 2 and f[1] == b"FREE":
            a = Answer("Q", f[0])
            a.holder = Holder(f[0].decode("utf-8", "surrogateescape"))
            return a
        return _holding(kind, f[0], f[1:])
    if kind == "L":
        if len(f) == 1 or (len(f) == 2 and f[1] == b"more"):
            a = Answer("L")
            a.count, a.more = _uint(f[0]), len(f) == 2
            return a
        raise BadAnswer(f"bad L answer: {line[:64]!r}")
    if kind == "S":
        if len(f) != 1:
            raise BadAnswer(f"bad S answer: {line[:64]!r}")
        a = Answer("S")
        a.count = _uint(f[0])
        return a
    if kind == "M":
        if len(f) != 1:
            raise BadAnswer("M with more than an address")
        a = Answer("M")
        addr = f[0].decode("ascii", "replace")
        a.addr = "" if addr == "-" else addr
        return a
    if kind == "I":
        if len(f) < 3:
            raise BadAnswer("I with fewer than 3 fields")
        extra: dict[str, str] = {}
        for x in f[3:]:
            n, _, v = x.partition(b"=")
            extra[n.decode("ascii", "replace")] = v.decode("ascii", "replace")
        act = f[2].decode("ascii", "replace")
        a = Answer("I")
        a.role = f[0].decode("ascii", "replace")
        a.self_addr = f[1].decode("ascii", "replace")
        a.active = "" if act == "-" else act
        a.extra = extra
        return a
    if kind == "U":
        if f == [b"OK"]:
            return Answer("U", ok=True)
        raise BadAnswer(f"bad U answer: {line[:64]!r}")
    raise BadAnswer(f"unknown answer {kind!r}")


def split_addr(addr: str) -> tuple[str, int]:
    """Split "host:port" ("[v6]:port") into host and port; raise ValueError."""
    if not isinstance(addr, str):
        raise TypeError(f"kunci: address must be a str, not {type(addr).__name__}")
    host, sep, port = addr.rpartition(":")
    if not sep or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"kunci: bad address {addr!r}: want host:port")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    if not host:
        raise ValueError(f"kunci: bad address {addr!r}: no host")
    return host, int(port)
