"""kunci: the official Python client of the kunci lock server.

Client (threads) and AsyncClient (asyncio) keep persistent, pipelined
connections to the nodes, follow redirects and failovers, and retry releases:
the behaviour of the Go client, clientlib. See README.md.
"""

from ._async import AsyncClient, AsyncLock, Locks
from ._config import Credentials, load_credentials, process_owner, tls_context
from ._sync import Client, Lock
from ._wire import Holder, Node
from .errors import (
    AuthError, ClosedError, KunciError, LostError, NoActiveError, RefusedError, StaleError, TimeoutError,
    UnavailableError,
)
# The names before 0.11, the same classes: they go in 0.12.
from .errors import Closed, Lost, NoActive, Refused, Stale, Timeout, Unavailable  # noqa: F401

__version__ = "0.10.0"

__all__ = [
    "AsyncClient",
    "AsyncLock",
    "AuthError",
    "Client",
    "ClosedError",
    "Credentials",
    "Holder",
    "KunciError",
    "Lock",
    "Locks",
    "LostError",
    "NoActiveError",
    "Node",
    "RefusedError",
    "StaleError",
    "TimeoutError",
    "UnavailableError",
    "load_credentials",
    "process_owner",
    "tls_context",
]
