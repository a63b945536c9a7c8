// Timer: the client's timers for waits and leases, which may be longer than
// setTimeout's 2^31−1 ms.

import assert from "node:assert/strict";
import { test } from "node:test";
import { Timer } from "../src/timer.js";

test("a delay over 2^31-1 ms does not fire at once", async () => {
  let fired = false;
  const t = new Timer(() => {
    fired = true;
  }, 2 ** 31 + 1000); // about 24.9 days
  await new Promise((r) => setTimeout(r, 100));
  t.clear();
  assert.equal(fired, false, "fired within 100 ms");
});

test("a short delay fires no sooner than asked, and clear stops it", async () => {
  // What fired and when, not in which order: on a busy machine the
  // synchronous lines between two timers' creation can take longer than the
  // 10 ms between their delays.
  const start = performance.now();
  const fired = new Map<string, number>();
  new Timer(() => fired.set("10 ms", performance.now() - start), 10);
  const never = new Timer(() => fired.set("cleared", 0), 20);
  never.clear();
  new Timer(() => fired.set("0 ms", performance.now() - start), -5);
  await new Promise((r) => setTimeout(r, 60));
  assert.deepEqual([...fired.keys()].sort(), ["0 ms", "10 ms"]);
  // Node's timers count whole milliseconds of a clock read once a turn.
  assert.ok(fired.get("10 ms")! >= 9, `the 10 ms timer fired after ${fired.get("10 ms")} ms`);
});
