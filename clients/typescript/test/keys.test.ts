// The client's keys (session.ts): one acquire of a key in progress at a
// time, the seen it is sent again with, and what a session's listing keeps,
// unit by unit: no node, no connection.

import assert from "node:assert/strict";
import { test } from "node:test";
import { TimeoutError } from "../src/index.js";
import { type Held, Keys } from "../src/session.js";

/** A lock as Keys sees one. */
const held = (token: bigint, until = performance.now() + 60_000): Held => ({ token, heldUntil: () => until });

test("keys: one acquire of a key at a time; what the session's listing keeps", async () => {
  const closing = { closed: false, onClose: () => () => {} };
  const keys = new Keys(5000);
  keys.granted(10n);
  // The first acquire of k takes the turn; a try is busy; another waits.
  const a = keys.enter("k", false);
  assert.ok(a !== undefined && a !== "busy");
  assert.equal(a.seen, 10n);
  assert.equal(keys.enter("k", true), "busy");
  assert.equal(keys.enter("k", false), undefined);
  const b = keys.wait("k", 0, undefined, closing);
  assert.equal(keys.waiting("k"), 1);
  // Before the acquire went out no listed grant of k is its: released.
  assert.equal(keys.keeps("k", 11n), false);
  a.sent = true;
  // Once it went out, a grant above its seen may be its answer: kept.
  assert.equal(keys.keeps("k", 11n), true);
  assert.equal(keys.keeps("k", 9n), false);
  // Granted 12: the next acquire takes its turn with seen 12.
  const l = held(12n);
  keys.granted(12n);
  a.answered = true;
  keys.leave("k", a, l);
  const bs = await b;
  assert.equal(bs.seen, 12n);
  assert.equal(bs.sent, false);
  assert.equal(keys.keeps("k", 12n), true); // a caller holds it
  assert.equal(keys.keeps("k", 13n), false); // not sent yet
  // It goes out and its answer does not come; its caller gives up: k is
  // unresolved, and a grant above its seen listed later is kept for the next
  // acquire of k (sent with seen=); a listing without k resolves it.
  bs.sent = true;
  keys.leave("k", bs);
  assert.equal(bs.unresolved, true);
  assert.equal(keys.keeps("k", 13n), false); // no acquire in progress: released
  const c = keys.enter("k", false);
  assert.ok(c !== undefined && c !== "busy");
  assert.equal(keys.keeps("k", 13n), true);
  c.answered = true;
  keys.leave("k", c);
  assert.equal(c.unresolved, false);
  keys.drop("k", l);
  assert.equal(keys.size, 0);
  // An unresolved key the listing does not show is forgotten.
  const d = keys.enter("j", false) as Exclude<ReturnType<Keys["enter"]>, "busy" | undefined>;
  d.sent = true;
  keys.leave("j", d);
  assert.equal(keys.size, 1);
  keys.resolve(new Set(["other"]));
  assert.equal(keys.size, 0);
});

test("keys: a waiter's wait runs out, its signal aborts, or the client closes", async () => {
  const hooks = new Set<() => void>();
  const closing = { closed: false, onClose: (fn: () => void) => (hooks.add(fn), () => hooks.delete(fn)) };
  const keys = new Keys(5000);
  const a = keys.enter("k", false);
  assert.ok(a !== undefined && a !== "busy");
  keys.enter("k", false);
  await assert.rejects(keys.wait("k", performance.now() + 50, undefined, closing), TimeoutError);
  const ac = new AbortController();
  const aborted = keys.wait("k", 0, ac.signal, closing);
  ac.abort(new Error("gave up"));
  await assert.rejects(aborted, /gave up/);
  const closed = keys.wait("k", 0, undefined, closing);
  for (const h of hooks) h();
  await assert.rejects(closed, /closed/);
  assert.equal(keys.waiting("k"), 0);
  keys.leave("k", a);
  assert.equal(keys.size, 0);
});

test("keys: locks whose leases ran out unreleased are forgotten", () => {
  const keys = new Keys(1000);
  const past = performance.now() - 5000;
  keys.hold("old", held(1n, past));
  for (let i = 0; i < 1024; i++) keys.hold(`k${i}`, held(BigInt(i + 2)));
  assert.equal(keys.size, 1024); // old swept on the 1024th grant recorded
  assert.equal(keys.keeps("old", 1n), false);
});
