"""One network connection of a _Conn: reading answers off it and writing
requests onto it (clientlib's conn.go link, flush.go).

Two kinds. _Link rides an asyncio transport: the loop reads and writes it
(AsyncClient; the thread client over TLS). _SockLink is a plain socket that
the thread client's callers use themselves: a caller writes its request at
once, and whoever waits for an answer reads, handing the others theirs
(Link.wait_for); the event loop reads only while no caller does, for the
loop's own requests and to notice the node closing the connection. A caller
that is alone so never crosses to another thread.

The loop and the caller threads of a thread client share everything here
under the client's mutex, Core.mu, which the loop thread holds at all times
but while it sleeps in its selector (ArmedSelector).
"""

from __future__ import annotations

import asyncio
import collections
import math
import select
import selectors
import socket
from typing import TYPE_CHECKING, Any, Deque, Mapping

from . import _wire as wire
from ._call import CoreLock, Waiter

if TYPE_CHECKING:
    from ._conn import _Conn

RECV_SIZE = 65536


class _NoActive(Exception):
    """The node redirected with "M -": it knows no active node."""


class ArmedSelector(selectors.BaseSelector):
    """The thread client's event loop selector: epoll, which a caller thread
    can tell to stop watching a socket for reading (disarm) and to watch it
    again (arm) while the loop sleeps in it, without waking it: the kernel's
    epoll takes such changes from any thread. select() releases mu, the
    client's mutex, while it sleeps: the loop thread holds it otherwise."""

    def __init__(self, mu: CoreLock) -> None:
        self._mu = mu
        self._ep = select.epoll()
        self._keys: dict[int, selectors.SelectorKey] = {}
        self._disarmed: set[int] = set()

    @staticmethod
    def available() -> bool:
        return hasattr(select, "epoll")

    def _mask(self, fd: int, events: int) -> int:
        m = 0
        if events & selectors.EVENT_READ and fd not in self._disarmed:
            m |= select.EPOLLIN
        if events & selectors.EVENT_WRITE:
            m |= select.EPOLLOUT
        return m

    def register(self, fileobj: Any, events: int, data: Any = None) -> selectors.SelectorKey:
        fd = fileobj if isinstance(fileobj, int) else fileobj.fileno()
        if fd in self._keys:
            raise KeyError(f"{fileobj!r} (fd {fd}) is already registered")
        key = selectors.SelectorKey(fileobj, fd, events, data)
        self._ep.register(fd, self._mask(fd, events))
        self._keys[fd] = key
        return key

    def unregister(self, fileobj: Any) -> selectors.SelectorKey:
        fd = fileobj if isinstance(fileobj, int) else fileobj.fileno()
        key = self._keys.pop(fd)
        self._disarmed.discard(fd)
        try:
            self._ep.unregister(fd)
        except OSError:
            pass  # closed since
        return key

    def modify(self, fileobj: Any, events: int, data: Any = None) -> selectors.SelectorKey:
        fd = fileobj if isinstance(fileobj, int) else fileobj.fileno()
        old = self._keys[fd]
        key = selectors.SelectorKey(old.fileobj, fd, events, data)
        if events != old.events:
            self._ep.modify(fd, self._mask(fd, events))
        self._keys[fd] = key
        return key

    def disarm(self, fd: int) -> None:
        """Stop watching fd for reading (mu held)."""
        if fd in self._disarmed:
            return
        self._disarmed.add(fd)
        key = self._keys.get(fd)
        if key is not None:
            self._ep.modify(fd, self._mask(fd, key.events))

    def arm(self, fd: int) -> None:
        """Watch fd for reading again (mu held)."""
        if fd not in self._disarmed:
            return
        self._disarmed.discard(fd)
        key = self._keys.get(fd)
        if key is not None:
            self._ep.modify(fd, self._mask(fd, key.events))

    def select(self, timeout: float | None = None) -> list[tuple[selectors.SelectorKey, int]]:
        t = -1.0 if timeout is None else (0.0 if timeout <= 0 else math.ceil(timeout * 1e3) / 1e3)
        self._mu.release()
        try:
            try:
                got = self._ep.poll(t, max(len(self._keys), 1))
            except InterruptedError:
                got = []
        finally:
            self._mu.acquire()
        ready = []
        for fd, ev in got:
            key = self._keys.get(fd)
            if key is None:
                continue
            events = 0
            if ev & (select.EPOLLIN | select.EPOLLHUP | select.EPOLLERR) and fd not in self._disarmed:
                events |= selectors.EVENT_READ
            if ev & (select.EPOLLOUT | select.EPOLLHUP | select.EPOLLERR):
                events |= selectors.EVENT_WRITE
            events &= key.events
            if events:
                ready.append((key, events))
        return ready

    def close(self) -> None:
        self._ep.close()
        self._keys.clear()

    def get_map(self) -> Mapping[Any, selectors.SelectorKey]:
        return self._keys


class UnlockingSelector(selectors.DefaultSelector):
    """The thread client's selector where epoll is not to be had: select()
    releases mu while it sleeps, but a caller cannot stop it watching a
    socket, so the loop reads every connection (_Link), and callers wait."""

    def __init__(self, mu: CoreLock) -> None:
        super().__init__()
        self._mu = mu

    def select(self, timeout: float | None = None) -> list[tuple[selectors.SelectorKey, int]]:
        self._mu.release()
        try:
            return super().select(timeout)
        finally:
            self._mu.acquire()


class _LinkBase:
    """What both kinds of link share: answers read before the link is
    attached go to early (the keeper reads them: authentication, seek),
    after, to the connection's dispatch; closed gets (redirect, served,
    error) when it ends."""

    def __init__(self, conn: _Conn, loop: asyncio.AbstractEventLoop) -> None:
        self.conn = conn
        self.loop = loop
        self.buf = b""
        self.attached = False
        self.served = False
        self.ended = False
        self.early: Deque[wire.Answer] = collections.deque()
        self.early_waiter: asyncio.Future[None] | None = None
        self.closed: asyncio.Future[tuple[str | None, bool, BaseException | None]] = loop.create_future()
        self.last_read = loop.time()
        self.probe_sent = 0.0
        self.probe_timer: asyncio.TimerHandle | None = None

    def write(self, data: bytes) -> None:
        raise NotImplementedError

    def feed(self, data: bytes) -> None:
        """Read the answers in data (and what was left of the last)."""
        if self.ended:
            return
        self.last_read = self.loop.time()
        buf = self.buf + data if self.buf else data
        start = 0
        conn = self.conn
        while True:
            end = buf.find(b"\n", start)
            if end < 0:
                break
            line = buf[start:end]
            start = end + 1
            if line.endswith(b"\r"):
                line = line[:-1]
            if len(line) >= wire.MAX_LINE:
                self.fail(wire.BadAnswer("answer line too long"))
                return
            try:
                a = wire.parse_answer(line)
            except wire.BadAnswer as e:
                self.fail(e)
                return
            if not self.attached:
                self.early.append(a)
                w = self.early_waiter
                if w is not None and not w.done():
                    w.set_result(None)
                continue
            if a.kind == "M":
                self.end(a.addr or None, None if a.addr else _NoActive("the node knows no active node"))
                return
            if conn.dispatch(a, self):
                self.served = True
            if self.ended:
                return
        self.buf = buf[start:]
        if len(self.buf) >= wire.MAX_LINE:
            self.fail(wire.BadAnswer("answer line too long"))

    def fail(self, err: BaseException) -> None:
        self.end(None, err)

    def end(self, redirect: str | None, err: BaseException | None) -> None:
        if self.ended:
            return
        self.ended = True
        self.closed.set_result((redirect, self.served, err))
        if self.probe_timer is not None:
            self.probe_timer.cancel()
        w = self.early_waiter
        if w is not None and not w.done():
            w.set_result(None)
        self.close()
        self.conn.detach(self, redirect, err)
        self.conn.core.poke()

    def close(self) -> None:
        raise NotImplementedError

    async def read_answer(self, timeout: float) -> wire.Answer:
        """The next answer before the link is attached (authentication, seek)."""
        deadline = self.loop.time() + timeout
        while not self.early:
            if self.closed.done():
                _, _, err = self.closed.result()
                raise ConnectionError(f"connection closed: {err}")
            left = deadline - self.loop.time()
            if left <= 0:
                raise TimeoutError("no answer in time")
            self.early_waiter = self.loop.create_future()
            try:
                await asyncio.wait_for(asyncio.shield(self.early_waiter), left)
            except asyncio.TimeoutError:
                raise TimeoutError("no answer in time") from None
        return self.early.popleft()

    def probe_tick(self) -> None:
        """Send I on a connection that read nothing for probe_interval; close
        it when nothing comes back within probe_timeout (half-open)."""
        self.probe_timer = None
        if self.ended:
            return
        cfg = self.conn.core.cfg
        now = self.loop.time()
        if self.probe_sent and self.last_read < self.probe_sent:
            if now - self.probe_sent >= cfg.probe_timeout:
                self.fail(TimeoutError("the node stopped answering"))
                return
            delay = self.probe_sent + cfg.probe_timeout - now
        elif now - self.last_read >= cfg.probe_interval:
            self.probe_sent = now
            self.conn.probe()
            delay = cfg.probe_timeout
        else:
            self.probe_sent = 0.0
            delay = self.last_read + cfg.probe_interval - now
        self.probe_timer = self.loop.call_later(max(delay, 0.01), self.probe_tick)

    # What a caller thread of the thread client does with a link (_SockLink
    # does it itself; on a _Link the loop reads and writes).

    def write_from_thread(self) -> None:
        """Have the connection's buffered requests written (mu held)."""
        conn = self.conn
        if not conn.flush_pending:
            conn.flush_pending = True
            self.loop.call_soon(conn.flush)
            conn.core.poke()

    def claim(self, w: Waiter) -> bool:
        """w's thread is about to send a request and wait for its answer
        (mu held): on a _SockLink it reads and writes the link itself when it
        is alone there, and takes the reading over now, before its answer
        can reach the loop. Report whether it did."""
        return False

    def unclaim(self, w: Waiter) -> None:
        """w's thread left without waiting (mu held): hand back the reading
        it claimed."""

    def wait_for(self, w: Waiter, mu: CoreLock) -> None:
        """Wait until w's call is answered, or the link ended (mu held)."""
        while w.result is None and not self.ended:
            w.block()


class _Link(_LinkBase, asyncio.Protocol):
    """A link on an asyncio transport: the loop reads and writes it."""

    def __init__(self, conn: _Conn, loop: asyncio.AbstractEventLoop) -> None:
        super().__init__(conn, loop)
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport

    def write(self, data: bytes) -> None:
        if self.transport is not None and not self.ended:
            self.transport.write(data)

    def data_received(self, data: bytes) -> None:
        self.feed(data)

    def connection_lost(self, exc: Exception | None) -> None:
        self.end(None, exc or ConnectionResetError("connection closed by the node"))

    def close(self) -> None:
        if self.transport is not None:
            self.transport.close()

    def socket(self) -> socket.socket | None:
        """The connection's socket (tests cut it)."""
        if self.transport is None:
            return None
        s: socket.socket | None = self.transport.get_extra_info("socket")
        return s


class _SockLink(_LinkBase):
    """A link on a plain non-blocking socket, shared by the loop and the
    thread client's callers under Core.mu.

    A caller alone on the link (no other request outstanding there, nobody
    reading it) claims it: it writes its request itself and reads until its
    answer comes, handing out the answers to others' requests sent
    meanwhile; while it reads, the loop's selector does not watch the socket
    (ArmedSelector). Callers that are not alone buffer their requests for
    the loop to write, in one write for all that came meanwhile, and are
    woken by whoever reads: that caller, or the loop, which reads whenever
    no caller does (reader None). Many callers so share a connection's
    writes and reads as they did through the loop alone; one caller never
    waits for another thread."""

    def __init__(self, conn: _Conn, loop: asyncio.AbstractEventLoop, sock: socket.socket,
                 sel: ArmedSelector) -> None:
        super().__init__(conn, loop)
        self.sock = sock
        self.fd = sock.fileno()
        self.sel = sel
        self.poller = select.poll()
        self.poller.register(self.fd, select.POLLIN)
        # reader: the caller's Waiter that reads the link now, "loop" while
        # the loop's callback reads it, or None (the loop's selector
        # watches it). writing: a caller sends outside mu; what others
        # write meanwhile waits in wbuf. wout: what the socket did not take,
        # which the loop writes once it can.
        self.reader: Waiter | str | None = None
        self.writing = False
        self.wbuf: list[bytes] = []
        self.wout = bytearray()
        self._send_err: OSError | None = None
        self.sock_closed = False
        loop.add_reader(self.fd, self.on_readable)

    def socket(self) -> socket.socket | None:
        return None if self.sock_closed else self.sock

    # -- reading --

    def on_readable(self) -> None:
        """The loop's turn to read: nobody else does (else it is disarmed,
        but for an event the selector returned before)."""
        if self.reader is not None or self.ended:
            return
        self.reader = "loop"
        try:
            self._recv()
        finally:
            self.reader = None
            if self.ended:
                self._close_sock()

    def _recv(self) -> None:
        try:
            data = self.sock.recv(RECV_SIZE)
        except (BlockingIOError, InterruptedError):
            return
        except OSError as e:
            self.end(None, e)
            return
        if not data:
            self.end(None, ConnectionResetError("connection closed by the node"))
            return
        self.feed(data)

    def claim(self, w: Waiter) -> bool:
        conn = self.conn
        if self.reader is not None or self.ended or self.writing or self.wout or conn.wbuf:
            return False
        if conn.acq or conn.sent or conn.lists or conn.infos:
            return False  # others' requests are out: the loop reads for them
        self.reader = w
        self.sel.disarm(self.fd)
        return True

    def unclaim(self, w: Waiter) -> None:
        if self.reader is w:
            self._stop_reading()

    def _stop_reading(self) -> None:
        self.reader = None
        if self.ended:
            self._close_sock()
        else:
            self.sel.arm(self.fd)

    def wait_for(self, w: Waiter, mu: CoreLock) -> None:
        """Wait until w's call is answered, or the link ended (mu held):
        reading the link for everyone if w claimed it, else waiting to be
        answered."""
        if self.reader is not w:
            super().wait_for(w, mu)
            return
        # An exception other than the socket's (a signal's, in the main
        # thread) that comes while the thread sleeps in poll leaves nothing
        # half done: the loop reads on. One that comes between reading bytes
        # and handing out their answers may have lost some: the link ends
        # then, and every call still outstanding on it fails over, as when a
        # connection breaks.
        handing = False
        try:
            while w.result is None and not self.ended:
                mu.release()
                try:
                    self.poller.poll()
                finally:
                    mu.relock()
                if self.ended:
                    break
                handing = True
                self._recv()
                handing = False
        except BaseException as e:
            if handing:
                self.end(None, ConnectionAbortedError(f"kunci: reading interrupted: {e!r}"))
            raise
        finally:
            self._stop_reading()

    # -- writing --

    def write(self, data: bytes) -> None:
        """Send data after what is buffered (mu held), from the loop or a
        caller thread: at once when nobody else is writing."""
        if self.ended:
            return
        if self.writing:
            self.wbuf.append(data)
            return
        if self.wout:
            self.wout += data
            return
        self._send(data)

    def write_from_thread(self) -> None:
        """Write the connection's buffered requests (mu held): at once, mu
        released while sending, for a caller that claimed the link (and
        what others buffer meanwhile); else by the loop (_LinkBase's)."""
        conn = self.conn
        if not isinstance(self.reader, Waiter):
            super().write_from_thread()
            return
        if not conn.wbuf or self.writing:
            return  # the writer sends them
        data = b"".join(conn.wbuf) if len(conn.wbuf) > 1 else conn.wbuf[0]
        conn.wbuf.clear()
        conn.core.rotate(conn)
        if self.wout:
            self.wout += data
            return
        mu = conn.core.mu
        sock = self.sock
        self.writing = True
        try:
            while True:
                mu.release()
                try:
                    n = sock.send(data)
                except (BlockingIOError, InterruptedError):
                    n = 0
                except OSError as e:
                    self._send_err = e
                    n = -1
                finally:
                    mu.relock()
                if n < 0:
                    self.end(None, self._send_err or ConnectionError("send failed"))
                    return
                if self.ended:
                    return
                if n < len(data):
                    self._write_later(data[n:])
                    return
                # What was buffered meanwhile: the loop's (flushed from the
                # connection's buffer while this writer sent, so older) first,
                # then other callers'.
                more = self.wbuf + conn.wbuf
                self.wbuf.clear()
                conn.wbuf.clear()
                if not more:
                    return
                data = b"".join(more)
        finally:
            self.writing = False
            if self.wbuf and not self.ended:
                rest = b"".join(self.wbuf)
                self.wbuf.clear()
                self._write_later(rest)

    def _try_send(self, data: bytes) -> int:
        """Send what the socket takes of data now; -1 when it failed (the
        caller ends the link)."""
        try:
            return self.sock.send(data)
        except (BlockingIOError, InterruptedError):
            return 0
        except OSError as e:
            self._send_err = e
            return -1

    def _send(self, data: bytes) -> None:
        n = self._try_send(data)
        if n < 0:
            self.end(None, self._send_err or ConnectionError("send failed"))
        elif n < len(data):
            self._write_later(data[n:])

    def _write_later(self, rest: bytes) -> None:
        """What the socket did not take now, the loop writes once it can."""
        if not self.wout:
            self.loop.call_soon_threadsafe(self._want_write)
        self.wout += rest

    def _want_write(self) -> None:
        if not self.ended and self.wout:
            self.loop.add_writer(self.fd, self._on_writable)

    def _on_writable(self) -> None:
        if self.ended or not self.wout:
            self.loop.remove_writer(self.fd)
            return
        try:
            n = self.sock.send(self.wout)
        except (BlockingIOError, InterruptedError):
            return
        except OSError as e:
            self.end(None, e)
            return
        del self.wout[:n]
        if not self.wout:
            self.loop.remove_writer(self.fd)

    # -- the end --

    def close(self) -> None:
        """Stop the loop watching the socket and wake a caller reading it;
        the socket closes once nobody reads it."""
        if not self.loop.is_closed():
            self.loop.remove_reader(self.fd)
            self.loop.remove_writer(self.fd)
        self.sel.arm(self.fd)  # forget it was disarmed: the fd may be reused
        try:
            self.sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass  # not connected any more: nothing to wake
        if self.reader is None:
            self._close_sock()

    def _close_sock(self) -> None:
        if not self.sock_closed:
            self.sock_closed = True
            self.sock.close()
