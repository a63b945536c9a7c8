// Runs every ```ts example of README.md as written, as a program importing
// the package "kunci" (this package's dist/, linked into a temporary
// node_modules), against real nodes: the examples' addresses and file paths
// are replaced by those of the nodes started here. The examples are
// TypeScript a user compiles: tsc type-checks them first, strict (as
// tsconfig.json, which a user's project may well be), and what it emits is
// what runs.

import assert from "node:assert/strict";
import { execFile, execFileSync } from "node:child_process";
import { mkdirSync, readFileSync, symlinkSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import type { TestContext } from "node:test";
import { PKG, makeCerts, startNode, tempDir } from "./harness.js";

/** The ```ts blocks of the README. */
export function readmeExamples(): string[] {
  const md = readFileSync(join(PKG, "README.md"), "utf8");
  return [...md.matchAll(/```ts\n([\s\S]*?)```/g)].map((m) => m[1]!);
}

export async function runReadmeExamples(t: TestContext): Promise<void> {
  const dir = tempDir(t);
  mkdirSync(join(dir, "node_modules"));
  symlinkSync(PKG, join(dir, "node_modules", "kunci"), "dir");
  assert.ok(readFileSync(join(PKG, "dist", "index.js")).length > 0, "dist/ is built (npm run build)");

  const plain = await startNode(t);
  const certs = makeCerts(tempDir(t), "tour");
  const auth = join(dir, "auth");
  writeFileSync(auth, "tour a-secret-of-at-least-16-bytes\n", { mode: 0o600 });
  const creds = join(dir, "credentials");
  writeFileSync(creds, "# the tour's\ntour a-secret-of-at-least-16-bytes\n", { mode: 0o600 });
  const secure = await startNode(t, [
    "--tls-listen", "127.0.0.1:0", "--tls-cert", certs.cert, "--tls-key", certs.key, "--tls-client-ca", certs.ca, "--auth-file", auth,
  ]);
  const put: Array<[string, string]> = [
    ["127.0.0.1:7070", plain.addr],
    ["127.0.0.1:7443", secure.tlsAddr],
    ["/etc/kunci/ca.pem", certs.ca],
    ["/etc/kunci/client.pem", certs.clientCert],
    ["/etc/kunci/client.key", certs.clientKey],
    ["/etc/kunci/credentials", creds],
  ];
  const examples = readmeExamples();
  assert.ok(examples.length >= 3, `${examples.length} examples in README.md`);
  for (const [i, ex] of examples.entries()) {
    let src = ex;
    for (const [from, to] of put) src = src.split(from).join(to);
    writeFileSync(join(dir, `example${i}.mts`), src);
  }
  typecheck(dir, examples.length);
  for (const [i, ex] of examples.entries()) {
    const file = join(dir, `example${i}.mjs`);
    const out = await new Promise<string>((res, rej) =>
      execFile(process.execPath, [file], { cwd: dir, timeout: 30_000 }, (err, stdout, stderr) =>
        err ? rej(new Error(`README example ${i + 1}:\n${ex}\nfailed: ${err.message}\n${stdout}${stderr}`)) : res(stdout),
      ),
    );
    t.diagnostic(`example ${i + 1}: ${out.trim().split("\n").join(" | ")}`);
  }
}

/**
 * Compiles the examples in dir (example<i>.mts, one module each, top-level
 * await) with this package's tsc, strict, to example<i>.mjs beside them;
 * a type error fails the test with tsc's words.
 */
function typecheck(dir: string, n: number): void {
  writeFileSync(
    join(dir, "tsconfig.json"),
    JSON.stringify({
      compilerOptions: {
        target: "es2022",
        lib: ["es2022"],
        module: "nodenext",
        moduleResolution: "nodenext",
        strict: true,
        types: ["node"],
        typeRoots: [join(PKG, "node_modules", "@types")],
        skipLibCheck: false,
        outDir: dir,
      },
      files: Array.from({ length: n }, (_, i) => `example${i}.mts`),
    }),
  );
  try {
    execFileSync(process.execPath, [join(PKG, "node_modules", "typescript", "bin", "tsc"), "-p", dir], { cwd: dir, encoding: "utf8", stdio: "pipe" });
  } catch (e) {
    const err = e as { stdout?: string; stderr?: string; message: string };
    assert.fail(`README's ts examples do not type-check (tsc --strict):\n${err.stdout ?? ""}${err.stderr ?? ""}${err.stdout || err.stderr ? "" : err.message}`);
  }
}
