// What a node or the network can do to a client, played against real
// kuncid processes on 127.0.0.1: a node that freezes (SIGSTOP), connections
// cut in the middle of a pipeline, answers that come late.

import assert from "node:assert/strict";
import { getEventListeners } from "node:events";
import { test } from "node:test";
import { LostError, UnavailableError } from "../src/index.js";
import { WAIT_MS, client, startNode } from "./harness.js";

const T = { timeout: 60_000 };

/** Resolves with signal's reason once it aborts; rejects after ms. */
function aborted(signal: AbortSignal, ms: number, what: string): Promise<unknown> {
  return new Promise((res, rej) => {
    if (signal.aborted) return res(signal.reason);
    const t = setTimeout(() => rej(new Error(`${what}: not signalled within ${ms} ms`)), ms);
    signal.addEventListener("abort", () => {
      clearTimeout(t);
      res(signal.reason);
    });
  });
}

/** p's value, or "still waiting" after ms. */
async function within<V>(p: Promise<V>, ms: number): Promise<V | "still waiting"> {
  let t: NodeJS.Timeout | undefined;
  const late = new Promise<"still waiting">((res) => (t = setTimeout(res, ms, "still waiting")));
  try {
    return await Promise.race([p, late]);
  } finally {
    clearTimeout(t);
  }
}

test("keep-alive signals the loss when the node freezes with an extend outstanding", T, async (t) => {
  const n = await startNode(t);
  // Probes so slow that only the lease can end the wait for the extend's answer.
  const c = client(t, { addrs: [n.addr], probeIntervalMs: 120_000 });
  const lock = await c.acquire("k", { leaseMs: 1000 });
  n.proc.kill("SIGSTOP"); // the node takes the extend, and never answers it
  t.after(() => n.proc.kill("SIGCONT"));
  const lost = lock.keepAlive();
  const reason = await aborted(lost, WAIT_MS, "the loss");
  assert.ok(reason instanceof LostError, String(reason));
});

test("an extend of a released lock fails at once while no node answers", T, async (t) => {
  const n = await startNode(t);
  const c = client(t, { addrs: [n.addr] });
  const lock = await c.acquire("k", { leaseMs: 30_000 });
  await lock.release();
  await n.kill();
  // The grant is over: there is no window to retry an extend in.
  const settled = await within(
    lock.extend(30_000).then(
      () => "extended",
      (e: unknown) => e,
    ),
    WAIT_MS,
  );
  assert.ok(settled instanceof UnavailableError, String(settled));
});

test("one signal shared by many requests is watched once", T, async (t) => {
  const n = await startNode(t);
  const c = client(t, { addrs: [n.addr] });
  const warnings: string[] = [];
  const onWarning = (w: Error) => {
    if (w.name === "MaxListenersExceededWarning") warnings.push(w.message);
  };
  process.on("warning", onWarning);
  t.after(() => process.off("warning", onWarning));
  // A process's shutdown signal, given to every request: no "possible
  // EventTarget memory leak" warning, and none left listening afterwards.
  const shutdown = new AbortController();
  await c.acquire("held", { leaseMs: 30_000 });
  const waiting = Array.from({ length: 20 }, () =>
    c.acquire("held", { leaseMs: 1000, waitMs: 30_000, signal: shutdown.signal }).then(
      () => "granted",
      (e: unknown) => String(e),
    ),
  );
  const cycles = Array.from({ length: 50 }, async (_, i) => {
    await c.withLock(`k${i}`, { leaseMs: 5000, signal: shutdown.signal }, () => c.inspect(`k${i}`, { signal: shutdown.signal }));
  });
  await Promise.all(cycles);
  assert.equal(getEventListeners(shutdown.signal, "abort").length, 1); // for the 20 waiting
  shutdown.abort(new Error("shutting down"));
  for (const w of waiting) assert.match(await w, /shutting down/);
  await new Promise((res) => setImmediate(res)); // warnings are emitted on the next tick
  assert.deepEqual(warnings, []);
});
