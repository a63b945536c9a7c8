// The Client: a pool of persistent connections to a kunci node or cluster,
// and the one way a request goes to it (route). The twin of clientlib's
// client.go, route.go, list.go, keepalive.go and do.go.

import { hostname } from "node:os";
import type * as tls from "node:tls";
import { onAbort } from "./abort.js";
import { type Credentials, checkCredentials } from "./credentials.js";
import { type Answered, Call, type Refused, type Result, broken, errNotUp, errWaitOver, redirected } from "./call.js";
import { Conn, type ConnConfig, MAX_REDIRECTS } from "./conn.js";
import {
  AuthError,
  BadInputError,
  ClosedError,
  KunciError,
  LostError,
  NoActiveError,
  RefusedError,
  StaleError,
  TimeoutError,
  UnavailableError,
} from "./errors.js";
import { Outage } from "./outage.js";
import {
  type Answer,
  type Kind,
  MAX_OWNER,
  MAX_U64,
  acquireLine,
  checkKey,
  extendLine,
  infoLine,
  inspectLine,
  kindOf,
  leaseMs as checkLease,
  listLine,
  releaseLine,
  splitAddr,
  validOwner,
  waitMs as checkWait,
} from "./protocol.js";
import { type KeyState, Keys, newSession, reconcile } from "./session.js";
import { Timer } from "./timer.js";

/** A log line of the client: connections lost, dials failed, redirects (debug); refused credentials, node errors (warn). */
export type Logger = (level: "debug" | "warn", msg: string, fields: Record<string, unknown>) => void;

/** Options of a Client. Only addrs is required. Times are in milliseconds. */
export interface ClientOptions {
  /** The nodes' addresses, "host:port" (every node of a cluster). With one address the client keeps two connections to it. */
  addrs: string[];
  /**
   * Names this client with every acquire ("owner=OWNER"): inspect, locks and
   * kunci show it with each grant it holds. 1 to 64 bytes of printable ASCII,
   * no space; processOwner() makes one ("host:pid").
   */
  owner?: string;
  /** Sent as the first line of every connection ("U name secret"), for nodes started with --auth-file. */
  credentials?: Credentials;
  /**
   * Makes every connection TLS with these options (ca: the CA that signed
   * the nodes' certificates; cert and key: a client certificate, for nodes
   * that ask for one). Give the nodes' TLS addresses. Without servername,
   * each address's host is verified.
   */
  tls?: tls.ConnectionOptions;
  /** Bounds each connection attempt, the TLS handshake included (default 2000). */
  dialTimeoutMs?: number;
  /** A write the node does not take within this long ends the connection (default 5000). */
  writeTimeoutMs?: number;
  /** The pause between attempts to re-dial an address that does not answer (default 3000). */
  reconnectIntervalMs?: number;
  /** A connection that has read nothing for this long is sent an I probe (default 5000); no answer within probeTimeoutMs ends it (default 3000). */
  probeIntervalMs?: number;
  probeTimeoutMs?: number;
  /** How long release, extend, inspect and locks keep trying through connection failures (default 5000). */
  releaseRetryMs?: number;
  /** How soon a keep-alive tries again after an extend failed (default 200). */
  releaseIntervalMs?: number;
  logger?: Logger;
}

/** @internal The options with their defaults filled in (those its connections use too: ConnConfig). */
export interface Config extends ConnConfig {
  addrs: string[];
  owner: string;
  releaseRetryMs: number;
  releaseIntervalMs: number;
  logger: Logger | undefined;
}

export interface AcquireOptions {
  /** How long the grant lasts unless extended, from the grant (milliseconds, above 0). */
  leaseMs: number;
  /**
   * How long to wait in the key's queue (milliseconds; default 0: no bound of
   * the client's own, the node's --max-wait bounds it). When it runs out the
   * acquire throws a TimeoutError. While no active node answers, the acquire
   * is sent again as soon as a connection comes up, for as long as the wait
   * lasts.
   */
  waitMs?: number;
  /**
   * Makes the key a counting semaphore: one of at most limit grants, each
   * with its own token and lease (a whole number from 1 to the node's
   * --max-holders). Every holder of the key must name the same limit: the
   * node refuses another (RefusedError "semaphore limit differs"), and an
   * acquire of another kind than the key is held as ("key held as a lock",
   * "key held as a semaphore").
   */
  limit?: number;
  /**
   * Takes a shared (read) grant of a read-write lock: held together with
   * other shared grants, never with an exclusive one (a plain acquire of the
   * same key: the write side). A writer queued ahead keeps later readers
   * waiting. Not together with limit.
   */
  shared?: boolean;
  /** Withdraws the acquire (C on the node; a grant that won the race is released) and throws signal.reason. */
  signal?: AbortSignal;
}

export interface TryAcquireOptions {
  leaseMs: number;
  /** As AcquireOptions' limit and shared. */
  limit?: number;
  shared?: boolean;
  signal?: AbortSignal;
}

export interface RequestOptions {
  /** Gives the request up (its answer is dropped) and throws signal.reason. */
  signal?: AbortSignal;
}

/** Who holds a key, as the node saw it. */
export interface Holder {
  key: string;
  /** The grant's fencing token. */
  token: bigint;
  /** What was left of the grant's lease, in milliseconds. */
  leftMs: number;
  /** The acquires queued behind the grant. */
  waiters: number;
  /** The owner the grant's acquire named, undefined for none. */
  owner: string | undefined;
  /** How many grants the key has: 1 for a plain lock, up to limit for a semaphore, the readers of a shared one. */
  holders: number;
  /** The semaphore's limit, undefined when the key is not a semaphore. */
  limit: number | undefined;
  /** The key is held in shared (read) mode. */
  shared: boolean;
}

export interface LocksOptions {
  /** Only keys that start with prefix. */
  prefix?: string;
  /** At most this many keys (default 1000; 0: every held key). */
  limit?: number | bigint;
  signal?: AbortSignal;
}

export interface LockList {
  /** The held keys, in no particular order. */
  locks: Holder[];
  /** More keys are held than limit let through. */
  more: boolean;
}

/** What a node says of itself and of its cluster ("I"). */
export interface NodeInfo {
  /** The node's own client address (its --advertise). */
  addr: string;
  /** "active" or "standby". */
  role: string;
  /** The active's address as the node knows it; undefined when it knows none (an election is under way). */
  active: string | undefined;
}

/** How a request is tried again (see route). */
interface Policy {
  /** Ends the window at a fixed time (an acquire's wait); 0: the window starts at the first failure and lasts span, or has no end when unbounded. */
  deadline: number;
  span: number;
  unbounded: boolean;
  /** Caps a window that starts at the first failure (a grant's end). */
  ends?: () => number;
  /** An acquire's key and wait: the error once the wait has ended is a TimeoutError, or says no node answered. */
  acquireKey?: string;
  waitMs?: number;
}

/** A send's answer that the request's window has ended for it (an acquire whose wait ran out in the client). */
const TRY_LATER: Result = broken(errWaitOver);

const errRedirected = new Error("redirected: the active moved");

/**
 * A connection pool to a kunci node or cluster: one persistent connection
 * per address (two when given one), kept up in the background; requests
 * pipelined on them, round-robin. Close it when done: its sockets keep the
 * process alive.
 */
export class Client {
  /** @internal */ readonly cfg: Config;
  /** @internal */ readonly conns: Conn[] = [];
  /** @internal */ readonly outage: Outage;
  /** @internal */ closed = false;
  /** The last refusal of the credentials, undefined once a node accepted them. Set by the connections (noteAuth). */
  private authErr: AuthError | undefined;
  /** @internal The client's session (session.ts), named first on every connection: 63 random bits. */
  readonly session: bigint = newSession();
  /** @internal What the client knows of the keys it holds and acquires, and the highest token it has been answered. */
  readonly keys: Keys;
  private cur = 0;
  private readonly firsts: Promise<void>;
  private firstsDone = false;
  private readonly upWaiters = new Set<() => void>();
  private readonly closeHooks = new Set<() => void>();
  private dirty: Conn[] = [];
  private flushScheduled = false;
  private readonly runs: Promise<void>[] = [];
  private closing: Promise<void> | undefined;

  constructor(opts: ClientOptions) {
    this.cfg = configure(opts);
    this.outage = new Outage(Math.min(this.cfg.reconnectIntervalMs, 1000));
    this.keys = new Keys(this.cfg.releaseRetryMs);
    let addrs = this.cfg.addrs;
    if (addrs.length === 1) addrs = [addrs[0]!, addrs[0]!];
    const firsts: Promise<void>[] = [];
    addrs.forEach((a, i) => {
      const cn = new Conn(this, a, i);
      this.conns.push(cn);
      let first!: () => void;
      firsts.push(new Promise<void>((res) => (first = res)));
      this.runs.push(cn.run(first));
    });
    this.firsts = Promise.all(firsts).then(() => {
      this.firstsDone = true;
    });
  }

  /**
   * Returns a client once it has made a first attempt to connect to every
   * address. Throws the AuthError when every first attempt was a refusal of
   * the credentials. (new Client works too: requests wait for those first
   * attempts.)
   */
  static async connect(opts: ClientOptions): Promise<Client> {
    const c = new Client(opts);
    await c.firsts;
    const ae = c.allAuthFailed();
    if (ae !== undefined) {
      await c.close();
      throw ae;
    }
    return c;
  }

  /**
   * Closes every connection and stops the background work. Locks still held
   * stay held on the node until released (by another client) or until their
   * leases run out. Requests outstanding throw a ClosedError.
   */
  close(): Promise<void> {
    if (this.closing !== undefined) return this.closing;
    this.closed = true;
    for (const h of [...this.closeHooks]) h();
    this.closeHooks.clear();
    this.fireUp();
    for (const cn of this.conns) cn.close();
    this.closing = Promise.all(this.runs).then(() => undefined);
    return this.closing;
  }

  /**
   * Waits for key and returns the granted lock, which ends by itself leaseMs
   * after the grant unless released or extended: a plain (exclusive) lock,
   * a semaphore's grant (opts.limit) or a shared one (opts.shared). Throws a TimeoutError when
   * the wait ran out (the node answered T), an UnavailableError when no
   * active node answered within the wait, a RefusedError with the node's
   * reason, an AuthError, or a BadInputError before sending anything.
   */
  async acquire(key: string, opts: AcquireOptions): Promise<Lock> {
    checkKey(key);
    const lease = checkLease(opts?.leaseMs);
    const wait = checkWait(opts.waitMs ?? 0);
    const kind = kindOf(opts.limit, opts.shared);
    const l = await this.acquireWith(key, lease, wait, kind, false, opts.signal);
    if (l === null) throw new TimeoutError(key); // the node answered T
    return l;
  }

  /**
   * Acquires key if it would be granted at once, without waiting ("A key
   * lease -"): returns the lock, or null while the key is held (a semaphore
   * at its limit, a shared key with a writer queued, …) or another acquire of
   * it by this client is in progress (answered null unsent: a client has one
   * acquire of a key in progress at a time, so that an acquire sent again
   * after a lost answer is answered its own grant and never another's).
   */
  async tryAcquire(key: string, opts: TryAcquireOptions): Promise<Lock | null> {
    checkKey(key);
    const lease = checkLease(opts?.leaseMs);
    const kind = kindOf(opts.limit, opts.shared);
    return this.acquireWith(key, lease, 0, kind, true, opts.signal);
  }

  /**
   * Runs fn while holding key: acquires it (as acquire, of any kind), keeps it alive while
   * fn runs (extending every third of the lease), and releases it when fn
   * settles. signal aborts the moment the lock is lost (the node answered an
   * extend STALE, or the lease ran out while no node answered), with a
   * LostError as its reason, or when opts.signal aborts. fn should stop its
   * work then, and pass lock.token to what it writes.
   *
   * Returns fn's result. Throws the acquire's error if nothing was granted;
   * a LostError when the lock was lost before fn settled or the final release
   * found the grant gone (fn's work may have overlapped another holder's; its
   * own error, if any, is the cause); else fn's error, or the release's.
   */
  async withLock<T>(key: string, opts: AcquireOptions, fn: (lock: Lock, signal: AbortSignal) => Promise<T> | T): Promise<T> {
    const lock = await this.acquire(key, opts);
    const ac = new AbortController();
    const lost = lock.keepAlive();
    const onLost = () => ac.abort(lost.reason);
    lost.addEventListener("abort", onLost, { once: true });
    const given = opts.signal;
    const unwatch = given === undefined ? undefined : onAbort(given, () => ac.abort(given.reason));
    let value: T | undefined;
    let fnErr: unknown;
    let threw = false;
    try {
      value = await fn(lock, ac.signal);
    } catch (e) {
      threw = true;
      fnErr = e;
    } finally {
      lost.removeEventListener("abort", onLost);
      unwatch?.();
    }
    let relErr: unknown;
    try {
      await lock.release(); // stops the keep-alive
    } catch (e) {
      relErr = e;
    }
    if (lost.aborted) {
      const le = lost.reason as LostError;
      if (threw) throw new LostError(key, `${le.message}; the function threw`, { cause: fnErr });
      throw le;
    }
    if (relErr instanceof StaleError) {
      throw new LostError(key, "the release found the grant gone", { cause: threw ? fnErr : relErr });
    }
    if (threw) throw fnErr;
    if (relErr !== undefined) throw relErr;
    return value as T;
  }

  /** Asks the active who holds key ("Q key"): the holder, or null when the key is free. It changes nothing. */
  async inspect(key: string, opts?: RequestOptions): Promise<Holder | null> {
    checkKey(key);
    const r = await this.route(this.retrying(), opts?.signal, (cn) => this.request(cn, "Q", key, inspectLine(key), opts?.signal));
    if (r.kind === "refused") throw r.err;
    return r.a.token === 0n ? null : holder(r.a);
  }

  /**
   * Lists the held keys on the active ("L limit prefix"), in no particular
   * order: at most limit (default 1000; 0: all), and more says whether more
   * are held. Streamed by the node; a listing cut by a failure is started
   * again.
   */
  async locks(opts?: LocksOptions): Promise<LockList> {
    const prefix = opts?.prefix ?? "";
    if (prefix !== "") checkKey(prefix, "prefix");
    let limit = opts?.limit ?? 1000;
    if (typeof limit === "number") {
      if (!Number.isSafeInteger(limit) || limit < 0) throw new BadInputError(`kunci: limit must be a whole number, 0 or more (got ${limit})`);
      limit = BigInt(limit);
    }
    if (typeof limit !== "bigint" || limit < 0n || limit > MAX_U64) {
      throw new BadInputError(`kunci: limit must be 0 to 2^64-1 (got ${String(limit)})`);
    }
    const line = listLine(limit, prefix);
    const r = await this.route(this.retrying(), opts?.signal, (cn) => this.request(cn, "L", "", line, opts?.signal));
    if (r.kind === "refused") throw r.err;
    return { locks: (r.held ?? []).map(holder), more: r.a.more };
  }

  /**
   * Asks a node which node of the cluster is the active ("I"), and returns
   * its address. A single node is its own active. Throws a NoActiveError when
   * the node knows none (an election is under way). Retried through
   * connection failures as inspect is.
   */
  async active(opts?: RequestOptions): Promise<string> {
    const n = await this.info(opts);
    if (n.active === undefined) throw new NoActiveError(n.addr);
    return n.active;
  }

  /**
   * Asks the node a connection goes to what it is ("I"): its address, its
   * role, and the active it knows. Every node answers, whatever its role.
   */
  async info(opts?: RequestOptions): Promise<NodeInfo> {
    const r = await this.route(this.retrying(), opts?.signal, (cn) => this.request(cn, "I", "", infoLine, opts?.signal));
    if (r.kind === "refused") throw r.err;
    const a = r.a;
    return { addr: a.self, role: a.role, active: a.active === "" ? undefined : a.active };
  }

  /**
   * Returns a handle on a grant this client did not make, from its key and
   * token (say, handed over by another process), to release, extend or keep
   * it alive. It sends nothing. leaseMs is the grant's lease, used by
   * keepAlive until an extend sets another.
   */
  adopt(key: string, token: bigint, leaseMs: number): Lock {
    checkKey(key);
    if (typeof token !== "bigint" || token < 1n || token > MAX_U64) {
      throw new BadInputError(`kunci: token must be a bigint from 1 to 2^64-1 (got ${String(token)})`);
    }
    const lease = checkLease(leaseMs);
    const l = Lock.of(this, key, token, lease, performance.now() + lease);
    this.keys.hold(key, l);
    return l;
  }

  /** Shows the addresses and owner, never the credentials' secret. */
  [Symbol.for("nodejs.util.inspect.custom")](): string {
    return `Client { addrs: ${JSON.stringify(this.cfg.addrs)}, owner: ${JSON.stringify(this.cfg.owner)}, closed: ${this.closed} }`;
  }

  // ---- internals ----

  /** @internal */
  log(level: "debug" | "warn", msg: string, fields: Record<string, unknown>): void {
    this.cfg.logger?.(level, `kunci: ${msg}`, fields);
  }

  /** Wakes whoever waits for a connection to come up (and everything when the client closes). */
  private fireUp(): void {
    if (this.upWaiters.size === 0) return;
    const ws = [...this.upWaiters];
    this.upWaiters.clear();
    for (const w of ws) w();
  }

  /** @internal Waits until a connection comes up, ms pass (ms < 0: no bound), signal aborts, or the client closes. */
  waitUp(ms: number, signal?: AbortSignal): Promise<void> {
    return new Promise<void>((resolve) => {
      if (this.closed || signal?.aborted) return resolve();
      let t: Timer | undefined;
      let unwatch: (() => void) | undefined;
      const w = () => {
        t?.clear();
        this.upWaiters.delete(w);
        unwatch?.();
        resolve();
      };
      this.upWaiters.add(w);
      if (ms >= 0) t = new Timer(w, ms);
      if (signal !== undefined) unwatch = onAbort(signal, w);
    });
  }

  /** @internal cn came up (ConnHost): the session it named first, sc, is reconciled with what the node lists for it (session.ts) while cn serves, and whoever waits for a connection is woken. */
  up(cn: Conn, sc: Call): void {
    void reconcile(this.keys, cn, sc, (msg, fields) => this.log("debug", msg, fields));
    this.fireUp();
  }

  /** @internal A node refused the credentials (err), or accepted them (undefined): ConnHost. */
  noteAuth(err: AuthError | undefined): void {
    this.authErr = err;
  }

  /** @internal Registers fn to run when the client closes; returns its removal. */
  onClose(fn: () => void): () => void {
    this.closeHooks.add(fn);
    return () => this.closeHooks.delete(fn);
  }

  /** @internal Waits ms; false when the client closed first. */
  sleep(ms: number): Promise<boolean> {
    return new Promise((resolve) => {
      if (this.closed) return resolve(false);
      const t = new Timer(() => {
        un();
        resolve(true);
      }, ms);
      const un = this.onClose(() => {
        t.clear();
        resolve(false);
      });
    });
  }

  /** @internal Puts cn on the list to write once every caller of this tick has buffered its request. */
  queueWrite(cn: Conn): void {
    this.dirty.push(cn);
    if (!this.flushScheduled) {
      this.flushScheduled = true;
      process.nextTick(this.flushAll);
    }
  }

  private readonly flushAll = (): void => {
    this.flushScheduled = false;
    const ds = this.dirty;
    this.dirty = [];
    for (const cn of ds) {
      // The requests made about the same moment share a connection, and
      // writing them makes the next connection current.
      this.cur = (cn.idx + 1) % this.conns.length;
      cn.flush();
    }
  };

  /**
   * Returns the usable connection a request goes to, or undefined. after,
   * when set, just failed the request: the search starts at the one after
   * it. A connection whose write the node has not taken is passed over while
   * another is usable.
   */
  private next(after: Conn | undefined): Conn | undefined {
    const n = this.conns.length;
    const start = after !== undefined ? after.idx + 1 : this.cur;
    let busy: Conn | undefined;
    for (let i = 0; i < n; i++) {
      const cn = this.conns[(start + i) % n]!;
      if (!cn.usable) continue;
      if (!cn.writing()) return cn;
      busy ??= cn;
    }
    return busy;
  }

  private allAuthFailed(): AuthError | undefined {
    const e = this.conns[0]!.lastErr;
    return e instanceof AuthError && this.conns.every((c) => c.lastErr instanceof AuthError) ? e : undefined;
  }

  /** The error of a request that found no connection to carry it: the credentials' refusal when that is why, else an UnavailableError saying why the last attempt failed. */
  private noConnection(cause: unknown, what?: string): KunciError {
    if (this.authErr !== undefined && (cause === undefined || cause === errNotUp)) return this.authErr;
    let why = cause instanceof Error ? cause.message : String(cause);
    if (cause === undefined || cause === errNotUp) {
      // Say why the connections are down.
      const down = this.conns.find((c) => c.lastErr !== undefined)?.lastErr;
      why = "no connection is up";
      if (down !== undefined) {
        why += ` (last attempt: ${down instanceof Error ? down.message : String(down)})`;
        cause = down;
      }
    }
    return new UnavailableError(what === undefined ? why : `${what} (last: ${why})`, { cause });
  }

  /** The policy of a release, extend, inspect or listing: tried again as connections come up, for releaseRetryMs from the first failure, not past ends. */
  private retrying(ends?: () => number): Policy {
    return { deadline: 0, span: this.cfg.releaseRetryMs, unbounded: false, ends };
  }

  /**
   * Sends a request by p until a connection answers it (see
   * clientlib/route.go). The request goes on a usable connection; one that
   * breaks before the answer, or is not up, fails it, and it goes on the
   * next. A redirect sends it again once a connection is up (at most
   * MAX_REDIRECTS). When no connection is usable it waits for one to come up
   * while the policy's window lasts, then throws why.
   *
   * @internal
   */
  async route(p: Policy, signal: AbortSignal | undefined, send: (cn: Conn) => Promise<Result>): Promise<Answered | Refused> {
    // The usual case first, without the retry state: a usable connection answers.
    if (this.firstsDone && !this.closed && !(signal?.aborted ?? false) && (p.deadline === 0 || performance.now() < p.deadline)) {
      const cn = this.next(undefined);
      if (cn !== undefined) {
        const r = await send(cn);
        if (r.kind === "answer" || r.kind === "refused") return r;
        return this.retry(p, signal, send, cn, r);
      }
    }
    return this.retry(p, signal, send, undefined, undefined);
  }

  /** route after a first attempt on first failed with r, or found no usable connection (first undefined). */
  private async retry(p: Policy, signal: AbortSignal | undefined, send: (cn: Conn) => Promise<Result>, first: Conn | undefined, r0: Result | undefined): Promise<Answered | Refused> {
    if (!this.firstsDone) await this.firsts;
    let attempts = 0;
    let redirects = 0;
    let lastErr: unknown;
    let failed: Conn | undefined;
    let until = p.deadline;
    const windowless = p.deadline === 0 && !p.unbounded && p.span <= 0;
    const failure = () => {
      if (until === 0 && p.span > 0) {
        until = performance.now() + p.span;
        // Not past the grant's end. A grant already over (its end 0 once
        // released or found stale) leaves no window, not an endless one.
        if (p.ends !== undefined) until = Math.max(Math.min(until, p.ends()), 1);
      }
    };
    const fail = () =>
      p.acquireKey === undefined
        ? this.noConnection(lastErr)
        : lastErr === undefined
          ? new TimeoutError(p.acquireKey)
          : this.noConnection(lastErr, `no active node answered within the wait of ${p.waitMs} ms`);
    for (;;) {
      if (this.closed) throw new ClosedError();
      if (signal?.aborted) throw signal.reason;
      if (r0 === undefined && until !== 0 && performance.now() >= until) throw fail();
      const cn = r0 !== undefined ? first : this.next(failed);
      if (cn !== undefined) {
        const r = r0 ?? (await send(cn));
        r0 = undefined;
        if (r === TRY_LATER) throw fail();
        if (r.kind === "answer" || r.kind === "refused") return r;
        if (this.closed) throw new ClosedError();
        failed = cn;
        if (r.kind === "redirect") {
          lastErr = errRedirected;
          if (++redirects > MAX_REDIRECTS) throw this.noConnection(new Error("too many redirects"));
          if (windowless && until === 0) until = performance.now() + this.cfg.dialTimeoutMs; // the moved connection may take a dial
        } else {
          // The node asks for credentials the client was not given: no
          // connection will carry the request without them.
          if (r.err instanceof AuthError) throw r.err;
          lastErr = r.err;
          if (++attempts >= this.conns.length && windowless) throw fail(); // each connection once
        }
        failure();
        continue;
      }
      // No connection is usable: wait for one to come up.
      lastErr ??= errNotUp;
      const ae = this.allAuthFailed();
      if (ae !== undefined) throw ae;
      if (windowless && until === 0) throw fail();
      failure();
      await this.waitUp(until === 0 ? -1 : Math.max(until - performance.now(), 0), signal);
    }
  }

  /** One request (not an acquire) on cn; its answer, or broken when cn is not up. */
  private request(cn: Conn, op: string, key: string, line: string, signal: AbortSignal | undefined): Promise<Result> {
    if (!cn.usable) return Promise.resolve(broken(errNotUp));
    const c = new Call(op, key);
    if (op === "L") c.held = [];
    cn.send(c, line);
    if (signal === undefined) return c.promise;
    return raceAbort(c.promise, signal).then((r) => {
      if (r === undefined) throw signal.reason; // the answer, when it comes, is dropped
      return r;
    });
  }

  /**
   * acquire, or tryAcquire when tryIt (wait is then 0). Returns null when
   * the node answered T: the wait ran out (acquire throws a TimeoutError),
   * or a try found the key held. One acquire of a key is in progress at a
   * time (Keys): the others wait their turn, and a try is null unsent.
   */
  private async acquireWith(key: string, lease: number, wait: number, kind: Kind, tryIt: boolean, signal: AbortSignal | undefined): Promise<Lock | null> {
    // A failover elects a new active meanwhile: try again while the wait
    // lasts, or with no bound. A try has no window.
    const p: Policy = { deadline: 0, span: 0, unbounded: false };
    if (wait > 0) {
      p.deadline = performance.now() + wait;
      p.acquireKey = key;
      p.waitMs = wait;
    } else if (!tryIt) p.unbounded = true;
    const keys = this.keys;
    let ks = keys.enter(key, tryIt);
    if (ks === "busy") return null;
    if (ks === undefined) ks = await keys.wait(key, p.deadline, signal, this);
    const turn = ks;
    let r: Result;
    try {
      r = await this.route(p, signal, (cn) => this.acquireOn(cn, turn, key, lease, kind, p.deadline, tryIt, signal));
    } catch (e) {
      keys.leave(key, turn);
      throw e;
    }
    turn.answered = true;
    if (r.kind === "refused") {
      keys.leave(key, turn);
      throw r.err;
    }
    const a = r.a;
    if (a.kind !== "A") {
      // T: the wait ran out, or the key is held (a try).
      keys.leave(key, turn);
      return null;
    }
    // The grant was made at most one network delay before its answer was read.
    const l = Lock.of(this, key, a.token, lease, r.at + lease);
    keys.granted(a.token);
    keys.leave(key, turn, l);
    return l;
  }

  /**
   * Sends one attempt of the acquire whose turn ks is on cn, with the wait
   * left until deadline (0: no bound), or as a try ("-"). An attempt after
   * one whose answer did not come (or after an unresolved acquire of the
   * key) carries seen= when cn's node knows sessions.
   */
  private acquireOn(cn: Conn, ks: KeyState, key: string, lease: number, kind: Kind, deadline: number, tryIt: boolean, signal: AbortSignal | undefined): Promise<Result> {
    if (!cn.usable) return Promise.resolve(broken(errNotUp));
    const again = ks.sent || ks.unresolved;
    // A connection just made: hear whether its node knows sessions first (a
    // node from before them refuses seen=).
    if (again && cn.sessions === undefined) return this.acquireKnown(cn, ks, key, lease, kind, deadline, tryIt, signal);
    return this.sendAcquire(cn, ks, key, lease, kind, deadline, tryIt, again && cn.sessions === true, signal);
  }

  /**
   * acquireOn for an acquire sent again on a connection whose node has not
   * yet answered the session: it waits for that answer (a round trip at
   * most), its wait and its signal counting meanwhile, and carries seen= only
   * when the answer was the listing (a node from before sessions refuses the
   * field).
   */
  private async acquireKnown(cn: Conn, ks: KeyState, key: string, lease: number, kind: Kind, deadline: number, tryIt: boolean, signal: AbortSignal | undefined): Promise<Result> {
    const gen = cn.gen;
    if (!(await within(cn.sessionsKnown(), deadline, signal))) return TRY_LATER;
    if (cn.gen !== gen || !cn.usable) return cn.redirecting ? redirected : broken(errNotUp);
    return this.sendAcquire(cn, ks, key, lease, kind, deadline, tryIt, cn.sessions === true, signal);
  }

  private sendAcquire(cn: Conn, ks: KeyState, key: string, lease: number, kind: Kind, deadline: number, tryIt: boolean, withSeen: boolean, signal: AbortSignal | undefined): Promise<Result> {
    let wait: number | "-" = tryIt ? "-" : 0;
    if (deadline !== 0) {
      const left = deadline - performance.now();
      if (left <= 0) return Promise.resolve(TRY_LATER);
      wait = Math.ceil(left);
    }
    const c = cn.acquire(key, acquireLine(key, lease, wait, this.cfg.owner, kind, withSeen ? ks.seen : undefined));
    ks.sent = true;
    if (signal === undefined) return c.promise;
    return this.awaitAcquire(cn, ks, c, lease, signal);
  }

  /** Waits for the acquire c or for signal; an aborted acquire is withdrawn (Conn.withdraw), and its outcome settles its key. */
  private async awaitAcquire(cn: Conn, ks: KeyState, c: Call, lease: number, signal: AbortSignal): Promise<Result> {
    const key = c.key;
    const r = await raceAbort(c.promise, signal);
    if (r !== undefined) return r;
    const late = await cn.withdraw(c);
    if (late.kind === "answer" || late.kind === "refused") ks.answered = true;
    if (late.kind === "answer" && late.a.kind === "A") {
      // The grant that won the race. Its token is one the client has been
      // answered: the next acquire of key, which may go out before this
      // release, takes it as its seen, so that the node never answers it
      // this grant. Not held by a caller: should the release fail, the
      // session's next listing releases it.
      this.keys.granted(late.a.token);
      Lock.of(this, key, late.a.token, lease, late.at + lease).release().catch(() => {});
    }
    throw signal.reason;
  }

  /** @internal Release, extend: see Lock. */
  async releaseLock(l: Lock, signal: AbortSignal | undefined): Promise<Answered | Refused> {
    return this.route(this.retrying(), signal, (cn) => this.request(cn, "R", l.key, releaseLine(l.key, l.token), signal));
  }

  /** @internal */
  async extendLock(l: Lock, lease: number, ends: () => number, signal: AbortSignal | undefined): Promise<{ r: Answered | Refused; sent: number }> {
    let sent = 0;
    const r = await this.route(this.retrying(ends), signal, (cn) => {
      sent = performance.now();
      return this.request(cn, "X", l.key, extendLine(l.key, l.token, lease), signal);
    });
    return { r, sent };
  }
}

/**
 * A granted lock. Its token is the fencing token: pass it to the resource
 * the lock protects, which refuses a token older than one it has seen.
 */
export class Lock {
  private leaseMs: number;
  private ends: number;
  private keep: AbortController | undefined;

  /** Locks come from acquire, tryAcquire and adopt (inside the client, Lock.of). */
  private constructor(
    private readonly cl: Client,
    readonly key: string,
    readonly token: bigint,
    leaseMs: number,
    ends: number,
  ) {
    this.leaseMs = leaseMs;
    this.ends = ends;
  }

  /** @internal A handle on the grant token of key, made by cl, with its lease (ms) and when it ends in the client (performance.now()). */
  static of(cl: Client, key: string, token: bigint, leaseMs: number, ends: number): Lock {
    return new Lock(cl, key, token, leaseMs, ends);
  }

  [Symbol.for("nodejs.util.inspect.custom")](): string {
    return `Lock { key: ${JSON.stringify(this.key)}, token: ${this.token}n }`;
  }

  /** @internal When the lease ends in the client (performance.now()); 0 once the lock ended (see Keys). */
  heldUntil(): number {
    return this.ends;
  }

  /** The lock ended: released, or found gone. The client holds it no more. */
  private ended(): void {
    this.ends = 0;
    this.cl.keys.drop(this.key, this);
  }

  /**
   * Ends the grant. Through connection failures it is sent again as soon as
   * a connection comes up, for releaseRetryMs. A release of a grant this
   * client released before succeeds (the node answers the client's session
   * OK again), so does one whose first attempt went through and whose answer
   * was lost. Throws a StaleError when the grant is not the holder's any
   * more: its lease ran out, someone else released it with its token, or a
   * crash failover lost it.
   */
  async release(opts?: RequestOptions): Promise<void> {
    this.stopKeepAlive();
    const r = await this.cl.releaseLock(this, opts?.signal);
    if (r.kind === "refused") throw r.err;
    this.ended();
    if (!r.a.ok) throw new StaleError(this.key, this.token);
  }

  /**
   * Makes the grant end leaseMs from now. Throws a StaleError when it already
   * ended. Through connection failures it is sent again as connections come
   * up, for up to releaseRetryMs but not past the grant's end.
   */
  async extend(leaseMs: number, opts?: RequestOptions): Promise<void> {
    const lease = checkLease(leaseMs);
    const { r, sent } = await this.cl.extendLock(this, lease, () => this.ends, opts?.signal);
    if (r.kind === "refused") throw r.err;
    if (!r.a.ok) {
      this.ended();
      throw new StaleError(this.key, this.token);
    }
    this.leaseMs = lease;
    // The node started the new lease after the extend was sent.
    this.ends = sent + lease;
  }

  /**
   * Keeps the lock held for a long job: extends it by its lease every third
   * of it, until release or stopKeepAlive. Returns a signal that aborts,
   * with a LostError as its reason, the moment the lock is lost: the node
   * answered STALE (the grant ended), or the lease ran out while no node
   * could be reached. Calling it again replaces the earlier keep-alive.
   */
  keepAlive(): AbortSignal {
    this.stopKeepAlive();
    const stop = new AbortController();
    this.keep = stop;
    const lost = new AbortController();
    void this.keepLoop(stop.signal, lost);
    return lost.signal;
  }

  /** Stops the keep-alive, if any; the lock stays held until its lease runs out. */
  stopKeepAlive(): void {
    this.keep?.abort();
    this.keep = undefined;
  }

  private async keepLoop(stop: AbortSignal, lost: AbortController): Promise<void> {
    const cl = this.cl;
    const lease = this.leaseMs;
    // validUntil is the earliest the grant may end on the node.
    let validUntil = this.ends;
    const period = Math.max(lease / 3, 1);
    const retry = Math.min(cl.cfg.releaseIntervalMs, period);
    // The first extend comes a period after the grant, not after this call.
    let next = Math.max(validUntil - lease + period - performance.now(), 0);
    for (;;) {
      if (!(await delay(next, stop, cl))) return;
      if (performance.now() > validUntil) {
        this.ended();
        lost.abort(new LostError(this.key, "the lease ran out while no node answered"));
        return;
      }
      const sent = performance.now();
      // An extend must not outlive the lease it tries to save: a node that
      // takes it and never answers would otherwise hide the loss.
      const x = deadlineSignal(stop, validUntil - sent);
      try {
        await this.extend(lease, { signal: x.signal });
        validUntil = sent + lease;
        next = period;
      } catch (e) {
        if (stop.aborted || cl.closed) return; // released, or stopped
        if (e instanceof StaleError || e instanceof RefusedError) {
          this.ended();
          lost.abort(new LostError(this.key, e.message, { cause: e }));
          return;
        }
        // Unreachable for now: try again soon, until the lease is gone.
        next = Math.max(Math.min(retry, validUntil - performance.now() + 1), 0);
      } finally {
        x.done();
      }
    }
  }
}

/** Returns an owner naming this process, "host:pid" (the host cut to fit 64 bytes, other bytes than printable ASCII replaced by "_"). */
export function processOwner(): string {
  const pid = `:${process.pid}`;
  let host = "unknown";
  try {
    host = hostname() || "unknown";
  } catch {
    // keep "unknown"
  }
  const b = Buffer.from(host, "utf8").subarray(0, MAX_OWNER - pid.length);
  let s = "";
  for (const c of b) s += c >= 0x21 && c <= 0x7e ? String.fromCharCode(c) : "_";
  return s + pid;
}

function configure(o: ClientOptions): Config {
  if (o === null || typeof o !== "object") throw new BadInputError("kunci: new Client({ addrs: [...] }): options missing");
  if (!Array.isArray(o.addrs) || o.addrs.length === 0) throw new BadInputError("kunci: no node address (addrs)");
  for (const a of o.addrs) splitAddr(a);
  if (o.credentials !== undefined) checkCredentials(o.credentials);
  const owner = o.owner ?? "";
  if (owner !== "" && !validOwner(owner)) {
    throw new BadInputError(`kunci: bad owner ${JSON.stringify(owner)}: 1 to ${MAX_OWNER} bytes of printable ASCII, no space`);
  }
  const ms = (v: number | undefined, def: number, name: string) => {
    if (v === undefined || v === 0) return def;
    if (typeof v !== "number" || !Number.isFinite(v) || v < 0) throw new BadInputError(`kunci: ${name} must be a number of milliseconds (got ${String(v)})`);
    return v;
  };
  return {
    addrs: [...o.addrs],
    owner,
    credentials: o.credentials === undefined ? undefined : { name: o.credentials.name, secret: o.credentials.secret },
    tls: o.tls,
    dialTimeoutMs: ms(o.dialTimeoutMs, 2000, "dialTimeoutMs"),
    writeTimeoutMs: ms(o.writeTimeoutMs, 5000, "writeTimeoutMs"),
    reconnectIntervalMs: ms(o.reconnectIntervalMs, 3000, "reconnectIntervalMs"),
    probeIntervalMs: ms(o.probeIntervalMs, 5000, "probeIntervalMs"),
    probeTimeoutMs: ms(o.probeTimeoutMs, 3000, "probeTimeoutMs"),
    releaseRetryMs: ms(o.releaseRetryMs, 5000, "releaseRetryMs"),
    releaseIntervalMs: ms(o.releaseIntervalMs, 200, "releaseIntervalMs"),
    logger: o.logger,
  };
}

function holder(a: Answer): Holder {
  return {
    key: a.key,
    token: a.token,
    leftMs: a.leftMs,
    waiters: a.waiters,
    owner: a.owner === "" ? undefined : a.owner,
    holders: a.holders,
    limit: a.limit === 0 ? undefined : a.limit,
    shared: a.shared,
  };
}

/** Resolves true once p resolves, false when deadline (performance.now(); 0: none) passes first; rejects with signal's reason when it aborts first. */
function within(p: Promise<void>, deadline: number, signal: AbortSignal | undefined): Promise<boolean> {
  if (signal?.aborted) return Promise.reject(signal.reason);
  return new Promise<boolean>((resolve, reject) => {
    const t = deadline === 0 ? undefined : new Timer(() => done(false), deadline - performance.now());
    const unwatch = signal === undefined ? undefined : onAbort(signal, () => done(false, signal.reason));
    let settled = false;
    function done(ok: boolean, err?: unknown): void {
      if (settled) return;
      settled = true;
      t?.clear();
      unwatch?.();
      if (err !== undefined) reject(err);
      else resolve(ok);
    }
    void p.then(() => done(true));
  });
}

/** Resolves with p's value, or undefined when signal aborts first. */
function raceAbort<T>(p: Promise<T>, signal: AbortSignal): Promise<T | undefined> {
  if (signal.aborted) return Promise.resolve(undefined);
  return new Promise<T | undefined>((resolve, reject) => {
    const unwatch = onAbort(signal, () => resolve(undefined));
    p.then(
      (v) => {
        unwatch();
        resolve(v);
      },
      (e) => {
        unwatch();
        reject(e);
      },
    );
  });
}

/** A signal that aborts when parent does or ms have passed; done() lets its timer go. (AbortSignal.any needs Node 20.3.) */
function deadlineSignal(parent: AbortSignal, ms: number): { signal: AbortSignal; done: () => void } {
  const ac = new AbortController();
  const onParent = () => ac.abort(parent.reason);
  const t = new Timer(() => ac.abort(new KunciError(`kunci: no answer within ${Math.round(ms)} ms`)), ms);
  if (parent.aborted) onParent();
  else parent.addEventListener("abort", onParent, { once: true });
  return {
    signal: ac.signal,
    done: () => {
      t.clear();
      parent.removeEventListener("abort", onParent);
    },
  };
}

/** Waits ms; false when stop aborts or the client closes first. */
function delay(ms: number, stop: AbortSignal, cl: Client): Promise<boolean> {
  return new Promise((resolve) => {
    if (stop.aborted || cl.closed) return resolve(false);
    const done = (ok: boolean) => {
      t.clear();
      stop.removeEventListener("abort", onStop);
      un();
      resolve(ok);
    };
    const onStop = () => done(false);
    const t = new Timer(() => done(true), ms);
    stop.addEventListener("abort", onStop, { once: true });
    const un = cl.onClose(() => done(false));
  });
}

