// The client's matching and retry rules, against a scripted node: a TCP
// server on 127.0.0.1:0 whose answers the test writes, so that it can answer
// out of order, cut connections, or stay silent.

import assert from "node:assert/strict";
import type * as net from "node:net";
import { test } from "node:test";
import { Call } from "../src/call.js";
import { Client, RefusedError, StaleError, UnavailableError } from "../src/index.js";
import { ScriptedNode, waitFor } from "./harness.js";

interface Line {
  conn: net.Socket;
  line: string;
}

/**
 * A scripted node: every line received is handed to onLine, with its
 * connection; but the client's session, first on every connection ("S
 * session"), is answered by onSession (default: a node that holds nothing for
 * it) and kept in sessions, not lines: it is not a request that counts.
 */
class Scripted extends ScriptedNode {
  readonly lines: Line[] = [];
  readonly sessions: Line[] = [];
  onLine: (l: Line) => void = () => {};
  onSession: (l: Line) => void = (l) => l.conn.write("S 0\n");
  protected override received(conn: net.Socket, line: string): void {
    const l = { conn, line };
    if (line.startsWith("S ")) {
      this.sessions.push(l);
      this.onSession(l);
      return;
    }
    this.lines.push(l);
    this.onLine(l);
  }
}

test("answers are matched by op and key, in send order for equal pairs", async (t) => {
  const node = await new Scripted().start(t);
  const c = new Client({ addrs: [node.addr, node.addr] });
  t.after(() => c.close());
  const held: Line[] = [];
  node.onLine = (l) => held.push(l);
  // Pipelined in one turn: all on one connection, in one write.
  const r1 = c.adopt("k", 5n, 1000).release();
  const r2 = c.adopt("k", 6n, 1000).release();
  const qa = c.inspect("a");
  const qb = c.inspect("b");
  await waitFor("four requests", () => held.length === 4);
  assert.deepEqual(held.map((l) => l.line), ["R k 5", "R k 6", "Q a", "Q b"]);
  assert.equal(new Set(held.map((l) => l.conn)).size, 1);
  // Answered across keys out of order; R k OK answers the first R k.
  held[0]!.conn.write("Q b 9 1 0\nR k OK\nQ a FREE\nR k STALE\n");
  await r1;
  await assert.rejects(r2, StaleError);
  assert.equal(await qa, null);
  assert.equal((await qb)?.token, 9n);
});

test("an acquire whose connection breaks goes on on another with the wait it has left", async (t) => {
  const node = await new Scripted().start(t);
  const c = new Client({ addrs: [node.addr] });
  t.after(() => c.close());
  let first = true;
  node.onLine = (l) => {
    if (!l.line.startsWith("A ")) return;
    if (first) {
      first = false;
      setTimeout(() => l.conn.destroy(), 300); // breaks with the acquire queued
    } else l.conn.write("A k 77\n");
  };
  const lock = await c.acquire("k", { leaseMs: 30_000, waitMs: 5000 });
  assert.equal(lock.token, 77n);
  const acquires = node.lines.filter((l) => l.line.startsWith("A ")).map((l) => l.line);
  assert.equal(acquires.length, 2);
  const wait = (i: number) => Number(acquires[i]!.split(" ")[3]);
  assert.ok(wait(0) <= 5 && wait(0) > 4.5, acquires[0]);
  assert.ok(wait(1) <= wait(0) - 0.25 && wait(1) > 0, `sent again with ${wait(1)} s left`);
  assert.notEqual(node.lines[0]!.conn, node.lines[1]!.conn);
  // Sent again, it says so: seen= the highest token the client had been
  // answered (none), so that a node that granted the first attempt answers
  // this one that grant (docs/PROTOCOL.md, Sessions).
  assert.doesNotMatch(acquires[0]!, /seen=/);
  assert.match(acquires[1]!, / seen=0$/);
});

test("a try fails after one attempt per connection", async (t) => {
  const node = await new Scripted().start(t);
  const c = new Client({ addrs: [node.addr] });
  t.after(() => c.close());
  node.onLine = (l) => l.conn.destroy(); // every request breaks its connection
  await assert.rejects(c.tryAcquire("k", { leaseMs: 1000 }), UnavailableError);
  assert.equal(node.lines.length, 2);
});

test("a second acquirer of a key waits its turn in the client, whatever the connection", async (t) => {
  const node = await new Scripted().start(t);
  const c = new Client({ addrs: [node.addr] });
  t.after(() => c.close());
  const held: Line[] = [];
  node.onLine = (l) => held.push(l);
  // One acquire of a key is in progress at a time, client-wide: the first is
  // sent, the others wait inside the client, in order, until the one before
  // is answered (each may go on either connection).
  const ps = [1, 2, 3].map(() => c.acquire("k", { leaseMs: 1000, waitMs: 10_000 }));
  for (let i = 1; i <= 3; i++) {
    await waitFor(`acquire ${i}`, () => held.length === i);
    await new Promise((res) => setTimeout(res, 20));
    assert.equal(held.length, i, "an acquire of k went out while another was in progress");
    held[i - 1]!.conn.write(`A k ${i}\n`);
  }
  const tokens = (await Promise.all(ps)).map((l) => l.token);
  assert.deepEqual(tokens, [1n, 2n, 3n]);
  // Each a first attempt: no seen=.
  for (const l of held) assert.match(l.line, /^A k 1 [0-9.]+$/);
});

test("an aborted acquire is withdrawn with C", async (t) => {
  const node = await new Scripted().start(t);
  const c = new Client({ addrs: [node.addr] });
  t.after(() => c.close());
  node.onLine = (l) => {
    if (l.line === "C k") l.conn.write("T k\nC k OK\n");
  };
  const ac = new AbortController();
  const p = c.acquire("k", { leaseMs: 1000, signal: ac.signal });
  await waitFor("the acquire", () => node.lines.length === 1);
  ac.abort(new Error("no longer wanted"));
  await assert.rejects(p, /no longer wanted/);
  assert.deepEqual(node.lines.map((l) => l.line), ["A k 1 0", "C k"]);
});

test("a connection carries one acquire of a key at a time, and withdraws only the one outstanding (Conn's gate)", async (t) => {
  const node = await new Scripted().start(t);
  const c = new Client({ addrs: [node.addr] });
  t.after(() => c.close());
  const cn = c.conns[0]!;
  await waitFor("the connection", () => cn.usable);
  const k1 = cn.acquire("k", "A k 1 0\n");
  // A second acquire of k would take the first's answer: the gate refuses
  // it, also one sent around it.
  assert.throws(() => cn.acquire("k", "A k 1 0\n"), /a second acquire of "k" on one connection/);
  assert.throws(() => cn.send(new Call("A", "k"), "A k 1 0\n"), /sent around the gate/);
  const j = cn.acquire("j", "A j 1 0\n"); // another key's
  await waitFor("two acquires", () => node.lines.length === 2);
  // Answered, the acquire of k has left the gate: withdrawing it sends no C
  // (which would withdraw the next acquire of k), and the next one goes out.
  node.lines[0]!.conn.write("A k 5\n");
  const r1 = await k1.promise;
  assert.equal(r1.kind === "answer" && r1.a.token, 5n);
  assert.equal(await cn.withdraw(k1), r1);
  cn.acquire("k", "A k 1 0\n");
  // Still outstanding, j's is withdrawn with C j, and gets its own answer.
  node.onLine = (l) => {
    if (l.line === "C j") l.conn.write("T j\nC j OK\n");
  };
  const r2 = await cn.withdraw(j);
  assert.equal(r2.kind === "answer" && r2.a.kind, "T");
  assert.deepEqual(node.lines.map((l) => l.line), ["A k 1 0", "A j 1 0", "A k 1 0", "C j"]);
});

test("a semaphore's and a shared acquire carry their kind; the node's kind refusal comes back typed", async (t) => {
  const node = await new Scripted().start(t);
  const c = new Client({ addrs: [node.addr], owner: "w:1" });
  t.after(() => c.close());
  node.onLine = (l) => {
    const [op, key] = l.line.split(" ");
    if (op === "A" && key === "pool") l.conn.write("A pool 7\n");
    else if (op === "A") l.conn.write(`E A ${key} key held as a semaphore\n`);
    else if (op === "Q") l.conn.write("Q pool 7 29.5 3 owner=w:1 holders=2 limit=2\n");
  };
  const lock = await c.acquire("pool", { leaseMs: 30_000, limit: 2 });
  assert.equal(lock.token, 7n);
  await assert.rejects(c.tryAcquire("doc", { leaseMs: 1500, shared: true }), (e: unknown) => {
    assert.ok(e instanceof RefusedError, String(e));
    assert.deepEqual([e.op, e.key, e.reason], ["A", "doc", "key held as a semaphore"]);
    return true;
  });
  assert.deepEqual(await c.inspect("pool"), {
    key: "pool", token: 7n, leftMs: 29_500, waiters: 3, owner: "w:1", holders: 2, limit: 2, shared: false,
  });
  assert.deepEqual(node.lines.map((l) => l.line), ["A pool 30 0 owner=w:1 limit=2", "A doc 1.5 - owner=w:1 mode=shared", "Q pool"]);
});
