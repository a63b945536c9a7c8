// Semaphores and read-write locks against real kuncid processes, beyond the
// shared scenarios (semaphore_limit, shared_readers, kind_mismatch): the
// node's --max-holders, and readers granted together from a queue.

import assert from "node:assert/strict";
import { test } from "node:test";
import { type Client, type Lock, RefusedError } from "../src/index.js";
import { WAIT_MS, client, httpGet, startNode, waitFor } from "./harness.js";

const T = { timeout: 60_000 };

test("a limit over --max-holders is refused with the node's maximum", T, async (t) => {
  const n = await startNode(t, ["--max-holders", "4"]);
  const c = client(t, { addrs: [n.addr] });
  await assert.rejects(c.acquire("pool", { leaseMs: 30_000, waitMs: WAIT_MS, limit: 5 }), (e: unknown) => {
    assert.ok(e instanceof RefusedError, String(e));
    assert.equal(e.reason, "limit too high (max 4)");
    return true;
  });
  assert.equal(await c.inspect("pool"), null);
  const l = await c.acquire("pool", { leaseMs: 30_000, limit: 4 });
  assert.equal((await c.inspect("pool"))?.limit, 4);
  await l.release();
});

test("shared grants past --max-holders wait for a place", T, async (t) => {
  const n = await startNode(t, ["--max-holders", "2"]);
  const [a, b, c, look] = [0, 1, 2, 3].map(() => client(t, { addrs: [n.addr] }));
  const read = { leaseMs: 30_000, waitMs: WAIT_MS * 2, shared: true };
  const l1 = await a!.acquire("doc", read);
  const l2 = await b!.acquire("doc", read);
  assert.equal(await look!.tryAcquire("doc", { leaseMs: 30_000, shared: true }), null);
  const p3 = c!.acquire("doc", read);
  await waitFor("the third reader seen waiting", async () => (await look!.inspect("doc"))?.waiters === 1);
  await l1.release();
  const l3 = await p3;
  assert.ok(l3.token > l2.token);
  const h = await look!.inspect("doc");
  assert.deepEqual(h && { token: h.token, holders: h.holders, shared: h.shared }, { token: l2.token, holders: 2, shared: true });
  await l2.release();
  await l3.release();
});

test("readers queued behind a writer are granted together when it releases, up to the next writer", T, async (t) => {
  const n = await startNode(t);
  const [w1, r1, r2, w2, r3, look] = [0, 1, 2, 3, 4, 5].map(() => client(t, { addrs: [n.addr] }));
  const read = { leaseMs: 30_000, waitMs: WAIT_MS * 2, shared: true };
  const write = { leaseMs: 30_000, waitMs: WAIT_MS * 2 };
  const lw1 = await w1!.acquire("doc", write);
  const granted: string[] = [];
  const ask = async (who: string, cl: Client, opts: typeof read | typeof write, waiters: number) => {
    const p = cl.acquire("doc", opts).then((l) => {
      granted.push(who);
      return l;
    });
    await waitFor(`${who} seen waiting`, async () => (await look!.inspect("doc"))?.waiters === waiters);
    return { p }; // not p itself: an async function's promise would wait for the grant
  };
  const { p: p1 } = await ask("R1", r1!, read, 1);
  const { p: p2 } = await ask("R2", r2!, read, 2);
  const { p: pw2 } = await ask("W2", w2!, write, 3);
  const { p: p3 } = await ask("R3", r3!, read, 4);

  await lw1.release();
  const [l1, l2] = await Promise.all([p1, p2]);
  assert.ok(l1.token > lw1.token && l2.token > l1.token, `W1 ${lw1.token}, R1 ${l1.token}, R2 ${l2.token}`);
  const h = await look!.inspect("doc");
  assert.deepEqual(h && { token: h.token, holders: h.holders, shared: h.shared, waiters: h.waiters }, {
    token: l1.token, holders: 2, shared: true, waiters: 2,
  });
  const listed = (await look!.locks({ prefix: "doc" })).locks;
  assert.deepEqual(listed.map((l) => l.token).sort(), [l1.token, l2.token].sort());
  assert.ok(listed.every((l) => l.shared && l.holders === 2 && l.limit === undefined));
  assert.deepEqual(granted, ["R1", "R2"]);

  await l1.release();
  await l2.release();
  const lw2: Lock = await pw2;
  assert.ok(lw2.token > l2.token);
  assert.deepEqual(granted, ["R1", "R2", "W2"]);
  await lw2.release();
  const l3 = await p3;
  assert.ok(l3.token > lw2.token);
  await l3.release();
  assert.equal(await look!.inspect("doc"), null);
});

test("a try while an acquire of the key is in progress is busy unsent; once it is answered, tries are granted beside it", T, async (t) => {
  // A client has one acquire of a key in progress at a time (so that an
  // acquire sent again with seen= is answered its own earlier grant, never
  // another acquire's: session.ts). A try of a semaphore or of a shared
  // grant made while one is outstanding is answered null without being
  // sent; once that acquire is answered, tries are granted beside it.
  const n = await startNode(t, []);
  const c = client(t, { addrs: [n.addr] });
  await c.inspect("warm");
  await waitFor("both connections up", async () => /^kunci_connections 2$/m.test(await httpGet(n.admin, "/metrics")));
  for (const [key, kind] of [["pool", { limit: 3 }], ["doc", { shared: true }]] as const) {
    const first = c.acquire(key, { leaseMs: 30_000, waitMs: WAIT_MS, ...kind });
    const tried = await Promise.all([0, 1, 2, 3].map(() => c.tryAcquire(key, { leaseMs: 30_000, ...kind })));
    assert.deepEqual(tried, [null, null, null, null], `${key}: tries beside the acquire in progress`);
    const l1 = await first;
    const h = await c.inspect(key);
    assert.equal(h?.holders, 1, `${key}: the tries went out`);
    const l2 = await c.tryAcquire(key, { leaseMs: 30_000, ...kind });
    assert.ok(l2 !== null, `${key}: a try beside the grant answered held`);
    assert.equal((await c.inspect(key))?.holders, 2);
    await l1.release();
    await l2.release();
  }
});
