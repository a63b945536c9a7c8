// The modules of src/ import one another without a circle: each can be
// read, and loaded, after those it imports. A type-only import counts: it
// ties the modules as much for a reader. (conn.ts once imported the Client
// type from client.ts, which imports Conn from conn.ts.)

import assert from "node:assert/strict";
import { readFileSync, readdirSync } from "node:fs";
import { join } from "node:path";
import { test } from "node:test";
import { PKG } from "./harness.js";

/** Module → the modules of the same directory it imports (import, import type, export … from, import()). */
function imports(dir: string): Map<string, string[]> {
  const g = new Map<string, string[]>();
  for (const f of readdirSync(dir).filter((f) => f.endsWith(".ts")).sort()) {
    const src = readFileSync(join(dir, f), "utf8");
    const to = [...src.matchAll(/(?:\bfrom\s+|\bimport\s*\(?\s*)"\.\/([\w-]+)\.js"/g)].map((m) => `${m[1]!}.ts`);
    g.set(f, [...new Set(to)].sort());
  }
  return g;
}

/** The circles of g, each as the path that closes it (a → b → a). */
function circles(g: Map<string, string[]>): string[] {
  const found: string[] = [];
  const done = new Set<string>();
  const path: string[] = [];
  const visit = (m: string) => {
    const at = path.indexOf(m);
    if (at >= 0) {
      found.push([...path.slice(at), m].join(" → "));
      return;
    }
    if (done.has(m)) return;
    path.push(m);
    for (const n of g.get(m) ?? []) visit(n);
    path.pop();
    done.add(m);
  };
  for (const m of g.keys()) visit(m);
  return found;
}

test("circles are found where they are", () => {
  const g = new Map([
    ["a.ts", ["b.ts"]],
    ["b.ts", ["c.ts"]],
    ["c.ts", ["a.ts"]],
    ["d.ts", ["a.ts"]],
  ]);
  assert.deepEqual(circles(g), ["a.ts → b.ts → c.ts → a.ts"]);
  assert.deepEqual(circles(new Map([["a.ts", ["b.ts"]], ["b.ts", []]])), []);
});

test("src/ has no import circle", () => {
  const g = imports(join(PKG, "src"));
  // The parse sees the imports (so that no circle is not no import read).
  assert.ok(g.get("client.ts")?.includes("conn.ts"), `client.ts imports conn.ts: ${JSON.stringify(Object.fromEntries(g))}`);
  assert.ok(g.get("index.ts")?.includes("errors.ts"), "index.ts re-exports errors.ts");
  assert.deepEqual(circles(g), [], `imports: ${JSON.stringify(Object.fromEntries(g))}`);
});
