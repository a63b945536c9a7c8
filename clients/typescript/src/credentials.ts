// Credentials for nodes started with an auth file (kuncid --auth-file), and
// the credentials file the Go client and the kunci CLI read too.

import { readFileSync, statSync } from "node:fs";
import { BadInputError } from "./errors.js";
import { keyProblem } from "./protocol.js";

/**
 * What a client authenticates with: sent as the first line of every
 * connection ("U name secret"). Both are 1 to 250 bytes without space or
 * control byte. A node without an auth file accepts any.
 */
export interface Credentials {
  name: string;
  secret: string;
}

/** @internal Throws a BadInputError unless c is well formed; the message never shows the secret. */
export function checkCredentials(c: Credentials): void {
  const n = keyProblem(c?.name, "name");
  if (n !== "") throw new BadInputError(`kunci: credentials: the ${n}`);
  if (keyProblem(c.secret, "secret") !== "") {
    throw new BadInputError(`kunci: credentials of ${c.name}: the secret is empty, over 250 bytes, or holds a space or control byte`);
  }
}

/**
 * Reads a credentials file: "name secret" on one line; blank lines and lines
 * starting with # are skipped. Like an ssh key, the file must not be
 * readable or writable by group or others (chmod 600). Errors never show the
 * secret.
 */
export function loadCredentials(path: string): Credentials {
  let text: string;
  try {
    const mode = statSync(path).mode & 0o777;
    if ((mode & 0o077) !== 0) {
      throw new BadInputError(
        `kunci: credentials file ${path} may be read or written by group or others (mode ${mode.toString(8).padStart(4, "0")}): it holds a secret; chmod 600 it`,
      );
    }
    text = readFileSync(path, "utf8");
  } catch (e) {
    if (e instanceof BadInputError) throw e;
    throw new BadInputError(`kunci: credentials file: ${(e as Error).message}`, { cause: e });
  }
  let c: Credentials | undefined;
  const lines = text.split("\n");
  for (let no = 1; no <= lines.length; no++) {
    const fields = lines[no - 1]!.trim().split(/\s+/).filter((f) => f !== "");
    if (fields.length === 0 || fields[0]!.startsWith("#")) continue;
    if (c !== undefined) {
      throw new BadInputError(`kunci: credentials file ${path}, line ${no}: a second credential (the file holds one "name secret" line)`);
    }
    if (fields.length !== 2) {
      throw new BadInputError(`kunci: credentials file ${path}, line ${no}: ${fields.length} fields, want "name secret"`);
    }
    c = { name: fields[0]!, secret: fields[1]! };
    try {
      checkCredentials(c);
    } catch (e) {
      throw new BadInputError(`kunci: credentials file ${path}, line ${no}: ${(e as Error).message}`);
    }
  }
  if (c === undefined) throw new BadInputError(`kunci: credentials file ${path} holds no "name secret" line`);
  return c;
}
