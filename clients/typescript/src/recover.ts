/**
 * Recovering a spill through the processor's recover service (a NATS micro
 * service on `<prefix>.recover.<session>`; processor/doc.go has the
 * protocol): info and read requests, cursors, 512 KiB replies, and a size
 * and SHA-256 check of every object of the chain.
 *
 * @module
 */

import { createHash } from "node:crypto";

import { Match, type Msg } from "@nats-io/transport-node";

import { validSessionId } from "./config.js";
import { transient, type Core } from "./core.js";
import {
  ArgumentError,
  BrokenChainError,
  DigestMismatchError,
  NotRecoveredError,
  RecoverServiceError,
  SpillForbiddenError,
  SpillNotFoundError,
} from "./errors.js";
import type { SpillHandle } from "./types.js";
import { abortReason, message, raceAbort, sleep } from "./util.js";
import { parseSpillHandle } from "./verdict.js";

/**
 * Where recovered bytes go, one reply's body at a time, in order; a
 * returned promise is awaited before the next chunk is read.
 */
export type ChunkSink = (chunk: Uint8Array) => void | Promise<void>;

/** Options of a recovery. */
export interface RecoverOptions {
  /** Ends the recovery early (for example `AbortSignal.timeout(30_000)`). */
  readonly signal?: AbortSignal;
}

/** A transcript recovered whole. */
export interface RecoveredTranscript {
  /** The spills read, oldest first; the last is the one asked for. */
  readonly chain: readonly SpillHandle[];
  /**
   * The chain's objects together: JSON Lines, every accepted event of the
   * session from its `session.opened` to the request that caused the
   * newest spill, one structured CloudEvent a line.
   */
  readonly transcript: Uint8Array;
}

/** The recover protocol's names (package events, recover.go). */
const Headers = {
  serviceError: "Nats-Service-Error",
  serviceErrorCode: "Nats-Service-Error-Code",
  spillName: "Seamguard-Spill-Name",
  spillSize: "Seamguard-Spill-Size",
  spillDigest: "Seamguard-Spill-Digest",
  offset: "Seamguard-Offset",
  cursor: "Seamguard-Cursor",
} as const;

/** Most bytes of a spill name in a request. */
const MAX_NAME_BYTES = 256;
/** Most spills of a chain a caller follows. */
const MAX_CHAIN = 10_000;
/** How often one request is sent while no processor answers, or one answers 503. */
const RECOVER_ATTEMPTS = 5;

interface RecoverRequest {
  op: "info" | "read";
  name: string;
  offset?: number;
  cursor?: string;
}

const encoder = new TextEncoder();
const decoder = new TextDecoder();

/**
 * Decodes an object store digest: `SHA-256=` and the URL-safe base64 of the
 * sum, with or without padding. Undefined when it is not one.
 */
export function decodeDigest(d: string): Uint8Array | undefined {
  const i = d.indexOf("=");
  if (i < 0 || d.slice(0, i).toUpperCase() !== "SHA-256") return undefined;
  const enc = d.slice(i + 1).replace(/=+$/, "");
  if (!/^[A-Za-z0-9_-]*$/.test(enc)) return undefined;
  const sum = Buffer.from(enc, "base64url");
  return sum.length === 32 ? new Uint8Array(sum) : undefined;
}

/**
 * Reports whether two object store digests name the same sum (padded or
 * not): compare the sums, not the strings.
 */
export function sameDigest(a: string, b: string): boolean {
  const da = decodeDigest(a);
  const db = decodeDigest(b);
  return da !== undefined && db !== undefined && Buffer.from(da).equals(db);
}

/** One recovery: a session's spill and the chain before it. @internal */
export class Recovery {
  readonly #core: Core;
  readonly #session: string;
  readonly #subject: string;
  readonly #signal: AbortSignal | undefined;

  constructor(core: Core, session: string, signal: AbortSignal | undefined) {
    this.#core = core;
    this.#session = session;
    this.#subject = core.subjects.recover(session);
    this.#signal = signal;
  }

  /** Reads `h` and its chain into `sink`; returns the chain, oldest first. */
  async run(h: SpillHandle, sink: ChunkSink): Promise<SpillHandle[]> {
    const chain = await this.#chain(h);
    for (const o of chain) {
      await this.#object(o, sink);
    }
    return chain;
  }

  /** Follows `h`'s chain back through the service's handles, checking the links. */
  async #chain(h: SpillHandle): Promise<SpillHandle[]> {
    const chain: SpillHandle[] = []; // newest first
    const seen = new Set<string>();
    for (let next: string | null = h.name; next !== null; ) {
      const child = chain[chain.length - 1];
      if (seen.has(next)) {
        throw new BrokenChainError(
          this.#session,
          h.name,
          `seamguard: broken spill chain: ${child?.name ?? h.name} names ${next} as its previous spill, which follows it: the chain loops`,
        );
      }
      if (chain.length === MAX_CHAIN) {
        throw new BrokenChainError(this.#session, h.name, `seamguard: broken spill chain: the chain of ${h.name} is longer than ${MAX_CHAIN} spills`);
      }
      seen.add(next);
      let got: SpillHandle;
      try {
        got = await this.#info(next);
      } catch (err) {
        if (child !== undefined && err instanceof Error) {
          err.message = `${child.name} names ${next} as its previous spill: ${err.message}`;
        }
        throw err;
      }
      if (child === undefined && h.digest !== "" && (got.size !== h.size || !sameDigest(got.digest, h.digest))) {
        throw new DigestMismatchError(
          this.#session,
          h.name,
          `seamguard: spill digest mismatch: spill ${h.name} of session ${this.#session} holds ${got.size} bytes with digest ${got.digest}, ` +
            `but the handle names ${h.size} bytes with digest ${h.digest} (was it written again?)`,
        );
      }
      if (child !== undefined && got.lastSeq >= child.firstSeq) {
        throw new BrokenChainError(
          this.#session,
          h.name,
          `seamguard: broken spill chain: ${child.name} starts at stream sequence ${child.firstSeq}, but its previous spill ${next} ends at ${got.lastSeq}`,
        );
      }
      chain.push(got);
      next = got.previous;
    }
    return chain.reverse();
  }

  /** Asks for the handle of the spill called `name`. */
  async #info(name: string): Promise<SpillHandle> {
    const m = await this.#request({ op: "info", name });
    let h: SpillHandle | undefined;
    let why = "";
    try {
      h = parseSpillHandle(JSON.parse(decoder.decode(m.data)) as unknown);
    } catch (err) {
      why = message(err);
    }
    if (h === undefined || h.name !== name) {
      throw new BrokenChainError(
        this.#session,
        name,
        `seamguard: broken spill chain: the recover service answered the info of ${name} with ${JSON.stringify(excerpt(m.data))}${why ? ` (${why})` : ""}`,
      );
    }
    return h;
  }

  /** Reads the object `o` describes, one reply at a time, into `sink`, and checks its size and digest. */
  async #object(o: SpillHandle, sink: ChunkSink): Promise<void> {
    const sum = createHash("sha256");
    let off = 0;
    let cursor = "";
    let restarts = 0;
    // Each pass either moves off forward by at least a byte or uses up one
    // of at most 3 restarts of the object's version.
    while (off < o.size) {
      let m: Msg;
      try {
        m = await this.#request({ op: "read", name: o.name, ...(off > 0 ? { offset: off } : {}), ...(cursor ? { cursor } : {}) });
      } catch (err) {
        if (err instanceof RecoverServiceError && err.status === 409 && restarts < 3) {
          restarts++; // written again: read on without the cursor; the headers say whether it is the same
          cursor = "";
          continue;
        }
        if (err instanceof Error) err.message = `read ${o.name} from byte ${off} of ${o.size}: ${err.message}`;
        throw err;
      }
      const hdr = (k: string): string => m.headers?.get(k, Match.IgnoreCase) ?? "";
      const size = Number(hdr(Headers.spillSize));
      const digest = hdr(Headers.spillDigest);
      if (size !== o.size || !sameDigest(digest, o.digest)) {
        throw new DigestMismatchError(
          this.#session,
          o.name,
          `seamguard: spill digest mismatch: spill ${o.name} of session ${this.#session} now holds ${hdr(Headers.spillSize)} bytes with digest ${digest}, ` +
            `but its handle names ${o.size} bytes with digest ${o.digest} (was it written again?)`,
        );
      }
      const n = m.data.length;
      if (hdr(Headers.spillName) !== o.name || hdr(Headers.offset) !== String(off) || n === 0 || n > o.size - off) {
        throw new BrokenChainError(
          this.#session,
          o.name,
          `seamguard: broken spill chain: the recover service answered a read of ${o.name} at byte ${off} with ${n} bytes ` +
            `at byte ${JSON.stringify(hdr(Headers.offset))} of ${JSON.stringify(hdr(Headers.spillName))}`,
        );
      }
      sum.update(m.data);
      try {
        await sink(m.data);
      } catch (err) {
        throw new NotRecoveredError(this.#session, o.name, `seamguard: spill not recovered: writing spill ${o.name} of session ${this.#session}: ${message(err)}`, {
          cause: err,
        });
      }
      off += n;
      cursor = hdr(Headers.cursor);
    }
    const want = decodeDigest(o.digest);
    if (want === undefined) {
      throw new DigestMismatchError(
        this.#session,
        o.name,
        `seamguard: spill digest mismatch: spill ${o.name} of session ${this.#session}: digest ${JSON.stringify(o.digest)} is not "SHA-256=" and base64`,
      );
    }
    const got = sum.digest();
    if (!got.equals(want)) {
      throw new DigestMismatchError(
        this.#session,
        o.name,
        `seamguard: spill digest mismatch: spill ${o.name} of session ${this.#session}: read ${off} bytes with digest SHA-256=${got.toString("base64url")}, ` +
          `but its handle names ${o.digest}`,
      );
    }
  }

  /**
   * Sends one request, again while no processor answers or one answers
   * 503, at most 5 times, each waiting `ackTimeoutMs`.
   */
  async #request(rq: RecoverRequest): Promise<Msg> {
    const body = encoder.encode(JSON.stringify(rq));
    let last: unknown;
    let attempt = 0;
    const gaveUp = (attempts: number, detail: string, cause: unknown): NotRecoveredError =>
      new NotRecoveredError(
        this.#session,
        rq.name,
        `seamguard: spill not recovered: spill ${rq.name} of session ${this.#session}: no answer from seamguard's recover service on ${this.#subject} after ${attempts} attempt(s): ${detail}`,
        { cause },
      );
    for (; attempt < RECOVER_ATTEMPTS; attempt++) {
      if (attempt > 0) {
        try {
          await sleep(Math.min(100 * 2 ** (attempt - 1), 2000), this.#signal);
        } catch {
          throw gaveUp(attempt, `${message(last)}; then ${this.#signal ? abortReason(this.#signal) : "aborted"}`, last);
        }
      }
      let m: Msg;
      try {
        m = await raceAbort(this.#core.nc.request(this.#subject, body, { timeout: this.#core.config.ackTimeoutMs }), this.#signal);
      } catch (err) {
        last = err;
        if (this.#signal?.aborted) throw gaveUp(attempt + 1, abortReason(this.#signal), err);
        if (!transient(err)) throw gaveUp(attempt + 1, message(err), err);
        continue;
      }
      const code = m.headers?.get(Headers.serviceErrorCode, Match.IgnoreCase) ?? "";
      if (code === "") return m;
      const status = Number.parseInt(code, 10);
      const text = m.headers?.get(Headers.serviceError, Match.IgnoreCase) ?? "";
      const Kind = status === 404 ? SpillNotFoundError : status === 403 ? SpillForbiddenError : RecoverServiceError;
      const re = new Kind(this.#session, rq.name, status, text);
      if (status !== 503) throw re;
      last = re;
    }
    throw gaveUp(attempt, message(last), last);
  }
}

/** Checks the arguments of a recovery; throws an {@link ArgumentError}. @internal */
export function checkRecover(session: string, h: SpillHandle, sink: ChunkSink): void {
  if (!validSessionId(session)) {
    throw new ArgumentError(`seamguard: spill not recovered: session id ${JSON.stringify(session)}: use 1 to 128 of A-Z, a-z, 0-9, '_' and '-'`);
  }
  if (typeof h?.name !== "string" || h.name === "" || encoder.encode(h.name).length > MAX_NAME_BYTES) {
    throw new ArgumentError(`seamguard: spill not recovered: spill name ${JSON.stringify(h?.name)}: use the name of a spill handle`);
  }
  if (typeof sink !== "function") {
    throw new ArgumentError("seamguard: spill not recovered: the sink is not a function");
  }
}

/** Collects a recovery into one buffer. @internal */
export async function recoverToBuffer(
  run: (sink: ChunkSink) => Promise<SpillHandle[]>,
): Promise<RecoveredTranscript> {
  const parts: Uint8Array[] = [];
  const chain = await run((chunk) => {
    parts.push(chunk.slice()); // a copy: the connection's buffers are not ours to keep
  });
  return { chain, transcript: Buffer.concat(parts) };
}

function excerpt(b: Uint8Array): string {
  const s = decoder.decode(b.subarray(0, 256));
  return b.length > 256 ? s + "…" : s;
}
