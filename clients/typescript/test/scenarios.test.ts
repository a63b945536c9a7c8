// The client scenarios every official client runs (clients/SCENARIOS.md),
// under the same names, against real kuncid processes on 127.0.0.1.

import assert from "node:assert/strict";
import { readFileSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { test } from "node:test";
import {
  AuthError,
  BadInputError,
  Client,
  type Lock,
  LostError,
  RefusedError,
  StaleError,
  TimeoutError,
  UnavailableError,
} from "../src/index.js";
import { Counter, WAIT_MS, behindProxy, client, httpGet, makeCerts, startCluster, startNode, tempDir, waitFor } from "./harness.js";

const T = { timeout: 60_000 };

test("fifo_handoff", T, async (t) => {
  const n = await startNode(t);
  const [a, b, c, d, look] = [0, 1, 2, 3, 4].map(() => client(t, { addrs: [n.addr] }));
  const la = await a!.acquire("k", { leaseMs: 30_000 });
  const granted: string[] = [];
  const ask = async (who: string, cl: Client, waiters: number) => {
    const p = cl.acquire("k", { leaseMs: 30_000, waitMs: WAIT_MS * 2 }).then((l) => {
      granted.push(who);
      return l;
    });
    await waitFor(`${who} seen waiting`, async () => (await look!.inspect("k"))?.waiters === waiters);
    return { p };
  };
  const { p: pb } = await ask("B", b!, 1);
  const { p: pc } = await ask("C", c!, 2);
  const { p: pd } = await ask("D", d!, 3);
  await la.release();
  const lb = await pb;
  assert.deepEqual(granted, ["B"]);
  assert.ok(lb.token > la.token);
  await lb.release();
  const lc = await pc;
  assert.deepEqual(granted, ["B", "C"]);
  assert.ok(lc.token > lb.token);
  await lc.release();
  const ld = await pd;
  assert.deepEqual(granted, ["B", "C", "D"]);
  assert.ok(ld.token > lc.token);
  await ld.release();
  assert.equal(await look!.inspect("k"), null);
});

test("wait_timeout", T, async (t) => {
  const n = await startNode(t);
  const a = client(t, { addrs: [n.addr] });
  const b = client(t, { addrs: [n.addr] });
  const la = await a.acquire("k", { leaseMs: 30_000 });
  const start = performance.now();
  await assert.rejects(b.acquire("k", { leaseMs: 30_000, waitMs: 300 }), (e: unknown) => {
    assert.ok(e instanceof TimeoutError, String(e));
    assert.equal(e.code, "ERR_KUNCI_TIMEOUT");
    return true;
  });
  assert.ok(performance.now() - start >= 300, `timed out after ${performance.now() - start} ms`);
  assert.equal((await b.inspect("k"))?.token, la.token);
});

/** Waits for signal (withLock's loss signal) to abort, at most WAIT_MS, and returns its reason. */
function aborted(signal: AbortSignal): Promise<unknown> {
  return new Promise((res, rej) => {
    const t = setTimeout(() => rej(new Error("the loss signal never fired")), WAIT_MS);
    signal.addEventListener("abort", () => {
      clearTimeout(t);
      res(signal.reason);
    });
  });
}

test("lease_loss", T, async (t) => {
  const n = await startNode(t);
  const a = client(t, { addrs: [n.addr] });
  const other = client(t, { addrs: [n.addr] });
  let told: unknown;
  const run = a.withLock("k", { leaseMs: 1000 }, async (lock, signal) => {
    // The grant is ended behind A's back: another client releases its key and token.
    await other.adopt(lock.key, lock.token, 1000).release();
    told = await aborted(signal);
    return "done";
  });
  await assert.rejects(run, LostError);
  assert.ok(told instanceof LostError, String(told));
  // The client goes on.
  const l = await a.acquire("k", { leaseMs: 1000 });
  await l.release();
});

test("release_across_drop", T, async (t) => {
  const { proxy, c: a, look } = await behindProxy(t);
  const lock = await a.acquire("k", { leaseMs: 60_000 });
  const before = proxy.accepted;
  assert.equal(proxy.cut(500), 2); // both of A's connections, and none for 0.5 s
  await lock.release();
  assert.ok(proxy.accepted > before, "the release came back on a new connection");
  assert.equal(await look.inspect("k"), null);
});

test("give_up_withdraws", T, async (t) => {
  const n = await startNode(t);
  const [a, b, c] = [0, 1, 2].map(() => client(t, { addrs: [n.addr] }));
  const la = await a!.acquire("k", { leaseMs: 30_000 });
  const gaveUp = AbortSignal.timeout(300);
  const start = performance.now();
  await assert.rejects(b!.acquire("k", { leaseMs: 30_000, waitMs: 10_000, signal: gaveUp }), (e: unknown) => {
    assert.equal(e, gaveUp.reason);
    return true;
  });
  assert.ok(performance.now() - start < 5_000, "the acquire outlived its signal");
  await la.release();
  // B's abandoned acquire was withdrawn: nothing holds k for B's lease.
  const lc = await c!.tryAcquire("k", { leaseMs: 30_000 });
  assert.ok(lc, "k was held after the release: the abandoned acquire was granted");
  assert.ok(lc.token > la.token);
  await lc.release();
});

test("redirect_from_standby", T, async (t) => {
  const cl = await startCluster(t, 2);
  const c = client(t, { addrs: [cl.addrs[1]!] }); // the standby only
  const lock = await c.acquire("k", { leaseMs: 30_000, waitMs: 10_000 });
  const active = client(t, { addrs: [cl.addrs[0]!] });
  assert.equal((await active.inspect("k"))?.token, lock.token);
  await lock.release();
});

/**
 * Callers acquiring and releasing keys of their own in a loop (each one key,
 * over and over, as real callers do), recording tokens with the time each
 * acquire started and ended.
 */
function loop(c: Client, callers: number, waitMs: number, allowed: (e: unknown, op: string, started: number) => boolean, leaseMs = 10_000) {
  const grants: Array<{ caller: number; token: bigint; started: number; ended: number }> = [];
  const errors: string[] = [];
  const cycles = new Array<number>(callers).fill(0);
  // When each caller's last completed cycle began (its acquire was asked).
  const lastBegan = new Array<number>(callers).fill(0);
  let stop = false;
  const done = Promise.all(
    Array.from({ length: callers }, async (_, i) => {
      const deadline = performance.now() + 45_000;
      while (!stop && performance.now() < deadline) {
        const started = performance.now();
        let lock: Lock;
        try {
          lock = await c.acquire(`loop/${i}`, { leaseMs, waitMs });
        } catch (e) {
          if (!allowed(e, "acquire", started)) errors.push(`acquire: ${String(e)}`);
          continue;
        }
        grants.push({ caller: i, token: lock.token, started, ended: performance.now() });
        const releasing = performance.now();
        try {
          await lock.release();
        } catch (e) {
          if (!allowed(e, "release", releasing)) errors.push(`release: ${String(e)}`);
        }
        cycles[i]!++;
        lastBegan[i] = started;
      }
    }),
  );
  return {
    grants,
    errors,
    cycles,
    /** Whether every caller completed a cycle that began after at. */
    everyoneBegunAfter(at: number): boolean {
      return lastBegan.every((b) => b > at);
    },
    async stop() {
      stop = true;
      await done;
    },
  };
}

test("crash_failover", T, async (t) => {
  // Semi-sync: every grant a caller saw is on the standbys when the active dies, so its release finds it.
  const cl = await startCluster(t, 3, ["--semi-sync"]);
  const c = client(t, { addrs: cl.addrs, logger: process.env.KUNCI_DEBUG ? (lv, m, f) => console.error(Math.round(performance.now()), lv, m, JSON.stringify(f)) : undefined });
  // Allowed: an acquire with a short wait that ran out, and STALE for a
  // release sent to the active as it died: the node executed it (and the
  // standbys have it) but its answer was lost, so the release sent again
  // finds the grant gone (as clientlib's Release says).
  let at = Infinity;
  const allowed = (e: unknown, op: string, started: number) =>
    op === "acquire" ? e instanceof TimeoutError || e instanceof UnavailableError : e instanceof StaleError && started < at;
  const l = loop(c, 4, 1500, allowed);
  t.after(() => l.stop());
  await waitFor("cycles before the crash", () => l.cycles.every((n) => n >= 20));
  at = performance.now();
  await cl.nodes[0]!.kill("SIGKILL");
  const base = [...l.cycles];
  await waitFor("every caller goes on at the new active", () => l.cycles.every((n, i) => n >= base[i]! + 20), 30_000);
  await l.stop();
  if (process.env.KUNCI_DEBUG) t.diagnostic(JSON.stringify(l.grants.filter((g) => g.ended > at).slice(0, 12).map((g) => [Math.round(g.started - at), Math.round(g.ended - at)])));
  assert.deepEqual(l.errors, []);
  const before = l.grants.filter((g) => g.ended < at);
  const after = l.grants.filter((g) => g.started > at);
  assert.ok(before.length > 0 && after.length > 0);
  const maxBefore = before.reduce((m, g) => (g.token > m ? g.token : m), 0n);
  for (const g of after) assert.ok(g.token > maxBefore, `token ${g.token} after the crash, ${maxBefore} before`);
});

test("crash_reuse", { timeout: 180_000 }, async (t) => {
  // A release the old active answered and never copied (asynchronous
  // replication), or a grant whose answer its client never read, used to
  // keep the key held on the new active for the grant's lease (30 s here):
  // the client's session now finds and releases the one, and takes the
  // other back.
  for (const semi of [false, true]) {
    const mode = semi ? "semi-sync" : "async";
    await t.test(mode, async (t) => {
      const cl = await startCluster(t, 3, semi ? ["--semi-sync"] : []);
      // The dead node's address is dialled again only after 10 s: the client
      // must not wait for it.
      const c = client(t, { addrs: cl.addrs, reconnectIntervalMs: 10_000 });
      const kept = await c.acquire("crash/kept", { leaseMs: 3000, waitMs: 2000 });
      const keptLost = kept.keepAlive();
      await waitFor("the standby to hold a copy of the kept-alive lock", async () =>
        (await httpGet(cl.nodes[1]!.admin, "/locks?prefix=crash/")).includes('"crash/kept"'),
      );
      const callers = 8;
      const leaseMs = 30_000;
      // No acquire may fail; a release only as stale ("not yours any
      // more"), and only with asynchronous replication: a grant the old
      // active answered and never copied.
      let stale = 0;
      const allowed = (e: unknown, op: string) => {
        if (op === "release" && e instanceof StaleError && !semi) {
          stale++;
          return true;
        }
        return false;
      };
      const l = loop(c, callers, 10_000, allowed, leaseMs);
      t.after(() => l.stop());
      const total = () => l.cycles.reduce((a, b) => a + b, 0);
      await waitFor("cycles on the active", () => total() >= 200);
      const base = [...l.cycles];
      const killed = performance.now();
      await cl.nodes[0]!.kill("SIGKILL");
      // Each caller completes a cycle begun after the kill: far sooner than
      // the lease a key held by a lost release or answer would take.
      await waitFor("every caller cycles again", () => l.everyoneBegunAfter(killed), leaseMs / 3).catch((e: Error) => {
        throw new Error(`${e.message}: ${Math.round(performance.now() - killed)} ms after the kill, cycles per caller ${JSON.stringify(l.cycles.map((n, i) => n - base[i]!))}: a key stays held`);
      });
      const cycledIn = performance.now() - killed;
      const again = total();
      await waitFor("cycles on the new active", () => total() >= again + 100, 30_000);
      await l.stop();
      t.diagnostic(`${mode}: every caller cycled again within ${Math.round(cycledIn)} ms of the kill; ${stale} releases stale`);
      assert.deepEqual(l.errors, []);
      assert.equal(keptLost.aborted, false, `the kept-alive lock: ${String(keptLost.reason)}`);
      await kept.release();
    });
  }
});

test("graceful_handoff", T, async (t) => {
  const cl = await startCluster(t, 2);
  const c = client(t, { addrs: cl.addrs });
  const l = loop(c, 4, 10_000, () => false);
  t.after(() => l.stop());
  await waitFor("cycles before the handoff", () => l.cycles.every((n) => n >= 20));
  const at = performance.now();
  cl.nodes[0]!.proc.kill("SIGINT");
  assert.equal(await cl.nodes[0]!.exited, "0");
  const base = [...l.cycles];
  await waitFor("every caller goes on at the successor", () => l.cycles.every((n, i) => n >= base[i]! + 20), 30_000);
  await l.stop();
  assert.deepEqual(l.errors, []);
  // Tokens keep rising: each caller's, one after the other, and across the handoff.
  const last = new Map<number, bigint>();
  for (const g of l.grants) {
    assert.ok(g.token > (last.get(g.caller) ?? 0n), `caller ${g.caller}: token ${g.token} after ${last.get(g.caller)}`);
    last.set(g.caller, g.token);
  }
  const maxBefore = l.grants.filter((g) => g.ended < at).reduce((m, g) => (g.token > m ? g.token : m), 0n);
  for (const g of l.grants.filter((g) => g.started > at)) assert.ok(g.token > maxBefore);
});

test("auth", T, async (t) => {
  const file = join(tempDir(t), "auth");
  writeFileSync(file, "alice alice-secret-of-24-bytes\n", { mode: 0o600 });
  const n = await startNode(t, ["--auth-file", file]);
  const none = client(t, { addrs: [n.addr] });
  await assert.rejects(none.acquire("k", { leaseMs: 5000, waitMs: 5000 }), (e: unknown) => {
    assert.ok(e instanceof AuthError, String(e));
    assert.match(e.message, /auth required/);
    return true;
  });
  const wrong = client(t, { addrs: [n.addr], credentials: { name: "alice", secret: "not-alices-secret-at-all" } });
  await assert.rejects(wrong.acquire("k", { leaseMs: 5000, waitMs: 5000 }), (e: unknown) => {
    assert.ok(e instanceof AuthError, String(e));
    assert.match(e.message, /bad credentials/);
    assert.doesNotMatch(e.message, /not-alices-secret/);
    return true;
  });
  await assert.rejects(Client.connect({ addrs: [n.addr], credentials: { name: "alice", secret: "not-alices-secret-at-all" } }), AuthError);
  const right = client(t, { addrs: [n.addr], credentials: { name: "alice", secret: "alice-secret-of-24-bytes" } });
  const lock = await right.acquire("k", { leaseMs: 5000, waitMs: 5000 });
  assert.ok(lock.token >= 1n);
  await lock.release();
});

test("tls", T, async (t) => {
  const dir = tempDir(t);
  const certs = makeCerts(dir);
  const ca = readFileSync(certs.ca);
  // The node's certificate, then mutual TLS with a client certificate.
  const n = await startNode(t, ["--tls-listen", "127.0.0.1:0", "--tls-cert", certs.cert, "--tls-key", certs.key]);
  const c = client(t, { addrs: [n.tlsAddr], tls: { ca } });
  const lock = await c.acquire("k", { leaseMs: 5000, waitMs: 5000 });
  await lock.release();

  const m = await startNode(t, ["--tls-listen", "127.0.0.1:0", "--tls-cert", certs.cert, "--tls-key", certs.key, "--tls-client-ca", certs.ca]);
  const mc = client(t, { addrs: [m.tlsAddr], tls: { ca, cert: readFileSync(certs.clientCert), key: readFileSync(certs.clientKey) } });
  const ml = await mc.acquire("k", { leaseMs: 5000, waitMs: 5000 });
  await ml.release();

  // Credentials beside a certificate that names one: the node takes the
  // certificate and answers the U "already authenticated".
  const file = join(dir, "auth");
  writeFileSync(file, "alice alice-secret-of-24-bytes\n", { mode: 0o600 });
  const a = await startNode(t, ["--tls-listen", "127.0.0.1:0", "--tls-cert", certs.cert, "--tls-key", certs.key, "--tls-client-ca", certs.ca, "--auth-file", file]);
  const both = client(t, {
    addrs: [a.tlsAddr],
    tls: { ca, cert: readFileSync(certs.clientCert), key: readFileSync(certs.clientKey) },
    credentials: { name: "alice", secret: "alice-secret-of-24-bytes" },
  });
  const bl = await both.acquire("k", { leaseMs: 5000, waitMs: 5000 });
  await bl.release();

  // A client that does not trust the CA.
  const untrusting = client(t, { addrs: [n.tlsAddr], tls: { ca: readFileSync(certs.otherCa) } });
  await assert.rejects(untrusting.acquire("k", { leaseMs: 5000, waitMs: 1000 }), (e: unknown) => {
    assert.ok(e instanceof UnavailableError, String(e));
    assert.match(e.message, /certificate/);
    return true;
  });
});

test("bad_input", T, async (t) => {
  const raw = await new Counter().start(t);
  const c = client(t, { addrs: [raw.addr] });
  await waitFor("the client's connections", () => raw.conns === 2);
  const bad: Array<[string, () => Promise<unknown>]> = [
    ["key with a space", () => c.acquire("a b", { leaseMs: 1000 })],
    ["key over 250 bytes", () => c.acquire("k".repeat(251), { leaseMs: 1000 })],
    ["key over 250 bytes in UTF-8", () => c.acquire("é".repeat(126), { leaseMs: 1000 })],
    ["empty key", () => c.acquire("", { leaseMs: 1000 })],
    ["key with a control byte", () => c.acquire("a\nA x 1 0", { leaseMs: 1000 })],
    ["lease 0", () => c.acquire("k", { leaseMs: 0 })],
    ["lease below 0", () => c.acquire("k", { leaseMs: -5 })],
    ["lease not a number", () => c.acquire("k", { leaseMs: Number.NaN })],
    ["negative wait", () => c.acquire("k", { leaseMs: 1000, waitMs: -1 })],
    ["try with lease 0", () => c.tryAcquire("k", { leaseMs: 0 })],
    ["inspect a bad key", () => c.inspect("a b")],
    ["list a bad prefix", () => c.locks({ prefix: "a b" })],
    ["list a negative limit", () => c.locks({ limit: -1 })],
    ["extend by 0", () => c.adopt("k", 1n, 1000).extend(0)],
    ["adopt token 0", async () => c.adopt("k", 0n, 1000)],
    ["semaphore limit 0", () => c.acquire("k", { leaseMs: 1000, limit: 0 })],
    ["semaphore limit not whole", () => c.acquire("k", { leaseMs: 1000, limit: 1.5 })],
    ["semaphore limit over 2^32-1", () => c.tryAcquire("k", { leaseMs: 1000, limit: 2 ** 32 })],
    ["limit and shared together", () => c.acquire("k", { leaseMs: 1000, limit: 2, shared: true })],
    ["limit and shared together, under a lock", () => c.withLock("k", { leaseMs: 1000, limit: 2, shared: true }, () => "ran")],
  ];
  for (const [what, f] of bad) {
    await assert.rejects(f(), (e: unknown) => {
      assert.ok(e instanceof BadInputError, `${what}: ${String(e)}`);
      assert.match(e.message, /^kunci: /, what);
      return true;
    });
  }
  assert.throws(() => new Client({ addrs: ["nohost"] }), BadInputError);
  assert.throws(() => new Client({ addrs: [raw.addr], owner: "two words" }), BadInputError);
  assert.throws(() => new Client({ addrs: [raw.addr], credentials: { name: "a", secret: "b c" } }), BadInputError);
  // A good request after them is the first thing the node gets (after the
  // client's session, named first on every connection).
  c.tryAcquire("sentinel", { leaseMs: 1000 }).catch(() => {}); // never answered: ends with the client
  await waitFor("the good request", () => /^A [^\n]*\n/m.test(raw.text));
  const requests = raw.text.split("\n").filter((l) => l !== "" && !/^S [0-9]+$/.test(l));
  assert.deepEqual(requests, ["A sentinel 1 -"]);
});

/** Asserts that p is refused by the node with reason, and returns the refusal. */
/** Checks that lock's grant alone holds its key, releases it, and checks the key free. */
async function releaseTheLast(look: Client, lock: Lock): Promise<void> {
  const h = await look.inspect(lock.key);
  assert.deepEqual(h && { token: h.token, holders: h.holders }, { token: lock.token, holders: 1 });
  await lock.release();
  assert.equal(await look.inspect(lock.key), null);
}

async function refused(p: Promise<unknown>, reason: string): Promise<void> {
  await assert.rejects(p, (e: unknown) => {
    assert.ok(e instanceof RefusedError, String(e));
    assert.equal(e.code, "ERR_KUNCI_REFUSED");
    assert.equal(e.reason, reason);
    assert.match(e.message, new RegExp(reason));
    return true;
  });
}

test("semaphore_limit", T, async (t) => {
  const n = await startNode(t);
  const [a, b, c, d, look] = [0, 1, 2, 3, 4].map(() => client(t, { addrs: [n.addr] }));
  const sem = { leaseMs: 30_000, waitMs: WAIT_MS * 2, limit: 2 };
  const la = await a!.acquire("pool", sem);
  const lb = await b!.acquire("pool", sem);
  assert.ok(lb.token > la.token, `B's token ${lb.token}, A's ${la.token}`);
  const h = await look!.inspect("pool");
  assert.deepEqual(h && { token: h.token, holders: h.holders, limit: h.limit, shared: h.shared, waiters: h.waiters }, {
    token: la.token, holders: 2, limit: 2, shared: false, waiters: 0,
  });
  const listed = await look!.locks({ prefix: "pool" });
  assert.deepEqual(listed.locks.sort((x, y) => (x.token < y.token ? -1 : 1)).map((l) => [l.token, l.holders, l.limit]), [
    [la.token, 2, 2],
    [lb.token, 2, 2],
  ]);

  // C waits: the semaphore is at its limit. A's release grants it.
  const pc = c!.acquire("pool", sem);
  await waitFor("C seen waiting", async () => (await look!.inspect("pool"))?.waiters === 1);
  await la.release();
  const lc = await pc;
  assert.ok(lc.token > lb.token, `C's token ${lc.token}, B's ${lb.token}`);

  // B and C hold: a try finds the key held; another limit is refused, and changes nothing.
  assert.equal(await look!.tryAcquire("pool", { leaseMs: 30_000, limit: 2 }), null);
  await refused(look!.acquire("pool", { leaseMs: 30_000, waitMs: WAIT_MS, limit: 3 }), "semaphore limit differs");
  const after = await look!.inspect("pool");
  assert.deepEqual(after && { token: after.token, holders: after.holders, limit: after.limit, waiters: after.waiters }, {
    token: lb.token, holders: 2, limit: 2, waiters: 0,
  });

  // D waits; B's lease ends by itself (shortened to 300 ms, no keep-alive) and frees its place for D.
  const pd = d!.acquire("pool", sem);
  await waitFor("D seen waiting", async () => (await look!.inspect("pool"))?.waiters === 1);
  await lb.extend(300);
  const ld = await pd;
  assert.ok(ld.token > lc.token);
  await assert.rejects(lb.release(), StaleError);

  // Run-under-lock: a semaphore's grant kept alive past twice its lease, then released.
  await lc.release();
  const ran = await a!.withLock("pool", { leaseMs: 1500, limit: 2 }, async (lock, signal) => {
    const start = performance.now();
    await waitFor("the grant held past twice its lease", async () => {
      const mine = (await look!.locks({ prefix: "pool" })).locks.find((l) => l.token === lock.token);
      assert.ok(mine !== undefined, "the grant ended under withLock");
      return performance.now() - start > 3100;
    });
    assert.equal(signal.aborted, false);
    return lock.token;
  });
  assert.ok(ran > ld.token);
  await releaseTheLast(look!, ld);
});

test("shared_readers", T, async (t) => {
  const n = await startNode(t);
  const [r1, r2, w, r3, look, other] = [0, 1, 2, 3, 4, 5].map(() => client(t, { addrs: [n.addr] }));
  const read = { leaseMs: 30_000, waitMs: WAIT_MS * 2, shared: true };
  const l1 = await r1!.acquire("doc", read);
  const l2 = await r2!.acquire("doc", read);
  assert.ok(l2.token > l1.token);
  const h = await look!.inspect("doc");
  assert.deepEqual(h && { token: h.token, holders: h.holders, shared: h.shared, limit: h.limit }, {
    token: l1.token, holders: 2, shared: true, limit: undefined,
  });

  // W waits for the readers; R3, after W, waits behind it; a shared try now finds the key held.
  const pw = w!.acquire("doc", { leaseMs: 30_000, waitMs: WAIT_MS * 2 });
  await waitFor("W seen waiting", async () => (await look!.inspect("doc"))?.waiters === 1);
  let r3Granted = false;
  const p3 = r3!.acquire("doc", read).then((l) => {
    r3Granted = true;
    return l;
  });
  await waitFor("R3 seen waiting", async () => (await look!.inspect("doc"))?.waiters === 2);
  assert.equal(await look!.tryAcquire("doc", { leaseMs: 30_000, shared: true }), null);

  // The readers leave: W is granted only once both have, with a token above theirs.
  let wGranted = false;
  const pw2 = pw.then((l) => {
    wGranted = true;
    return l;
  });
  await l1.release();
  const mid = await look!.inspect("doc");
  assert.deepEqual(mid && { token: mid.token, holders: mid.holders, waiters: mid.waiters }, { token: l2.token, holders: 1, waiters: 2 });
  assert.equal(wGranted, false);
  await l2.release();
  const lw = await pw2;
  assert.ok(lw.token > l2.token, `W's token ${lw.token}, R2's ${l2.token}`);
  const wh = await look!.inspect("doc");
  assert.deepEqual(wh && { token: wh.token, holders: wh.holders, shared: wh.shared, waiters: wh.waiters }, {
    token: lw.token, holders: 1, shared: false, waiters: 1,
  });
  assert.equal(r3Granted, false);

  // W's release grants R3, with a token above W's.
  await lw.release();
  const l3 = await p3;
  assert.ok(l3.token > lw.token, `R3's token ${l3.token}, W's ${lw.token}`);

  // Run-under-lock in shared mode: beside R3, and told when its grant is ended behind its back.
  const value = await look!.withLock("doc", { leaseMs: 30_000, waitMs: WAIT_MS, shared: true }, async (lock) => {
    const mine = (await other!.locks({ prefix: "doc" })).locks.find((l) => l.token === lock.token);
    assert.deepEqual(mine && { holders: mine.holders, shared: mine.shared }, { holders: 2, shared: true });
    return lock.token;
  });
  assert.ok(value > l3.token);
  let told: unknown;
  const run = look!.withLock("doc", { leaseMs: 1000, shared: true }, async (lock, signal) => {
    await other!.adopt(lock.key, lock.token, 1000).release();
    told = await aborted(signal);
    return "done";
  });
  await assert.rejects(run, LostError);
  assert.ok(told instanceof LostError, String(told));
  await releaseTheLast(look!, l3);
});

test("kind_mismatch", T, async (t) => {
  const n = await startNode(t);
  const [a, b, look] = [0, 1, 2].map(() => client(t, { addrs: [n.addr] }));
  const untouched = async (want: { token: bigint; holders: number; limit: number | undefined }) => {
    const h = await look!.inspect("k");
    assert.deepEqual(h && { token: h.token, holders: h.holders, limit: h.limit, shared: h.shared, waiters: h.waiters }, { ...want, shared: false, waiters: 0 });
  };
  let ran = false;
  const fn = () => {
    ran = true;
  };

  // k held as a lock: a semaphore acquire (waiting, a try, run-under-lock) is refused at once.
  const la = await a!.acquire("k", { leaseMs: 30_000 });
  await refused(b!.acquire("k", { leaseMs: 30_000, waitMs: WAIT_MS * 2, limit: 2 }), "key held as a lock");
  await refused(b!.tryAcquire("k", { leaseMs: 30_000, limit: 2 }), "key held as a lock");
  await refused(b!.withLock("k", { leaseMs: 30_000, waitMs: WAIT_MS * 2, limit: 2 }, fn), "key held as a lock");
  await untouched({ token: la.token, holders: 1, limit: undefined });
  await la.release();

  // k held as a semaphore: a plain and a shared acquire are refused.
  const ls = await a!.acquire("k", { leaseMs: 30_000, limit: 2 });
  await refused(b!.acquire("k", { leaseMs: 30_000, waitMs: WAIT_MS * 2 }), "key held as a semaphore");
  await refused(b!.acquire("k", { leaseMs: 30_000, waitMs: WAIT_MS * 2, shared: true }), "key held as a semaphore");
  await refused(b!.tryAcquire("k", { leaseMs: 30_000 }), "key held as a semaphore");
  await refused(b!.withLock("k", { leaseMs: 30_000, waitMs: WAIT_MS * 2, shared: true }, fn), "key held as a semaphore");
  await refused(b!.acquire("k", { leaseMs: 30_000, waitMs: WAIT_MS * 2, limit: 1 }), "semaphore limit differs");
  assert.equal(ran, false);
  await untouched({ token: ls.token, holders: 1, limit: 2 });
  await ls.release();

  // Free again, k has no kind: the next grant decides it.
  const lp = await b!.acquire("k", { leaseMs: 30_000, shared: true });
  assert.ok(lp.token > ls.token);
  await lp.release();
});

test("readme_examples", T, async (t) => {
  const { runReadmeExamples } = await import("./readme.js");
  await runReadmeExamples(t);
});

test("inspect_holder", T, async (t) => {
  const n = await startNode(t);
  const a = client(t, { addrs: [n.addr], owner: "billing" });
  const [b, look] = [0, 1].map(() => client(t, { addrs: [n.addr] }));
  assert.equal(await look!.inspect("free"), null);
  const la = await a.acquire("k", { leaseMs: 30_000 });
  const pb = b!.acquire("k", { leaseMs: 30_000, waitMs: WAIT_MS * 2 });
  await waitFor("B seen waiting", async () => (await look!.inspect("k"))?.waiters === 1);
  const h = await look!.inspect("k");
  assert.ok(h !== null);
  assert.deepEqual(
    { key: h.key, token: h.token, owner: h.owner, holders: h.holders, waiters: h.waiters },
    { key: "k", token: la.token, owner: "billing", holders: 1, waiters: 1 },
  );
  assert.ok(h.leftMs > 0 && h.leftMs <= 30_000, `${h.leftMs} ms left`);
  await la.release();
  await (await pb).release();
  assert.equal(await look!.inspect("k"), null);
});
