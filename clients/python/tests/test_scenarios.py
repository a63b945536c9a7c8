"""The scenarios of clients/SCENARIOS.md, one method each (test_<name>), run
by the thread client against real kuncid processes on 127.0.0.1."""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
import unittest
from pathlib import Path

import urllib.request

import kunci
from tests.nodes import WAIT, Node, NodeCase, Proxy, info, roundtrip, until

README = Path(__file__).resolve().parents[1] / "README.md"
SCENARIOS = Path(__file__).resolve().parents[2] / "SCENARIOS.md"


class Cycler:
    """Threads that acquire and release keys of their own in a loop (a new
    key each cycle; with reuse, one key each, over and over, as real callers
    do), noting every token, every error and when each cycle ended."""

    def __init__(self, c: kunci.Client, threads: int, wait: float, reuse: bool = False, lease: float = 30) -> None:
        self.c, self.wait, self.reuse, self.lease = c, wait, reuse, lease
        self.stop = threading.Event()
        self.mu = threading.Lock()
        self.grants: list[tuple[int, float, float, int]] = []  # thread, began, granted, token
        self.cycles: list[tuple[int, float, float]] = []  # thread, began, ended: acquired and released
        self.errors: list[str] = []
        self.timeouts = 0
        self.stale = 0
        self.threads = [threading.Thread(target=self.loop, args=(g,), daemon=True) for g in range(threads)]
        for t in self.threads:
            t.start()

    def loop(self, g: int) -> None:
        i = 0
        while not self.stop.is_set() and i < 100_000:
            i += 1
            began = time.monotonic()
            # A key of its own each time, unless reuse: a release lost in a
            # crash failover, without sessions, left its key held until its
            # lease ended.
            key = "cycle/%d" % g if self.reuse else "cycle/%d/%d" % (g, i)
            try:
                lock = self.c.acquire(key, lease=self.lease, wait=self.wait)
            except kunci.TimeoutError:
                with self.mu:
                    self.timeouts += 1
                continue
            except Exception as e:  # noqa: BLE001 - every other error is the test's failure
                with self.mu:
                    self.errors.append("acquire: %r" % e)
                continue
            with self.mu:
                self.grants.append((g, began, time.monotonic(), lock.token))
            try:
                lock.release()
            except kunci.StaleError:
                with self.mu:
                    self.stale += 1
            except Exception as e:  # noqa: BLE001
                with self.mu:
                    self.errors.append("release: %r" % e)
                continue
            with self.mu:
                self.cycles.append((g, began, time.monotonic()))

    def count(self) -> int:
        with self.mu:
            return len(self.grants)

    def count_after(self, t: float) -> int:
        with self.mu:
            return sum(1 for g in self.grants if g[1] > t)

    def cycled_after(self, t: float) -> set[int]:
        """The threads that completed a cycle begun after t."""
        with self.mu:
            return {g for g, began, _ in self.cycles if began > t}

    def end(self) -> None:
        self.stop.set()
        for t in self.threads:
            t.join(WAIT)


class Scenarios(NodeCase):
    def client(self, addrs: list[str], **kw: object) -> kunci.Client:
        c = kunci.Client(addrs, **kw)  # type: ignore[arg-type]
        self.cleanups_first.append(c.close)
        return c

    def test_fifo_handoff(self) -> None:
        n = self.node()
        a = self.client([n.addr])
        held = a.acquire("k", lease=30, wait=5)
        order: list[tuple[str, int]] = []
        mu = threading.Lock()

        def ask(name: str) -> None:
            c = self.client([n.addr])
            lock = c.acquire("k", lease=30, wait=WAIT * 2)
            with mu:
                order.append((name, lock.token))
            lock.release()

        threads = []
        for i, name in enumerate("BCD", 1):
            t = threading.Thread(target=ask, args=(name,), daemon=True)
            t.start()
            threads.append(t)
            self.assertTrue(until(lambda: a.inspect("k").waiters == i), "%s never seen waiting" % name)
        held.release()
        for t in threads:
            t.join(WAIT * 2)
        self.assertEqual([x[0] for x in order], ["B", "C", "D"])
        tokens = [held.token] + [x[1] for x in order]
        self.assertEqual(tokens, sorted(set(tokens)), "tokens not rising: %s" % tokens)

    def test_wait_timeout(self) -> None:
        n = self.node()
        a = self.client([n.addr])
        b = self.client([n.addr])
        held = a.acquire("k", lease=30, wait=5)
        start = time.monotonic()
        with self.assertRaises(kunci.TimeoutError):
            b.acquire("k", lease=30, wait=0.3)
        self.assertGreaterEqual(time.monotonic() - start, 0.3)
        self.assertEqual(a.inspect("k").token, held.token)

    def test_lease_loss(self) -> None:
        n = self.node()
        a = self.client([n.addr])
        with self.assertRaises(kunci.LostError):
            with a.lock("k", lease=1, wait=5) as lock:
                # The grant ends behind A's back: another client releases it.
                self.assertEqual(roundtrip(n.addr, b"R k %d\n" % lock.token), b"R k OK")
                self.assertTrue(lock.lost.wait(10), "the loss was never signalled")
        # The client goes on.
        a.acquire("k", lease=5, wait=5).release()

    def test_release_across_drop(self) -> None:
        n = self.node()
        p = Proxy(n.addr)
        self.cleanups_first.append(p.close)
        a = self.client([p.addr])
        lock = a.acquire("k", lease=30, wait=5)
        p.cut(refuse_for=0.3)
        start = time.monotonic()
        lock.release()  # retried until a connection is back
        took = time.monotonic() - start
        self.assertLess(took, 6.0)
        self.assertEqual(roundtrip(n.addr, b"Q k\n"), b"Q k FREE")

    def test_give_up_withdraws(self) -> None:
        n = self.node()
        a = self.client([n.addr])
        c = self.client([n.addr])
        held = a.acquire("k", lease=30, wait=5)

        async def scenario() -> None:
            # B's client stays open throughout: its connection's close
            # would withdraw the acquire on the node by itself.
            async with kunci.AsyncClient([n.addr]) as b:
                start = time.monotonic()
                with self.assertRaises(asyncio.TimeoutError):
                    await asyncio.wait_for(b.acquire("k", lease=30, wait=10), 0.3)
                self.assertLess(time.monotonic() - start, 5)
                await asyncio.to_thread(held.release)
                # B's abandoned acquire was withdrawn: nothing holds k.
                lock = await asyncio.to_thread(c.try_acquire, "k", 30)
                self.assertIsNotNone(lock, "k was held after the release: the abandoned acquire was granted")
                assert lock is not None
                self.assertGreater(lock.token, held.token)
                await asyncio.to_thread(lock.release)

        asyncio.run(scenario())

    def test_redirect_from_standby(self) -> None:
        nodes, addrs = self.cluster(2)
        c = self.client([addrs[1]])
        lock = c.acquire("k", lease=30, wait=10)
        got = roundtrip(addrs[0], b"Q k\n").decode()
        self.assertTrue(got.startswith("Q k %d " % lock.token), got)
        lock.release()

    def cycling(self, size: int, wait: float) -> tuple[list[Node], Cycler]:
        """A cluster of size nodes, and a Cycler of 4 threads (ended when the
        test ends) on a client of all of them, once it has cycled 100 times
        on the active."""
        nodes, addrs = self.cluster(size)
        cy = Cycler(self.client(addrs), threads=4, wait=wait)
        self.cleanups_first.append(cy.end)
        self.assertTrue(until(lambda: cy.count() >= 100), "no cycles on the active")
        return nodes, cy

    def test_crash_failover(self) -> None:
        nodes, cy = self.cycling(3, wait=3)
        killed = time.monotonic()
        nodes[0].proc.send_signal(signal.SIGKILL)
        ok = until(lambda: cy.count_after(killed) >= 100, 20)
        cy.end()
        self.assertTrue(ok, "acquires did not go on at the new active: %d errors %s" % (len(cy.errors), cy.errors[:3]))
        self.assertEqual(cy.errors, [])
        before = [t for _, _, at, t in cy.grants if at < killed]
        after = [t for _, began, _, t in cy.grants if began > killed]
        self.assertGreater(min(after), max(before))

    def test_crash_reuse(self) -> None:
        for semi in (False, True):
            with self.subTest("semi-sync" if semi else "async"):
                self.crash_reuse(semi)

    def crash_reuse(self, semi: bool) -> None:
        """Callers that reuse their keys across a kill -9 of the active. A
        release the old active answered and never copied, or a grant its
        client never heard of, used to keep the key held on the new active
        for the grant's lease (30 s here): the client's session now finds and
        releases the one, and takes the other back. Every caller cycles again
        within 10 s; no acquire fails; a release fails only as kunci.StaleError,
        and only with asynchronous replication; the kept-alive lock lives on."""
        nodes, addrs = self.cluster(3, "--semi-sync") if semi else self.cluster(3)
        c = self.client(addrs)
        kept = c.acquire("crash/kept", lease=3, wait=5)
        kept.keep_alive()

        def copied() -> bool:
            url = "http://%s/locks?prefix=crash/" % nodes[1].admin
            with urllib.request.urlopen(url, timeout=5) as r:
                return any(x["key"] == "crash/kept" for x in json.load(r)["locks"])

        self.assertTrue(until(copied), "the standby never held a copy of the kept-alive lock")
        threads, lease = 8, 30.0
        cy = Cycler(c, threads=threads, wait=10, reuse=True, lease=lease)
        self.cleanups_first.append(cy.end)
        self.assertTrue(until(lambda: cy.count() >= 200, 30), "no cycles on the active")
        killed = time.monotonic()
        nodes[0].proc.send_signal(signal.SIGKILL)
        # Generous for a busy machine, and far below the lease a stuck key
        # would take.
        everyone = until(lambda: len(cy.cycled_after(killed)) == threads, lease / 3)
        took = time.monotonic() - killed
        more = until(lambda: cy.count_after(killed) >= 100, 20)
        cy.end()
        mode = "semi-sync" if semi else "async"
        self.assertTrue(everyone, "%s: %.1f s after the kill only threads %s of %d cycled again: a key stays held; "
                        "errors: %s" % (mode, took, sorted(cy.cycled_after(killed)), threads, cy.errors[:3]))
        self.assertTrue(more, "%s: cycles did not go on at the new active" % mode)
        self.assertEqual((cy.errors, cy.timeouts), ([], 0), "%s: requests failed across the crash" % mode)
        if semi:
            self.assertEqual(cy.stale, 0, "releases stale with semi-synchronous replication")
        self.assertFalse(kept.lost.is_set(), "%s: the kept-alive lock was lost across the crash" % mode)
        kept.release()
        c.close()
        for n in nodes:
            n.kill()

    def test_graceful_handoff(self) -> None:
        nodes, cy = self.cycling(2, wait=10)
        stopped = time.monotonic()
        nodes[0].signal(signal.SIGINT)
        ok = until(lambda: cy.count_after(stopped) >= 100 and nodes[0].proc.poll() is not None, 20)
        cy.end()
        self.assertTrue(ok, "cycles did not go on after the handoff")
        self.assertEqual((cy.errors, cy.timeouts, cy.stale), ([], 0, 0))
        for g in range(4):
            tokens = [t for th, _, _, t in cy.grants if th == g]
            self.assertEqual(tokens, sorted(set(tokens)), "thread %d: tokens not rising" % g)

    def test_auth(self) -> None:
        secret = "s3cret-s3cret-s3cret-1234"
        auth = self.file("auth", b"billing %s\n" % secret.encode())
        n = self.node("--auth-file", auth)
        none = self.client([n.addr])
        with self.assertRaises(kunci.AuthError) as cm:
            none.acquire("k", lease=5, wait=5)
        self.assertIn("auth required", str(cm.exception))
        with self.assertRaises(kunci.AuthError) as cm2:
            self.client([n.addr], credentials=kunci.Credentials("billing", "wrong-wrong-wrong-wrong"))
        self.assertIn("bad credentials", str(cm2.exception))
        cred = self.file("client.cred", b"# billing's\nbilling %s\n" % secret.encode())
        for creds in (kunci.Credentials("billing", secret), cred):
            ok = self.client([n.addr], credentials=creds)
            ok.acquire("k", lease=5, wait=5).release()

    def test_tls(self) -> None:
        certs = self.certs()
        n = self.node("--tls-listen", "127.0.0.1:0", "--tls-cert", certs["node1.crt"], "--tls-key", certs["node1.key"])
        c = self.client([n.tls_addr], tls=kunci.tls_context(ca=certs["ca.crt"]))
        c.acquire("k", lease=5, wait=5).release()
        # Mutual TLS: a client certificate from the CA.
        m = self.node("--tls-listen", "127.0.0.1:0", "--tls-cert", certs["node1.crt"], "--tls-key", certs["node1.key"],
                      "--tls-client-ca", certs["ca.crt"])
        mtls = kunci.tls_context(ca=certs["ca.crt"], cert=certs["app.crt"], key=certs["app.key"])
        mc = self.client([m.tls_addr], tls=mtls)
        mc.acquire("k", lease=5, wait=5).release()
        # Credentials beside a certificate that names one: the node takes
        # the certificate and answers the U "already authenticated".
        secret = "s3cret-s3cret-s3cret-1234"
        a = self.node("--tls-listen", "127.0.0.1:0", "--tls-cert", certs["node1.crt"], "--tls-key", certs["node1.key"],
                      "--tls-client-ca", certs["ca.crt"],
                      "--auth-file", self.file("auth", b"app %s\n" % secret.encode()))
        both = self.client([a.tls_addr], tls=mtls, credentials=kunci.Credentials("app", secret))
        both.acquire("k", lease=5, wait=5).release()
        # A client that does not trust the nodes' CA.
        bad = self.client([n.tls_addr], tls=kunci.tls_context(ca=certs["other.crt"]))
        with self.assertRaises(kunci.UnavailableError) as cm:
            bad.acquire("k", lease=5, wait=1)
        self.assertIn("CERTIFICATE_VERIFY_FAILED", str(cm.exception))
        # Without its certificate, a node asking for one does not serve it.
        nocert = self.client([m.tls_addr], tls=kunci.tls_context(ca=certs["ca.crt"]))
        with self.assertRaises(kunci.UnavailableError):
            nocert.acquire("k", lease=5, wait=1)

    def test_bad_input(self) -> None:
        n = self.node()
        p = Proxy(n.addr)
        self.cleanups_first.append(p.close)
        c = self.client([p.addr])
        gone = self.client(["127.0.0.1:1"])  # a node that is not there
        for cl in (c, gone):
            for call in (
                lambda: cl.acquire("a key", lease=5, wait=1),
                lambda: cl.acquire("k" * 251, lease=5, wait=1),
                lambda: cl.acquire("", lease=5, wait=1),
                lambda: cl.acquire("k\x01", lease=5, wait=1),
                lambda: cl.acquire("k", lease=0, wait=1),
                lambda: cl.acquire("k", lease=-1, wait=1),
                lambda: cl.acquire("k", lease=float("nan"), wait=1),
                lambda: cl.acquire("k", lease=5, wait=-0.5),
                lambda: cl.try_acquire("k k", lease=5),
                lambda: cl.try_acquire("k", lease=0),
                lambda: cl.acquire("k", lease=5, wait=1, limit=0),
                lambda: cl.acquire("k", lease=5, wait=1, limit=2, shared=True),
                lambda: cl.try_acquire("k", lease=5, limit=-1),
                lambda: cl.lock("k", lease=5, wait=1, limit=2, shared=True).__enter__(),
                lambda: cl.inspect("k\n"),
                lambda: cl.locks(prefix="a b"),
                lambda: cl.locks(limit=-1),
            ):
                with self.assertRaises(ValueError):
                    call()
        with self.assertRaises(ValueError):
            kunci.Client([p.addr], owner="a b")
        with self.assertRaises(ValueError):
            kunci.Client([p.addr], credentials=kunci.Credentials("billing", "with space"))
        # The lines the node received: none but the client's session, named
        # first on each connection.
        self.assertEqual([x for x in p.lines() if not x.startswith(b"S ")], [])
        c.acquire("k", lease=5, wait=5).release()
        self.assertTrue(until(lambda: any(x.startswith(b"R k ") for x in p.lines())))

    def test_readme_examples(self) -> None:
        certs = self.certs()
        n = self.node()
        t = self.node("--tls-listen", "127.0.0.1:0", "--tls-cert", certs["node1.crt"], "--tls-key", certs["node1.key"],
                      "--tls-client-ca", certs["ca.crt"])
        work = os.path.join(self.tmp, "readme")
        os.mkdir(work)
        for name in ("ca.crt", "app.crt", "app.key"):
            os.link(certs[name], os.path.join(work, name))
        self.file("readme/client.cred", b"billing 4f0XkVq3sH8mJp2rT6wYc1nA9dLe\n")
        blocks = re.findall(r"```python\n(.*?)```", README.read_text(), re.S)
        self.assertGreaterEqual(len(blocks), 3)
        env = dict(os.environ, PYTHONPATH=str(README.parent))
        for i, code in enumerate(blocks):
            code = code.replace("127.0.0.1:7070", n.addr).replace("127.0.0.1:7443", t.tls_addr)
            r = subprocess.run(
                [sys.executable, "-c", code], cwd=work, env=env, capture_output=True, text=True, timeout=60
            )
            self.assertEqual(r.returncode, 0, "README example %d:\n%s\n%s" % (i + 1, code, r.stderr))

    def test_semaphore_limit(self) -> None:
        n = self.node()
        a, b, c = (self.client([n.addr]) for _ in range(3))
        la = a.acquire("pool", lease=30, wait=5, limit=2)
        lb = b.acquire("pool", lease=30, wait=5, limit=2)
        self.assertLess(la.token, lb.token)
        h = a.inspect("pool")
        self.assertEqual((h.token, h.holders, h.limit, h.shared, h.waiters), (la.token, 2, 2, False, 0))
        granted = Asker(c, "pool", limit=2)
        self.assertTrue(until(lambda: a.inspect("pool").waiters == 1), "C never seen waiting")
        self.assertIsNone(granted.lock)
        la.release()
        lc = granted.wait(self)
        self.assertGreater(lc.token, lb.token)
        # Full: B and C hold.
        self.assertIsNone(a.try_acquire("pool", lease=30, limit=2))
        with self.assertRaises(kunci.RefusedError) as cm:
            a.acquire("pool", lease=30, wait=1, limit=3)
        e = cm.exception
        self.assertEqual((e.op, e.key, e.reason), ("A", "pool", "semaphore limit differs"))
        listed = sorted(x.token for x in a.locks(prefix="pool"))
        self.assertEqual(listed, [lb.token, lc.token])
        # B's lease ends by itself (made short, no keep-alive): a place is free.
        lb.extend(0.3)
        self.assertTrue(until(lambda: a.inspect("pool").holders == 1), "B's grant never ended")
        ld = a.try_acquire("pool", lease=30, limit=2)
        self.assertIsNotNone(ld, "no place after B's lease ended")
        assert ld is not None
        self.assertGreater(ld.token, lc.token)
        with self.assertRaises(kunci.StaleError):
            lb.release()
        for lock in (lc, ld):
            lock.release()
        self.assertIsNone(a.inspect("pool"))

    def test_shared_readers(self) -> None:
        n = self.node()
        r1, r2, w, r3 = (self.client([n.addr]) for _ in range(4))
        l1 = r1.acquire("doc", lease=30, wait=5, shared=True)
        l2 = r2.acquire("doc", lease=30, wait=5, shared=True)
        h = r1.inspect("doc")
        self.assertEqual((h.token, h.holders, h.shared, h.limit), (l1.token, 2, True, None))
        writer = Asker(w, "doc")
        self.assertTrue(until(lambda: r1.inspect("doc").waiters == 1), "W never seen waiting")
        reader = Asker(r3, "doc", shared=True)
        self.assertTrue(until(lambda: r1.inspect("doc").waiters == 2), "R3 never seen waiting")
        # A writer queued: a reader may not join the readers that hold.
        self.assertIsNone(r1.try_acquire("doc", lease=30, shared=True))
        l1.release()
        self.assertIsNone(writer.lock)
        l2.release()
        lw = writer.wait(self)
        self.assertGreater(lw.token, max(l1.token, l2.token))
        h = r1.inspect("doc")
        self.assertEqual((h.token, h.holders, h.shared, h.waiters), (lw.token, 1, False, 1))
        self.assertIsNone(reader.lock)
        lw.release()
        l3 = reader.wait(self)
        self.assertGreater(l3.token, lw.token)
        # Run-under-lock in shared mode: it joins R3 at once and is kept
        # alive past its lease (its lease left seen renewed three times).
        with r1.lock("doc", lease=0.6, wait=5, shared=True) as lock:
            self.assertEqual(r1.inspect("doc").holders, 2)
            seen = Renewals(r1, "doc", lock.token)
            self.assertTrue(until(lambda: seen.count() >= 3), "never kept alive")
            self.assertFalse(lock.lost.is_set())
            self.assertIn(lock.token, [x.token for x in r1.locks(prefix="doc")])
        h = r1.inspect("doc")
        self.assertEqual((h.token, h.holders), (l3.token, 1))
        l3.release()

    def test_kind_mismatch(self) -> None:
        n = self.node()
        a, b = self.client([n.addr]), self.client([n.addr])
        held = a.acquire("k", lease=30, wait=5)
        for call in (
            lambda: b.acquire("k", lease=30, wait=1, limit=2),
            lambda: b.try_acquire("k", lease=30, limit=1),
        ):
            with self.assertRaises(kunci.RefusedError) as cm:
                call()
            e = cm.exception
            self.assertEqual((e.op, e.key, e.reason), ("A", "k", "key held as a lock"))
        h = a.inspect("k")
        self.assertEqual((h.token, h.holders, h.limit, h.shared, h.waiters), (held.token, 1, None, False, 0))
        held.release()
        # Now k is a semaphore.
        sem = a.acquire("k", lease=30, wait=5, limit=2)
        for call in (
            lambda: b.acquire("k", lease=30, wait=1),
            lambda: b.acquire("k", lease=30, wait=1, shared=True),
            lambda: b.try_acquire("k", lease=30),
            lambda: b.try_acquire("k", lease=30, shared=True),
        ):
            with self.assertRaises(kunci.RefusedError) as cm:
                call()
            self.assertEqual(cm.exception.reason, "key held as a semaphore")
            self.assertIn("key held as a semaphore", str(cm.exception))
        h = a.inspect("k")
        self.assertEqual((h.token, h.holders, h.limit, h.waiters), (sem.token, 1, 2, 0))
        sem.release()

    def test_inspect_holder(self) -> None:
        n = self.node()
        a, look = self.client([n.addr], owner="billing"), self.client([n.addr])
        self.assertIsNone(look.inspect("free"))
        held = a.acquire("k", lease=30, wait=5)
        waiter = Asker(self.client([n.addr]), "k")
        self.assertTrue(until(lambda: (h := look.inspect("k")) is not None and h.waiters == 1), "B never seen waiting")
        h = look.inspect("k")
        assert h is not None
        self.assertEqual((h.key, h.token, h.owner, h.holders, h.waiters), ("k", held.token, "billing", 1, 1))
        self.assertTrue(h.held)
        self.assertTrue(0 < h.left <= 30, h.left)
        held.release()
        waiter.wait(self).release()
        self.assertIsNone(look.inspect("k"))


class Asker:
    """An acquire in a thread of its own, waiting long."""

    def __init__(self, c: kunci.Client, key: str, **kind: object) -> None:
        self.lock: kunci.Lock | None = None
        self.err: BaseException | None = None

        def run() -> None:
            try:
                self.lock = c.acquire(key, lease=30, wait=WAIT * 2, **kind)  # type: ignore[arg-type]
            except BaseException as e:  # noqa: BLE001 - the test reports it
                self.err = e

        self.t = threading.Thread(target=run, daemon=True)
        self.t.start()

    def wait(self, tc: unittest.TestCase) -> kunci.Lock:
        self.t.join(WAIT * 2)
        tc.assertIsNone(self.err)
        tc.assertIsNotNone(self.lock, "never granted")
        assert self.lock is not None
        return self.lock


class Renewals:
    """Counts the times a grant's lease left, as listed, was seen to rise:
    its extends, when looked at more often than they come."""

    def __init__(self, c: kunci.Client, key: str, token: int) -> None:
        self.c, self.key, self.token = c, key, token
        self.left: float | None = None
        self.seen = 0

    def count(self) -> int:
        left = next((x.left for x in self.c.locks(prefix=self.key) if x.token == self.token), None)
        if left is not None:
            if self.left is not None and left > self.left:
                self.seen += 1
            self.left = left
        return self.seen


class ScenarioList(unittest.TestCase):
    def test_every_scenario_and_no_other(self) -> None:
        """Scenarios has a test_<name> for each scenario of clients/SCENARIOS.md."""
        names = re.findall(r"^\| `([a-z_]+)` \|", SCENARIOS.read_text(), re.M)
        self.assertGreaterEqual(len(names), 11)
        tests = sorted(m[len("test_"):] for m in dir(Scenarios) if m.startswith("test_"))
        self.assertEqual(tests, sorted(names))


if __name__ == "__main__":
    unittest.main()
