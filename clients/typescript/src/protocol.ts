// The wire protocol (docs/PROTOCOL.md), as pure functions over strings: the
// checks a request passes before it is sent (the node's own rules), the
// request lines, and the parser of answer lines. Nothing here does I/O.

import { BadInputError } from "./errors.js";

/** @internal The longest line, in bytes, its LF included. */
export const MAX_LINE = 512;
/** The longest key (and credential name, secret, listing prefix), in bytes. */
export const MAX_KEY = 250;
/** The longest owner, in bytes. */
export const MAX_OWNER = 64;
/** @internal The largest unsigned 64-bit number: the largest limit, and above any token. */
export const MAX_U64 = (1n << 64n) - 1n;
/**
 * The largest semaphore limit the client sends (2^32-1): the node refuses a
 * limit over its --max-holders (1024 by default) itself, with the maximum in
 * its reason; the client refuses only what no node takes.
 *
 * @internal
 */
export const MAX_SEMAPHORE_LIMIT = 2 ** 32 - 1;
/**
 * The largest lease or wait the client sends, in milliseconds: the node
 * refuses more than its --max-lease/--max-wait (a day by default) itself,
 * with the maximum in its reason; the client refuses only what no node takes.
 *
 * @internal
 */
export const MAX_MS = Number.MAX_SAFE_INTEGER;

/**
 * Returns why key breaks the protocol's rules (1 to 250 bytes, each
 * 0x21–0x7E or ≥ 0x80 in UTF-8: no space, no control byte), or "" when it
 * is a valid key.
 */
export function keyProblem(key: unknown, what = "key"): string {
  if (typeof key !== "string") return `${what} must be a string (got ${typeof key})`;
  if (key.length === 0) return `${what} is empty`;
  let ascii = true;
  for (let i = 0; i < key.length; i++) {
    const c = key.charCodeAt(i);
    if (c <= 0x20) return `${what} ${JSON.stringify(key)} holds a ${c === 0x20 ? "space" : "control byte"}`;
    if (c === 0x7f) return `${what} ${JSON.stringify(key)} holds a control byte (DEL)`;
    if (c >= 0x80) {
      ascii = false;
      if (c >= 0xd800 && c <= 0xdfff) {
        // A surrogate must pair up, or the key is not text UTF-8 can carry.
        const d = key.charCodeAt(i + 1);
        if (c > 0xdbff || !(d >= 0xdc00 && d <= 0xdfff)) return `${what} ${JSON.stringify(key)} holds a lone surrogate`;
        i++;
      }
    }
  }
  const n = ascii ? key.length : Buffer.byteLength(key, "utf8");
  if (n > MAX_KEY) return `${what} is ${n} bytes, over ${MAX_KEY}`;
  return "";
}

/** @internal Throws a BadInputError unless key is a valid key. */
export function checkKey(key: unknown, what = "key"): asserts key is string {
  const p = keyProblem(key, what);
  if (p !== "") throw new BadInputError(`kunci: ${p}`);
}

/** @internal Reports whether s is a valid owner: 1 to 64 bytes of printable ASCII (0x21–0x7E). */
export function validOwner(s: unknown): s is string {
  if (typeof s !== "string" || s.length === 0 || s.length > MAX_OWNER) return false;
  for (let i = 0; i < s.length; i++) {
    const c = s.charCodeAt(i);
    if (c < 0x21 || c > 0x7e) return false;
  }
  return true;
}

/**
 * Checks a lease in milliseconds (a finite number above 0; a fraction is
 * rounded up to the millisecond, so a lease is never shorter than asked) and
 * returns it as whole milliseconds.
 *
 * @internal
 */
export function leaseMs(ms: unknown, what = "lease"): number {
  if (typeof ms !== "number" || !Number.isFinite(ms) || ms <= 0) {
    throw new BadInputError(`kunci: ${what} must be a number of milliseconds above 0 (got ${String(ms)})`);
  }
  const n = Math.ceil(ms);
  if (n > MAX_MS) throw new BadInputError(`kunci: ${what} of ${ms} ms is too long`);
  return n;
}

/** @internal Checks a wait in milliseconds (finite, 0 or more; 0: no bound of its own) and returns it as whole milliseconds. */
export function waitMs(ms: unknown): number {
  if (typeof ms !== "number" || !Number.isFinite(ms) || ms < 0) {
    throw new BadInputError(`kunci: wait must be a number of milliseconds, 0 or more (got ${String(ms)})`);
  }
  const n = Math.ceil(ms);
  if (n > MAX_MS) throw new BadInputError(`kunci: wait of ${ms} ms is too long`);
  return n;
}

/**
 * What an acquire asks for: one of at most limit grants of a semaphore
 * (limit ≥ 1), a shared (read) grant of a read-write lock (shared), or,
 * with neither, a plain (exclusive) lock. Never both.
 *
 * @internal
 */
export interface Kind {
  limit: number;
  shared: boolean;
}

/**
 * Checks an acquire's limit (undefined, or a whole number from 1 to 2^32-1)
 * and shared (undefined or a boolean; not true with a limit) and returns
 * what they ask for (limit 0: no semaphore).
 *
 * @internal
 */
export function kindOf(limit: unknown, shared: unknown): Kind {
  if (shared !== undefined && typeof shared !== "boolean") {
    throw new BadInputError(`kunci: shared must be true or false (got ${String(shared)})`);
  }
  if (limit === undefined) return { limit: 0, shared: shared === true };
  if (typeof limit !== "number" || !Number.isInteger(limit) || limit < 1 || limit > MAX_SEMAPHORE_LIMIT) {
    throw new BadInputError(`kunci: limit must be a whole number from 1 to ${MAX_SEMAPHORE_LIMIT} (got ${String(limit)})`);
  }
  if (shared === true) {
    throw new BadInputError("kunci: limit and shared together: a key is a semaphore (limit) or a read-write lock (shared), not both");
  }
  return { limit, shared: false };
}

/** @internal Checks a host:port address. */
export function splitAddr(addr: unknown): { host: string; port: number } {
  if (typeof addr !== "string") throw new BadInputError(`kunci: bad address ${String(addr)}: want host:port`);
  const i = addr.lastIndexOf(":");
  let host = i > 0 ? addr.slice(0, i) : "";
  const portText = addr.slice(i + 1);
  if (host.startsWith("[") && host.endsWith("]")) host = host.slice(1, -1);
  else if (host.includes(":")) host = ""; // an IPv6 address needs brackets
  const port = Number(portText);
  if (host === "" || !/^[0-9]{1,5}$/.test(portText) || port < 1 || port > 65535) {
    throw new BadInputError(`kunci: bad address ${JSON.stringify(addr)}: want host:port`);
  }
  return { host, port };
}

/** @internal Writes milliseconds as the protocol's seconds: 30000 → "30", 500 → "0.5", 2125 → "2.125". */
export function seconds(ms: number): string {
  const s = Math.floor(ms / 1000);
  const f = ms - s * 1000;
  if (f === 0) return String(s);
  let t = String(f).padStart(3, "0");
  while (t.endsWith("0")) t = t.slice(0, -1);
  return `${s}.${t}`;
}

/** @internal Reads the protocol's seconds ("28.14") as milliseconds, or -1 when malformed. */
export function parseSeconds(s: string): number {
  const m = /^([0-9]+)(?:\.([0-9]{1,3}))?$/.exec(s);
  if (m === null) return -1;
  const ms = Number(m[1]) * 1000 + (m[2] === undefined ? 0 : Number(m[2].padEnd(3, "0")));
  return Number.isSafeInteger(ms) ? ms : -1;
}

/** @internal Reads a decimal unsigned 64-bit number, or -1n when malformed. */
export function parseU64(s: string): bigint {
  if (s.length === 0 || s.length > 20 || !/^[0-9]+$/.test(s)) return -1n;
  const n = BigInt(s);
  return n > MAX_U64 ? -1n : n;
}

// Request lines. Their fields are checked by the caller.

/**
 * An acquire: owner "" for none; kind (default a plain lock) adds limit=N or
 * mode=shared; seen, when given, marks an acquire of a session sent again
 * (seen=TOKEN: the highest token the session had been answered when it was
 * first sent).
 *
 * @internal
 */
export function acquireLine(key: string, lease: number, wait: number | "-", owner: string, kind?: Kind, seen?: bigint): string {
  let line = `A ${key} ${seconds(lease)} ${wait === "-" ? "-" : seconds(wait)}`;
  if (owner !== "") line += ` owner=${owner}`;
  if (kind !== undefined) {
    if (kind.limit > 0) line += ` limit=${kind.limit}`;
    else if (kind.shared) line += " mode=shared";
  }
  if (seen !== undefined) line += ` seen=${seen}`;
  return line + "\n";
}
/** @internal */
export const releaseLine = (key: string, token: bigint) => `R ${key} ${token}\n`;
/** @internal */
export const extendLine = (key: string, token: bigint, lease: number) => `X ${key} ${token} ${seconds(lease)}\n`;
/** @internal */
export const cancelLine = (key: string) => `C ${key}\n`;
/** @internal */
export const inspectLine = (key: string) => `Q ${key}\n`;
/** @internal */
export const listLine = (limit: bigint, prefix: string) => (prefix === "" ? `L ${limit}\n` : `L ${limit} ${prefix}\n`);
/** @internal */
export const infoLine = "I\n";
/** @internal Names the connection's session (a number from 1 to 2^64-1): the node lists the grants it holds for it. */
export const sessionLine = (session: bigint) => `S ${session}\n`;
/** @internal */
export const authLine = (name: string, secret: string) => `U ${name} ${secret}\n`;

/** @internal One answer line, parsed. Only the fields of its kind are set. */
export interface Answer {
  /** "A" "T" "R" "X" "C" "Q" "H" "L" "S" "I" "U" "E" or "M". */
  kind: string;
  /** A T R X C Q H: the key; E: the key echo ("" for "-"). */
  key: string;
  /** A: the grant; Q H: the holder's (0n for Q FREE). */
  token: bigint;
  /** R X: OK (not STALE); C: OK (not NONE). */
  ok: boolean;
  /** E: the op echo ("" for "-"). */
  op: string;
  /** E: the reason; M: the address ("" for "-"). */
  text: string;
  /** Q H: lease left, in milliseconds; waiters; owner ("" for none). */
  leftMs: number;
  waiters: number;
  owner: string;
  /** Q H: the key's grants (1 for a plain lock); a semaphore's limit (0: not a semaphore); held in shared mode. */
  holders: number;
  limit: number;
  shared: boolean;
  /** L S: how many H lines; L: whether the limit stopped the listing. */
  count: bigint;
  more: boolean;
  /** I: the node's role, its own address, the active's ("" for "-"), and a state= field ("" for none). */
  role: string;
  self: string;
  active: string;
  state: string;
}

/** @internal An answer line the protocol does not allow: the connection is dropped. */
export class BadAnswerError extends Error {
  constructor(line: string) {
    super(`kunci: unreadable answer from the node: ${JSON.stringify(line.slice(0, 120))}`);
  }
}

function blank(kind: string): Answer {
  return {
    kind, key: "", token: 0n, ok: false, op: "", text: "", leftMs: 0, waiters: 0, owner: "",
    holders: 0, limit: 0, shared: false, count: 0n, more: false, role: "", self: "", active: "", state: "",
  };
}

const dash = (s: string) => (s === "-" ? "" : s);

/** Reads a count of holders or a limit (a decimal up to 2^32-1), or -1 when malformed. */
function count(s: string): number {
  const n = parseU64(s);
  return n < 0n || n > BigInt(MAX_SEMAPHORE_LIMIT) ? -1 : Number(n);
}

/**
 * Parses one answer line (without its LF; a CR before it is dropped by the
 * caller or here). Throws BadAnswerError for a line the protocol does not
 * allow. Fields after the known ones (name=value) are skipped.
 *
 * @internal
 */
export function parseAnswer(line: string): Answer {
  if (line.endsWith("\r")) line = line.slice(0, -1);
  if (line.length < 3 || line.charCodeAt(1) !== 0x20) throw new BadAnswerError(line);
  const kind = line[0]!;
  const rest = line.slice(2);
  const bad = () => new BadAnswerError(line);
  switch (kind) {
    case "A":
    case "R":
    case "X":
    case "C":
    case "T": {
      const sp = rest.indexOf(" ");
      const a = blank(kind);
      if (kind === "T") {
        if (sp >= 0 || keyProblem(rest) !== "") throw bad();
        a.key = rest;
        return a;
      }
      if (sp <= 0) throw bad();
      a.key = rest.slice(0, sp);
      const v = rest.slice(sp + 1);
      if (kind === "A") {
        a.token = parseU64(v);
        if (a.token < 1n) throw bad();
      } else if (v === "OK") a.ok = true;
      else if (v !== (kind === "C" ? "NONE" : "STALE")) throw bad();
      return a;
    }
    case "Q":
    case "H": {
      const f = rest.split(" ");
      const a = blank(kind);
      a.key = f[0]!;
      if (a.key === "" || f.length < 2) throw bad();
      if (kind === "Q" && f.length === 2 && f[1] === "FREE") return a;
      if (f.length < 4) throw bad();
      a.token = parseU64(f[1]!);
      a.leftMs = parseSeconds(f[2]!);
      const w = parseU64(f[3]!);
      if (a.token < 1n || a.leftMs < 0 || w < 0n) throw bad();
      a.waiters = Number(w);
      a.holders = 1;
      for (let i = 4; i < f.length; i++) {
        const x = f[i]!;
        if (x.startsWith("owner=")) a.owner = x.slice(6);
        else if (x.startsWith("holders=")) a.holders = count(x.slice(8));
        else if (x.startsWith("limit=")) a.limit = count(x.slice(6));
        else if (x === "mode=shared") a.shared = true;
      }
      if (a.holders < 1 || a.limit < 0) throw bad();
      return a;
    }
    case "L": {
      const f = rest.split(" ");
      const a = blank(kind);
      a.count = parseU64(f[0]!);
      if (a.count < 0n || f.length > 2 || (f.length === 2 && f[1] !== "more")) throw bad();
      a.more = f.length === 2;
      return a;
    }
    case "S": {
      const a = blank(kind);
      a.count = parseU64(rest);
      if (a.count < 0n) throw bad();
      return a;
    }
    case "E": {
      const s1 = rest.indexOf(" ");
      const s2 = s1 < 0 ? -1 : rest.indexOf(" ", s1 + 1);
      if (s1 <= 0 || s2 <= s1 + 1 || s2 === rest.length - 1) throw bad();
      const a = blank(kind);
      a.op = dash(rest.slice(0, s1));
      a.key = dash(rest.slice(s1 + 1, s2));
      a.text = rest.slice(s2 + 1);
      return a;
    }
    case "U":
      if (rest !== "OK") throw bad();
      return Object.assign(blank(kind), { ok: true });
    case "M":
      if (rest.includes(" ")) throw bad();
      return Object.assign(blank(kind), { text: dash(rest) });
    case "I": {
      const f = rest.split(" ");
      if (f.length < 3 || f.some((x) => x === "")) throw bad();
      const a = blank(kind);
      a.role = f[0]!;
      a.self = f[1]!;
      a.active = dash(f[2]!);
      for (let i = 3; i < f.length; i++) if (f[i]!.startsWith("state=")) a.state = f[i]!.slice(6);
      return a;
    }
  }
  throw bad();
}
