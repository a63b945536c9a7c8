// Watching the AbortSignals that callers give: one "abort" listener per
// signal, however many requests wait with it. A process's shutdown signal
// is often given to every request, and Node warns of a leak ("Possible
// EventTarget memory leak detected") past 10 listeners on one signal. The
// twin of clientlib's context watches (call.go).

interface Watch {
  fns: Set<() => void>;
  listener: () => void;
}

const watches = new WeakMap<AbortSignal, Watch>();

/**
 * Calls fn once when signal aborts; returns the removal of fn, to call once
 * the wait for signal is over. Nothing happens for a signal that has
 * aborted already: check signal.aborted first.
 *
 * @internal
 */
export function onAbort(signal: AbortSignal, fn: () => void): () => void {
  let w = watches.get(signal);
  if (w === undefined) {
    const fns = new Set<() => void>();
    const listener = () => {
      watches.delete(signal);
      for (const f of [...fns]) f();
      fns.clear();
    };
    w = { fns, listener };
    watches.set(signal, w);
    signal.addEventListener("abort", listener, { once: true });
  }
  const watch = w;
  watch.fns.add(fn);
  return () => {
    if (!watch.fns.delete(fn) || watch.fns.size > 0 || watches.get(signal) !== watch) return;
    watches.delete(signal);
    signal.removeEventListener("abort", watch.listener);
  };
}
