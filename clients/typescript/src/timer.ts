// A timer for any delay. Node's setTimeout takes at most 2^31−1 ms (about
// 24.8 days): a longer delay fires at once, with a TimeoutOverflowWarning.
// Waits and leases may be longer (a node's --max-wait and --max-lease have
// no such bound), so the client's timers go through Timer, which re-arms
// until the whole delay has passed.

const MAX_DELAY = 2 ** 31 - 1;

/** @internal */
export class Timer {
  private t: NodeJS.Timeout | undefined;

  /** Runs fn once ms (clamped at 0) have passed, unless cleared first. */
  constructor(fn: () => void, ms: number) {
    const due = performance.now() + Math.max(ms, 0);
    const arm = (left: number) => {
      this.t = setTimeout(() => {
        const rest = due - performance.now();
        if (rest > 0 && left > MAX_DELAY) arm(rest);
        else fn();
      }, Math.min(left, MAX_DELAY));
    };
    arm(Math.max(ms, 0));
  }

  clear(): void {
    clearTimeout(this.t);
  }
}
