"""The connection behaviour the scenarios do not spell out, against real
kuncid processes: two connections for one address, an acquire that goes on
on the other connection with the wait it has left, pipelined requests from
many tasks on one client."""

from __future__ import annotations

import asyncio
import select
import signal
import threading
import time
import urllib.request
from typing import Any

import kunci
from tests.nodes import (
    WAIT, NodeCase, OldNode, Proxy, _readline as readline, free_addrs, info, roundtrip, until,
)


def connections(admin: str) -> int:
    with urllib.request.urlopen("http://%s/metrics" % admin, timeout=5) as r:
        for line in r.read().decode().splitlines():
            if line.startswith("kunci_connections "):
                return int(float(line.split()[1]))
    return -1


class Connections(NodeCase):
    def holder_and_waiter(self) -> tuple[Proxy, kunci.Client, kunci.Client]:
        """A node; a client of it (the holder); and one reaching it through
        a Proxy to cut (the waiter, reconnecting every 0.2 s). All closed
        when the test ends."""
        n = self.node()
        p = Proxy(n.addr)
        self.cleanups_first.append(p.close)
        holder = kunci.Client([n.addr])
        self.cleanups_first.append(holder.close)
        waiter = kunci.Client([p.addr], reconnect_interval=0.2)
        self.cleanups_first.append(waiter.close)
        return p, holder, waiter

    def test_two_connections_for_one_address(self) -> None:
        admin = free_addrs(1)[0]
        n = self.node("--admin", admin)
        with kunci.Client([n.addr]):
            self.assertTrue(until(lambda: connections(admin) == 2), "connections: %d" % connections(admin))
        self.assertTrue(until(lambda: connections(admin) == 0))
        with kunci.Client([n.addr, n.addr, n.addr]):
            self.assertTrue(until(lambda: connections(admin) == 3))

    def test_queued_acquire_goes_on_after_a_cut(self) -> None:
        """An acquire queued behind a holder when its connection is cut is
        sent again (on a connection that comes back) with the wait it has
        left, and granted when the holder releases."""
        p, holder, waiter = self.holder_and_waiter()
        held = holder.acquire("k", lease=30, wait=5)
        got: list[object] = []

        def ask() -> None:
            try:
                got.append(waiter.acquire("k", lease=30, wait=8))
            except Exception as e:  # noqa: BLE001
                got.append(e)

        t = threading.Thread(target=ask, daemon=True)
        start = time.monotonic()
        t.start()
        self.assertTrue(until(lambda: holder.inspect("k").waiters == 1))
        p.cut(refuse_for=0.3)
        # The node withdraws the queued acquire with its connection; the
        # client sends it again once a connection is back.
        self.assertTrue(until(lambda: holder.inspect("k").waiters == 0, every=0.002), "never withdrawn")
        self.assertTrue(until(lambda: holder.inspect("k").waiters == 1), "the acquire was not sent again")
        held.release()
        t.join(10)
        self.assertEqual(len(got), 1)
        lock = got[0]
        self.assertIsInstance(lock, kunci.Lock, lock)
        assert isinstance(lock, kunci.Lock)
        self.assertGreater(lock.token, held.token)
        self.assertLess(time.monotonic() - start, 8 + 1)
        lock.release()

    def test_wait_left_bounds_the_acquire_across_a_cut(self) -> None:
        """The wait counts from the call, not from the last attempt."""
        p, holder, waiter = self.holder_and_waiter()
        holder.acquire("k", lease=30, wait=5)
        done = threading.Event()
        err: list[BaseException] = []

        def ask() -> None:
            try:
                waiter.acquire("k", lease=30, wait=2)
            except BaseException as e:  # noqa: BLE001
                err.append(e)
            done.set()

        start = time.monotonic()
        threading.Thread(target=ask, daemon=True).start()
        self.assertTrue(until(lambda: holder.inspect("k").waiters == 1))
        p.cut(refuse_for=0.3)
        self.assertTrue(done.wait(10))
        took = time.monotonic() - start
        self.assertIsInstance(err[0], (kunci.TimeoutError, kunci.UnavailableError))
        self.assertGreaterEqual(took, 2)
        self.assertLess(took, 5)

    def test_pipelined_tasks_share_the_connections(self) -> None:
        """200 tasks on one AsyncClient, keys of their own and one shared
        key: every answer reaches its own caller."""
        admin = free_addrs(1)[0]
        n = self.node("--admin", admin)

        async def main() -> None:
            async with kunci.AsyncClient([n.addr]) as c:
                async def one(i: int) -> int:
                    lock = await c.acquire("p/%d" % i, lease=30, wait=10)
                    h = await c.inspect("p/%d" % i)
                    self.assertEqual(h.token, lock.token)
                    await lock.release()
                    shared = await c.acquire("shared", lease=30, wait=30)
                    await shared.release()
                    return lock.token

                tokens = await asyncio.gather(*(one(i) for i in range(200)))
                self.assertEqual(len(set(tokens)), 200)
                self.assertEqual(len(await c.locks()), 0)
                self.assertEqual(connections(admin), 2)

        self.run_async(main())


class GaveUp(Exception):
    """What the test's signal handler raises: a user's Ctrl-C, or a
    signal-based timeout around a blocking call."""


class Interrupted(NodeCase):
    def test_acquire_interrupted_as_its_grant_came_is_released(self) -> None:
        """A thread client's acquire is interrupted by a signal (Ctrl-C, a
        signal-based timeout) just as its grant was read: the caller never
        gets the Lock, so the client must release the grant, not leave the
        key held for its whole lease."""
        n = self.node()
        raw, held = self.raw_hold(n.addr, b"k")
        c = kunci.Client([n.addr])
        self.cleanups_first.append(c.close)
        main = threading.main_thread().ident
        assert main is not None
        fired = threading.Event()

        def handler(signum: int, frame: object) -> None:
            fired.set()
            raise GaveUp()

        old = signal.signal(signal.SIGUSR1, handler)
        self.cleanups_first.append(lambda: signal.signal(signal.SIGUSR1, old))

        def release_and_interrupt() -> None:
            # In the I/O thread, held busy until the grant is in the
            # client's socket; the signal goes out in the next turn, right
            # after the grant is read.
            loop = c._loop
            socks = [cn.link.socket() for cn in c._core.conns if cn.link]
            raw.sendall(b"R k " + held.split()[2] + b"\n")
            if readline(raw) == b"R k OK":
                select.select(socks, [], [], 10)
            loop.call_at(loop.time(), signal.pthread_kill, main, signal.SIGUSR1)

        def when_queued() -> None:
            if until(lambda: roundtrip(n.addr, b"Q k\n").endswith(b" 1")):
                c._loop.call_soon_threadsafe(release_and_interrupt)

        threading.Thread(target=when_queued, daemon=True).start()
        got: list[kunci.Lock] = []
        with self.assertRaises(GaveUp):
            got.append(c.acquire("k", lease=30, wait=10))
            threading.Event().wait(10)  # where a late signal lands
        for lock in got:
            lock.release()  # the signal came after acquire returned
        self.assertTrue(fired.is_set())
        self.assertTrue(until(lambda: roundtrip(n.addr, b"Q k\n") == b"Q k FREE", 5),
                        "the grant was left held: %r" % roundtrip(n.addr, b"Q k\n"))

    def test_acquire_interrupted_in_its_turn_leaves_the_line(self) -> None:
        """A thread client's acquire interrupted by a signal while it waits
        its turn inside the client (another acquire of the key in
        progress) leaves the line: nothing is sent for it, and the key's
        next acquirer goes on as if it had never asked."""
        n = self.node()
        p = Proxy(n.addr)
        self.cleanups_first.append(p.close)
        raw, held = self.raw_hold(n.addr, b"k")
        c = kunci.Client([p.addr])
        self.cleanups_first.append(c.close)
        main = threading.main_thread().ident
        assert main is not None

        def waiting() -> int:
            ks = c._core.keys.m.get(b"k")
            return 0 if ks is None else len(ks.turns)

        def handler(signum: int, frame: object) -> None:
            raise GaveUp()

        old = signal.signal(signal.SIGUSR1, handler)
        self.cleanups_first.append(lambda: signal.signal(signal.SIGUSR1, old))
        got: list[object] = []
        first = threading.Thread(target=lambda: got.append(c.acquire("k", lease=30, wait=20)), daemon=True)
        first.start()
        self.assertTrue(until(lambda: roundtrip(n.addr, b"Q k\n").endswith(b" 1")), "the first never queued")

        def interrupt() -> None:
            if until(lambda: waiting() == 1):
                signal.pthread_kill(main, signal.SIGUSR1)

        threading.Thread(target=interrupt, daemon=True).start()
        with self.assertRaises(GaveUp):
            c.acquire("k", lease=30, wait=20)
            threading.Event().wait(10)  # where a late signal lands
        self.assertTrue(until(lambda: waiting() == 0), "the interrupted acquire stayed in the line")
        raw.sendall(b"R k " + held.split()[2] + b"\n")
        first.join(WAIT)
        self.assertEqual(len(got), 1)
        lock = got[0]
        assert isinstance(lock, kunci.Lock)
        lock.release()
        self.assertEqual(roundtrip(n.addr, b"Q k\n"), b"Q k FREE")
        self.assertEqual(len([x for x in p.lines() if x.startswith(b"A k ")]), 1, p.lines())
        self.assertIsNone(c._core.keys.m.get(b"k"))

    def test_reader_interrupted_hands_on_the_others_answers(self) -> None:
        """The main thread, alone, reads its connection itself while its
        acquire waits; another thread's acquire, made meanwhile, rides on
        the same connection. A signal interrupts the main thread's wait: the
        other thread must still get its grant, and the main thread's given-
        up acquire must leave the key free (withdrawn), not held."""
        n = self.node()
        raw_a, held_a = self.raw_hold(n.addr, b"a")
        raw_b, held_b = self.raw_hold(n.addr, b"b")
        c = kunci.Client([n.addr])
        self.cleanups_first.append(c.close)
        main = threading.main_thread().ident
        assert main is not None

        def handler(signum: int, frame: object) -> None:
            raise GaveUp()

        old = signal.signal(signal.SIGUSR1, handler)
        self.cleanups_first.append(lambda: signal.signal(signal.SIGUSR1, old))
        got: list[object] = []

        def other() -> None:
            try:
                got.append(c.acquire("b", lease=30, wait=20))
            except BaseException as e:  # noqa: BLE001 - the test's failure
                got.append(e)

        def attack() -> None:
            # The main thread queued on a, then the other thread on b.
            if not until(lambda: roundtrip(n.addr, b"Q a\n").endswith(b" 1")):
                return
            threading.Thread(target=other, daemon=True).start()
            if until(lambda: roundtrip(n.addr, b"Q b\n").endswith(b" 1")):
                signal.pthread_kill(main, signal.SIGUSR1)

        threading.Thread(target=attack, daemon=True).start()
        with self.assertRaises(GaveUp):
            c.acquire("a", lease=30, wait=20)
            threading.Event().wait(10)  # where a late signal lands
        raw_b.sendall(b"R b " + held_b.split()[2] + b"\n")
        self.assertTrue(until(lambda: bool(got)), "the other thread's acquire never ended")
        lock = got[0]
        self.assertIsInstance(lock, kunci.Lock, lock)
        assert isinstance(lock, kunci.Lock)
        self.assertEqual(roundtrip(n.addr, b"Q b\n").split()[2], str(lock.token).encode())
        lock.release()
        raw_a.sendall(b"R a " + held_a.split()[2] + b"\n")
        self.assertTrue(until(lambda: roundtrip(n.addr, b"Q a\n") == b"Q a FREE", 5),
                        "the interrupted acquire was left queued or granted: %r" % roundtrip(n.addr, b"Q a\n"))


class LeaseRunsOut(NodeCase):
    def test_lost_is_set_when_the_lease_runs_out(self) -> None:
        """A lock not kept alive is lost, as far as the client can tell,
        when its lease runs out: lost is set then (Go's Done), and not
        before; one released in time never is."""
        n = self.node()
        with kunci.Client([n.addr]) as c:
            lock = c.acquire("k", lease=0.4, wait=1)
            lost = lock.lost
            self.assertFalse(lost.is_set())
            self.assertTrue(lost.wait(5), "lost was not set after the lease ran out")
            kept = c.acquire("j", lease=0.4, wait=1)
            kept_lost = kept.lost
            kept.extend(1.5)  # moves the end: not lost at 0.4 s
            self.assertFalse(kept_lost.wait(0.8))
            kept.release()
            self.assertFalse(kept_lost.wait(1.2), "a lock released in time was reported lost")

    def test_lost_is_set_when_the_lease_runs_out_async(self) -> None:
        n = self.node()

        async def main() -> None:
            async with kunci.AsyncClient([n.addr]) as c:
                lock = await c.acquire("k", lease=0.4, wait=1)
                self.assertFalse(lock.lost.is_set())
                await asyncio.wait_for(lock.lost.wait(), 5)
                kept = await c.acquire("j", lease=0.4, wait=1)
                lost = kept.lost
                await kept.release()
                with self.assertRaises(asyncio.TimeoutError):
                    await asyncio.wait_for(lost.wait(), 1)

        self.run_async(main())


class Ordering(NodeCase):
    def test_keep_alive_then_release_keeps_their_order(self) -> None:
        """keep_alive() then release() from one thread, while the I/O thread
        is busy: the keep-alive must start before the release, not after it
        (it then extended a released grant and set lost on a lock released
        cleanly). Both run on the caller's thread under the client's mutex,
        which the busy I/O thread holds until it is done."""
        n = self.node()
        c = kunci.Client([n.addr])
        self.cleanups_first.append(c.close)
        lock = c.acquire("k", lease=3, wait=5)
        lost = lock.lost
        gate = threading.Event()
        c._loop.call_soon_threadsafe(gate.wait, 0.3)  # the I/O thread is busy a while
        other = threading.Thread(target=c.inspect, args=("j",), daemon=True)
        other.start()
        lock.keep_alive()
        lock.release()
        other.join(10)
        gate.set()
        # A keep-alive that started after the release would find the grant
        # STALE at its first extend, a third of the lease after the grant.
        self.assertFalse(until(lambda: lost.is_set(), 2), "a cleanly released lock was reported lost")


class CloseRace(NodeCase):
    def test_a_call_racing_close_ends(self) -> None:
        """A call that passed the closed check just as another thread's
        close() began: it must end, answered or with kunci.ClosedError, and
        close() must return. The race is made certain by holding the call
        just after its check (under the client's mutex, which close() needs
        to stop the connections) until close() has had a second."""
        n = self.node()
        c = kunci.Client([n.addr])
        checked, go_on = threading.Event(), threading.Event()
        first = [True]
        core = c._core
        real_next = core.next

        def held_next(after: Any) -> Any:
            if first[0]:
                first[0] = False
                checked.set()
                go_on.wait(10)
            return real_next(after)

        core.next = held_next  # type: ignore[method-assign]
        outcome: list[str] = []

        def call() -> None:
            try:
                c.acquire("k", lease=30, wait=5).release()
                outcome.append("ok")
            except kunci.ClosedError:
                outcome.append("closed")
            except BaseException as e:  # noqa: BLE001 - the test's failure
                outcome.append(repr(e))

        caller = threading.Thread(target=call, daemon=True)
        caller.start()
        self.assertTrue(checked.wait(10))
        closer = threading.Thread(target=c.close, daemon=True)
        closer.start()
        closer.join(1)
        go_on.set()
        caller.join(10)
        closer.join(10)
        self.assertFalse(caller.is_alive(), "the call was still waiting 10 s after close()")
        self.assertFalse(closer.is_alive(), "close() did not return")
        self.assertIn(outcome[0] if outcome else "none", ("ok", "closed"), outcome)
        with self.assertRaises(kunci.ClosedError):
            c.acquire("k", lease=30, wait=1)


class Kinds(NodeCase):
    def test_semaphore_and_readers_across_a_handoff(self) -> None:
        """Semaphore and shared grants made at one active are held, listed
        and released at the next after a graceful handoff; a semaphore
        acquire queued meanwhile is sent again with its limit and granted
        there in its turn."""
        nodes, addrs = self.cluster(2)
        c = kunci.Client(addrs)
        self.cleanups_first.append(c.close)
        q = kunci.Client(addrs)
        self.cleanups_first.append(q.close)
        s1 = c.acquire("pool", lease=30, wait=5, limit=2)
        s2 = c.acquire("pool", lease=30, wait=5, limit=2)
        r1 = c.acquire("doc", lease=30, wait=5, shared=True)
        r2 = c.acquire("doc", lease=30, wait=5, shared=True)
        third: list[kunci.Lock | BaseException] = []

        def ask() -> None:
            try:
                third.append(q.acquire("pool", lease=30, wait=30, limit=2))
            except BaseException as e:  # noqa: BLE001 - the test reports it
                third.append(e)

        t = threading.Thread(target=ask, daemon=True)
        t.start()
        self.assertTrue(until(lambda: c.inspect("pool").waiters == 1), "the third never seen waiting")
        nodes[0].signal(signal.SIGINT)
        self.assertTrue(until(lambda: nodes[0].proc.poll() is not None, 20), "the old active did not exit")
        self.assertTrue(until(lambda: info(addrs[1]).startswith("I active ")), info(addrs[1]))
        # The third's acquire, withdrawn by the handoff, queued again.
        self.assertTrue(until(lambda: c.inspect("pool").waiters == 1, 20), "the third not queued at the new active")
        h = c.inspect("pool")
        self.assertEqual((h.token, h.holders, h.limit), (s1.token, 2, 2))
        docs = c.locks(prefix="doc")
        self.assertEqual(sorted(x.token for x in docs), [r1.token, r2.token])
        self.assertTrue(all(x.shared and x.holders == 2 for x in docs), docs)
        self.assertEqual(third, [])
        s1.release()
        t.join(WAIT)
        self.assertEqual(len(third), 1)
        s3 = third[0]
        self.assertIsInstance(s3, kunci.Lock)
        assert isinstance(s3, kunci.Lock)
        self.assertGreater(s3.token, max(s1.token, s2.token, r1.token, r2.token))
        for lock in (s2, s3, r1, r2):
            lock.release()  # each its own grant, by token: never StaleError
        self.assertIsNone(c.inspect("pool"))
        self.assertIsNone(c.inspect("doc"))


class Info(NodeCase):
    def test_info_and_active(self) -> None:
        """info() is what a node says of itself (I): its address, role and
        the active it knows; active() the active's address, a single node
        its own; kunci.NoActiveError when the node knows none (an election)."""
        n = self.node()
        with kunci.Client([n.addr]) as c:
            self.assertEqual(c.info(), kunci.Node(n.addr, "active", n.addr))
            self.assertEqual(c.active(), n.addr)
        _, addrs = self.cluster(2)

        async def main() -> None:
            # Given only the standby: its connections follow its redirect.
            async with kunci.AsyncClient([addrs[1]]) as ac:
                self.assertEqual(await ac.active(), addrs[0])
                self.assertEqual(await ac.info(), kunci.Node(addrs[0], "active", addrs[0]))

        self.run_async(main())
        electing = OldNode()
        self.cleanups_first.append(electing.close)
        electing.info_line = b"I standby %s - state=promoting" % electing.addr.encode()
        with kunci.Client([electing.addr]) as c:
            self.assertEqual(c.info(), kunci.Node(electing.addr, "standby", ""))
            with self.assertRaises(kunci.NoActiveError) as cm:
                c.active()
            self.assertIn(electing.addr, str(cm.exception))
