// A client's session (docs/PROTOCOL.md, Sessions; docs/clients.md, "Sessions:
// what a client does after a lost answer"): a random number the client names
// first on every connection it makes ("S session"), so that the grants made
// for its acquires are known as its own on every node, across broken
// connections and failovers. The twin of clientlib's session.go. Three things
// use it:
//
//   - Reconciling (reconcile): a new connection first names the session and
//     reads the grants the node holds for it; those the client neither holds
//     nor waits for are released at once. A release the old active answered
//     and crashed before its standbys had, or a grant the client gave up on
//     before its answer came, no longer keeps a key held until its lease ends.
//   - Acquires sent again: an acquire whose connection broke, or was
//     redirected, before its answer came is sent again with "seen=TOKEN", the
//     highest token the client had been answered when the acquire got its
//     turn: the node answers it the grant of its earlier attempt, rather than
//     queue it behind that grant.
//   - Releases sent again: the node answers a release of the session's grant
//     that it released before OK, not STALE, so that release() succeeds for a
//     release whose first answer was lost, and throws a StaleError only for a
//     grant that ended otherwise.
//
// For "seen=" to name only an earlier attempt's grant, the client has one
// acquire of a key in progress at a time, whatever the connection (Keys: the
// others wait their turn, in order); and it keeps the grants its callers
// hold, so that reconciling releases only what nobody holds.
//
// Everything runs on Node's one thread: no locks.

import { randomBytes } from "node:crypto";
import { onAbort } from "./abort.js";
import { Call } from "./call.js";
import { ClosedError, TimeoutError } from "./errors.js";
import { type Answer, releaseLine } from "./protocol.js";
import { Timer } from "./timer.js";

/** @internal Draws a session: 63 random bits, never 0. */
export function newSession(): bigint {
  for (;;) {
    const s = randomBytes(8).readBigUInt64LE() >> 1n;
    if (s !== 0n) return s;
  }
}

/** @internal A grant a caller holds, as Keys sees it (a Lock). */
export interface Held {
  readonly token: bigint;
  /** When its lease ends in the client (performance.now()); 0 once it ended (released, or found gone). */
  heldUntil(): number;
}

/**
 * What the client knows of a key it holds or acquires: the grants its
 * callers hold, and the acquire in progress. Kept while a caller holds a
 * grant of it, acquires it, or an acquire of it is unresolved.
 *
 * @internal
 */
export class KeyState {
  /** Grants callers hold: not ended (released, or found gone). */
  held: Held[] = [];
  /** An acquire of the key is in progress (one at a time); turns: those waiting for theirs, oldest first. */
  acquiring = false;
  turns: Array<() => void> = [];
  /**
   * The client's highest token when the acquire in progress got its turn;
   * sent: it went out, and an attempt after it (its answer did not come) is
   * sent with seen=.
   */
  seen = 0n;
  sent = false;
  /**
   * An acquire of the key ended without its outcome known (an attempt went
   * out, no answer came, and the caller gave up or its wait ran out): a grant
   * may have been made for it. The next acquire of the key is sent with
   * seen= from its first attempt, and takes that grant if so.
   */
  unresolved = false;
  /** The acquire in progress was answered (granted, timed out, refused). */
  answered = false;

  idle(): boolean {
    return this.held.length === 0 && !this.acquiring && this.turns.length === 0 && !this.unresolved;
  }
}

/** How many states of forgotten keys Keys keeps for the next keys (the uncontended path then makes none). */
const FREE_STATES = 64;

/** @internal The waits of Keys.wait: the client's close (returns its removal), and whether it is closed. */
export interface Closing {
  readonly closed: boolean;
  onClose(fn: () => void): () => void;
}

/**
 * The keys a client holds or acquires (KeyState each), and the highest token
 * it has been answered. One per client.
 *
 * @internal
 */
export class Keys {
  private readonly m = new Map<string, KeyState>();
  /** States of keys forgotten, for the next keys (at most FREE_STATES). */
  private readonly free: KeyState[] = [];
  /** The highest token the client has been answered (a grant). */
  seen = 0n;
  /** Grants recorded since the last sweep. */
  private records = 0;

  /** forgetMs: how long after its lease ran out in the client a lock nobody released is forgotten (see sweep). */
  constructor(private readonly forgetMs: number) {}

  /** Raises seen to token. */
  granted(token: bigint): void {
    if (token > this.seen) this.seen = token;
  }

  /**
   * Takes the turn of an acquire of key when no other acquire of key is in
   * progress, and returns its state. While one is, a try is "busy" (the key
   * is held, or is about to be: answered so unsent), and another acquire
   * gets undefined: it waits its turn (wait).
   */
  enter(key: string, tryIt: boolean): KeyState | "busy" | undefined {
    let ks = this.m.get(key);
    if (ks === undefined) {
      ks = this.make(key);
    } else if (ks.acquiring) {
      return tryIt ? "busy" : undefined;
    }
    this.begin(ks);
    return ks;
  }

  /**
   * Waits for the turn of an acquire of key behind the one in progress, in
   * order: until it comes (the state), or until the wait ends at until (0:
   * no bound; TimeoutError), signal aborts (its reason) or the client closes
   * (ClosedError).
   */
  wait(key: string, until: number, signal: AbortSignal | undefined, cl: Closing): Promise<KeyState> {
    const ks = this.m.get(key)!;
    return new Promise<KeyState>((resolve, reject) => {
      let t: Timer | undefined;
      let unwatch: (() => void) | undefined;
      let unclose: (() => void) | undefined;
      const stop = () => {
        t?.clear();
        unwatch?.();
        unclose?.();
      };
      const go = () => {
        stop();
        resolve(ks);
      };
      const leave = (err: unknown) => {
        stop();
        const i = ks.turns.indexOf(go);
        if (i >= 0) ks.turns.splice(i, 1);
        reject(err);
      };
      if (cl.closed) return reject(new ClosedError());
      if (signal?.aborted) return reject(signal.reason);
      ks.turns.push(go);
      if (until !== 0) t = new Timer(() => leave(new TimeoutError(key)), until - performance.now());
      if (signal !== undefined) unwatch = onAbort(signal, () => leave(signal.reason));
      unclose = cl.onClose(() => leave(new ClosedError()));
    });
  }

  /** Sets up the acquire whose turn it is. */
  private begin(ks: KeyState): void {
    ks.acquiring = true;
    ks.seen = this.seen;
    ks.sent = false;
    ks.answered = false;
  }

  /**
   * Ends the acquire in progress of key (ks): held is the grant it got, if
   * any. An acquire answered (granted, timed out, refused) makes the key
   * resolved; one that ended unanswered after it went out (its connection
   * broke or was redirected, and its caller gave up or its wait ran out),
   * unresolved: a grant may have been made for it. The next acquirer waiting
   * gets its turn.
   */
  leave(key: string, ks: KeyState, held?: Held): void {
    if (held !== undefined) this.record(ks, held);
    if (ks.answered) ks.unresolved = false;
    else if (ks.sent) ks.unresolved = true;
    ks.acquiring = false;
    const next = ks.turns.shift();
    if (next !== undefined) {
      this.begin(ks); // theirs now
      next();
      return;
    }
    this.tidy(key, ks);
  }

  /** Records that a caller holds l, a grant of key it did not acquire here (adopt, a late grant being released). */
  hold(key: string, l: Held): void {
    this.record(this.m.get(key) ?? this.make(key), l);
  }

  /** Records that l, a grant of key, ended: released, or known gone. */
  drop(key: string, l: Held): void {
    const ks = this.m.get(key);
    if (ks === undefined) return;
    const i = ks.held.indexOf(l);
    if (i >= 0) {
      const last = ks.held.length - 1;
      ks.held[i] = ks.held[last]!;
      ks.held.pop();
    }
    this.tidy(key, ks);
  }

  /**
   * Reports whether a grant the node lists for the session, token of key, is
   * the client's to keep: a caller holds it (or is releasing it), or the
   * acquire of key in progress may be answered it (it was made after the
   * acquire's seen, and the acquire went out, or an earlier one of the key
   * was left unresolved: it is sent with seen=). Every other grant of the
   * session is released: its release was lost, or its acquire given up.
   */
  keeps(key: string, token: bigint): boolean {
    const ks = this.m.get(key);
    if (ks === undefined) return false;
    for (const l of ks.held) if (l.token === token) return true;
    return ks.acquiring && token > ks.seen && (ks.sent || ks.unresolved);
  }

  /** Forgets that the acquires of keys the node listed no grant of were unresolved: the node holds nothing for them. */
  resolve(listed: Set<string>): void {
    for (const [key, ks] of this.m) {
      if (ks.unresolved && !ks.acquiring && !listed.has(key)) {
        ks.unresolved = false;
        this.tidy(key, ks);
      }
    }
  }

  /** How many keys the client keeps a state of (for tests). */
  get size(): number {
    return this.m.size;
  }

  /** How many acquirers of key wait for their turn (for tests). */
  waiting(key: string): number {
    return this.m.get(key)?.turns.length ?? 0;
  }

  /** Makes key's state. */
  private make(key: string): KeyState {
    const ks = this.free.pop() ?? new KeyState();
    this.m.set(key, ks);
    return ks;
  }

  /** Forgets key's state once nothing is left in it. */
  private tidy(key: string, ks: KeyState): void {
    if (!ks.idle()) return;
    this.m.delete(key);
    if (this.free.length < FREE_STATES) {
      ks.unresolved = ks.acquiring = ks.sent = ks.answered = false;
      ks.seen = 0n;
      this.free.push(ks);
    }
  }

  private record(ks: KeyState, l: Held): void {
    ks.held.push(l);
    // Swept once as many grants were recorded as keys are kept (and at least
    // 1024): a constant cost per grant.
    if (++this.records >= Math.max(1024, this.m.size)) {
      this.records = 0;
      this.sweep(performance.now());
    }
  }

  /**
   * Forgets the locks whose lease ran out in the client more than forgetMs
   * ago without an extend: a caller that lets its locks run out rather than
   * release them (a lease as a time to live) would otherwise leave one here
   * for each. Their grants ended on the node long since.
   */
  private sweep(now: number): void {
    for (const [key, ks] of this.m) {
      if (ks.held.length === 0) continue;
      ks.held = ks.held.filter((l) => {
        const until = l.heldUntil();
        return until !== 0 && now <= until + this.forgetMs;
      });
      this.tidy(key, ks);
    }
  }
}

/** @internal What reconcile needs of a connection (a Conn). */
export interface Reconciled {
  gen: number;
  usable: boolean;
  readonly addr: string;
  send(c: Call, line: string): void;
}

/**
 * Waits for the answer of sc, the session the connection cn named first, and
 * releases, on cn, the grants the node lists for the session that the client
 * does not keep (Keys.keeps): their releases were lost (an active crashed
 * after it answered them), or their acquires were given up before their
 * answers came. The answers to those releases, OK or STALE, need nothing
 * more. The connection serves meanwhile: the listing is read as the answers
 * to any other request. A node from before sessions (it refused S with
 * "unknown op"), or one that asks for credentials, lists nothing: Conn's
 * dispatch has noted either.
 *
 * @internal
 */
export async function reconcile(keys: Keys, cn: Reconciled, sc: Call, log: (msg: string, fields: Record<string, unknown>) => void): Promise<void> {
  const gen = cn.gen;
  const r = await sc.promise;
  if (r.kind !== "answer" || r.a.kind !== "S") return; // refused, or the connection broke or moved: the next one names it again
  const names = new Set<string>();
  const stale: Answer[] = [];
  for (const h of r.held ?? []) {
    names.add(h.key);
    if (!keys.keeps(h.key, h.token)) stale.push(h);
  }
  keys.resolve(names);
  for (const h of stale) {
    if (cn.gen !== gen || !cn.usable) return; // gone: the next connection names the session again
    cn.send(new Call("R", h.key), releaseLine(h.key, h.token));
  }
  if (stale.length > 0) log("released grants of the session that the client no longer holds", { node: cn.addr, released: stale.length });
}
