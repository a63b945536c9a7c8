// npm pack gives a tarball that installs: packed, installed into an empty
// project (offline: it has no dependencies), and used from there as an ES
// module (import) and from CommonJS (require), both getting the same
// classes; its type declarations type-check a consumer of each kind, and
// declare the public surface only (no member marked @internal).

import assert from "node:assert/strict";
import { execFileSync } from "node:child_process";
import { existsSync, readdirSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { test } from "node:test";
import { PKG, tempDir } from "./harness.js";

const NAMES = ["Client", "Lock", "TimeoutError", "RefusedError", "AuthError", "UnavailableError", "StaleError", "NoActiveError", "KunciError", "loadCredentials"];

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
  const node = (file: string, src: string) => {
    writeFileSync(join(app, file), src);
    try {
      return execFileSync(process.execPath, [file], { cwd: app, encoding: "utf8", stdio: "pipe" });
    } catch (e) {
      const err = e as { stderr?: string; message: string };
      return assert.fail(`${file}:\n${src}\nfailed: ${err.stderr || err.message}`);
    }
  };

  // An ES module.
  const esm = node("esm.mjs", 'import * as k from "kunci"; console.log(Object.keys(k).sort().join(" "))').trim();
  for (const name of NAMES) assert.ok(esm.split(" ").includes(name), `${name} exported to import: ${esm}`);

  // A CommonJS file: require("kunci") gives the same exports, and the very
  // same classes as import does (one copy of the code: an error thrown to
  // a CommonJS caller is instanceof the class an ES module imported).
  const cjs = node(
    "cjs.cjs",
    `const k = require("kunci");
     const c = new k.Client({ addrs: ["127.0.0.1:1"] });
     c.close().then(async () => {
       const m = await import("kunci");
       if (m.Client !== k.Client || m.TimeoutError !== k.TimeoutError) throw new Error("import and require give different classes");
       console.log(Object.keys(k).sort().join(" "));
     });`,
  ).trim();
  assert.equal(cjs, esm, "require and import export the same names");

  // The declarations, for a TypeScript consumer of either kind (strict).
  writeFileSync(
    join(app, "esm.mts"),
    'import { Client, NoActiveError, type NodeInfo, TimeoutError } from "kunci";\nconst c: Client = new Client({ addrs: ["127.0.0.1:1"] });\nconst e: TimeoutError | NoActiveError | undefined = undefined;\nconst info: () => Promise<NodeInfo> = () => c.info();\nconst active: Promise<string> | undefined = e === undefined ? undefined : c.active();\nvoid c.close(), e, info, active;\n',
  );
  writeFileSync(
    join(app, "cjs.cts"),
    'import kunci = require("kunci");\nconst c: kunci.Client = new kunci.Client({ addrs: ["127.0.0.1:1"] });\nconst e: kunci.TimeoutError | kunci.NoActiveError | undefined = undefined;\nconst info: () => Promise<kunci.NodeInfo> = () => c.info();\nconst active: Promise<string> | undefined = e === undefined ? undefined : c.active();\nvoid c.close(), e, info, active;\n',
  );
  // The declarations hold the public surface only (stripInternal): every
  // line below must be an error for a consumer, or its @ts-expect-error is
  // unused (TS2578); and the module declares exactly the names index.ts
  // exports.
  const names = [...new Set([...NAMES, "BadInputError", "ClosedError", "LostError", "MAX_KEY", "MAX_OWNER", "keyProblem", "processOwner"])];
  writeFileSync(
    join(app, "internals.mts"),
    [
      'import * as kunci from "kunci";',
      'import { Client, Lock } from "kunci";',
      'const c = new Client({ addrs: ["127.0.0.1:1"] });',
      'const l = c.adopt("k", 1n, 1000);',
      ...["c.cfg", "c.conns", "c.outage", "c.closed", "c.session", "c.keys", "c.route", "c.up", "c.noteAuth", "c.queueWrite", "c.waitUp", "c.releaseLock", "l.heldUntil", "Lock.of", "new Lock()", "kunci.parseAnswer", "kunci.MAX_LINE"].flatMap((x) => ["// @ts-expect-error", `void ${x};`]),
      `type Want = ${names.map((n) => JSON.stringify(n)).join(" | ")};`,
      "type Names = keyof typeof kunci;",
      "const exact: [Names] extends [Want] ? ([Want] extends [Names] ? true : false) : false = true;",
      "void exact, c.close();",
      "",
    ].join("\n"),
  );
  writeFileSync(
    join(app, "tsconfig.json"),
    JSON.stringify({
      compilerOptions: { module: "nodenext", moduleResolution: "nodenext", target: "es2022", strict: true, noEmit: true, types: ["node"], typeRoots: [join(PKG, "node_modules", "@types")] },
      files: ["esm.mts", "cjs.cts", "internals.mts"],
    }),
  );
  try {
    execFileSync(process.execPath, [join(PKG, "node_modules", "typescript", "bin", "tsc"), "-p", app], { cwd: app, encoding: "utf8", stdio: "pipe" });
  } catch (e) {
    const err = e as { stdout?: string; stderr?: string; message: string };
    assert.fail(`a consumer does not type-check against the package's declarations:\n${err.stdout ?? ""}${err.stderr ?? ""}`);
  }
});
