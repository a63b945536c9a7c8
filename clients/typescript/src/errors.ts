// The errors the client throws. Every one is a KunciError: test with
// instanceof (err instanceof TimeoutError), or read err.code.

/** The base of every error the client throws. */
export class KunciError extends Error {
  /** A stable name for the kind of error, e.g. "ERR_KUNCI_TIMEOUT". */
  readonly code: string = "ERR_KUNCI";
  constructor(message: string, options?: { cause?: unknown }) {
    super(message, options);
    this.name = new.target.name;
  }
}

/** The acquire's wait ran out and nothing was granted: the node answered T. */
export class TimeoutError extends KunciError {
  override readonly code = "ERR_KUNCI_TIMEOUT";
  constructor(readonly key: string, message = `kunci: acquire of ${key}: the wait ran out`) {
    super(message);
  }
}

/** The node refused the request (E), with its reason. */
export class RefusedError extends KunciError {
  override readonly code = "ERR_KUNCI_REFUSED";
  constructor(
    readonly op: string,
    readonly key: string,
    readonly reason: string,
  ) {
    super(`kunci: ${op} ${key || "-"} refused: ${reason}`);
  }
}

/**
 * A node refused the client's credentials (bad credentials, too many
 * failures), or asked for credentials the client was not given ("auth
 * required").
 */
export class AuthError extends KunciError {
  override readonly code = "ERR_KUNCI_AUTH";
  constructor(
    readonly addr: string,
    readonly reason: string,
  ) {
    super(`kunci: authentication at ${addr} failed: ${reason}`);
  }
}

/**
 * No connection could carry the request: no node answered (down, frozen,
 * electing an active) within the request's window. cause says why the last
 * attempt failed.
 */
export class UnavailableError extends KunciError {
  override readonly code = "ERR_KUNCI_UNAVAILABLE";
  constructor(message: string, options?: { cause?: unknown }) {
    super(`kunci: no usable connection: ${message}`, options);
  }
}

/**
 * The grant is not the holder's any more (the node answered STALE): its lease
 * ran out, someone else released it with its token, or a crash failover lost
 * it (a grant the old active answered and never copied to its standbys, with
 * asynchronous replication). A release of a grant this client released
 * before succeeds: the node answers its session OK again.
 */
export class StaleError extends KunciError {
  override readonly code = "ERR_KUNCI_STALE";
  constructor(
    readonly key: string,
    readonly token: bigint,
  ) {
    super(`kunci: ${key} token ${token} is stale: the grant is not yours any more`);
  }
}

/** A lock held under withLock or keepAlive was lost: its grant ended behind the holder's back. */
export class LostError extends KunciError {
  override readonly code = "ERR_KUNCI_LOST";
  constructor(
    readonly key: string,
    message: string,
    options?: { cause?: unknown },
  ) {
    super(`kunci: lock ${key} lost: ${message}`, options);
  }
}

/** The node asked knows no active node: the cluster is electing one (Client.active). */
export class NoActiveError extends KunciError {
  override readonly code = "ERR_KUNCI_NO_ACTIVE";
  /** addr: the node asked. */
  constructor(readonly addr: string) {
    super(`kunci: no active node known (asked ${addr})`);
  }
}

/** Bad input refused before anything was sent: a bad key, lease, wait, owner, address… */
export class BadInputError extends KunciError {
  override readonly code = "ERR_KUNCI_BAD_INPUT";
}

/** The client was closed. */
export class ClosedError extends KunciError {
  override readonly code = "ERR_KUNCI_CLOSED";
  constructor() {
    super("kunci: client closed");
  }
}
