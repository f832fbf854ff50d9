/**
 * Small helpers: a lock, abortable waits. Not part of the public API.
 *
 * @module
 */

/** A lock: callers run one at a time, in the order they asked. */
export class Mutex {
  #tail: Promise<void> = Promise.resolve();

  /** Waits for the lock and returns the function that releases it. */
  async lock(): Promise<() => void> {
    let release!: () => void;
    const held = new Promise<void>((resolve) => {
      release = resolve;
    });
    const prev = this.#tail;
    this.#tail = prev.then(() => held);
    await prev;
    return release;
  }

  /** Runs `fn` holding the lock. */
  async run<T>(fn: () => Promise<T>): Promise<T> {
    const release = await this.lock();
    try {
      return await fn();
    } finally {
      release();
    }
  }
}

/** Why a signal ended a wait, as text. */
export function abortReason(signal: AbortSignal): string {
  const r: unknown = signal.reason;
  if (r instanceof Error) return r.name === "TimeoutError" ? "the deadline passed" : `the signal was aborted (${r.message})`;
  return "the signal was aborted";
}

/**
 * Settles as `p` does, or rejects with the signal's reason once `signal`
 * aborts first. `p` goes on in the background.
 */
export function raceAbort<T>(p: Promise<T>, signal: AbortSignal | undefined): Promise<T> {
  if (signal === undefined) return p;
  if (signal.aborted) {
    p.catch(() => undefined);
    return Promise.reject(signal.reason as Error);
  }
  return new Promise<T>((resolve, reject) => {
    const onAbort = (): void => {
      p.catch(() => undefined);
      reject(signal.reason as Error);
    };
    signal.addEventListener("abort", onAbort, { once: true });
    p.then(
      (v) => {
        signal.removeEventListener("abort", onAbort);
        resolve(v);
      },
      (e: unknown) => {
        signal.removeEventListener("abort", onAbort);
        reject(e instanceof Error ? e : new Error(String(e)));
      },
    );
  });
}

/** Waits `ms` milliseconds, or rejects with the signal's reason once it aborts. */
export function sleep(ms: number, signal: AbortSignal | undefined): Promise<void> {
  return new Promise<void>((resolve, reject) => {
    if (signal?.aborted) {
      reject(signal.reason as Error);
      return;
    }
    const onAbort = (): void => {
      clearTimeout(timer);
      reject(signal?.reason as Error);
    };
    const timer = setTimeout(() => {
      signal?.removeEventListener("abort", onAbort);
      resolve();
    }, ms);
    signal?.addEventListener("abort", onAbort, { once: true });
  });
}

/** Combines a caller's signal with a timeout: the one that ends first ends the wait. */
export function withTimeout(signal: AbortSignal | undefined, timeoutMs: number): AbortSignal {
  const t = AbortSignal.timeout(timeoutMs);
  return signal === undefined ? t : AbortSignal.any([signal, t]);
}

/** The message of an unknown thrown value. */
export function message(err: unknown): string {
  return err instanceof Error ? err.message : String(err);
}
