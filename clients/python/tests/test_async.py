"""AsyncClient against real kuncid processes: the scenarios' core, the
same-key queue inside one client, and a cancelled acquire withdrawn."""

from __future__ import annotations

import asyncio
import contextlib
import select
import socket
import threading
import time
from typing import Any, AsyncIterator

import kunci
from tests.nodes import NodeCase, Proxy, _readline as readline, in_loop, roundtrip, until_async


class Async(NodeCase):
    @contextlib.asynccontextmanager
    async def two_clients(self) -> AsyncIterator[tuple[kunci.AsyncClient, kunci.AsyncClient]]:
        """Two clients, a and b, of a node of their own."""
        n = self.node()
        async with kunci.AsyncClient([n.addr]) as a, kunci.AsyncClient([n.addr]) as b:
            yield a, b

    async def queued(self, c: kunci.AsyncClient, key: str, want: int) -> None:
        """Wait until want acquires of key wait in the node's queue (as c's
        inspect sees it)."""
        async def waiting() -> bool:
            return (await c.inspect(key)).waiters == want

        await until_async(waiting, "%d waiting for %s" % (want, key))

    async def cancel_queued(self, c: kunci.AsyncClient, t: asyncio.Future[Any], key: str) -> None:
        """Cancel t, an acquire of key waiting in the node's queue: it ends
        cancelled, and leaves the queue (withdrawn: C), as c's inspect sees."""
        t.cancel()
        with self.assertRaises(asyncio.CancelledError):
            await t
        await self.queued(c, key, 0)

    @in_loop
    async def test_tour(self) -> None:
        n = self.node()
        async with kunci.AsyncClient([n.addr], owner="billing") as c:
            lock = await c.acquire("orders/42", lease=30, wait=10)
            self.assertIsNone(await c.try_acquire("orders/42", lease=5))
            h = await c.inspect("orders/42")
            self.assertEqual((h.token, h.owner), (lock.token, "billing"))
            await lock.extend(60)
            self.assertGreater((await c.inspect("orders/42")).left, 30)
            listed = await c.locks(prefix="orders/")
            self.assertEqual([x.key for x in listed], ["orders/42"])
            self.assertFalse(listed.more)
            await lock.release()
            # Released again by this client (its session): done, as the
            # node answers, not stale.
            await lock.release()
            self.assertFalse(lock.lost.is_set())
            self.assertIsNone(await c.inspect("orders/42"))
            # Not the client's any more: its lease ran out.
            brief = await c.acquire("orders/43", lease=0.2, wait=10)

            async def free() -> bool:
                return await c.inspect("orders/43") is None

            await until_async(free, "orders/43 free (its lease ran out)")
            with self.assertRaises(kunci.StaleError) as cm:
                await brief.release()
            self.assertIn("not yours any more", str(cm.exception))
            self.assertTrue(brief.lost.is_set())

    @in_loop
    async def test_fifo_and_timeout(self) -> None:
        async with self.two_clients() as (a, b):
            held = await a.acquire("k", lease=30, wait=5)
            start = time.monotonic()
            with self.assertRaises(kunci.TimeoutError):
                await b.acquire("k", lease=30, wait=0.3)
            self.assertGreaterEqual(time.monotonic() - start, 0.3)
            # Six acquirers of one key in one client, which has one
            # acquire of a key in progress at a time: all granted in
            # turn, tokens rising.
            order: list[int] = []

            async def one() -> None:
                lock = await b.acquire("k", lease=30, wait=20)
                order.append(lock.token)
                await lock.release()

            tasks = [asyncio.ensure_future(one()) for _ in range(6)]
            await self.queued(a, "k", 1)
            await held.release()
            await asyncio.gather(*tasks)
            self.assertEqual(order, sorted(set(order)))
            self.assertEqual(len(order), 6)

    @in_loop
    async def test_lease_loss(self) -> None:
        n = self.node()
        async with kunci.AsyncClient([n.addr]) as c:
            with self.assertRaises(kunci.LostError):
                async with c.lock("k", lease=1, wait=5) as lock:
                    await asyncio.to_thread(roundtrip, n.addr, b"R k %d\n" % lock.token)
                    await asyncio.wait_for(lock.lost.wait(), 10)
            await (await c.acquire("k", lease=5, wait=5)).release()

    @in_loop
    async def test_kept_alive_past_its_lease(self) -> None:
        n = self.node()
        async with kunci.AsyncClient([n.addr]) as c:
            async with c.lock("k", lease=0.6, wait=5) as lock:
                await asyncio.sleep(2)
                self.assertEqual((await c.inspect("k")).token, lock.token)
                self.assertFalse(lock.lost.is_set())
            self.assertIsNone(await c.inspect("k"))

    @in_loop
    async def test_semaphore_and_shared(self) -> None:
        n = self.node()
        async with kunci.AsyncClient([n.addr], owner="w1") as a, kunci.AsyncClient([n.addr]) as b:
            s1 = await a.acquire("pool", lease=30, wait=5, limit=2)
            s2 = await b.acquire("pool", lease=30, wait=5, limit=2)
            self.assertIsNone(await b.try_acquire("pool", lease=30, limit=2))
            listed = await a.locks(prefix="pool")
            self.assertEqual(sorted(x.token for x in listed), [s1.token, s2.token])
            self.assertEqual({(x.holders, x.limit, x.shared) for x in listed}, {(2, 2, False)})
            self.assertEqual({x.owner for x in listed}, {"w1", ""})
            with self.assertRaises(kunci.RefusedError) as cm:
                await b.acquire("pool", lease=30, wait=1, shared=True)
            self.assertEqual(cm.exception.reason, "key held as a semaphore")
            with self.assertRaises(kunci.RefusedError) as cm:
                await b.acquire("big", lease=30, wait=1, limit=5000)
            self.assertEqual(cm.exception.reason, "limit too high (max 1024)")
            # A third waits in a run-under-lock block until a place is
            # free; its grant ended behind its back is signalled lost.
            token = 0

            async def third() -> None:
                nonlocal token
                async with b.lock("pool", lease=1, wait=20, limit=2) as lock:
                    token = lock.token
                    self.assertEqual(await asyncio.to_thread(
                        roundtrip, n.addr, b"R pool %d\n" % lock.token), b"R pool OK")
                    await asyncio.wait_for(lock.lost.wait(), 10)

            t = asyncio.ensure_future(third())
            await self.queued(a, "pool", 1)
            self.assertEqual(token, 0)
            await s1.release()
            with self.assertRaises(kunci.LostError):
                await asyncio.wait_for(t, 20)
            self.assertGreater(token, s2.token)
            await s2.release()
            self.assertIsNone(await a.inspect("pool"))
            # Shared: two readers at once, shown as such.
            r1 = await a.acquire("doc", lease=30, wait=5, shared=True)
            r2 = await b.acquire("doc", lease=30, wait=5, shared=True)
            h = await a.inspect("doc")
            self.assertEqual((h.token, h.holders, h.shared, h.limit), (r1.token, 2, True, None))
            self.assertIsNone(await a.try_acquire("doc", lease=30))
            await r1.release()
            await r2.release()

    @in_loop
    async def test_cancelled_acquire_is_withdrawn(self) -> None:
        async with self.two_clients() as (a, b):
            held = await a.acquire("k", lease=30, wait=5)
            t = asyncio.ensure_future(b.acquire("k", lease=30, wait=20))
            await self.queued(a, "k", 1)
            await self.cancel_queued(a, t, "k")
            await held.release()
            self.assertIsNone(await a.inspect("k"))

    @in_loop
    async def test_try_beside_an_acquire_of_the_key(self) -> None:
        """The client has one acquire of a key in progress at a time (so that
        an acquire sent again with seen= is answered its own earlier grant,
        never another acquire's): a try of a semaphore or a shared key made
        in the turn an acquire of it was sent is None at once, unsent (it
        went on the other connection, and was granted beside it); once that
        acquire is answered, tries are granted beside it."""
        n = self.node()
        p = Proxy(n.addr)
        self.cleanups_first.append(p.close)
        async with kunci.AsyncClient([p.addr]) as c:
            for key, kind in (("pool", {"limit": 3}), ("doc", {"shared": True})):
                t1 = asyncio.ensure_future(c.acquire(key, 30, 5, **kind))  # type: ignore[arg-type]
                t2 = asyncio.ensure_future(c.try_acquire(key, 30, **kind))  # type: ignore[arg-type]
                first, tried = await t1, await t2
                self.assertIsNone(tried, "%s: a try beside an acquire in progress was sent" % key)
                sent = [x for x in p.lines() if x.startswith(b"A %s " % key.encode())]
                self.assertEqual(len(sent), 1, sent)
                tried = await c.try_acquire(key, 30, **kind)  # type: ignore[arg-type]
                self.assertIsNotNone(tried, "%s: a try beside a grant answered held" % key)
                assert tried is not None
                self.assertEqual((await c.inspect(key)).holders, 2)
                await first.release()
                await tried.release()

    @in_loop
    async def test_cancelled_semaphore_and_writer_are_withdrawn(self) -> None:
        async with self.two_clients() as (a, b):
            # A semaphore's queued acquire, cancelled: withdrawn (C), so
            # the holder's release leaves the key free.
            sem = await a.acquire("pool", lease=30, wait=5, limit=1)
            t = asyncio.ensure_future(b.acquire("pool", lease=30, wait=20, limit=1))
            await self.queued(a, "pool", 1)
            await self.cancel_queued(a, t, "pool")
            await sem.release()
            self.assertIsNone(await a.inspect("pool"))
            # A writer queued behind a reader keeps new readers out;
            # cancelled, it lets them in again.
            r = await a.acquire("doc", lease=30, wait=5, shared=True)
            w = asyncio.ensure_future(b.acquire("doc", lease=30, wait=20))
            await self.queued(a, "doc", 1)
            self.assertIsNone(await a.try_acquire("doc", lease=30, shared=True))
            await self.cancel_queued(a, w, "doc")
            r2 = await a.try_acquire("doc", lease=30, shared=True)
            self.assertIsNotNone(r2, "a reader kept out by a withdrawn writer")
            assert r2 is not None
            self.assertEqual((await a.inspect("doc")).holders, 2)
            await r.release()
            await r2.release()
            self.assertIsNone(await a.inspect("doc"))

    @in_loop
    async def test_grant_and_cancel_in_one_turn_is_released(self) -> None:
        """A busy loop reads an acquire's grant and runs the caller's
        timeout (asyncio.timeout's timer: it cancels the task) in the same
        turn: the task ends cancelled, so the grant must be released, not
        left holding the key for its whole lease."""
        n = self.node()
        raw, held = self.raw_hold(n.addr, b"k")
        async with kunci.AsyncClient([n.addr]) as c:
            loop = asyncio.get_running_loop()
            t = asyncio.ensure_future(c.acquire("k", lease=30, wait=10))
            await self.queued(c, "k", 1)
            socks = [cn.link.socket() for cn in c._core.conns if cn.link]
            # Busy: the loop is held while the grant reaches the
            # client's socket, and the timeout falls due meanwhile.
            raw.sendall(b"R k " + held.split()[2] + b"\n")
            self.assertEqual(readline(raw), b"R k OK")
            readable, _, _ = select.select(socks, [], [], 10)
            self.assertTrue(readable, "the grant never came")
            loop.call_later(0, t.cancel)
            with self.assertRaises(asyncio.CancelledError):
                await t

            async def released() -> bool:
                return await c.inspect("k") is None

            await until_async(released, "k free (the late grant released)")

    def test_cancelled_connect_leaves_nothing_behind(self) -> None:
        """A connect given up (a timeout around "async with AsyncClient")
        while a node sits on the credentials stops the client's background
        work and closes its sockets: no task keeps dialling, no connection
        stays open."""
        silent = socket.socket()
        self.cleanups_first.append(silent.close)
        silent.bind(("127.0.0.1", 0))
        silent.listen(8)
        addr = "127.0.0.1:%d" % silent.getsockname()[1]
        accepted: list[socket.socket] = []

        async def main() -> None:
            before = asyncio.all_tasks()
            c = kunci.AsyncClient([addr], credentials=kunci.Credentials("app", "s3cret"))
            with self.assertRaises(asyncio.TimeoutError):
                await asyncio.wait_for(c.connect(), 0.5)

            def others() -> list[asyncio.Task[Any]]:
                return list(asyncio.all_tasks() - before)

            await until_async(lambda: not others(), "the client's tasks ended (after its cancelled connect)")

        self.run_async(main())
        silent.settimeout(5)
        for _ in range(2):
            s, _ = silent.accept()
            self.cleanups_first.append(s.close)
            accepted.append(s)
        for s in accepted:
            s.settimeout(5)
            data = s.recv(512)
            self.assertTrue(data.startswith(b"U app s3cret"), data)
            if len(data) == len(b"U app s3cret\n"):
                data = s.recv(512)
            self.assertEqual(data, b"", "the connection stayed open")

    @in_loop
    async def test_release_across_drop(self) -> None:
        n = self.node()
        p = Proxy(n.addr)
        self.cleanups_first.append(p.close)
        async with kunci.AsyncClient([p.addr]) as c:
            lock = await c.acquire("k", lease=30, wait=5)
            await asyncio.to_thread(p.cut, 0.3)
            await lock.release()
        self.assertEqual(roundtrip(n.addr, b"Q k\n"), b"Q k FREE")

    @in_loop
    async def test_bad_input(self) -> None:
        async with kunci.AsyncClient(["127.0.0.1:1"]) as c:
            for bad in ("a b", "", "k" * 251):
                with self.assertRaises(ValueError):
                    await c.acquire(bad, lease=5, wait=1)
            with self.assertRaises(ValueError):
                await c.acquire("k", lease=0, wait=1)
            with self.assertRaises(ValueError):
                await c.acquire("k", lease=5, wait=-1)
            with self.assertRaises(ValueError):
                await c.acquire("k", lease=5, wait=1, limit=0)
            with self.assertRaises(ValueError):
                await c.try_acquire("k", lease=5, limit=2, shared=True)
            with self.assertRaises(ValueError):
                async with c.lock("k", lease=5, wait=1, limit=-2):
                    pass
            with self.assertRaises(kunci.UnavailableError):
                await c.acquire("k", lease=5, wait=0.2)
        with self.assertRaises(kunci.ClosedError):
            await c.acquire("k", lease=5, wait=1)


class Threads(NodeCase):
    def test_many_threads_one_client(self) -> None:
        """Eight threads share one Client, on one key and on keys of their
        own; every cycle completes, the one key's grants one at a time."""
        n = self.node()
        errors: list[BaseException] = []
        holding = [0]
        mu = threading.Lock()
        with kunci.Client([n.addr]) as c:

            def work(g: int) -> None:
                try:
                    for i in range(30):
                        c.acquire("own/%d/%d" % (g, i), lease=30, wait=10).release()
                        lock = c.acquire("shared", lease=30, wait=30)
                        with mu:
                            holding[0] += 1
                            self.assertEqual(holding[0], 1)
                        with mu:
                            holding[0] -= 1
                        lock.release()
                except BaseException as e:  # noqa: BLE001
                    errors.append(e)

            ts = [threading.Thread(target=work, args=(g,)) for g in range(8)]
            for t in ts:
                t.start()
            for t in ts:
                t.join(60)
            self.assertEqual(errors, [])
            self.assertEqual(len(c.locks()), 0)
