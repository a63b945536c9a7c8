"""The client's session (docs/clients.md, Sessions), against real kuncid
processes behind a proxy that loses answers, and a fake node from before
sessions: an acquire whose answer was lost takes its grant back, a release
sent again succeeds, the grants nobody holds are released on reconnect, one
acquire of a key is in progress at a time, and an old node still works."""

from __future__ import annotations

import asyncio
import re
import threading

import kunci
from tests.nodes import WAIT, NodeCase, OldNode, Proxy, roundtrip, until, until_async


def acquires(p: Proxy, key: bytes) -> list[bytes]:
    """The acquire lines of key that went through p."""
    return [x for x in p.lines() if x.startswith(b"A " + key + b" ")]


class Sessions(NodeCase):
    def proxied(self) -> tuple[str, Proxy]:
        """A node, and a proxy to it (closed when the test ends)."""
        n = self.node()
        p = Proxy(n.addr)
        self.cleanups_first.append(p.close)
        return n.addr, p

    def client(self, addrs: list[str]) -> kunci.Client:
        c = kunci.Client(addrs, reconnect_interval=0.2)
        self.cleanups_first.append(c.close)
        return c

    def check_taken_back(self, node: str, p: Proxy, token: int) -> None:
        """The acquire of k whose answer p lost was sent again with seen= and
        answered the first attempt's grant: token, held alone."""
        self.assertTrue(p.lost.is_set(), "no answer was lost")
        lost = int(p.lost_line.split()[2])
        sent = acquires(p, b"k")
        self.assertEqual(len(sent), 2, sent)
        self.assertNotIn(b"seen=", sent[0])
        self.assertRegex(sent[1], rb" seen=\d+$")
        self.assertEqual(token, lost, "not the grant whose answer was lost")
        self.assertEqual(roundtrip(node, b"Q k\n").split()[2::2], [b"%d" % lost, b"0"], "another grant, or a waiter")

    def test_lost_grant_is_taken_back(self) -> None:
        """A grant whose answer was lost (the connection broke first) is
        answered to the acquire sent again, rather than queue it behind
        that grant for its lease."""
        node, p = self.proxied()
        c = self.client([p.addr])
        p.lose_answer(b"A k ")
        lock = c.acquire("k", lease=30, wait=5)
        self.check_taken_back(node, p, lock.token)
        lock.release()
        self.assertEqual(roundtrip(node, b"Q k\n"), b"Q k FREE")

    def test_lost_grant_is_taken_back_async(self) -> None:
        node, p = self.proxied()

        async def main() -> None:
            async with kunci.AsyncClient([p.addr], reconnect_interval=0.2) as c:
                p.lose_answer(b"A k ")
                lock = await c.acquire("k", lease=30, wait=5)
                await asyncio.to_thread(self.check_taken_back, node, p, lock.token)
                await lock.release()

        self.run_async(main())
        self.assertEqual(roundtrip(node, b"Q k\n"), b"Q k FREE")

    def check_released_again(self, node: str, p: Proxy, token: int) -> None:
        self.assertTrue(p.lost.is_set(), "no answer was lost")
        self.assertEqual(p.lost_line, b"R k OK")
        self.assertEqual([x for x in p.lines() if x.startswith(b"R k ")], [b"R k %d" % token] * 2)
        self.assertEqual(roundtrip(node, b"Q k\n"), b"Q k FREE")

    def test_release_sent_again_succeeds(self) -> None:
        """A release whose OK was lost is sent again, and the node answers it
        OK again (this client's session released it): success, not StaleError.
        A second release of it too."""
        node, p = self.proxied()
        c = self.client([p.addr])
        lock = c.acquire("k", lease=30, wait=5)
        p.lose_answer(b"R k ")
        lock.release()
        self.check_released_again(node, p, lock.token)
        lock.release()
        self.assertFalse(lock.lost.is_set())

    def test_release_sent_again_succeeds_async(self) -> None:
        node, p = self.proxied()

        async def main() -> None:
            async with kunci.AsyncClient([p.addr], reconnect_interval=0.2) as c:
                lock = await c.acquire("k", lease=30, wait=5)
                p.lose_answer(b"R k ")
                await lock.release()
                await asyncio.to_thread(self.check_released_again, node, p, lock.token)
                await lock.release()
                self.assertFalse(lock.lost.is_set())

        self.run_async(main())

    def test_stale_grants_released_on_reconnect(self) -> None:
        """An acquire given up while its answer was lost (the connections cut,
        and refused until its wait ran out) leaves a grant its caller never
        heard of: once a connection is back, the session's listing shows it,
        and the client releases it, rather than leave the key held for the
        lease. The lock the client holds meanwhile stays held."""
        node, p = self.proxied()
        c = self.client([p.addr])
        kept = c.acquire("kept", lease=30, wait=5)
        p.lose_answer(b"A k ", refuse_for=1.5)
        with self.assertRaises(kunci.UnavailableError):
            c.acquire("k", lease=30, wait=0.5)
        self.assertTrue(p.lost.wait(WAIT), "no answer was lost")
        lost = int(p.lost_line.split()[2])
        self.assertTrue(until(lambda: roundtrip(node, b"Q k\n") == b"Q k FREE", 10),
                        "the grant nobody holds stayed: %r" % roundtrip(node, b"Q k\n"))
        self.assertIn(b"R k %d" % lost, p.lines())
        self.assertTrue(roundtrip(node, b"Q kept\n").startswith(b"Q kept %d " % kept.token),
                        "the lock the client holds was released")
        again = c.acquire("k", lease=30, wait=5)
        self.assertGreater(again.token, lost)
        again.release()
        kept.release()

    def test_one_acquire_of_a_key_at_a_time(self) -> None:
        """The client has one acquire of a key in progress at a time,
        whatever the connection: other acquirers of the key wait their turn
        inside it, in order, and a try meanwhile is answered "held" without
        being sent (so that a grant above an acquire's seen can only be that
        acquire's)."""
        node, p = self.proxied()
        raw, held = self.raw_hold(node, b"k")
        c = self.client([p.addr])
        order: list[tuple[str, int]] = []
        mu = threading.Lock()

        def ask(name: str) -> None:
            lock = c.acquire("k", lease=30, wait=WAIT * 2)
            with mu:
                order.append((name, lock.token))
            lock.release()

        def turns() -> int:
            ks = c._core.keys.m.get(b"k")
            return 0 if ks is None else len(ks.turns)

        threads = []

        def start(name: str) -> None:
            t = threading.Thread(target=ask, args=(name,), daemon=True)
            t.start()
            threads.append(t)

        start("B")
        self.assertTrue(until(lambda: roundtrip(node, b"Q k\n").endswith(b" 1")), "B never queued")
        self.assertIsNone(c.try_acquire("k", lease=30))
        self.assertIsNone(c.try_acquire("k", lease=30, shared=True))
        self.assertEqual(len(acquires(p, b"k")), 1, "a try was sent: %s" % acquires(p, b"k"))
        for i, name in enumerate("CD", 1):
            start(name)
            self.assertTrue(until(lambda: turns() == i), "%s never seen waiting its turn" % name)
        self.assertEqual(len(acquires(p, b"k")), 1, "more than B's acquire sent: %s" % acquires(p, b"k"))
        raw.sendall(b"R k " + held.split()[2] + b"\n")
        for t in threads:
            t.join(WAIT * 2)
        self.assertEqual([x[0] for x in order], ["B", "C", "D"])
        tokens = [x[1] for x in order]
        self.assertEqual(tokens, sorted(set(tokens)))
        self.assertIsNone(c._core.keys.m.get(b"k"), "the key's state outlived its acquires and grants")

    def test_given_up_acquire_keeps_its_turn_until_withdrawn(self) -> None:
        """A cancelled acquire that was sent keeps the key's turn until the
        node answered it (C sent, T back): the next acquirer of the key goes
        out only then, so that no two acquires of a key are in progress; one
        cancelled while it waited its turn leaves the line, sending nothing."""
        node, p = self.proxied()
        raw, held = self.raw_hold(node, b"k")

        async def main() -> None:
            async with kunci.AsyncClient([p.addr]) as c:
                first = asyncio.ensure_future(c.acquire("k", lease=30, wait=20))

                async def queued() -> bool:
                    return (await asyncio.to_thread(roundtrip, node, b"Q k\n")).endswith(b" 1")

                await until_async(queued, "the first acquire queued")
                # Made after the first went out: the current connection is
                # the other one now.
                second = asyncio.ensure_future(c.acquire("k", lease=30, wait=20))
                third = asyncio.ensure_future(c.acquire("k", lease=30, wait=20))
                for _ in range(5):
                    await asyncio.sleep(0)  # their turns of the loop: each waits, or has sent
                third.cancel()
                first.cancel()
                for t in (first, third):
                    with self.assertRaises(asyncio.CancelledError):
                        await t
                await until_async(lambda: len(acquires(p, b"k")) == 2, "the second acquire sent")
                ks = [x.split()[0] for x in p.lines() if x.startswith((b"A k ", b"C k"))]
                self.assertEqual(ks, [b"A", b"C", b"A"], "the next acquire went out before the first was withdrawn")
                await asyncio.to_thread(raw.sendall, b"R k " + held.split()[2] + b"\n")
                lock = await second
                self.assertGreater(lock.token, int(held.split()[2]))
                await lock.release()
                self.assertEqual(len(acquires(p, b"k")), 2, "the acquire cancelled in the line was sent")
                self.assertIsNone(c._core.keys.m.get(b"k"))

        self.run_async(main())


class OldNodes(NodeCase):
    def old(self) -> OldNode:
        o = OldNode()
        self.cleanups_first.append(o.close)
        return o

    def check_old(self, o: OldNode) -> None:
        """Every connection named the session first, and no acquire carried
        seen=; the acquire of j whose connection broke was sent again (more
        than once when it went out on another connection the node closed)."""
        for lines in o.lines:
            if lines:
                self.assertTrue(re.fullmatch(rb"S \d+", lines[0]), lines)
        sent = [x for x in o.read() if x.startswith(b"A ")]
        self.assertFalse([x for x in sent if b"seen=" in x], sent)
        self.assertGreaterEqual(len([x for x in sent if x.startswith(b"A j ")]), 2, sent)

    def test_old_node(self) -> None:
        """A node from before sessions answers S "unknown op": the client
        goes on without seen= on its connections (which that node would
        refuse), an acquire whose connection broke is sent again as always,
        and every operation works."""
        o = self.old()
        c = kunci.Client([o.addr], reconnect_interval=0.2)
        self.cleanups_first.append(c.close)
        c.acquire("k", lease=30, wait=5).release()
        o.lose = b"j"
        lock = c.acquire("j", lease=30, wait=5)
        self.assertEqual(c.inspect("j").token, lock.token)
        lock.release()
        self.assertEqual(c.active(), o.addr)
        self.check_old(o)

    def test_old_node_async(self) -> None:
        o = self.old()

        async def main() -> None:
            async with kunci.AsyncClient([o.addr], reconnect_interval=0.2) as c:
                await (await c.acquire("k", lease=30, wait=5)).release()
                o.lose = b"j"
                lock = await c.acquire("j", lease=30, wait=5)
                await lock.release()

        self.run_async(main())
        self.check_old(o)
