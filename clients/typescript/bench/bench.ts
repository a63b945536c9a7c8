// Lock cycles per second (acquire + release) of this client with 1 and 50
// concurrent callers against one kuncid node, beside ioredis doing a fenced
// Redis lock with Lua scripts against redis-server, and beside clientlib
// (the Go bench, `go run ./bench --mode client`) against the same node, in
// one run, interleaved round by round. A benchmark, not a test.
//
//   npm run bench -- [--seconds 5] [--rounds 3] [--callers 1,50]
//
// Every caller locks a key of its own (uncontended), with a 30 s lease and
// a 5 s wait. kuncid: $KUNCID or built from this checkout; redis-server:
// $REDIS_SERVER or on PATH. Prints a markdown table of medians (and the
// range over the rounds).

import { execFileSync, spawn, type ChildProcess } from "node:child_process";
import { mkdtempSync, readFileSync, rmSync } from "node:fs";
import * as net from "node:net";
import { tmpdir } from "node:os";
import { dirname, join, resolve } from "node:path";
import { createInterface } from "node:readline";
import { fileURLToPath } from "node:url";
import { parseArgs } from "node:util";
import { Redis } from "ioredis";
import { Client } from "../src/index.js";

const { values: flags } = parseArgs({
  options: {
    seconds: { type: "string", default: "5" },
    rounds: { type: "string", default: "3" },
    callers: { type: "string", default: "1,50" },
    only: { type: "string", default: "kunci-ts,ioredis,clientlib" },
  },
});
const SECONDS = Number(flags.seconds);
const ROUNDS = Number(flags.rounds);
const CALLERS = flags.callers!.split(",").map(Number);
const ONLY = new Set(flags.only!.split(","));
const REPO = resolve(dirname(fileURLToPath(import.meta.url)), "../../../..");
const LEASE_MS = 30_000;
const WAIT_MS = 5_000;

const work = mkdtempSync(join(tmpdir(), "kunci-ts-bench-"));
const procs: ChildProcess[] = [];
process.on("exit", () => {
  for (const p of procs) p.kill("SIGKILL");
  rmSync(work, { recursive: true, force: true });
});

function startKuncid(): Promise<{ addr: string; pid: number }> {
  let bin = process.env.KUNCID;
  if (bin === undefined) {
    bin = join(work, "kuncid");
    execFileSync("go", ["build", "-o", bin, "./cmd/kuncid"], { cwd: REPO, stdio: "inherit" });
  }
  const env = Object.fromEntries(Object.entries(process.env).filter(([k]) => !k.startsWith("KUNCI_")));
  const p = spawn(resolve(bin), ["--listen", "127.0.0.1:0", "--log-format", "json", "--data-dir", join(work, "data")], { stdio: ["ignore", "ignore", "pipe"], env });
  procs.push(p);
  return new Promise((res, rej) => {
    p.once("exit", (c) => rej(new Error(`kuncid exited ${c}`)));
    createInterface({ input: p.stderr! }).on("line", (l) => {
      if (l.includes('"kunci node started"')) res({ addr: JSON.parse(l).addr as string, pid: p.pid! });
    });
  });
}

async function startRedis(): Promise<number> {
  const l = net.createServer();
  await new Promise<void>((r) => l.listen(0, "127.0.0.1", r));
  const port = (l.address() as net.AddressInfo).port;
  await new Promise((r) => l.close(r));
  const p = spawn(process.env.REDIS_SERVER ?? "redis-server", ["--port", String(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"], { stdio: "ignore" });
  procs.push(p);
  for (let i = 0; ; i++) {
    const up = await new Promise<boolean>((res) => {
      const s = net.connect({ port, host: "127.0.0.1" }, () => {
        s.destroy();
        res(true);
      });
      s.on("error", () => res(false));
    });
    if (up) break;
    if (i > 400) throw new Error("redis-server did not start");
    await new Promise((res) => setTimeout(res, 25));
  }
  return port;
}

/** Runs callers loops of cycle for SECONDS and returns cycles/s. */
async function measure(callers: number, cycle: (i: number) => Promise<void>): Promise<number> {
  // Warm up.
  const warm = performance.now() + 500;
  await Promise.all(Array.from({ length: callers }, async (_, i) => {
    while (performance.now() < warm) await cycle(i);
  }));
  let n = 0;
  const start = performance.now();
  const end = start + SECONDS * 1000;
  await Promise.all(Array.from({ length: callers }, async (_, i) => {
    while (performance.now() < end) {
      await cycle(i);
      n++;
    }
  }));
  return n / ((performance.now() - start) / 1000);
}

async function kunciTs(addr: string, callers: number, round: number): Promise<number> {
  const c = new Client({ addrs: [addr] });
  try {
    return await measure(callers, async (i) => {
      const l = await c.acquire(`bench/ts/${round}/${i}`, { leaseMs: LEASE_MS, waitMs: WAIT_MS });
      await l.release();
    });
  } finally {
    await c.close();
  }
}

const ACQUIRE = `if redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then
  return redis.call('INCR', KEYS[2])
end
return 0`;
const RELEASE = `if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('DEL', KEYS[1])
end
return 0`;

type Fenced = Redis & {
  fencedAcquire(key: string, fence: string, owner: string, leaseMs: number): Promise<number>;
  fencedRelease(key: string, owner: string): Promise<number>;
};

async function ioredis(port: number, callers: number, round: number): Promise<number> {
  // One connection, commands of a tick pipelined (ioredis' fastest setting).
  const r = new Redis({ port, host: "127.0.0.1", enableAutoPipelining: true }) as Fenced;
  r.defineCommand("fencedAcquire", { numberOfKeys: 2, lua: ACQUIRE });
  r.defineCommand("fencedRelease", { numberOfKeys: 1, lua: RELEASE });
  let seq = 0;
  try {
    return await measure(callers, async (i) => {
      const key = `bench/redis/${round}/${i}`;
      const owner = `${process.pid}-${seq++}`;
      // Redis has no queue: retry with a short pause until the wait runs out (uncontended here: never).
      const until = performance.now() + WAIT_MS;
      for (;;) {
        const token = await r.fencedAcquire(key, "bench/fence", owner, LEASE_MS);
        if (token !== 0) break;
        if (performance.now() > until) throw new Error("wait ran out");
        await new Promise((res) => setTimeout(res, 1));
      }
      if ((await r.fencedRelease(key, owner)) !== 1) throw new Error("stale");
    });
  } finally {
    r.disconnect();
  }
}

function clientlib(addr: string, callers: number, round: number): number {
  const out = join(work, `go-${callers}-${round}.json`);
  execFileSync(join(work, "bench-go"), [
    "--target", `kunci://${addr}`, "--mode", "client", "--conns", "1", "--depth", String(callers), "--workload", "uncontended",
    "--lease", `${LEASE_MS}ms`, "--wait", `${WAIT_MS}ms`, "--warmup", "500ms", "--duration", `${SECONDS}s`, "--progress", "0", "--json", out,
  ], { stdio: ["ignore", "ignore", "inherit"] });
  return (JSON.parse(readFileSync(out, "utf8")) as { cycles_per_s: number }).cycles_per_s;
}

const median = (xs: number[]) => [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)]!;
const k = (x: number) => (x >= 10_000 ? `${(x / 1000).toFixed(1)}k` : x.toFixed(0));

const node = await startKuncid();
const redisPort = await startRedis();
if (ONLY.has("clientlib")) execFileSync("go", ["build", "-o", join(work, "bench-go"), "./bench"], { cwd: REPO, stdio: "inherit" });
const results = new Map<string, number[]>();
const add = (name: string, callers: number, v: number) => {
  const key = `${name}|${callers}`;
  results.set(key, [...(results.get(key) ?? []), v]);
  process.stderr.write(`round: ${name} ${callers} callers: ${k(v)} cycles/s\n`);
};
for (let round = 0; round < ROUNDS; round++) {
  for (const callers of CALLERS) {
    if (ONLY.has("kunci-ts")) add("kunci-ts", callers, await kunciTs(node.addr, callers, round));
    if (ONLY.has("ioredis")) add("ioredis", callers, await ioredis(redisPort, callers, round));
    if (ONLY.has("clientlib")) add("clientlib", callers, clientlib(node.addr, callers, round));
  }
}
const cell = (name: string, callers: number) => {
  const xs = results.get(`${name}|${callers}`);
  if (xs === undefined) return "–";
  return `${k(median(xs))} (${k(Math.min(...xs))}–${k(Math.max(...xs))})`;
};
const lines = [
  `| callers | kunci (TypeScript) | ioredis, fenced Lua lock | clientlib (Go) | TS ÷ ioredis | TS ÷ clientlib |`,
  `| ---: | ---: | ---: | ---: | ---: | ---: |`,
];
for (const callers of CALLERS) {
  const ts = median(results.get(`kunci-ts|${callers}`) ?? [NaN]);
  const io = median(results.get(`ioredis|${callers}`) ?? [NaN]);
  const go = median(results.get(`clientlib|${callers}`) ?? [NaN]);
  lines.push(`| ${callers} | ${cell("kunci-ts", callers)} | ${cell("ioredis", callers)} | ${cell("clientlib", callers)} | ${(ts / io).toFixed(2)}× | ${(ts / go).toFixed(2)}× |`);
}
console.log(`lock cycles/s (acquire + release), median of ${ROUNDS} rounds of ${SECONDS} s (range), node ${process.version}\n`);
console.log(lines.join("\n"));
process.exit(0);
