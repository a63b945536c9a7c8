"""Validation, encoding and parsing: no node needed."""

from __future__ import annotations

import os
import tempfile
import unittest

import kunci
from kunci import _wire as wire


class Validation(unittest.TestCase):
    def test_keys(self) -> None:
        for ok in ("k", "orders/42", "k" * 250, "ключ", "é" * 125):
            self.assertEqual(wire.check_key(ok), ok.encode())
        for bad in ("", "a b", "k" * 251, "é" * 126, "k\x00", "k\x7f", "k\t", "k\n", "k\r"):
            with self.assertRaises(ValueError, msg=repr(bad)):
                wire.check_key(bad)
        with self.assertRaises(TypeError):
            wire.check_key(b"bytes")  # type: ignore[arg-type]

    def test_seconds(self) -> None:
        self.assertEqual(wire.lease_ms(30), 30000)
        self.assertEqual(wire.lease_ms(0.3), 300)
        self.assertEqual(wire.lease_ms(0.0001), 1)  # rounded up, never shorter
        self.assertEqual(wire.lease_ms(2.1251), 2126)
        self.assertEqual(wire.wait_ms(0), 0)
        self.assertEqual(wire.wait_ms(0.5), 500)
        # A positive wait, however short, is bounded: never 0, which means
        # "no bound of its own" (up to the node's --max-wait).
        self.assertEqual(wire.wait_ms(5e-13), 1)
        self.assertEqual(wire.wait_ms(1e-300), 1)
        for bad in (0, -1, float("nan"), float("inf"), 1e300, 2**1024):
            with self.assertRaises(ValueError, msg=repr(bad)):
                wire.lease_ms(bad)
        for bad in (-0.001, float("nan"), float("-inf"), 2**1024):
            with self.assertRaises(ValueError, msg=repr(bad)):
                wire.wait_ms(bad)
        for wrong in ("30", None, True):
            with self.assertRaises(TypeError):
                wire.lease_ms(wrong)  # type: ignore[arg-type]

    def test_owner_token_limit(self) -> None:
        self.assertEqual(wire.check_owner("web-3:4121"), b"web-3:4121")
        for bad in ("", "a b", "x" * 65, "é", "a\x01"):
            with self.assertRaises(ValueError):
                wire.check_owner(bad)
        self.assertEqual(wire.check_token(2**64 - 1), 2**64 - 1)
        for n in (0, -1, 2**64, True):
            with self.assertRaises(ValueError):
                wire.check_token(n)
        for n in (-1, 2**64):
            with self.assertRaises(ValueError):
                wire.check_limit(n)

    def test_kinds(self) -> None:
        self.assertEqual(wire.kind_field(None, False), b"")
        self.assertEqual(wire.kind_field(None, True), b"mode=shared")
        self.assertEqual(wire.kind_field(1, False), b"limit=1")
        self.assertEqual(wire.kind_field(1024, False), b"limit=1024")
        self.assertEqual(wire.kind_field(2**32 - 1, False), b"limit=4294967295")
        for limit, shared, want in (
            (2, True, "cannot go together"), (0, False, "from 1 to"), (-3, False, "from 1 to"),
            (2**32, False, "from 1 to"),
        ):
            with self.assertRaises(ValueError, msg=repr((limit, shared))) as cm:
                wire.kind_field(limit, shared)
            self.assertIn(want, str(cm.exception))
        for wrong in ("2", 2.0, True):
            with self.assertRaises(TypeError, msg=repr(wrong)):
                wire.kind_field(wrong, False)  # type: ignore[arg-type]
        with self.assertRaises(TypeError):
            wire.kind_field(None, "yes")  # type: ignore[arg-type]

    def test_addresses(self) -> None:
        self.assertEqual(wire.split_addr("127.0.0.1:7070"), ("127.0.0.1", 7070))
        self.assertEqual(wire.split_addr("[::1]:7070"), ("::1", 7070))
        for bad in ("127.0.0.1", ":7070", "h:0", "h:70000", "h:x"):
            with self.assertRaises(ValueError):
                wire.split_addr(bad)
        with self.assertRaises(TypeError):
            kunci.Client("127.0.0.1:7070")  # type: ignore[arg-type]
        with self.assertRaises(ValueError):
            kunci.Client([])


class Encoding(unittest.TestCase):
    def test_lines(self) -> None:
        self.assertEqual(wire.acquire_line(b"k", 30000, 5000, None), b"A k 30 5\n")
        self.assertEqual(wire.acquire_line(b"k", 500, 0, b"web-3:1"), b"A k 0.5 0 owner=web-3:1\n")
        self.assertEqual(wire.acquire_line(b"k", 2125, None, None), b"A k 2.125 -\n")
        self.assertEqual(wire.acquire_line(b"k", 1, 10, None), b"A k 0.001 0.01\n")
        self.assertEqual(wire.acquire_line(b"pool", 30000, 0, None, b"limit=2"), b"A pool 30 0 limit=2\n")
        self.assertEqual(
            wire.acquire_line(b"doc", 30000, None, b"web-3:1", b"mode=shared"),
            b"A doc 30 - owner=web-3:1 mode=shared\n",
        )
        self.assertEqual(wire.release_line(b"k", 2**64 - 1), b"R k 18446744073709551615\n")
        self.assertEqual(wire.extend_line(b"k", 7, 60000), b"X k 7 60\n")
        self.assertEqual(wire.list_line(10, b"orders/"), b"L 10 orders/\n")
        self.assertEqual(wire.list_line(0, None), b"L 0\n")
        self.assertEqual(wire.cancel_line(b"k"), b"C k\n")
        self.assertEqual(wire.inspect_line(b"k"), b"Q k\n")
        self.assertEqual(wire.session_line(7239014414582019), b"S 7239014414582019\n")
        # An acquire of a session sent again: seen= last, after the kind.
        self.assertEqual(wire.acquire_line(b"k", 30000, 5000, None, seen=0), b"A k 30 5 seen=0\n")
        self.assertEqual(
            wire.acquire_line(b"pool", 30000, 2500, b"web-3:1", b"limit=2", 2**64 - 1),
            b"A pool 30 2.5 owner=web-3:1 limit=2 seen=18446744073709551615\n",
        )
        self.assertEqual(
            wire.acquire_line(b"k", 30000, None, None, b"mode=shared", 7), b"A k 30 - mode=shared seen=7\n"
        )

    def test_session(self) -> None:
        """Sessions are 63 random bits, never 0: each client its own."""
        from kunci._session import new_session
        drawn = {new_session() for _ in range(64)}
        self.assertEqual(len(drawn), 64)
        self.assertTrue(all(0 < s < 2**63 for s in drawn), drawn)


class Parsing(unittest.TestCase):
    def test_answers(self) -> None:
        a = wire.parse_answer(b"A orders/42 18446744073709551615")
        self.assertEqual((a.kind, a.key, a.token), ("A", b"orders/42", 2**64 - 1))
        self.assertEqual(wire.parse_answer(b"T k").kind, "T")
        self.assertTrue(wire.parse_answer(b"R k OK").ok)
        self.assertFalse(wire.parse_answer(b"R k STALE").ok)
        self.assertFalse(wire.parse_answer(b"C k NONE").ok)
        q = wire.parse_answer(b"Q orders/42 1002 27.3 1 owner=web-3:4121 future=x")
        self.assertEqual(q.holder, wire.Holder("orders/42", 1002, 27.3, 1, "web-3:4121"))
        self.assertFalse(wire.parse_answer(b"Q k FREE").holder.held)  # type: ignore[union-attr]
        h = wire.parse_answer(b"H k 3 0.001 0")
        self.assertEqual(h.holder, wire.Holder("k", 3, 0.001, 0))
        self.assertEqual(wire.Holder("k", 3).holders, 1)
        self.assertEqual(wire.parse_answer(b"Q k FREE").holder, wire.Holder("k", holders=0))
        q = wire.parse_answer(b"Q pool/db 1003 29.1 1 holders=2 limit=2")
        self.assertEqual(q.holder, wire.Holder("pool/db", 1003, 29.1, 1, holders=2, limit=2))
        h = wire.parse_answer(b"H doc/7 1006 29.8 1 owner=r1 holders=2 mode=shared later=1")
        self.assertEqual(h.holder, wire.Holder("doc/7", 1006, 29.8, 1, "r1", holders=2, shared=True))
        h = wire.parse_answer(b"H k 9 1 0 mode=exclusive")
        self.assertEqual(h.holder, wire.Holder("k", 9, 1.0, 0, holders=1))
        ln = wire.parse_answer(b"L 2 more")
        self.assertEqual((ln.count, ln.more), (2, True))
        sn = wire.parse_answer(b"S 3")
        self.assertEqual((sn.kind, sn.count, sn.more), ("S", 3, False))
        e = wire.parse_answer(b"E S 7239014414582019 unknown op")
        self.assertEqual((e.op, e.key, e.reason), ("S", b"7239014414582019", "unknown op"))
        e = wire.parse_answer(b"E A orders/42 lease too long (max 86400)")
        self.assertEqual((e.op, e.key, e.reason), ("A", b"orders/42", "lease too long (max 86400)"))
        e = wire.parse_answer(b"E - - idle")
        self.assertEqual((e.op, e.key, e.reason), ("", b"", "idle"))
        i = wire.parse_answer(b"I standby node2:7070 node1:7070 state=promoting")
        self.assertEqual(
            (i.role, i.self_addr, i.active, i.extra), ("standby", "node2:7070", "node1:7070", {"state": "promoting"})
        )
        self.assertEqual(wire.parse_answer(b"I active n:1 -").active, "")
        self.assertEqual(wire.parse_answer(b"M node1:7070").addr, "node1:7070")
        self.assertEqual(wire.parse_answer(b"M -").addr, "")
        self.assertTrue(wire.parse_answer(b"U OK").ok)

    def test_bad_answers(self) -> None:
        for bad in (b"", b"A", b"Ak 1", b"A k", b"A k x", b"A k 18446744073709551616", b"R k MAYBE",
                    b"C k STALE", b"Q k 1 2", b"Q k 1 x 0", b"Q k 1 1.0001 0", b"L x", b"L 1 less",
                    b"E A k", b"T k x", b"Z k", b"U NO", b"I active", b"Q k 1 1 0 holders=x",
                    b"Q k 1 1 0 holders=2 limit=-1", b"S x", b"S 1 more", b"S -1"):
            with self.assertRaises(wire.BadAnswer, msg=repr(bad)):
                wire.parse_answer(bad)


class CredentialsFile(unittest.TestCase):
    def write(self, text: str, mode: int = 0o600) -> str:
        fd, p = tempfile.mkstemp()
        self.addCleanup(os.remove, p)
        with os.fdopen(fd, "w") as f:
            f.write(text)
        os.chmod(p, mode)
        return p

    def test_load(self) -> None:
        c = kunci.load_credentials(self.write("# ours\n\nbilling  s3cret-s3cret-s3cret\n"))
        self.assertEqual((c.name, c.secret), ("billing", "s3cret-s3cret-s3cret"))
        self.assertNotIn("s3cret", repr(c))
        for text, mode, want in (
            ("billing s3cret\n", 0o644, "chmod 600"),
            ("billing\n", 0o600, "1 fields"),
            ("a b\nc d\n", 0o600, "a second credential"),
            ("# nothing\n", 0o600, "holds no"),
        ):
            with self.assertRaises(ValueError) as cm:
                kunci.load_credentials(self.write(text, mode))
            self.assertIn(want, str(cm.exception))
            self.assertNotIn("s3cret", str(cm.exception))

    def test_process_owner(self) -> None:
        o = kunci.process_owner()
        self.assertEqual(wire.check_owner(o), o.encode())
        self.assertTrue(o.endswith(":%d" % os.getpid()))


if __name__ == "__main__":
    unittest.main()
