// A request on a connection and its outcome: a Call waits for its answer,
// and a Result is what it gets. The twin of clientlib's call.go.
//
// Everything runs on Node's one thread: no locks.

import type { AuthError, RefusedError } from "./errors.js";
import type { Answer } from "./protocol.js";

/**
 * The outcome of one request on one connection, told apart by kind: only an
 * answer has an answer line to read (a), only a refusal or a failure an
 * error, so the compiler checks that a caller looked at kind first.
 *
 * @internal
 */
export type Result = Answered | Refused | Broken | Redirected;

/** @internal The node answered the request. */
export interface Answered {
  readonly kind: "answer";
  readonly a: Answer;
  /** When the answer was read (performance.now()). */
  readonly at: number;
  /** The H lines that came before the answer of a listing (L) or a session (S); undefined for none. */
  readonly held: Answer[] | undefined;
}

/** @internal The node refused the request (E): a RefusedError with its reason, or an AuthError when it asks for credentials ("auth required"). */
export interface Refused {
  readonly kind: "refused";
  readonly err: RefusedError | AuthError;
}

/** @internal The connection failed the request, or was not up: err says why. */
export interface Broken {
  readonly kind: "broken";
  readonly err: unknown;
}

/** @internal The node moved the connection (M) before it answered. */
export interface Redirected {
  readonly kind: "redirect";
}

/** @internal */
export const errNotUp = new Error("connection not up");
/** @internal */
export const errWaitOver = new Error("the wait ran out before the acquire could be sent");

/** @internal */
export const broken = (err: unknown): Broken => ({ kind: "broken", err });
/** @internal */
export const redirected: Redirected = { kind: "redirect" };

/**
 * One request waiting for its answer. It stays outstanding until the node
 * answers it or the connection breaks, even when its caller gives up. Its
 * Conn finishes it (dispatch, detach); its caller awaits promise.
 *
 * @internal
 */
export class Call {
  private resolve!: (r: Result) => void;
  readonly promise: Promise<Result>;
  /** An S or L call's listing: the H lines read so far (Conn's dispatch adds them). */
  held: Answer[] | undefined;
  /** The call has its outcome (finish was called). */
  answered = false;
  constructor(
    readonly op: string,
    readonly key: string,
  ) {
    this.promise = new Promise<Result>((res) => (this.resolve = res));
  }
  /** Gives the call its outcome; later outcomes are dropped. */
  finish(r: Result): void {
    if (this.answered) return;
    this.answered = true;
    this.resolve(r);
  }
}
