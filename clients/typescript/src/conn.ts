// One persistent connection of a Client: its socket, the requests
// outstanding on it, and the loop that keeps it up (dial, authenticate, find
// the active, name the client's session, serve, and again after a failure).
// The twin of clientlib's conn.go, and of outage.go's seek and pause.
//
// A Conn sees its client only through ConnHost, defined here: client.ts
// imports this module, never the other way round.
//
// Everything runs on Node's one thread: no locks. Requests are buffered by
// their callers and written once per tick of the event loop
// (process.nextTick: after every caller woken by the answers just read has
// sent its next request), one write per connection.

import * as net from "node:net";
import * as tls from "node:tls";
import { Call, type Result, broken, redirected } from "./call.js";
import type { Credentials } from "./credentials.js";
import { AuthError, KunciError, RefusedError } from "./errors.js";
import type { Outage } from "./outage.js";
import { type Answer, BadAnswerError, MAX_LINE, authLine, cancelLine, infoLine, parseAnswer, sessionLine, splitAddr } from "./protocol.js";

const errHalfOpen = new Error("node stopped answering");
const errWriteStuck = new Error("node stopped reading");
const errNoActive = new Error("the node knows no active node");

/** @internal The settings of a client that its connections use (Config, the client's, has them all). Times are in milliseconds. */
export interface ConnConfig {
  credentials: Credentials | undefined;
  tls: tls.ConnectionOptions | undefined;
  dialTimeoutMs: number;
  writeTimeoutMs: number;
  reconnectIntervalMs: number;
  probeIntervalMs: number;
  probeTimeoutMs: number;
}

/**
 * What a connection needs of the client it belongs to (a Client is one),
 * and all it sees of it: its settings and session, what its connections
 * learned of the nodes, and the waits and wake-ups they share. Its methods
 * are called on Node's one thread, by the Conn's run loop and socket
 * handlers.
 *
 * @internal
 */
export interface ConnHost {
  readonly cfg: ConnConfig;
  /** The client's session, named first on every connection (session.ts). */
  readonly session: bigint;
  /** The client is closed: the connection stops. */
  readonly closed: boolean;
  /** Shared by the client's connections, which read and write it. */
  readonly outage: Outage;
  log(level: "debug" | "warn", msg: string, fields: Record<string, unknown>): void;
  /** A node refused the credentials (err), or accepted them (undefined). */
  noteAuth(err: AuthError | undefined): void;
  /** Registers fn to run when the client closes; returns its removal. */
  onClose(fn: () => void): () => void;
  /** Waits ms; false when the client closed first. */
  sleep(ms: number): Promise<boolean>;
  /** Waits until a connection comes up, ms pass, or the client closes. */
  waitUp(ms: number): Promise<void>;
  /** cn came up, having named the session first with sc: the client reconciles the session's listing, and wakes whoever waits for a connection. */
  up(cn: Conn, sc: Call): void;
  /** Puts cn on the list to write (its flush) once every caller of this tick has buffered its request. */
  queueWrite(cn: Conn): void;
}

/** How a connection ended: a redirect (M addr; "" for none), or a failure. */
interface End {
  redirect?: string;
  err?: unknown;
  served: boolean;
}

/**
 * One persistent connection of a client. Its fields are set by its own run
 * loop and socket handlers; the client reads the public ones to route
 * requests (usable, writing(), gen, redirecting, sessions, lastErr), sends
 * on it with send (an acquire with acquire, withdrawn with withdraw: the
 * gate is the connection's alone), and writes what it buffered with flush.
 *
 * @internal
 */
export class Conn {
  /** The socket while the connection is up; null between sockets. */
  private sock: net.Socket | null = null;
  /** The address the socket goes to, and how many sockets came before it (a request sent again checks that its connection is still the same one). */
  addr = "";
  gen = 0;
  /** The socket went down to follow a redirect. */
  redirecting = false;
  /** The connection is up and takes requests: set by attach, cleared when it ends. */
  usable = false;
  /** Why the last attempt to connect failed, undefined once one worked. */
  lastErr: unknown = undefined;
  /**
   * The node of the connection knows sessions: true once it answered the
   * client's S with its listing, false when it refused it (a node from
   * before sessions: nothing is sent with seen= on this connection);
   * undefined until the answer comes.
   */
  sessions: boolean | undefined = undefined;
  private sessionWaiters: Array<() => void> = [];
  /** The node refused the session with "auth required" (it asks for credentials the client was not given), and closes the connection. */
  private authRefused: AuthError | undefined;

  // Outstanding requests: acquires by key, at most one of a key (the gate:
  // see acquire), the rest in send order in sent[sentHead..] (answered ones
  // null).
  private readonly acq = new Map<string, Call>();
  private sent: Array<Call | null> = [];
  private sentHead = 0;
  private probes = 0;

  // Writing: the lines buffered for the next write, whether the connection
  // is on the client's list to write, and since when the socket has not
  // taken a write (0: it took them all).
  private wbuf = "";
  private dirty = false;
  private writeStuckSince = 0;

  // Reading.
  private rbuf: Buffer | null = null;
  private served = false;
  private lastRead = 0;
  private probeSent = 0;
  private timer: NodeJS.Timeout | undefined;
  private ended: ((e: End) => void) | undefined;
  private unhook: (() => void) | undefined;

  constructor(
    private readonly cl: ConnHost,
    readonly home: string,
    readonly idx: number,
  ) {}

  /** Destroys the socket of the connection, if any: the client closes (a socket still being dialled is destroyed by the client's close hooks). */
  close(): void {
    this.sock?.destroy();
  }

  /** A write is under way that the socket has not taken yet: the node may have stopped reading. */
  writing(): boolean {
    return this.writeStuckSince !== 0;
  }

  /**
   * Keeps the connection up until the client closes. first is called after
   * the first attempt to connect. An address that does not answer is dialled
   * again every reconnectInterval (see pause); a redirect to a node that
   * answers is followed at once, and so is the active when another
   * connection finds it. A redirect to an address that is down, or to none,
   * is not followed: the node that sent it is asked which node is the active
   * (seek).
   */
  async run(first: () => void): Promise<void> {
    const cl = this.cl;
    const cfg = cl.cfg;
    let addr = this.home;
    // named: addr is where a node, or another connection, found the active;
    // seek: ask the node at addr which node is the active before use.
    let named = false;
    let seek = false;
    let bounces = 0;
    // The next attempt goes to to, where a node or another connection found the active.
    const follow = (to: string) => {
      addr = to;
      named = true;
      seek = false;
    };
    for (let attempt = 0; ; attempt++) {
      if (cl.closed) return;
      let sock: net.Socket | null = null;
      let err: unknown;
      try {
        sock = await this.dial(addr);
      } catch (e) {
        err = e;
      }
      cl.outage.dialed(addr, err);
      if (sock !== null && err === undefined) {
        try {
          await this.authenticate(sock, addr);
        } catch (e) {
          err = e;
        }
      }
      if (sock !== null && err === undefined && seek) {
        try {
          const r = await this.seek(sock, addr);
          if (!r.active) {
            this.drop(sock);
            cl.log("debug", "the node names the active", { node: addr, active: r.to });
            follow(r.to);
            continue;
          }
          named = true;
        } catch (e) {
          err = e;
        }
      }
      if (err !== undefined || sock === null || cl.closed) {
        if (sock !== null) this.drop(sock);
        if (cl.closed) {
          if (attempt === 0) first();
          return;
        }
        this.lastErr = err;
        if (attempt === 0) first();
        if (err instanceof AuthError) {
          cl.noteAuth(err);
          cl.log("warn", "credentials refused", { err: String(err) });
        } else {
          cl.log("debug", "dial failed", { addr, err: String(err) });
        }
        if (addr !== this.home) {
          // The active named is gone: back to our own node, which may know the next one.
          addr = this.home;
          named = false;
          seek = true;
          continue;
        }
        const to = await this.pause(cfg.reconnectIntervalMs, addr);
        if (cl.closed) return;
        if (to !== "") follow(to);
        continue;
      }
      if (cfg.credentials) cl.noteAuth(undefined);
      const sought = seek; // the node said it is the active
      this.lastErr = undefined;
      const ended = this.attach(sock, addr, named);
      if (attempt === 0) first();
      const since = performance.now();
      let { redirect, err: cause, served } = await ended;
      const refused = this.authRefused;
      if (refused !== undefined) {
        // The node wants credentials: say so to the requests that find no
        // connection, and dial again after reconnectInterval, not at once.
        this.authRefused = undefined;
        this.detach(undefined, refused);
        this.lastErr = refused;
        cl.noteAuth(refused);
        cl.log("warn", "credentials required", { err: String(refused) });
        addr = this.home;
        named = false;
        seek = false;
        const to = await this.pause(cfg.reconnectIntervalMs, this.home);
        if (cl.closed) return;
        if (to !== "") follow(to);
        continue;
      }
      if (redirect === "") {
        seek = true; // "M -": ask this node again
        cause = errNoActive;
        redirect = undefined;
      } else if (redirect !== undefined && cl.outage.isDown(redirect)) {
        cause = new Error(`the node names an active that does not answer: ${redirect}`);
        redirect = undefined;
        seek = true;
      } else {
        seek = false;
      }
      this.detach(redirect, cause);
      if (served) bounces = 0;
      const quick = !served && performance.now() - since < cfg.reconnectIntervalMs;
      if (cl.closed) return;
      if (redirect !== undefined) {
        cl.log("debug", "redirected", { from: addr, to: redirect });
        follow(redirect); // seek is already false
        // Follow a redirect at once, but not nodes that keep naming each other.
        if (++bounces > MAX_REDIRECTS && !(await cl.sleep(cfg.reconnectIntervalMs))) return;
      } else if (seek) {
        cl.log("debug", "the node knows no active that answers", { addr, err: String(cause) });
        // Ask it again at once (seek paces the questions), unless it said it
        // was the active and then served nothing.
        if (quick && sought && !(await cl.sleep(cfg.reconnectIntervalMs))) return;
      } else {
        cl.log("debug", "connection lost", { addr, err: String(cause) });
        const lost = addr;
        addr = this.home;
        named = false;
        // Try again at once after a connection that served. One that failed
        // soon after it was made, serving nothing, is from a node that is
        // stopping or closes every connection: it counts as down, and our
        // own node is dialled again after reconnectInterval (or the active
        // found elsewhere), not in a loop.
        if (quick) cl.outage.markDown(lost);
        if (quick && lost === this.home) {
          const to = await this.pause(cfg.reconnectIntervalMs, lost);
          if (cl.closed) return;
          if (to !== "") follow(to);
        }
      }
    }
  }

  /** Connects to addr (TLS when configured), within dialTimeoutMs, the TLS handshake included. */
  private dial(addr: string): Promise<net.Socket> {
    const cl = this.cl;
    const { host, port } = splitAddr(addr);
    return new Promise((resolve, reject) => {
      let s: net.Socket;
      let ready: string;
      if (cl.cfg.tls !== undefined) {
        const o: tls.ConnectionOptions = { ...cl.cfg.tls, host, port };
        if (o.servername === undefined && net.isIP(host) === 0) o.servername = host;
        s = tls.connect(o);
        ready = "secureConnect";
      } else {
        s = net.connect({ host, port });
        ready = "connect";
      }
      // A socket always has an error listener: an error with none would
      // end the process. Errors are seen as the close that follows.
      s.on("error", (e) => ((s as SockWithErr).kunciErr ??= e));
      const t = setTimeout(() => s.destroy(new Error(`dial ${addr}: no connection within ${cl.cfg.dialTimeoutMs} ms`)), cl.cfg.dialTimeoutMs);
      const stop = cl.onClose(() => s.destroy(new KunciError("kunci: client closed")));
      const fail = () => {
        clearTimeout(t);
        stop();
        reject((s as SockWithErr).kunciErr ?? new Error(`dial ${addr}: connection closed`));
      };
      s.once("close", fail);
      s.once(ready, () => {
        clearTimeout(t);
        // Until attach, the client's close still destroys the socket.
        this.unhook = stop;
        s.off("close", fail);
        s.setNoDelay(true);
        s.setKeepAlive(true, 15_000);
        s.pause();
        resolve(s);
      });
    });
  }

  /** Sends the client's credentials as the first line of sock, and reads the node's answer. Throws an AuthError when the node refuses them. */
  private async authenticate(sock: net.Socket, addr: string): Promise<void> {
    const c = this.cl.cfg.credentials;
    if (c === undefined) return;
    sock.write(authLine(c.name, c.secret));
    let line: string;
    try {
      line = await readLine(sock, this.cl.cfg.dialTimeoutMs + AUTH_TIMEOUT_MS);
    } catch (e) {
      throw new Error(`${addr}: no answer to the credentials: ${(e as Error).message}`, { cause: e });
    }
    const a = parseAnswer(line);
    if (a.kind === "U") return;
    // A connection whose client certificate names a credential is
    // authenticated by it (mutual TLS), before the U.
    if (a.kind === "E" && a.op === "U" && a.text === "already authenticated") return;
    if (a.kind === "E" && a.op === "U") throw new AuthError(addr, a.text);
    if (a.kind === "E") throw new Error(`${addr} refused the connection: ${a.text}`);
    throw new BadAnswerError(line);
  }

  /**
   * Asks the node on sock, a new connection to addr, which node is the
   * active: every SEEK_INTERVAL_MS, until it says it is (active), or names
   * another whose address is not down (to). When another connection finds
   * the active meanwhile, it ends with that address.
   */
  private async seek(sock: net.Socket, addr: string): Promise<{ active: boolean; to: string }> {
    const cl = this.cl;
    for (;;) {
      sock.write(infoLine);
      let line: string;
      try {
        line = await readLine(sock, cl.cfg.probeTimeoutMs);
      } catch (e) {
        throw new Error(`${addr}: no answer to I: ${(e as Error).message}`, { cause: e });
      }
      const a = parseAnswer(line);
      if (a.kind !== "I") throw new Error(`${addr}: answered I with ${JSON.stringify(line)}`);
      if (a.role === "active") return { active: true, to: "" };
      if (a.active !== "" && !cl.outage.isDown(a.active)) return { active: false, to: a.active };
      const to = cl.outage.activeBut(addr);
      if (to !== "") return { active: false, to };
      await cl.waitUp(SEEK_INTERVAL_MS);
      if (cl.closed) throw new KunciError("kunci: client closed");
    }
  }

  /**
   * Waits ms before a connection dials again after a failure at addr. It
   * returns early with the active's address when one is known elsewhere, at
   * once or when another connection finds it meanwhile ("" when the wait ran
   * out or the client closed).
   */
  private async pause(ms: number, addr: string): Promise<string> {
    const until = performance.now() + ms;
    for (;;) {
      const a = this.cl.outage.activeBut(addr);
      if (a !== "") return a;
      const left = until - performance.now();
      if (left <= 0 || this.cl.closed) return "";
      await this.cl.waitUp(left);
    }
  }

  /** Closes a socket that did not become the connection. */
  private drop(sock: net.Socket): void {
    sock.destroy();
    this.unhook?.();
    this.unhook = undefined;
  }

  /** Makes sock the connection, and returns how it ends. Requests waiting for a connection are woken. */
  private attach(sock: net.Socket, addr: string, named: boolean): Promise<End> {
    const cl = this.cl;
    this.unhook?.();
    this.unhook = undefined;
    const ended = new Promise<End>((res) => (this.ended = res));
    this.sock = sock;
    this.addr = addr;
    this.gen++;
    this.redirecting = false;
    this.wbuf = "";
    this.rbuf = null;
    this.served = false;
    this.writeStuckSince = 0;
    this.probes = 0;
    this.lastRead = performance.now();
    this.probeSent = 0;
    this.sessions = undefined;
    this.authRefused = undefined;
    // The session goes first: the node lists what it holds for it, and
    // reconcile releases what the client no longer holds (session.ts). The
    // requests made meanwhile go out behind it, in the same write.
    const sc = new Call("S", "");
    sc.held = [];
    this.send(sc, sessionLine(cl.session));
    this.usable = true;
    // The handlers of a socket since replaced do nothing.
    sock.on("data", (d: Buffer) => {
      if (this.sock === sock) this.onData(d);
    });
    sock.on("drain", () => {
      if (this.sock === sock) this.writeStuckSince = 0;
    });
    sock.once("close", () => {
      if (this.sock === sock) this.end({ err: (sock as SockWithErr).kunciErr ?? new Error("connection closed by the node") });
    });
    sock.resume();
    const period = Math.max(Math.min(cl.cfg.probeIntervalMs, cl.cfg.probeTimeoutMs) / 2, 10);
    this.timer = setInterval(() => this.check(), period);
    this.timer.unref();
    if (named) cl.outage.active = addr;
    cl.up(this, sc);
    return ended;
  }

  /** Ends the connection now (the first reason counts). */
  private end(e: Omit<End, "served">): void {
    const f = this.ended;
    if (f === undefined) return;
    this.ended = undefined;
    this.usable = false;
    clearInterval(this.timer);
    this.sock?.destroy();
    f({ ...e, served: this.served });
  }

  /** Tells every outstanding call that the connection broke or was redirected, and those waiting to hear whether its node knows sessions. */
  private detach(redirect: string | undefined, cause: unknown): void {
    this.usable = false;
    this.sock = null;
    this.redirecting = redirect !== undefined;
    const r: Result = redirect !== undefined ? redirected : broken(cause);
    const calls = [...this.acq.values(), ...this.sent.slice(this.sentHead)];
    this.acq.clear();
    this.sent = [];
    this.sentHead = 0;
    this.probes = 0;
    this.wbuf = "";
    for (const c of calls) c?.finish(r);
    this.knowSessions(undefined);
  }

  /** Probes an idle connection with I, and ends one whose probe or write got nowhere. */
  private check(): void {
    const now = performance.now();
    const cfg = this.cl.cfg;
    if (this.writeStuckSince !== 0 && now - this.writeStuckSince > cfg.writeTimeoutMs) {
      this.end({ err: errWriteStuck });
      return;
    }
    if (this.probeSent !== 0) {
      if (this.lastRead >= this.probeSent) this.probeSent = 0;
      else if (now - this.probeSent >= cfg.probeTimeoutMs) this.end({ err: errHalfOpen });
      return;
    }
    if (now - this.lastRead >= cfg.probeIntervalMs && this.sock !== null) {
      this.probes++;
      this.probeSent = now;
      this.buffer(infoLine);
    }
  }

  private onData(d: Buffer): void {
    const now = performance.now();
    this.lastRead = now;
    let buf = d;
    if (this.rbuf !== null) {
      buf = Buffer.concat([this.rbuf, d]);
      this.rbuf = null;
    }
    const last = buf.lastIndexOf(10);
    if (last < 0) {
      if (buf.length >= MAX_LINE) this.end({ err: new BadAnswerError(buf.toString("latin1", 0, 80)) });
      else this.rbuf = buf;
      return;
    }
    if (last + 1 < buf.length) {
      if (buf.length - last - 1 >= MAX_LINE) {
        this.end({ err: new BadAnswerError(buf.toString("latin1", last + 1, last + 81)) });
        return;
      }
      this.rbuf = Buffer.from(buf.subarray(last + 1));
    }
    // Up to the last LF the bytes end on a character boundary.
    const text = buf.toString("utf8", 0, last);
    let start = 0;
    for (;;) {
      let nl = text.indexOf("\n", start);
      if (nl < 0) nl = text.length;
      let a: Answer;
      try {
        a = parseAnswer(text.slice(start, nl));
      } catch (e) {
        this.end({ err: e });
        return;
      }
      if (a.kind === "M") {
        this.end({ redirect: a.text });
        return;
      }
      if (this.dispatch(a, now)) this.served = true;
      if (this.ended === undefined) return;
      if (nl >= text.length) return;
      start = nl + 1;
    }
  }

  /** Hands an answer to the oldest outstanding call it answers; reports whether there was one (an answer to a probe or to no request is not). */
  private dispatch(a: Answer, at: number): boolean {
    let op = a.kind;
    if (op === "T") op = "A";
    else if (op === "E") {
      if (a.op.length !== 1) {
        // About no request: the node is closing the connection (idle,
        // credentials revoked), or could not read one.
        this.cl.log("warn", "node error", { reason: a.text });
        return false;
      }
      op = a.op;
    }
    let c: Call | undefined;
    switch (op) {
      case "A":
        c = this.acq.get(a.key);
        if (c !== undefined) this.acq.delete(a.key);
        break;
      case "H":
        // A line of the listing the oldest S or L outstanding waits for.
        c = this.listing();
        if (c === undefined) {
          this.cl.log("debug", "listed grant with no listing", { key: a.key });
          return false;
        }
        (c.held ??= []).push(a);
        return c.op === "L"; // the session's listing is the client's own, not a request served
      case "I":
        // An info request's, or a probe's (every I answer is alike).
        c = this.takeSent("I", "", true);
        if (c === undefined) {
          if (this.probes > 0) this.probes--;
          return false;
        }
        break;
      default:
        // A listing and a session have no key (an E L line echoes its
        // limit there, an E S line the session).
        c = this.takeSent(op, op === "L" || op === "S" ? "" : a.key, true);
    }
    if (c === undefined) {
      this.cl.log("debug", "answer with no request", { kind: a.kind, key: a.key });
      return false;
    }
    const r: Result =
      a.kind !== "E"
        ? { kind: "answer", a, at, held: c.held }
        : { kind: "refused", err: a.text === "auth required" ? new AuthError(this.addr, a.text) : new RefusedError(a.op, c.key, a.text) };
    c.finish(r);
    if (op === "S") {
      // A node that refuses S predates sessions ("unknown op"): nothing is
      // sent with seen= on this connection. One that asks for credentials
      // closes the connection: the requests behind the S are not read.
      this.knowSessions(a.kind === "S");
      if (r.kind === "refused" && r.err instanceof AuthError) this.authRefused = r.err;
      return false; // the client's own, not a request served
    }
    return true;
  }

  /** The oldest S or L call outstanding: the one H lines answer. */
  private listing(): Call | undefined {
    const sent = this.sent;
    for (let i = this.sentHead; i < sent.length; i++) {
      const c = sent[i];
      if (c !== null && c !== undefined && (c.op === "S" || c.op === "L")) return c;
    }
    return undefined;
  }

  /** Notes whether the node knows sessions (undefined: the connection ended before it said), and wakes those waiting to hear it. */
  private knowSessions(v: boolean | undefined): void {
    this.sessions = v;
    const ws = this.sessionWaiters;
    if (ws.length === 0) return;
    this.sessionWaiters = [];
    for (const w of ws) w();
  }

  /** Resolves once the node has answered the session (sessions is then set), or the connection ended. */
  sessionsKnown(): Promise<void> {
    if (this.sessions !== undefined || !this.usable) return Promise.resolve();
    return new Promise<void>((res) => this.sessionWaiters.push(res));
  }

  /** Removes (when take) and returns the oldest outstanding call with op and key. */
  private takeSent(op: string, key: string, take: boolean): Call | undefined {
    const sent = this.sent;
    for (let i = this.sentHead; i < sent.length; i++) {
      const c = sent[i];
      if (c === null || c === undefined || c.op !== op || c.key !== key) continue;
      if (!take) return c;
      sent[i] = null;
      while (this.sentHead < sent.length && sent[this.sentHead] === null) this.sentHead++;
      if (this.sentHead === sent.length) {
        this.sent = [];
        this.sentHead = 0;
      } else if (this.sentHead >= 64 && this.sentHead >= sent.length / 2) {
        this.sent = sent.slice(this.sentHead);
        this.sentHead = 0;
      }
      return c;
    }
    return undefined;
  }

  /** Registers c, a request other than an acquire (see acquire), as outstanding, and buffers line for the next write. The connection must be up. */
  send(c: Call, line: string): void {
    if (c.op === "A") throw new Error(`kunci: internal: an acquire of ${JSON.stringify(c.key)} sent around the gate (Conn.acquire)`);
    this.sent.push(c);
    this.buffer(line);
  }

  /**
   * Sends an acquire of key, line, and returns its call. The connection must
   * be up.
   *
   * The gate: a connection carries one acquire of a key at a time, because
   * the node's answer to an acquire (A key token, T key, E A key …) names
   * only its key: a second would take the first's answer, and a C key
   * withdraw either. The client never sends a second (one acquire of a key
   * is in progress client-wide, Keys, and it keeps its turn until its call
   * is answered or its connection broke), so a second here is a bug, and
   * throws.
   */
  acquire(key: string, line: string): Call {
    if (this.acq.has(key)) throw new Error(`kunci: internal: a second acquire of ${JSON.stringify(key)} on one connection`);
    const c = new Call("A", key);
    this.acq.set(key, c);
    this.buffer(line);
    return c;
  }

  /**
   * Withdraws c, an acquire sent on this connection whose caller gave up,
   * and returns its own outcome: T (withdrawn), the grant that won the race,
   * a refusal, or the broken connection (whose queued acquires the node
   * drops). C key goes only while c is still the acquire of its key
   * outstanding here: once answered it has left the gate, and a C would
   * withdraw the acquire of the key that came next.
   */
  withdraw(c: Call): Promise<Result> {
    if (this.usable && this.acq.get(c.key) === c) this.send(new Call("C", c.key), cancelLine(c.key));
    return c.promise;
  }

  private buffer(line: string): void {
    this.wbuf += line;
    if (!this.dirty) {
      this.dirty = true;
      this.cl.queueWrite(this);
    }
  }

  /** Writes what is buffered, in one write. */
  flush(): void {
    this.dirty = false;
    const s = this.sock;
    if (s === null || this.wbuf === "") return;
    const b = this.wbuf;
    this.wbuf = "";
    if (!s.write(b) && this.writeStuckSince === 0) this.writeStuckSince = performance.now();
  }
}

type SockWithErr = net.Socket & { kunciErr?: Error };

/** @internal How many redirects a request, or a connection that serves nothing, follows in a row. */
export const MAX_REDIRECTS = 8;
/** @internal How often a connection asks a node that knows no live active which node is the active. */
export const SEEK_INTERVAL_MS = 50;
/** How long, beyond the dial timeout, a node may take to answer the credentials (it answers bad ones after a second). */
const AUTH_TIMEOUT_MS = 3000;

/** Reads the one answer line the node sends next on sock, on which nothing else is outstanding. */
function readLine(sock: net.Socket, ms: number): Promise<string> {
  return new Promise((resolve, reject) => {
    let buf: Buffer = Buffer.alloc(0);
    const done = (err: Error | null, line = "") => {
      clearTimeout(t);
      sock.off("data", onData);
      sock.off("close", onClose);
      sock.pause();
      if (err !== null) reject(err);
      else resolve(line);
    };
    const onData = (d: Buffer) => {
      buf = buf.length === 0 ? d : Buffer.concat([buf, d]);
      const i = buf.indexOf(10);
      if (i < 0) {
        if (buf.length >= MAX_LINE) done(new BadAnswerError(buf.toString("latin1", 0, 80)));
        return;
      }
      if (i !== buf.length - 1) done(new Error(`more than one answer: ${JSON.stringify(buf.toString("latin1", 0, 120))}`));
      else done(null, buf.toString("utf8", 0, i));
    };
    const onClose = () => done((sock as SockWithErr).kunciErr ?? new Error("connection closed"));
    const t = setTimeout(() => done(new Error(`no answer within ${ms} ms`)), ms);
    sock.on("data", onData);
    sock.once("close", onClose);
    if (sock.destroyed) onClose();
    else sock.resume();
  });
}
