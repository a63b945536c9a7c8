// The client's session (docs/clients.md, "Sessions: what a client does after
// a lost answer"): answers lost with a connection, against real kuncid
// processes behind a proxy that loses them; a try beside an acquire in
// progress, and a node from before sessions, against a scripted node; and
// active() and info(). (The keys' state, unit by unit: keys.test.ts.)

import assert from "node:assert/strict";
import { writeFileSync } from "node:fs";
import type * as net from "node:net";
import { join } from "node:path";
import { test } from "node:test";
import { AuthError, NoActiveError, StaleError, TimeoutError, UnavailableError } from "../src/index.js";
import { Proxy, ScriptedNode, behindProxy, client, startCluster, startNode, tempDir, waitFor } from "./harness.js";

const T = { timeout: 60_000 };

/** The acquires of key the node was sent through proxy. */
const acquiresOf = (proxy: Proxy, key: string) => proxy.up.filter((l) => l.startsWith(`A ${key} `));

test("a grant whose answer was lost is taken back by the acquire sent again", T, async (t) => {
  const { proxy, c, look } = await behindProxy(t);
  await c.inspect("warm"); // connections up, the session named on them
  // The node grants k; its answer is lost with the connection. The acquire,
  // sent again on the next one, is answered that very grant (it used to
  // queue behind it for its lease: 60 s here, far past its wait).
  proxy.lose = (line) => line.startsWith("A k ");
  const lock = await c.acquire("k", { leaseMs: 60_000, waitMs: 5_000 });
  assert.deepEqual(proxy.lost, [`A k ${lock.token}`]);
  const sent = acquiresOf(proxy, "k");
  assert.equal(sent.length, 2, sent.join(" | "));
  assert.doesNotMatch(sent[0]!, /seen=/);
  assert.match(sent[1]!, / seen=0$/); // the client had been answered no grant before
  const h = await look.inspect("k");
  assert.deepEqual(h && { token: h.token, waiters: h.waiters }, { token: lock.token, waiters: 0 });
  await lock.release();
  assert.equal(await look.inspect("k"), null);
  // seen is the highest token the client has been answered: the next
  // acquire whose answer is lost carries it.
  proxy.lose = (line) => line.startsWith("A j ");
  const next = await c.acquire("j", { leaseMs: 60_000, waitMs: 5_000 });
  assert.match(acquiresOf(proxy, "j")[1]!, new RegExp(` seen=${lock.token}$`));
  await next.release();
});

test("a release sent again after its answer was lost succeeds; so does a second release; another client's is stale", T, async (t) => {
  const { proxy, c, look } = await behindProxy(t);
  const lock = await c.acquire("k", { leaseMs: 60_000 });
  // The node releases the grant; its OK is lost with the connection. The
  // release, sent again, is answered OK again (to the session), not STALE.
  proxy.lose = (line) => line === "R k OK";
  await lock.release();
  assert.deepEqual(proxy.lost, ["R k OK"]);
  assert.ok(proxy.up.filter((l) => l === `R k ${lock.token}`).length >= 2, "the release was sent again");
  assert.equal(await look.inspect("k"), null);
  // Released again by this client: done, not stale.
  await lock.release();
  // Not this client's: another one's release of the token is stale.
  await assert.rejects(look.adopt("k", lock.token, 60_000).release(), (e: unknown) => {
    assert.ok(e instanceof StaleError, String(e));
    assert.match(e.message, /not yours any more/);
    return true;
  });
});

test("the session's listing: grants the client gave up on are released on reconnect, those it holds are kept", T, async (t) => {
  const { proxy, c, look } = await behindProxy(t, { reconnectIntervalMs: 100 });
  const kept = await c.acquire("kept", { leaseMs: 60_000 });
  // The node grants k; its answer is lost, and no connection comes back
  // before the acquire's wait runs out: the caller gives up, a grant of its
  // session left on the node for 60 s.
  proxy.lose = (line) => line.startsWith("A k ");
  proxy.loseBlockMs = 1500;
  await assert.rejects(c.acquire("k", { leaseMs: 60_000, waitMs: 500 }), (e: unknown) => {
    assert.ok(e instanceof UnavailableError || e instanceof TimeoutError, String(e));
    return true;
  });
  const [, , token] = proxy.lost[0]!.split(" ");
  assert.equal((await look.inspect("k"))?.token, BigInt(token!));
  // The client's connections come back and name its session: the node lists
  // k's grant, which the client does not hold, and the client releases it.
  // Nothing else is asked of the client meanwhile.
  await waitFor("k released by the client", async () => (await look.inspect("k")) === null);
  assert.ok(proxy.up.includes(`R k ${token}`), "released on a connection of the client");
  // The grant a caller holds stays.
  assert.equal((await look.inspect("kept"))?.token, kept.token);
  await kept.release();
});

test("an acquire that waits its turn behind one whose answer was lost takes the key after it", T, async (t) => {
  // Two callers of one key: the first's grant is answered on the connection
  // made after the cut (seen=), the second waits its turn in the client and
  // then queues behind the first's grant on the node, as it would have.
  const n = await startNode(t);
  const proxy = await new Proxy(n.addr).start(t);
  const c = client(t, { addrs: [proxy.addr] });
  await c.inspect("warm");
  proxy.lose = (line) => line.startsWith("A k ");
  const first = c.acquire("k", { leaseMs: 60_000, waitMs: 10_000 });
  const second = c.acquire("k", { leaseMs: 60_000, waitMs: 10_000 });
  const l1 = await first;
  assert.deepEqual(proxy.lost, [`A k ${l1.token}`]);
  let got2 = false;
  void second.then(() => (got2 = true));
  await waitFor("the second acquire sent", () => acquiresOf(proxy, "k").length === 3);
  assert.equal(got2, false);
  await l1.release();
  const l2 = await second;
  assert.ok(l2.token > l1.token);
  assert.doesNotMatch(acquiresOf(proxy, "k")[2]!, /seen=/);
  await l2.release();
});

/** A node the test writes: answers "S" with onSession, other lines with onLine; both see every line. */
class Scripted extends ScriptedNode {
  readonly lines: Array<{ conn: net.Socket; line: string }> = [];
  onSession: (conn: net.Socket, line: string) => void = (conn) => conn.write("S 0\n");
  onLine: (conn: net.Socket, line: string) => void = () => {};
  protected override received(conn: net.Socket, line: string): void {
    this.lines.push({ conn, line });
    if (line.startsWith("S ")) this.onSession(conn, line);
    else this.onLine(conn, line);
  }
  requests(prefix: string): string[] {
    return this.lines.map((l) => l.line).filter((l) => l.startsWith(prefix));
  }
}

test("a try while an acquire of the key is in progress is busy, and not sent", T, async (t) => {
  const node = await new Scripted().start(t);
  // The node holds the acquire of k unanswered; it would answer a try of k
  // "held", and grant one of another key.
  node.onLine = (conn, line) => {
    const [op, key, , wait] = line.split(" ");
    if (op === "A" && key === "k" && wait === "-") conn.write("T k\n");
    else if (op === "A" && key === "other") conn.write("A other 8\n");
  };
  const c = client(t, { addrs: [node.addr] });
  await waitFor("both connections", () => node.conns.length === 2);
  const first = c.acquire("k", { leaseMs: 30_000, waitMs: 10_000 });
  await waitFor("the acquire", () => node.requests("A k ").length === 1);
  // Whichever connection they would take, and whatever their kind: busy.
  for (const kind of [{}, {}, { shared: true }, { limit: 3 }, {}]) {
    assert.equal(await c.tryAcquire("k", { leaseMs: 30_000, ...kind }), null, JSON.stringify(kind));
  }
  // Another key is not held back.
  assert.equal((await c.tryAcquire("other", { leaseMs: 30_000 }))?.token, 8n);
  assert.deepEqual(node.requests("A k "), ["A k 30 10"]);
  node.lines.find((l) => l.line.startsWith("A k "))!.conn.write("A k 7\n");
  assert.equal((await first).token, 7n);
});

test("an acquire given up whose grant won the race: the next acquire of the key is not answered that grant", T, async (t) => {
  const node = await new Scripted().start(t);
  node.onLine = (conn, line) => {
    // The grant wins the race with the C. The release of it that follows is
    // left unanswered: it is still on its way when the next acquire goes out.
    if (line === "C k") conn.write("A k 7\nC k NONE\n");
  };
  const c = client(t, { addrs: [node.addr] });
  const ac = new AbortController();
  const gaveUp = c.acquire("k", { leaseMs: 30_000, waitMs: 10_000, signal: ac.signal });
  await waitFor("the acquire", () => node.requests("A k ").length === 1);
  ac.abort(new Error("gave up"));
  await assert.rejects(gaveUp, /gave up/);
  await waitFor("the release of the grant that won the race", () => node.requests("R k 7").length === 1);
  const next = c.acquire("k", { leaseMs: 30_000, waitMs: 10_000 });
  await waitFor("the next acquire", () => node.requests("A k ").length === 2);
  // Sent with no seen= (its key is resolved: the first acquire was
  // answered), or with one at or above 7: never one the node would answer
  // with the grant being released.
  const second = node.requests("A k ")[1]!;
  const seen = / seen=([0-9]+)$/.exec(second);
  assert.ok(seen === null || BigInt(seen[1]!) >= 7n, `${second}: the node would answer it the grant being released`);
  node.lines.find((l) => l.line === second)!.conn.write("A k 8\n");
  assert.equal((await next).token, 8n);
});

test("a node from before sessions (S: unknown op) still works, and is sent no seen=", T, async (t) => {
  const node = await new Scripted().start(t);
  // As a node of 0.10 answers: S is no op of its, and an acquire with a field
  // it does not know is refused.
  node.onSession = (conn, line) => conn.write(`E S ${line.slice(2)} unknown op\n`);
  let broke = false;
  node.onLine = (conn, line) => {
    const [op, key, , , ...rest] = line.split(" ");
    if (op === "A" && rest.length > 0) conn.write(`E A ${key} too many fields\n`);
    else if (op === "A" && !broke) {
      // The grant's answer is lost: both connections break with the
      // acquire outstanding, so that it is sent again on a connection just
      // made, whose S has not been answered yet.
      broke = true;
      for (const c of node.conns) c.destroy();
    } else if (op === "A") conn.write(`A ${key} 5\n`);
    else if (op === "R") conn.write(`R ${key} OK\n`);
  };
  const c = client(t, { addrs: [node.addr] });
  const lock = await c.acquire("k", { leaseMs: 30_000, waitMs: 10_000 });
  assert.equal(lock.token, 5n);
  await lock.release();
  const acquires = node.requests("A k ");
  assert.ok(acquires.length >= 2, acquires.join(" | "));
  for (const a of acquires) assert.doesNotMatch(a, /seen=/);
  // Every connection named the session first, and went on when refused.
  for (const conn of node.conns) {
    const first = node.lines.find((l) => l.conn === conn);
    if (first !== undefined) assert.match(first.line, /^S [0-9]+$/);
  }
  assert.ok(node.requests("S ").length >= 3);
});

test("an acquire sent again waits for its connection's answer to the session no longer than its wait", T, async (t) => {
  const node = await new Scripted().start(t);
  // The connections made after the break are never answered: the session's
  // answer does not come (a node that froze as it took them).
  node.onSession = (conn) => {
    if (node.conns.indexOf(conn) < 2) conn.write("S 0\n");
  };
  node.onLine = (conn, line) => {
    if (line.startsWith("A k ")) for (const c of node.conns) c.destroy();
  };
  const c = client(t, { addrs: [node.addr], reconnectIntervalMs: 50 });
  const start = performance.now();
  await assert.rejects(c.acquire("k", { leaseMs: 30_000, waitMs: 1000 }), (e: unknown) => {
    assert.ok(e instanceof TimeoutError || e instanceof UnavailableError, String(e));
    return true;
  });
  // Not held until the connection is found dead (probes: 5 s and more).
  const took = performance.now() - start;
  assert.ok(took < 4000, `the acquire returned after ${Math.round(took)} ms`);
  assert.equal(node.requests("A k ").length, 1, "sent again before the session was answered");
});

test("a node that refuses the session for want of credentials ends the requests of a client that has none", T, async (t) => {
  const file = join(tempDir(t), "auth");
  writeFileSync(file, "alice alice-secret-of-24-bytes\n", { mode: 0o600 });
  const n = await startNode(t, ["--auth-file", file]);
  const c = client(t, { addrs: [n.addr] });
  // Unbounded waits and a listing: each ends with the refusal, at once
  // (the node closes every connection after its "auth required").
  for (const ask of [() => c.acquire("k", { leaseMs: 5000 }), () => c.locks(), () => c.acquire("k", { leaseMs: 5000 })]) {
    const start = performance.now();
    await assert.rejects(ask(), (e: unknown) => {
      assert.ok(e instanceof AuthError, String(e));
      assert.match(e.message, /auth required/);
      return true;
    });
    assert.ok(performance.now() - start < 5000, `refused after ${Math.round(performance.now() - start)} ms`);
  }
});

test("active() and info() ask a node", T, async (t) => {
  const n = await startNode(t);
  const c = client(t, { addrs: [n.addr] });
  assert.deepEqual(await c.info(), { addr: n.addr, role: "active", active: n.addr });
  assert.equal(await c.active(), n.addr);

  const cl = await startCluster(t, 2);
  const cc = client(t, { addrs: cl.addrs });
  assert.equal(await cc.active(), cl.addrs[0]);
  assert.deepEqual(await cc.info(), { addr: cl.addrs[0], role: "active", active: cl.addrs[0] });

  // A node that knows no active: a typed error naming the node asked.
  const node = await new Scripted().start(t);
  node.onLine = (conn, line) => {
    if (line === "I") conn.write("I standby 127.0.0.1:7071 -\n");
  };
  const sc = client(t, { addrs: [node.addr] });
  assert.deepEqual(await sc.info(), { addr: "127.0.0.1:7071", role: "standby", active: undefined });
  await assert.rejects(sc.active(), (e: unknown) => {
    assert.ok(e instanceof NoActiveError, String(e));
    assert.equal(e.code, "ERR_KUNCI_NO_ACTIVE");
    assert.equal(e.addr, "127.0.0.1:7071");
    return true;
  });
});
