// The repository's documents name this client's options as the client
// spells them: every TypeScript call of acquire, tryAcquire or withLock
// written inline in a Markdown file (README.md, docs/*.md, the clients'
// READMEs and scenario list) passes only options that AcquireOptions has.
// (The README's ```ts blocks are compiled and run: readme.ts.)

import assert from "node:assert/strict";
import { readFileSync, readdirSync } from "node:fs";
import { join } from "node:path";
import { test } from "node:test";
import { PKG, REPO } from "./harness.js";

/** The option names of an interface of src/client.ts, from its source. */
function optionNames(iface: string): Set<string> {
  const src = readFileSync(join(PKG, "src", "client.ts"), "utf8");
  const body = src.match(new RegExp(`export interface ${iface} \\{([\\s\\S]*?)\\n\\}`))?.[1];
  assert.ok(body, `src/client.ts has interface ${iface}`);
  return new Set([...body.matchAll(/^ {2}(\w+)\??:/gm)].map((m) => m[1]!));
}

/** The Markdown files a user reads. */
function documents(): string[] {
  const docs = readdirSync(join(REPO, "docs")).filter((f) => f.endsWith(".md")).map((f) => join("docs", f));
  return ["README.md", "clients/SCENARIOS.md", "clients/python/README.md", "clients/typescript/README.md", ...docs];
}

test("documents pass acquire the options it takes", () => {
  const options = optionNames("AcquireOptions");
  assert.ok(options.has("leaseMs") && options.has("limit"), `options read: ${[...options].join(" ")}`);
  let calls = 0;
  const wrong: string[] = [];
  for (const doc of documents()) {
    const md = readFileSync(join(REPO, doc), "utf8");
    // A call with an options object: acquire("k", { leaseMs: 1, limit: 3 }),
    // or acquire(key, { lease, limit: 3 }) with shorthand properties.
    for (const m of md.matchAll(/\b(?:acquire|tryAcquire|withLock)\([^(){}`\n]*\{([^{}`\n]*)\}/g)) {
      calls++;
      for (const prop of m[1]!.split(",")) {
        const name = prop.trim().split(/[\s:]/)[0]!;
        if (name !== "" && name !== "..." && !name.startsWith("…") && !options.has(name)) {
          wrong.push(`${doc}: ${m[0]}: no option ${JSON.stringify(name)} (AcquireOptions: ${[...options].join(", ")})`);
        }
      }
    }
  }
  assert.ok(calls >= 5, `found ${calls} calls with options in the documents`);
  assert.deepEqual(wrong, []);
});
