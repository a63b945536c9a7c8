// npm pack gives a tarball that installs: packed, installed into an empty
// project (offline: it has no dependencies), imported by name, and its type
// declarations found.

import assert from "node:assert/strict";
import { execFileSync } from "node:child_process";
import { existsSync, readdirSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { test } from "node:test";
import { PKG, tempDir } from "./harness.js";

test("npm pack installs and imports", { timeout: 120_000 }, (t) => {
  const out = tempDir(t);
  const npm = (cwd: string, ...args: string[]) =>
    execFileSync("npm", [...args, "--no-audit", "--no-fund", "--loglevel=error"], { cwd, encoding: "utf8", stdio: ["ignore", "pipe", "pipe"] });
  npm(PKG, "pack", "--pack-destination", out);
  const tgz = readdirSync(out).find((f) => f.endsWith(".tgz"));
  assert.ok(tgz, "a tarball");
  const app = join(out, "app");
  execFileSync("mkdir", [app]);
  writeFileSync(join(app, "package.json"), JSON.stringify({ name: "app", version: "1.0.0", type: "module", private: true }));
  npm(app, "install", "--offline", join(out, tgz));
  const dir = join(app, "node_modules", "kunci");
  assert.ok(existsSync(join(dir, "dist", "index.d.ts")), "type declarations");
  assert.deepEqual(readdirSync(dir).sort(), ["README.md", "dist", "package.json"]);
  const got = execFileSync(
    process.execPath,
    ["--input-type=module", "-e", 'import * as k from "kunci"; console.log(Object.keys(k).sort().join(" "))'],
    { cwd: app, encoding: "utf8" },
  );
  for (const name of ["Client", "Lock", "TimeoutError", "RefusedError", "AuthError", "UnavailableError", "StaleError", "KunciError", "loadCredentials"]) {
    assert.ok(got.split(" ").includes(name), `${name} exported: ${got}`);
  }
});
