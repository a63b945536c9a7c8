"""kunci: the official Python client of the kunci lock server.

Client (threads) and AsyncClient (asyncio) keep persistent, pipelined
connections to the nodes, follow redirects and failovers, and retry releases:
the behaviour of the Go client, clientlib. See README.md.
"""

from ._async import AsyncClient, AsyncLock, Locks
from ._config import Credentials, load_credentials, process_owner, tls_context
from ._sync import Client, Lock
from ._wire import Holder, Node
from .errors import AuthError, Closed, KunciError, Lost, NoActive, Refused, Stale, Timeout, Unavailable

__version__ = "0.10.0"

__all__ = [
    "AsyncClient",
    "AsyncLock",
    "AuthError",
    "Client",
    "Closed",
    "Credentials",
    "Holder",
    "KunciError",
    "Lock",
    "Locks",
    "Lost",
    "NoActive",
    "Node",
    "Refused",
    "Stale",
    "Timeout",
    "Unavailable",
    "load_credentials",
    "process_owner",
    "tls_context",
]
