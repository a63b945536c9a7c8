"""Building a client's Config from what the caller gave: addresses, owner,
credentials (or a credentials file), TLS."""

from __future__ import annotations

import os
import socket
import ssl
import stat
from dataclasses import dataclass
from typing import Sequence, Union

from . import _wire as wire
from ._core import Config


@dataclass(frozen=True)
class Credentials:
    """A name and secret, sent as the first line of every connection
    ("U name secret") to nodes started with --auth-file."""

    name: str
    secret: str

    def __repr__(self) -> str:
        return f"Credentials(name={self.name!r}, secret=<hidden>)"

    def check(self) -> tuple[bytes, bytes]:
        n = _checked(self.name, "credentials name", f"kunci: credentials: the name {self.name!r}")
        s = _checked(self.secret, "secret", f"kunci: credentials of {self.name}: the secret")
        return n, s


def _checked(value: str, what: str, which: str) -> bytes:
    """value as a protocol word, or ValueError saying which (never value
    itself: it may be a secret) breaks the rules."""
    try:
        return wire.check_key(value, what)
    except ValueError:
        raise ValueError(f"{which} is empty, over {wire.MAX_KEY} bytes, or holds a space or control byte") from None


def load_credentials(path: Union[str, "os.PathLike[str]"]) -> Credentials:
    """Read a credentials file, the Go client's format: "name secret" on one
    line; blank lines and lines starting with # are skipped. Like an ssh key,
    the file must not be readable or writable by group or others (chmod 600).
    Errors never show the secret."""
    p = os.fspath(path)
    try:
        with open(p, "rb") as f:
            mode = os.fstat(f.fileno()).st_mode
            data = f.read()
    except OSError as e:
        raise ValueError(f"kunci: credentials file: {e}") from None
    perm = stat.S_IMODE(mode)
    if perm & 0o077:
        raise ValueError(
            f"kunci: credentials file {p} may be read or written by group or others "
            f"(mode {perm:04o}): it holds a secret; chmod 600 it"
        )
    found: Credentials | None = None
    for no, raw in enumerate(data.decode("utf-8", "surrogateescape").splitlines(), 1):
        fields = raw.split()
        if not fields or fields[0].startswith("#"):
            continue
        if found is not None:
            raise ValueError(
                f'kunci: credentials file {p}, line {no}: a second credential (the file holds one "name secret" line)'
            )
        if len(fields) != 2:
            raise ValueError(f'kunci: credentials file {p}, line {no}: {len(fields)} fields, want "name secret"')
        found = Credentials(fields[0], fields[1])
        try:
            found.check()
        except ValueError as e:
            raise ValueError(f"kunci: credentials file {p}, line {no}: {e}") from None
    if found is None:
        raise ValueError(f'kunci: credentials file {p} holds no "name secret" line')
    return found


def tls_context(
    ca: Union[str, "os.PathLike[str]", None] = None,
    cert: Union[str, "os.PathLike[str]", None] = None,
    key: Union[str, "os.PathLike[str]", None] = None,
) -> ssl.SSLContext:
    """An ssl.SSLContext for the nodes' TLS addresses: verifying them against
    the CA certificates in ca (PEM; None: the system's), presenting the client
    certificate cert with its key for mutual TLS when given. TLS 1.2 or 1.3,
    with Python's default checks (3.13's strict X.509 ones included: a CA
    certificate must carry key usage, as docs/security.md's commands make)."""
    ctx = ssl.create_default_context(ssl.Purpose.SERVER_AUTH, cafile=os.fspath(ca) if ca is not None else None)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    if cert is not None:
        ctx.load_cert_chain(os.fspath(cert), os.fspath(key) if key is not None else None)
    elif key is not None:
        raise ValueError("kunci: a TLS key without its certificate")
    return ctx


def process_owner() -> str:
    """An owner naming this process, "host:pid" (the host cut to fit 64
    bytes, bytes an owner may not hold replaced by '_')."""
    host = socket.gethostname() or "unknown"
    pid = f":{os.getpid()}"
    b = host.encode("utf-8", "replace")[: wire.MAX_OWNER - len(pid)]
    return "".join(chr(c) if 0x21 <= c <= 0x7E else "_" for c in b) + pid


CredentialsArg = Union[Credentials, str, "os.PathLike[str]", None]


def make_config(
    addrs: Sequence[str],
    owner: str | None,
    credentials: CredentialsArg,
    tls: ssl.SSLContext | None,
    dial_timeout: float,
    reconnect_interval: float,
) -> Config:
    if isinstance(addrs, str):
        raise TypeError('kunci: addrs is a list of "host:port" strings, not one string')
    al = list(addrs)
    if not al:
        raise ValueError("kunci: no node address")
    for a in al:
        wire.split_addr(a)
    cfg = Config(addrs=al)
    if owner:
        cfg.owner = wire.check_owner(owner)
    if credentials is not None:
        cr = credentials if isinstance(credentials, Credentials) else load_credentials(credentials)
        n, s = cr.check()
        cfg.credentials = (n, s, cr.name)
    if tls is not None and not isinstance(tls, ssl.SSLContext):
        raise TypeError("kunci: tls must be an ssl.SSLContext (kunci.tls_context makes one)")
    cfg.tls = tls
    for v, what in ((dial_timeout, "dial_timeout"), (reconnect_interval, "reconnect_interval")):
        if not v > 0:
            raise ValueError(f"kunci: {what} must be > 0 seconds (got {v})")
    cfg.dial_timeout = dial_timeout
    cfg.reconnect_interval = reconnect_interval
    return cfg


class ClientBase:
    """The constructor Client and AsyncClient share: what the caller gave,
    checked into a Config (make_config), is handed to the client's _setup."""

    def __init__(
        self,
        addrs: Sequence[str],
        *,
        owner: str | None = None,
        credentials: CredentialsArg = None,
        tls: ssl.SSLContext | None = None,
        dial_timeout: float = 2.0,
        reconnect_interval: float = 3.0,
    ) -> None:
        self._setup(make_config(addrs, owner, credentials, tls, dial_timeout, reconnect_interval))

    def _setup(self, cfg: Config) -> None:
        raise NotImplementedError
