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

test("a short delay fires, and clear stops it", async () => {
  const order: string[] = [];
  new Timer(() => order.push("10 ms"), 10);
  const never = new Timer(() => order.push("cleared"), 20);
  never.clear();
  new Timer(() => order.push("0 ms"), -5);
  await new Promise((r) => setTimeout(r, 60));
  assert.deepEqual(order, ["0 ms", "10 ms"]);
});
