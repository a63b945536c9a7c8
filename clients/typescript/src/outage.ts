// What a client learned of nodes down and of the active, shared by its
// connections while the active is down, moving or being elected. The twin
// of clientlib's outage.go, which says how a client follows a failover.
//
// Everything runs on Node's one thread: no locks.

import { AuthError } from "./errors.js";

/**
 * Which addresses did not answer lately, and where a connection last found
 * the active. One per client; its connections read and write it (Conn's
 * run, seek and pause).
 *
 * @internal
 */
export class Outage {
  /** Address → when a dial to it last failed (performance.now()). */
  private readonly down = new Map<string, number>();
  /** Where a connection last found the active: a node named it, or said it is. Set by Conn. */
  active = "";
  /** forgetMs: how long an address counts as down; a node that names it as the active after that is believed again. */
  constructor(private readonly forgetMs: number) {}

  /** Notes how a dial to addr went (err undefined: it worked): down when it failed. */
  dialed(addr: string, err: unknown): void {
    if (err === undefined) this.down.delete(addr);
    else if (!(err instanceof AuthError)) this.markDown(addr); // a node that refuses the credentials answers
  }
  /** Notes that addr is down: a dial to it failed, or it closed a connection as soon as it was made, having served nothing (a node stopping). */
  markDown(addr: string): void {
    this.down.set(addr, performance.now());
  }
  /** Reports whether addr was found down lately (markDown), and no dial to it worked since. */
  isDown(addr: string): boolean {
    const at = this.down.get(addr);
    if (at === undefined) return false;
    if (performance.now() - at >= this.forgetMs) {
      this.down.delete(addr);
      return false;
    }
    return true;
  }
  /** Where a connection last found the active, unless that is not, or is down; "" for none. */
  activeBut(not: string): string {
    const a = this.active;
    return a === "" || a === not || this.isDown(a) ? "" : a;
  }
}
