// Real kuncid processes for the tests, on 127.0.0.1: single nodes on port 0
// (the address read from the node's "kunci node started" log line),
// clusters on free ports picked here, a TCP proxy that can cut
// connections, scripted nodes whose answers the test writes, clients, and
// waiting on conditions with a deadline. Every process is killed, and every
// client closed, when its test ends.

import { type ChildProcess, execFileSync, spawn } from "node:child_process";
import { chmodSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import * as net from "node:net";
import { tmpdir } from "node:os";
import { dirname, join, resolve } from "node:path";
import { createInterface } from "node:readline";
import type { TestContext } from "node:test";
import { fileURLToPath } from "node:url";
import { Client, type ClientOptions } from "../src/index.js";

/** The package's directory (clients/typescript), and the repository's. */
export const PKG = resolve(dirname(fileURLToPath(import.meta.url)), "../..");
export const REPO = resolve(PKG, "../..");

/** How long a test waits for a condition: long enough for a busy 2-core machine. */
export const WAIT_MS = 15_000;

let kuncid = process.env.KUNCID;

/** The kuncid binary: $KUNCID, or built once from this repository. */
export function kuncidPath(): string {
  if (kuncid === undefined) {
    const dir = mkdtempSync(join(tmpdir(), "kunci-ts-"));
    kuncid = join(dir, "kuncid");
    execFileSync("go", ["build", "-o", kuncid, "./cmd/kuncid"], { cwd: REPO, stdio: "inherit" });
    process.on("exit", () => rmSync(dir, { recursive: true, force: true }));
  }
  return resolve(kuncid);
}

/** A temporary directory removed when the test ends. */
export function tempDir(t: TestContext): string {
  const d = mkdtempSync(join(tmpdir(), "kunci-ts-"));
  t.after(() => rmSync(d, { recursive: true, force: true }));
  return d;
}

export interface Node {
  proc: ChildProcess;
  addr: string;
  tlsAddr: string;
  admin: string;
  /** Resolves with the exit code (or signal) once the process has exited. */
  exited: Promise<string>;
  logs: string[];
  /** Sends sig (default SIGKILL) and waits for the exit. */
  kill(sig?: NodeJS.Signals): Promise<string>;
}

/**
 * Starts kuncid with args (before them --listen 127.0.0.1:0, JSON logs, its
 * own data directory and an admin endpoint on port 0, each overridable by
 * giving it again), and waits for its start line. The process is killed
 * when the test ends.
 */
export async function startNode(t: TestContext, args: string[] = []): Promise<Node> {
  const all = ["--listen", "127.0.0.1:0", "--log-format", "json", "--data-dir", tempDir(t), "--admin", "127.0.0.1:0", ...args];
  // kuncid refuses to start beside a KUNCI_ variable it does not know.
  const env = Object.fromEntries(Object.entries(process.env).filter(([k]) => !k.startsWith("KUNCI_")));
  const proc = spawn(kuncidPath(), all, { stdio: ["ignore", "ignore", "pipe"], env });
  const exited = new Promise<string>((res) => proc.once("exit", (code, sig) => res(sig ?? String(code))));
  const node: Node = {
    proc,
    addr: "",
    tlsAddr: "",
    admin: "",
    exited,
    logs: [],
    async kill(sig: NodeJS.Signals = "SIGKILL") {
      if (proc.exitCode === null && proc.signalCode === null) proc.kill(sig);
      return exited;
    },
  };
  t.after(() => node.kill("SIGKILL"));
  const lines = createInterface({ input: proc.stderr! });
  const started = new Promise<void>((res, rej) => {
    const timer = setTimeout(() => rej(new Error(`kuncid ${all.join(" ")}: no start line within ${WAIT_MS} ms`)), WAIT_MS);
    void exited.then((how) => {
      clearTimeout(timer);
      rej(new Error(`kuncid ${all.join(" ")} exited (${how}) before it started:\n${node.logs.join("\n")}`));
    });
    lines.on("line", (l) => {
      if (node.logs.length < 2000) node.logs.push(l);
      try {
        const j = JSON.parse(l) as { message?: string; addr?: string; tls_addr?: string; admin?: string };
        if (j.message === "kunci node started") {
          node.addr = j.addr ?? "";
          node.tlsAddr = j.tls_addr ?? "";
          node.admin = j.admin ?? "";
          clearTimeout(timer);
          res();
        }
      } catch {
        // not JSON: keep it in logs
      }
    });
  });
  await started;
  return node;
}

/** The ports freeAddrs picks from: below the kernel's ephemeral range. */
function pickRange(): [number, number] {
  let lo = 10000;
  let hi = 32768;
  try {
    const first = Number(readFileSync("/proc/sys/net/ipv4/ip_local_port_range", "utf8").trim().split(/\s+/)[0]);
    if (Number.isInteger(first) && first > 1024) {
      hi = first;
      lo = Math.min(lo, Math.max(1024, hi - 20000));
    }
  } catch {
    // not Linux: the defaults
  }
  return [lo, hi];
}

/** Listens with l on port, reporting whether it could. */
function tryListen(l: net.Server, port: number): Promise<boolean> {
  return new Promise((res) => {
    const failed = (): void => res(false);
    l.once("error", failed);
    l.listen(port, "127.0.0.1", () => {
      l.off("error", failed);
      res(true);
    });
  });
}

/**
 * n loopback addresses nothing listened on a moment ago (each held until all
 * are picked). The ports come from below the ephemeral range, from which
 * every outgoing connection takes its local port: one picked there (as
 * listening on port 0 does) and let go is anyone's next connect() before
 * the node binds it (the Go tests' testaddr.Free does the same).
 */
export async function freeAddrs(n: number): Promise<string[]> {
  const [lo, hi] = pickRange();
  const ls: net.Server[] = [];
  const out: string[] = [];
  while (ls.length < n) {
    let l = net.createServer();
    let ok = false;
    for (let i = 0; i < 64 && !ok && hi - lo >= 1000; i++) {
      ok = await tryListen(l, lo + Math.floor(Math.random() * (hi - lo)));
      if (!ok) l = net.createServer();
    }
    if (!ok && !(await tryListen(l, 0))) throw new Error("no free loopback port");
    ls.push(l);
    out.push(`127.0.0.1:${(l.address() as net.AddressInfo).port}`);
  }
  await Promise.all(ls.map((l) => new Promise((res) => l.close(res))));
  return out;
}

/**
 * Listens with server on a free loopback port and returns its "host:port".
 * When the test ends, onEnd runs (to destroy the server's connections) and
 * the server closes.
 */
export async function listenLoopback(t: TestContext, server: net.Server, onEnd: () => void): Promise<string> {
  await new Promise<void>((res) => server.listen(0, "127.0.0.1", res));
  t.after(() => {
    onEnd();
    return new Promise<void>((res) => server.close(() => res()));
  });
  return `127.0.0.1:${(server.address() as net.AddressInfo).port}`;
}

/** Writes a cluster key file (mode 600) and returns its path. */
export function clusterKey(t: TestContext): string {
  const f = join(tempDir(t), "cluster.key");
  writeFileSync(f, "a test cluster key, 32 bytes lng\n", { mode: 0o600 });
  chmodSync(f, 0o600);
  return f;
}

export interface Cluster {
  addrs: string[];
  nodes: Node[];
}

/**
 * Starts a cluster of size kuncid processes on free loopback ports (the
 * first is the active), with test timing (heartbeat 50 ms, failover 500
 * ms) and extra args, and waits until every standby follows the active's
 * stream. A port taken meanwhile by another process: tried again on others.
 */
export async function startCluster(t: TestContext, size: number, extra: string[] = []): Promise<Cluster> {
  const key = clusterKey(t);
  let last: unknown;
  for (let attempt = 0; attempt < 3; attempt++) {
    const addrs = await freeAddrs(size);
    const nodes: Node[] = [];
    try {
      for (const a of addrs) {
        nodes.push(
          await startNode(t, [
            "--listen", a, "--advertise", a, "--peers", addrs.join(","), "--cluster-key-file", key,
            "--heartbeat", "50ms", "--failover-timeout", "500ms", ...extra,
          ]),
        );
      }
    } catch (e) {
      last = e;
      await Promise.all(nodes.map((n) => n.kill()));
      continue;
    }
    for (let i = 0; i < size; i++) {
      await waitInfo(addrs[i]!, i === 0 ? `I active ${addrs[0]} ${addrs[0]}` : `I standby ${addrs[i]} ${addrs[0]}`);
    }
    // Every standby has copied the active's state and follows its stream.
    await waitFor("every standby synced", async () => {
      const m = await httpGet(nodes[0]!.admin, "/metrics");
      return addrs.slice(1).every((a) => m.includes(`kunci_replication_synced{standby="${a}"} 1`));
    });
    return { addrs, nodes };
  }
  throw last;
}

/** GETs path from an admin endpoint; "" on failure. */
export function httpGet(addr: string, path: string): Promise<string> {
  return new Promise((res) => {
    const [host, port] = [addr.slice(0, addr.lastIndexOf(":")), Number(addr.slice(addr.lastIndexOf(":") + 1))];
    const s = net.connect({ host, port });
    let body = "";
    s.setTimeout(2000, () => s.destroy());
    s.on("error", () => res(""));
    s.on("data", (d) => (body += d.toString()));
    s.on("close", () => res(body));
    s.write(`GET ${path} HTTP/1.0\r\nHost: ${addr}\r\n\r\n`);
  });
}

/** Sends one line to addr on a connection of its own and returns the answer line ("" when none came). */
export function roundTrip(addr: string, line: string, ms = 2000): Promise<string> {
  return new Promise((res) => {
    const i = addr.lastIndexOf(":");
    const s = net.connect({ host: addr.slice(0, i), port: Number(addr.slice(i + 1)) });
    let got = "";
    const done = (v: string) => {
      s.destroy();
      res(v);
    };
    s.setTimeout(ms, () => done(""));
    s.on("error", () => done(""));
    s.on("data", (d) => {
      got += d.toString();
      const nl = got.indexOf("\n");
      if (nl >= 0) done(got.slice(0, nl));
    });
    s.write(line + "\n");
  });
}

/** Waits until the node at addr answers I with want. */
export async function waitInfo(addr: string, want: string): Promise<void> {
  let got = "";
  await waitFor(`${addr} to answer I with ${JSON.stringify(want)}`, async () => {
    got = await roundTrip(addr, "I");
    return got === want;
  }).catch((e: Error) => {
    throw new Error(`${e.message}; last answer ${JSON.stringify(got)}`);
  });
}

/** Polls cond every 10 ms until it holds; throws after ms. */
export async function waitFor(what: string, cond: () => boolean | Promise<boolean>, ms = WAIT_MS): Promise<void> {
  const until = performance.now() + ms;
  for (;;) {
    if (await cond()) return;
    if (performance.now() > until) throw new Error(`still waiting after ${ms} ms for ${what}`);
    await new Promise((r) => setTimeout(r, 10));
  }
}

/**
 * A TCP proxy on 127.0.0.1:0 to target that the test controls: it can cut
 * every connection, refuse new ones for a while, and lose an answer.
 */
export class Proxy {
  readonly server: net.Server;
  addr = "";
  /** Connections accepted in all. */
  accepted = 0;
  /** The lines clients sent through the proxy, in the order it read them. */
  readonly up: string[] = [];
  /**
   * When set, the next answer line from the node it matches is lost: not
   * passed on, and every connection cut at that moment (blocked for
   * loseBlockMs), as when a connection breaks after the node wrote an answer
   * and before the client read it. It is then unset; lost holds the line.
   */
  lose: ((line: string) => boolean) | undefined;
  loseBlockMs = 0;
  readonly lost: string[] = [];
  private readonly pairs = new Set<[net.Socket, net.Socket]>();
  private blockedUntil = 0;

  constructor(private readonly target: string) {
    this.server = net.createServer((c) => this.accept(c));
  }

  async start(t: TestContext): Promise<this> {
    this.addr = await listenLoopback(t, this.server, () => this.cut());
    return this;
  }

  private accept(c: net.Socket): void {
    this.accepted++;
    c.on("error", () => {});
    if (performance.now() < this.blockedUntil) {
      c.destroy();
      return;
    }
    const i = this.target.lastIndexOf(":");
    const u = net.connect({ host: this.target.slice(0, i), port: Number(this.target.slice(i + 1)) });
    u.on("error", () => {});
    const pair: [net.Socket, net.Socket] = [c, u];
    this.pairs.add(pair);
    const end = () => {
      c.destroy();
      u.destroy();
      this.pairs.delete(pair);
    };
    c.on("close", end);
    u.on("close", end);
    let upBuf = "";
    c.on("data", (d: Buffer) => {
      upBuf += d.toString("latin1");
      for (let i = upBuf.indexOf("\n"); i >= 0; i = upBuf.indexOf("\n")) {
        this.up.push(upBuf.slice(0, i));
        upBuf = upBuf.slice(i + 1);
      }
      u.write(d);
    });
    let downBuf = "";
    u.on("data", (d: Buffer) => {
      if (this.lose === undefined && downBuf === "") {
        c.write(d);
        return;
      }
      // Line by line, until the line to lose.
      downBuf += d.toString("latin1");
      let out = "";
      for (let i = downBuf.indexOf("\n"); i >= 0; i = downBuf.indexOf("\n")) {
        const line = downBuf.slice(0, i);
        downBuf = downBuf.slice(i + 1);
        if (this.lose?.(line)) {
          this.lose = undefined;
          this.lost.push(line);
          c.write(Buffer.from(out, "latin1"));
          this.cut(this.loseBlockMs);
          return;
        }
        out += line + "\n";
      }
      c.write(Buffer.from(out, "latin1"));
    });
  }

  /** Cuts every connection through the proxy, and refuses new ones (accepted, then closed) for blockMs. */
  cut(blockMs = 0): number {
    this.blockedUntil = performance.now() + blockMs;
    const n = this.pairs.size;
    for (const [c, u] of this.pairs) {
      c.destroy();
      u.destroy();
    }
    this.pairs.clear();
    return n;
  }

  close(): Promise<void> {
    this.cut();
    return new Promise((res) => this.server.close(() => res()));
  }
}

/**
 * A node the test scripts: a TCP server on 127.0.0.1 that hands every line
 * its connections send, without its LF, to received, which answers as the
 * test has it. Its connections are destroyed when the test ends.
 */
export abstract class ScriptedNode {
  readonly server = net.createServer((c) => this.accept(c));
  addr = "";
  /** Every connection accepted, in order. */
  readonly conns: net.Socket[] = [];

  protected abstract received(conn: net.Socket, line: string): void;

  async start(t: TestContext): Promise<this> {
    this.addr = await listenLoopback(t, this.server, () => {
      for (const c of this.conns) c.destroy();
    });
    return this;
  }

  private accept(c: net.Socket): void {
    this.conns.push(c);
    c.on("error", () => {});
    let buf = "";
    c.on("data", (d) => {
      buf += d.toString();
      for (let i = buf.indexOf("\n"); i >= 0; i = buf.indexOf("\n")) {
        const line = buf.slice(0, i);
        buf = buf.slice(i + 1);
        this.received(c, line);
      }
    });
  }
}

/** A client closed when the test ends. */
export function client(t: TestContext, opts: ClientOptions): Client {
  const c = new Client(opts);
  t.after(() => c.close());
  return c;
}

/**
 * A node behind a Proxy, and two clients closed when the test ends: c goes
 * through the proxy (with opts), look to the node itself, so that it sees
 * what the node holds whatever the proxy does to c.
 */
export async function behindProxy(
  t: TestContext,
  opts: Omit<ClientOptions, "addrs"> = {},
): Promise<{ proxy: Proxy; c: Client; look: Client }> {
  const n = await startNode(t);
  const proxy = await new Proxy(n.addr).start(t);
  return { proxy, c: client(t, { ...opts, addrs: [proxy.addr] }), look: client(t, { addrs: [n.addr] }) };
}

/** A TCP server that accepts connections and keeps what they send, answering nothing. */
export class Counter {
  readonly server: net.Server;
  addr = "";
  /** What the connections sent, in the order it arrived. */
  text = "";
  conns = 0;
  private readonly socks = new Set<net.Socket>();
  constructor() {
    this.server = net.createServer((c) => {
      this.conns++;
      this.socks.add(c);
      c.on("data", (d) => (this.text += d.toString("latin1")));
      c.on("error", () => {});
      c.on("close", () => this.socks.delete(c));
    });
  }
  async start(t: TestContext): Promise<this> {
    this.addr = await listenLoopback(t, this.server, () => {
      for (const s of this.socks) s.destroy();
    });
    return this;
  }
}

/** Makes a CA, a server certificate for 127.0.0.1 and a client certificate named CN, with openssl, in dir. */
export function makeCerts(dir: string, clientName = "alice"): { ca: string; cert: string; key: string; clientCert: string; clientKey: string; otherCa: string } {
  const run = (...args: string[]) => execFileSync("openssl", args, { cwd: dir, stdio: ["ignore", "ignore", "pipe"] });
  const ext = join(dir, "san.ext");
  writeFileSync(ext, "subjectAltName=IP:127.0.0.1,DNS:localhost\nextendedKeyUsage=serverAuth\n");
  const cext = join(dir, "client.ext");
  writeFileSync(cext, "extendedKeyUsage=clientAuth\n");
  const key = (name: string) => run("ecparam", "-name", "prime256v1", "-genkey", "-noout", "-out", name);
  key("ca.key");
  run("req", "-x509", "-new", "-key", "ca.key", "-sha256", "-days", "2", "-subj", "/CN=kunci test CA", "-out", "ca.pem");
  key("other-ca.key");
  run("req", "-x509", "-new", "-key", "other-ca.key", "-sha256", "-days", "2", "-subj", "/CN=another CA", "-out", "other-ca.pem");
  key("node.key");
  run("req", "-new", "-key", "node.key", "-subj", "/CN=127.0.0.1", "-out", "node.csr");
  run("x509", "-req", "-in", "node.csr", "-CA", "ca.pem", "-CAkey", "ca.key", "-CAcreateserial", "-days", "2", "-sha256", "-extfile", ext, "-out", "node.pem");
  key("client.key");
  run("req", "-new", "-key", "client.key", "-subj", `/CN=${clientName}`, "-out", "client.csr");
  run("x509", "-req", "-in", "client.csr", "-CA", "ca.pem", "-CAkey", "ca.key", "-CAcreateserial", "-days", "2", "-sha256", "-extfile", cext, "-out", "client.pem");
  for (const f of ["ca.key", "other-ca.key", "node.key", "client.key"]) chmodSync(join(dir, f), 0o600);
  return {
    ca: join(dir, "ca.pem"),
    cert: join(dir, "node.pem"),
    key: join(dir, "node.key"),
    clientCert: join(dir, "client.pem"),
    clientKey: join(dir, "client.key"),
    otherCa: join(dir, "other-ca.pem"),
  };
}
