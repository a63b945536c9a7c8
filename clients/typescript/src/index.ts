// kunci: the official TypeScript/Node client of the kunci lock server.
// See README.md for a tour, and docs/PROTOCOL.md in the kunci repository for
// the wire protocol it speaks.

export {
  Client,
  Lock,
  processOwner,
  type AcquireOptions,
  type ClientOptions,
  type Holder,
  type LockList,
  type LocksOptions,
  type Logger,
  type NodeInfo,
  type RequestOptions,
  type TryAcquireOptions,
} from "./client.js";
export { type Credentials, loadCredentials } from "./credentials.js";
// Every error class: KunciError and its kinds.
export * from "./errors.js";
export { MAX_KEY, MAX_OWNER, keyProblem } from "./protocol.js";
