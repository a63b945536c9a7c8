// Unit tests of the pure parts: the checks made before sending, the request
// lines, the answer parser, the credentials file.

import assert from "node:assert/strict";
import { chmodSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { test } from "node:test";
import { loadCredentials } from "../src/credentials.js";
import { BadInputError } from "../src/errors.js";
import {
  BadAnswerError,
  MAX_U64,
  acquireLine,
  extendLine,
  keyProblem,
  kindOf,
  leaseMs,
  listLine,
  parseAnswer,
  parseSeconds,
  parseU64,
  seconds,
  splitAddr,
  validOwner,
  waitMs,
} from "../src/protocol.js";
import { processOwner } from "../src/client.js";
import { tempDir } from "./harness.js";

test("keys: the node's rules, in UTF-8 bytes", () => {
  for (const ok of ["k", "orders/42", "x".repeat(250), "é".repeat(125), "日本", "a=b", "~!", "😀"]) assert.equal(keyProblem(ok), "", ok);
  const bad: Array<[unknown, RegExp]> = [
    ["", /empty/],
    ["a b", /space/],
    ["a\tb", /control/],
    ["a\nb", /control/],
    ["a\rb", /control/],
    ["a\u007fb", /control/],
    ["\u0000", /control/],
    ["x".repeat(251), /251 bytes, over 250/],
    ["é".repeat(126), /252 bytes/],
    ["a\ud800b", /surrogate/],
    ["\udc00", /surrogate/],
    [42, /string/],
    [undefined, /string/],
  ];
  for (const [k, re] of bad) assert.match(keyProblem(k), re, String(k));
});

test("leases and waits in milliseconds", () => {
  assert.equal(leaseMs(30_000), 30_000);
  assert.equal(leaseMs(0.2), 1); // rounded up: never shorter than asked
  for (const bad of [0, -1, Number.NaN, Infinity, "30", null, undefined, 2 ** 60]) assert.throws(() => leaseMs(bad), BadInputError, String(bad));
  assert.equal(waitMs(0), 0);
  assert.equal(waitMs(1.5), 2);
  for (const bad of [-1, -0.5, Number.NaN, Infinity, "5"]) assert.throws(() => waitMs(bad), BadInputError, String(bad));
});

test("seconds on the wire", () => {
  const cases: Array<[number, string]> = [[30_000, "30"], [500, "0.5"], [2125, "2.125"], [1, "0.001"], [10, "0.01"], [28_140, "28.14"], [0, "0"], [86_400_000, "86400"]];
  for (const [ms, s] of cases) {
    assert.equal(seconds(ms), s);
    assert.equal(parseSeconds(s), ms);
  }
  assert.equal(parseSeconds("007"), 7000);
  for (const bad of ["", "5.", ".5", "1.2345", "-1", "1e3", "1 "]) assert.equal(parseSeconds(bad), -1, bad);
});

test("request lines", () => {
  assert.equal(acquireLine("k", 30_000, 5000, ""), "A k 30 5\n");
  assert.equal(acquireLine("k", 1500, "-", "web-3:4121"), "A k 1.5 - owner=web-3:4121\n");
  assert.equal(acquireLine("k", 1000, 0, ""), "A k 1 0\n");
  assert.equal(acquireLine("pool", 30_000, 5000, "", { limit: 2, shared: false }), "A pool 30 5 limit=2\n");
  assert.equal(acquireLine("doc", 30_000, "-", "w:1", { limit: 0, shared: true }), "A doc 30 - owner=w:1 mode=shared\n");
  assert.equal(acquireLine("k", 1000, 0, "", { limit: 0, shared: false }), "A k 1 0\n");
  assert.equal(extendLine("k", MAX_U64, 250), "X k 18446744073709551615 0.25\n");
  assert.equal(listLine(0n, ""), "L 0\n");
  assert.equal(listLine(100n, "orders/"), "L 100 orders/\n");
});

test("kinds of lock: a semaphore's limit, a shared grant, never both", () => {
  assert.deepEqual(kindOf(undefined, undefined), { limit: 0, shared: false });
  assert.deepEqual(kindOf(undefined, true), { limit: 0, shared: true });
  assert.deepEqual(kindOf(undefined, false), { limit: 0, shared: false });
  assert.deepEqual(kindOf(1, undefined), { limit: 1, shared: false });
  assert.deepEqual(kindOf(1024, false), { limit: 1024, shared: false });
  assert.deepEqual(kindOf(2 ** 32 - 1, undefined), { limit: 2 ** 32 - 1, shared: false });
  const bad: Array<[unknown, unknown, RegExp]> = [
    [0, undefined, /limit must be a whole number from 1/],
    [-1, undefined, /limit must be/],
    [1.5, undefined, /limit must be/],
    [Number.NaN, undefined, /limit must be/],
    [Infinity, undefined, /limit must be/],
    [2 ** 32, undefined, /limit must be/],
    ["2", undefined, /limit must be/],
    [null, undefined, /limit must be/],
    [2, true, /limit and shared together/],
    [undefined, "yes", /shared must be true or false/],
  ];
  for (const [limit, shared, re] of bad) {
    assert.throws(() => kindOf(limit, shared), (e: unknown) => {
      assert.ok(e instanceof BadInputError, String(e));
      assert.match(e.message, re);
      return true;
    }, `${String(limit)} ${String(shared)}`);
  }
});

test("tokens are exact unsigned 64-bit numbers", () => {
  assert.equal(parseU64("18446744073709551615"), MAX_U64);
  assert.equal(parseU64("9007199254740993"), 9007199254740993n); // above 2^53: exact
  assert.equal(parseU64("0007"), 7n);
  for (const bad of ["18446744073709551616", "-1", "", "1x", "1 "]) assert.equal(parseU64(bad), -1n, bad);
  assert.equal(parseAnswer("A k 9223372036854775807").token, 9223372036854775807n);
});

test("answers", () => {
  assert.deepEqual(pick(parseAnswer("A orders/42 1001"), "kind", "key", "token"), { kind: "A", key: "orders/42", token: 1001n });
  assert.deepEqual(pick(parseAnswer("T k"), "kind", "key"), { kind: "T", key: "k" });
  assert.equal(parseAnswer("R k OK").ok, true);
  assert.equal(parseAnswer("R k STALE").ok, false);
  assert.equal(parseAnswer("X k OK\r").ok, true);
  assert.equal(parseAnswer("C k NONE").ok, false);
  assert.deepEqual(pick(parseAnswer("Q k 7 27.3 2 owner=web-3:4121 later=1"), "token", "leftMs", "waiters", "owner"), {
    token: 7n, leftMs: 27_300, waiters: 2, owner: "web-3:4121",
  });
  assert.equal(parseAnswer("Q k FREE").token, 0n);
  const kinds = (line: string) => pick(parseAnswer(line), "holders", "limit", "shared");
  assert.deepEqual(kinds("Q k 7 27.3 2 owner=web-3:4121"), { holders: 1, limit: 0, shared: false });
  assert.deepEqual(kinds("Q pool/db 1003 29.1 1 holders=2 limit=2"), { holders: 2, limit: 2, shared: false });
  assert.deepEqual(kinds("H doc/7 1006 29.8 1 owner=r:1 holders=2 mode=shared later=1"), { holders: 2, limit: 0, shared: true });
  assert.deepEqual(kinds("Q k 7 1 0 mode=exclusive"), { holders: 1, limit: 0, shared: false });
  assert.deepEqual(pick(parseAnswer("H a/b 3 0 0"), "kind", "key", "token"), { kind: "H", key: "a/b", token: 3n });
  assert.deepEqual(pick(parseAnswer("L 2 more"), "count", "more"), { count: 2n, more: true });
  assert.deepEqual(pick(parseAnswer("L 0"), "count", "more"), { count: 0n, more: false });
  assert.deepEqual(pick(parseAnswer("E A k wait too long (max 86400)"), "op", "key", "text"), { op: "A", key: "k", text: "wait too long (max 86400)" });
  assert.deepEqual(pick(parseAnswer("E - - idle"), "op", "key", "text"), { op: "", key: "", text: "idle" });
  assert.equal(parseAnswer("M 10.0.0.2:7070").text, "10.0.0.2:7070");
  assert.equal(parseAnswer("M -").text, "");
  assert.deepEqual(pick(parseAnswer("I standby n2:7070 - state=promoting x=y"), "role", "self", "active", "state"), {
    role: "standby", self: "n2:7070", active: "", state: "promoting",
  });
  assert.equal(parseAnswer("U OK").ok, true);
  for (const bad of ["", "A", "A k", "A k 0", "A k -1", "A k x", "T k x", "R k MAYBE", "C k STALE", "Q k 1 2", "Q k", "Q k 1 2 0 holders=0", "Q k 1 2 0 holders=x limit=2", "Q k 1 2 0 holders=2 limit=-1", "H k 1 2 0 holders=4294967296 mode=shared", "L x", "L 1 less", "E A", "E A k", "U NO", "M a b", "I active", "Z k", "Ak 1"]) {
    assert.throws(() => parseAnswer(bad), BadAnswerError, JSON.stringify(bad));
  }
});

test("addresses, owners", () => {
  assert.deepEqual(splitAddr("127.0.0.1:7070"), { host: "127.0.0.1", port: 7070 });
  assert.deepEqual(splitAddr("[::1]:7070"), { host: "::1", port: 7070 });
  assert.deepEqual(splitAddr("node1:1"), { host: "node1", port: 1 });
  for (const bad of ["", "7070", ":7070", "host:", "host:0", "host:65536", "host:x", "::1:7070", 7070]) assert.throws(() => splitAddr(bad), BadInputError, String(bad));
  assert.ok(validOwner("web-3:4121"));
  for (const bad of ["", "a b", "x".repeat(65), "é", "a\n"]) assert.ok(!validOwner(bad), bad);
  const o = processOwner();
  assert.ok(validOwner(o), o);
  assert.match(o, new RegExp(`:${process.pid}$`));
});

test("credentials file: the Go client's format", (t) => {
  const d = tempDir(t);
  const f = (name: string, text: string, mode = 0o600) => {
    const p = join(d, name);
    writeFileSync(p, text);
    chmodSync(p, mode);
    return p;
  };
  assert.deepEqual(loadCredentials(f("ok", "# mine\n\n  alice   s3cret  \n")), { name: "alice", secret: "s3cret" });
  const refused: Array<[string, RegExp]> = [
    [f("open", "alice s3cret\n", 0o644), /group or others.*chmod 600/],
    [f("two", "alice s3cret\nbob zz-hidden\n"), /line 2: a second credential/],
    [f("three", "alice s3cret extra\n"), /line 1: 3 fields/],
    [f("none", "# nothing\n"), /no "name secret" line/],
    [join(d, "missing"), /credentials file/],
  ];
  for (const [p, re] of refused) {
    assert.throws(() => loadCredentials(p), (e: unknown) => {
      assert.ok(e instanceof BadInputError);
      assert.match(e.message, re);
      assert.doesNotMatch(e.message, /s3cret|zz-hidden/);
      return true;
    });
  }
});

function pick<T extends object, K extends keyof T>(o: T, ...keys: K[]): Pick<T, K> {
  return Object.fromEntries(keys.map((k) => [k, o[k]])) as Pick<T, K>;
}
