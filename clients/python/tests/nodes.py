"""Real kuncid processes, a TCP proxy and certificates for the tests.

The kuncid binary is $KUNCID, or built once per test run from the checkout
(go build ./cmd/kuncid). Nodes listen on 127.0.0.1 port 0 and the tests learn
the port from the node's JSON start line; a cluster's nodes must know each
other's addresses up front, so their ports are picked free first (and the
cluster started again on new ones if another process took one meanwhile).
Every wait is bounded: WAIT seconds, generous for a busy machine.
"""

from __future__ import annotations

import asyncio
import atexit
import fcntl
import functools
import json
import os
import random
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time
import unittest
from pathlib import Path
from typing import Any, Callable, Coroutine, TypeVar

WAIT = 15.0
ROOT = Path(__file__).resolve().parents[3]  # the checkout
CLUSTER_KEY = b"a test cluster key, 32 bytes lng\n"

_built: str | None = None
_build_lock = threading.Lock()


def kuncid() -> str:
    """The kuncid binary: $KUNCID, or one built from the checkout."""
    global _built
    env = os.environ.get("KUNCID")
    if env:
        return env
    with _build_lock:
        if _built is None:
            d = tempfile.mkdtemp(prefix="kunci-py-")
            atexit.register(shutil.rmtree, d, True)
            out = os.path.join(d, "kuncid")
            subprocess.run(["go", "build", "-o", out, "./cmd/kuncid"], cwd=ROOT, check=True)
            _built = out
    return _built


def until(cond: Callable[[], bool], timeout: float = WAIT, every: float = 0.01) -> bool:
    """Poll cond until it holds or timeout passes; report whether it held."""
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            return False
        time.sleep(every)
    return True


async def until_async(cond: Callable[[], Any], what: str, timeout: float = WAIT, every: float = 0.01) -> None:
    """Poll cond (a function returning a bool, or an awaitable of one) on the
    running event loop until it holds; fail the test, naming what was
    awaited, when timeout passes first."""
    deadline = time.monotonic() + timeout
    while True:
        r = cond()
        if asyncio.iscoroutine(r) or isinstance(r, asyncio.Future):
            r = await r
        if r:
            return
        if time.monotonic() > deadline:
            raise AssertionError(f"still not {what} after {timeout} s")
        await asyncio.sleep(every)


def _pick_range() -> tuple[int, int]:
    """The ports free_addrs picks from: below the kernel's ephemeral range."""
    lo, hi = 10000, 32768
    try:
        first = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return lo, hi
    if first > 1024:
        hi = first
        lo = min(lo, max(1024, hi - 20000))
    return lo, hi


_reserved: list[Any] = []  # the port files this process holds locked


def _reserve(port: int) -> bool:
    """Reserve port for the rest of this process, unless another process
    holds it: the Go tests' testaddr reservation (an flock on a file named for
    the port), so that a node stopped and started again on its address does
    not find it taken by another suite's node. Without the lock directory it
    reserves nothing and says yes."""
    d = Path(tempfile.gettempdir()) / "kunci-test-ports"
    try:
        d.mkdir(mode=0o777, exist_ok=True)
        f = open(d / str(port), "a+")
    except OSError:
        return True
    try:
        fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        f.close()
        return False
    _reserved.append(f)
    return True


def free_addrs(n: int) -> list[str]:
    """n loopback addresses nothing listens on, each held until all are picked
    and reserved for the rest of the process (_reserve).

    The ports come from below the ephemeral range, from which every outgoing
    connection takes its local port: one picked there (as binding port 0
    does) and let go is anyone's next connect() before the node binds it
    (the Go tests' testaddr.Free does the same, for the same reason).
    """
    lo, hi = _pick_range()
    socks: list[socket.socket] = []
    try:
        while len(socks) < n:
            s = socket.socket()
            for _ in range(64):
                port = random.randrange(lo, hi) if hi - lo >= 1000 else 0
                if port and not _reserve(port):
                    continue
                try:
                    s.bind(("127.0.0.1", port))
                    break
                except OSError:
                    continue
            else:
                s.bind(("127.0.0.1", 0))
            socks.append(s)
        return ["127.0.0.1:%d" % s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


class Node:
    """A kuncid process with JSON logs on stderr, read by a thread of its own
    (so the pipe never fills); lines holds them."""

    def __init__(self, args: list[str], tmp: str) -> None:
        data = tempfile.mkdtemp(dir=tmp)
        argv = [kuncid(), "--log-format", "json", "--data-dir", data, "--idle-timeout", "0"]
        if "--listen" not in args:
            argv += ["--listen", "127.0.0.1:0"]
        self.proc = subprocess.Popen(
            argv + args, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
        )
        self.lines: list[dict[str, object]] = []
        self.addr = ""
        self.tls_addr = ""
        self.admin = ""
        self.started = threading.Event()
        self.exited = threading.Event()
        threading.Thread(target=self._read, daemon=True).start()
        if not until(lambda: self.started.is_set() or self.exited.is_set(), WAIT):
            self.kill()
            raise RuntimeError("kuncid did not log its start in time")
        if not self.started.is_set():
            raise RuntimeError("kuncid exited before it started: " + self.log_text())

    def _read(self) -> None:
        assert self.proc.stderr is not None
        for raw in self.proc.stderr:
            try:
                line = json.loads(raw)
            except ValueError:
                line = {"message": raw.decode("utf-8", "replace").strip()}
            self.lines.append(line)
            if line.get("message") == "kunci node started":
                self.addr = str(line.get("addr", ""))
                self.tls_addr = str(line.get("tls_addr", ""))
                self.admin = str(line.get("admin", ""))
                self.started.set()
        self.exited.set()

    def log_text(self) -> str:
        return "\n".join(str(x.get("message")) for x in self.lines[-20:])

    def signal(self, sig: int) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        try:
            self.proc.wait(WAIT)
        except subprocess.TimeoutExpired:
            pass
        if self.proc.stderr is not None:
            self.proc.stderr.close()

    def wait(self, timeout: float = WAIT) -> int:
        return self.proc.wait(timeout)


def info(addr: str) -> str:
    """The node's answer to I, without its LF ("" when none)."""
    try:
        with socket.create_connection(_split(addr), timeout=1) as s:
            s.sendall(b"I\n")
            return _readline(s).decode()
    except OSError:
        return ""


def roundtrip(addr: str, line: bytes) -> bytes:
    with socket.create_connection(_split(addr), timeout=5) as s:
        s.sendall(line)
        return _readline(s)


def _readline(s: socket.socket) -> bytes:
    buf = b""
    while not buf.endswith(b"\n"):
        b = s.recv(512)
        if not b:
            break
        buf += b
    return buf.rstrip(b"\n")


def _split(addr: str) -> tuple[str, int]:
    h, _, p = addr.rpartition(":")
    return h, int(p)


def _shut(s: socket.socket) -> None:
    """Shut s down both ways, as a connection breaks (nothing when it is
    not connected any more)."""
    try:
        s.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass


def _close(s: socket.socket) -> None:
    """Shut s down, then close it: close() alone leaves a thread blocked in
    accept() accepting on (Linux), and shutdown() wakes it."""
    _shut(s)
    s.close()


class NodeCase(unittest.TestCase):
    """A TestCase that starts nodes and kills every one in tearDown."""

    def setUp(self) -> None:
        self.tmp = tempfile.mkdtemp(prefix="kunci-py-test-")
        self.nodes: list[Node] = []
        self.cleanups_first: list[Callable[[], None]] = []

    def tearDown(self) -> None:
        for f in reversed(self.cleanups_first):
            try:
                f()
            except Exception:
                pass
        for n in self.nodes:
            n.kill()
        shutil.rmtree(self.tmp, ignore_errors=True)

    def node(self, *args: str) -> Node:
        n = Node(list(args), self.tmp)
        self.nodes.append(n)
        return n

    def run_async(self, coro: Coroutine[Any, Any, None]) -> None:
        """Run coro in an event loop of its own (asyncio.run); a test still
        running after 60 s fails."""
        asyncio.run(asyncio.wait_for(coro, 60))

    def raw_hold(self, addr: str, key: bytes) -> tuple[socket.socket, bytes]:
        """A raw protocol connection to addr holding key, granted at once
        (closed when the test ends), and its grant line."""
        raw = socket.create_connection(_split(addr), timeout=5)
        self.cleanups_first.append(raw.close)
        raw.sendall(b"A " + key + b" 30 5\n")
        held = _readline(raw)
        self.assertTrue(held.startswith(b"A " + key + b" "), held)
        return raw, held

    def file(self, name: str, data: bytes, mode: int = 0o600) -> str:
        p = os.path.join(self.tmp, name)
        fd = os.open(p, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.chmod(p, mode)
        return p

    def cluster(self, n: int, *extra: str) -> tuple[list[Node], list[str]]:
        """n nodes of a cluster, node 0 active and the others its standbys;
        extra: more flags for every node (--semi-sync, say)."""
        key = self.file("cluster.key", CLUSTER_KEY)
        for _ in range(3):
            addrs = free_addrs(n)
            nodes: list[Node] = []
            try:
                for i in range(n):
                    nodes.append(self.node(
                        "--listen", addrs[i], "--advertise", addrs[i], "--peers", ",".join(addrs),
                        "--cluster-key-file", key, "--heartbeat", "50ms", "--failover-timeout", "500ms",
                        "--admin", free_addrs(1)[0], *extra,
                    ))
            except RuntimeError:
                for x in nodes:
                    x.kill()
                continue  # a port was taken meanwhile: other ports
            want = ["I active %s %s" % (addrs[0], addrs[0])] + [
                "I standby %s %s" % (a, addrs[0]) for a in addrs[1:]
            ]
            ok = until(lambda: [info(a) for a in addrs] == want, WAIT)
            self.assertTrue(ok, "cluster never settled: %s" % [info(a) for a in addrs])
            return nodes, addrs
        raise RuntimeError("could not start a cluster on free ports")

    def certs(self) -> dict[str, str]:
        """A CA, a node certificate (localhost, 127.0.0.1) and a client one,
        made with the openssl commands of docs/security.md; and a second CA
        that signed nothing here."""
        d = os.path.join(self.tmp, "certs")
        os.mkdir(d)
        ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes"]

        def run(*a: str) -> None:
            subprocess.run(["openssl", *a], cwd=d, check=True, capture_output=True)

        run("req", "-x509", *ec, "-days", "3650", "-subj", "/CN=kunci-ca",
            "-addext", "keyUsage=critical,keyCertSign,cRLSign", "-keyout", "ca.key", "-out", "ca.crt")
        run("req", "-x509", "-CA", "ca.crt", "-CAkey", "ca.key", *ec, "-days", "825", "-subj", "/CN=node1",
            "-addext", "subjectAltName=DNS:localhost,IP:127.0.0.1", "-addext", "basicConstraints=critical,CA:FALSE",
            "-addext", "extendedKeyUsage=serverAuth,clientAuth", "-keyout", "node1.key", "-out", "node1.crt")
        run("req", "-x509", "-CA", "ca.crt", "-CAkey", "ca.key", *ec, "-days", "825", "-subj", "/CN=app",
            "-addext", "basicConstraints=critical,CA:FALSE", "-addext", "extendedKeyUsage=clientAuth",
            "-keyout", "app.key", "-out", "app.crt")
        run("req", "-x509", *ec, "-days", "3650", "-subj", "/CN=other-ca", "-keyout", "other.key", "-out", "other.crt")
        for f in os.listdir(d):
            os.chmod(os.path.join(d, f), 0o600)
        return {n: os.path.join(d, n) for n in ("ca.crt", "node1.crt", "node1.key", "app.crt", "app.key", "other.crt")}


C = TypeVar("C", bound=NodeCase)


def in_loop(test: Callable[[C], Coroutine[Any, Any, None]]) -> Callable[[C], None]:
    """A coroutine test method made one unittest runs: its coroutine runs in
    an event loop of its own (NodeCase.run_async)."""

    @functools.wraps(test)
    def run(self: C) -> None:
        self.run_async(test(self))

    return run


class Proxy:
    """A TCP proxy on 127.0.0.1 to a node, which the test can cut: cut()
    closes every connection through it and refuses new ones for a moment.
    received counts the bytes clients sent through it, and lines() returns
    them as lines. lose_answer() makes it lose an answer as a broken
    connection does: the node wrote it, the client never reads it."""

    def __init__(self, target: str) -> None:
        self.target = _split(target)
        self.lock = threading.Lock()
        self.socks: list[socket.socket] = []
        self.received = 0
        self.up = bytearray()
        self.closed = False
        self.lose: tuple[bytes, float | None] | None = None
        self.lost = threading.Event()
        self.lost_line = b""
        self.ls = self._listen(0)
        self.addr = "127.0.0.1:%d" % self.ls.getsockname()[1]
        threading.Thread(target=self._accept, args=(self.ls,), daemon=True).start()

    def _listen(self, port: int) -> socket.socket:
        ls = socket.socket()
        ls.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        ls.bind(("127.0.0.1", port))
        ls.listen(64)
        return ls

    def _accept(self, ls: socket.socket) -> None:
        while True:
            try:
                c, _ = ls.accept()
            except OSError:
                return
            try:
                u = socket.create_connection(self.target, timeout=5)
            except OSError:
                c.close()
                continue
            with self.lock:
                self.socks += [c, u]
            threading.Thread(target=self._pipe, args=(c, u, True), daemon=True).start()
            threading.Thread(target=self._pipe, args=(u, c, False), daemon=True).start()

    def _pipe(self, src: socket.socket, dst: socket.socket, up: bool) -> None:
        pending = b""  # an answer line not yet whole, while an answer is to be lost
        try:
            while True:
                b = src.recv(65536)
                if not b:
                    break
                if up:
                    with self.lock:
                        self.received += len(b)
                        self.up += b
                    dst.sendall(b)
                    continue
                with self.lock:
                    lose = self.lose
                if lose is None and not pending:
                    dst.sendall(b)
                    continue
                pending += b
                whole, sep, pending = pending.rpartition(b"\n")
                if not sep:
                    whole, pending = b"", whole
                out = []
                for line in (whole + sep).splitlines(keepends=True):
                    if lose is not None and line.startswith(lose[0]):
                        with self.lock:
                            self.lose = None
                            self.lost_line = line.rstrip(b"\r\n")
                        dst.sendall(b"".join(out))
                        self._break(src, dst, lose[1])
                        return
                    out.append(line)
                dst.sendall(b"".join(out))
        except OSError:
            pass
        _shut(src)
        _shut(dst)

    def lose_answer(self, prefix: bytes, refuse_for: float | None = None) -> None:
        """Lose the next answer line that starts with prefix: the connection
        that carries it is closed before it reaches the client; with
        refuse_for, every connection is cut, and new ones refused for that
        long (cut). lost is set once it happened, lost_line is the line."""
        with self.lock:
            self.lose = (prefix, refuse_for)

    def _break(self, src: socket.socket, dst: socket.socket, refuse_for: float | None) -> None:
        # lost is set before the connection breaks: the client, which goes
        # on as soon as it sees the break, must find it set (it raced the
        # shutdown under load).
        self.lost.set()
        if refuse_for is None:
            _shut(src)
            _shut(dst)
            return
        threading.Thread(target=self.cut, args=(refuse_for,), daemon=True).start()

    def lines(self) -> list[bytes]:
        """The whole lines clients sent through the proxy, without their LF."""
        with self.lock:
            data = bytes(self.up)
        return data.split(b"\n")[:-1]

    def cut(self, refuse_for: float = 0.3) -> None:
        """Close every connection through the proxy, and refuse new ones for
        refuse_for seconds."""
        port = self.ls.getsockname()[1]
        _close(self.ls)
        with self.lock:
            socks, self.socks = self.socks, []
        for s in socks:
            _close(s)
        if refuse_for > 0:
            time.sleep(refuse_for)
        for _ in range(100):
            try:
                self.ls = self._listen(port)
                break
            except OSError:
                time.sleep(0.05)
        threading.Thread(target=self._accept, args=(self.ls,), daemon=True).start()

    def close(self) -> None:
        _close(self.ls)
        with self.lock:
            socks, self.socks = self.socks, []
        for s in socks:
            s.close()


class OldNode:
    """A fake kunci node from before sessions, on 127.0.0.1, serving each
    connection in a thread of its own (as the Go tests' fake nodes do). It
    answers S and an acquire's seen= as such a node does ("unknown op", "too
    many fields"), grants a free key at once (T when held: it queues
    nothing), releases by token, and answers I with info_line (its own
    address as the active's by default). lines holds the lines it read, a
    list per connection. lose: the key whose next acquire is never
    answered: every connection is closed instead (as a restart would),
    nothing granted, so that the client sends it again on a connection it
    has just made. What a closed connection still had on its way is not
    served: a restarted node never reads it."""

    def __init__(self) -> None:
        self.ls = socket.socket()
        self.ls.bind(("127.0.0.1", 0))
        self.ls.listen(16)
        self.addr = "127.0.0.1:%d" % self.ls.getsockname()[1]
        self.mu = threading.Lock()
        self.lines: list[list[bytes]] = []
        self.held: dict[bytes, int] = {}
        self.token = 0
        self.lose: bytes | None = None
        self.info_line = b"I active %s %s" % (self.addr.encode(), self.addr.encode())
        self.socks: list[socket.socket] = []
        self.shut: set[socket.socket] = set()
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                c, _ = self.ls.accept()
            except OSError:
                return
            with self.mu:
                self.socks.append(c)
                lines: list[bytes] = []
                self.lines.append(lines)
            threading.Thread(target=self._serve, args=(c, lines), daemon=True).start()

    def _serve(self, c: socket.socket, lines: list[bytes]) -> None:
        try:
            for raw in c.makefile("rb"):
                line = raw.rstrip(b"\r\n")
                with self.mu:
                    lines.append(line)
                    answer = None if c in self.shut else self._answer(line)
                if answer is None:
                    break
                c.sendall(answer + b"\n")
        except OSError:
            pass
        c.close()

    def _answer(self, line: bytes) -> bytes | None:
        """The answer to line (None: close the connection). self.mu is held."""
        f = line.split(b" ")
        op = f[0]
        if op == b"I":
            return self.info_line
        key = f[1] if len(f) > 1 else b"-"
        if op == b"A":
            if any(not x.startswith((b"owner=", b"limit=", b"mode=")) for x in f[4:]):
                return b"E A %s too many fields" % key
            if key == self.lose:
                self.lose = None
                for s in self.socks:
                    _shut(s)
                self.shut.update(self.socks)
                return None
            if key in self.held:
                return b"T " + key
            self.token += 1
            self.held[key] = self.token
            return b"A %s %d" % (key, self.token)
        if op == b"R":
            if self.held.get(key) == int(f[2]):
                del self.held[key]
                return b"R %s OK" % key
            return b"R %s STALE" % key
        if op == b"Q":
            t = self.held.get(key)
            return b"Q %s FREE" % key if t is None else b"Q %s %d 30 0" % (key, t)
        return b"E %s %s unknown op" % (op, key)

    def read(self) -> list[bytes]:
        """Every line read, over all connections."""
        with self.mu:
            return [x for lines in self.lines for x in lines]

    def close(self) -> None:
        _close(self.ls)
        with self.mu:
            socks, self.socks = self.socks, []
        for s in socks:
            _close(s)
