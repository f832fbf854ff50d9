/**
 * A session: one agent conversation, whose events the client publishes in
 * order and whose compactions it asks seamguard about.
 *
 * @module
 */

import type { Msg, Subscription } from "@nats-io/transport-node";

import { verifyVerdict, type Attribution } from "./attest.js";
import type { Unattributed } from "./config.js";

import { buildEvent, msgId, type OutEvent } from "./encode.js";
import { newId, type Core } from "./core.js";
import {
  ArgumentError,
  NoVerdictError,
  NotPublishedError,
  NotRetryableError,
  RejectedError,
  SessionClosedError,
} from "./errors.js";
import { Recovery, checkRecover, recoverToBuffer, type ChunkSink, type RecoverOptions, type RecoveredTranscript } from "./recover.js";
import { InputTypes, MAX_OFFSET, VerdictTypes } from "./types.js";
import type { CompactionRequest, JsonObject, Range, SentCompactionRequest, SpillHandle, Unit } from "./types.js";
import { Mutex, abortReason, message, raceAbort, withTimeout } from "./util.js";
import {
  droppedPins,
  isRetryable,
  mustCarryPins,
  parseRejected,
  parseVerdictEvent,
  rejects,
  toVerdict,
  type RefusedVerdict,
  type Verdict,
  type VerdictEvent,
} from "./verdict.js";

/** Options of a call that publishes. */
export interface CallOptions {
  /**
   * Ends the call early (for example `AbortSignal.timeout(10_000)`). An
   * event whose publish it cuts short is kept and sent again, same id.
   */
  readonly signal?: AbortSignal;
}

/**
 * Reports whether the verdict event `ev` claims to answer the request
 * `sent`, published as `eventId` from `source`: as its verdict or its
 * rejection.
 */
function claimsToAnswer(ev: VerdictEvent, sent: SentCompactionRequest, source: string, eventId: string): boolean {
  if (ev.type === VerdictTypes.eventRejected) {
    try {
      return rejects(ev, parseRejected(ev.data), ...answering(source, eventId)) !== undefined;
    } catch {
      return false;
    }
  }
  return ev.causationId === eventId && ev.data["request_id"] === sent.requestId;
}

/** Options of a call that waits for a verdict. */
export interface VerdictOptions extends CallOptions {
  /**
   * The deadline of the whole call (publish and wait), in milliseconds;
   * default: the client's `verdictTimeoutMs` (30 s). The signal may end it
   * sooner. {@link Session.compact} gives each request its own deadline.
   */
  readonly timeoutMs?: number;
}

/** A session to open (or resume). */
export interface SessionOptions {
  /** The session id: 1 to 128 of A-Z, a-z, 0-9, `_` and `-`. */
  readonly id: string;
  /**
   * The recovery floor: how many of the latest offsets (in `unit`) every
   * compaction must keep verbatim. More than 0.
   */
  readonly span: number;
  /** What offsets count; default `turns`. */
  readonly unit?: Unit;
  /** The context window in tokens; informational. */
  readonly window?: number;
  /** The compaction threshold in tokens; informational. */
  readonly trigger?: number;
  /**
   * Resumes a session opened before, by this or an earlier process, whose
   * transcript is `[0, head)`: `open` publishes `session.opened` again
   * (seamguard accepts an unchanged configuration and changes nothing) and
   * appends continue at offset `head`. 0 or absent starts a new session.
   */
  readonly head?: number;
  /**
   * Called with every rejection of one of this session's own events other
   * than compaction requests (whose rejections their call throws): an
   * `event.rejected` verdict whose causationid (or `Nats-Msg-Id`) is the id
   * of an event this session published. With it, the session listens on
   * `<prefix>.verdicts.<session>.rejected` from before its `session.opened`
   * until {@link Session.close} has stored the close: a rejection of the
   * close itself is not reported. Without it, rejections of events other
   * than requests are seen only by subscribers and operators.
   */
  readonly onRejected?: (err: RejectedError) => void;
}

/** One turn to append. `{}` is a turn of size 1 with no content. */
export interface Turn {
  /** The turn's length in the session's unit; default 1 (a session counting turns). */
  readonly size?: number;
  /** Who spoke (`user`, `assistant`, `tool`); optional. */
  readonly role?: string;
  /** The turn's length in tokens; optional, informational. */
  readonly tokens?: number;
  /**
   * What the turn said: any value `JSON.stringify` encodes. It is what a
   * spill preserves.
   */
  readonly content?: unknown;
  /**
   * Marks the turn as a rule that must stay in the agent's working context
   * for the session's life (a standing instruction, a constraint, the task
   * statement): seamguard then refuses every compaction that neither keeps
   * it in the tail nor carries it.
   */
  readonly pinned?: boolean;
}

/** The rejected ids a session remembers to match rejections against. */
const REMEMBERED_IDS = 4096;

/** The matchers of {@link rejects} for the one event `eventId` of `source`. */
function answering(source: string, eventId: string): [(id: string) => boolean, (m: string) => string | undefined] {
  const mine = msgId(source, eventId);
  return [(x) => x === eventId, (m) => (m === mine ? eventId : undefined)];
}

/** Most requests {@link Session.compact} sends for one compaction. */
const MAX_COMPACT_STEPS = 4;

function isOffset(v: unknown): v is number {
  return typeof v === "number" && Number.isInteger(v) && v >= 0 && v <= MAX_OFFSET;
}

function checkRange(r: Range | undefined, what: string, problems: string[]): void {
  if (r === undefined || r === null || !isOffset(r.start) || !isOffset(r.end)) {
    problems.push(`${what} must be a range {start, end} of integers from 0 to 2^53, not ${JSON.stringify(r)}`);
  }
}

function wireRange(r: Range): JsonObject {
  return { start: r.start, end: r.end };
}

/** Reports every problem with `o` at once: an empty list when it is valid. */
export function validateSessionOptions(o: SessionOptions): string[] {
  const problems: string[] = [];
  if (typeof o?.id !== "string" || !/^[A-Za-z0-9_-]{1,128}$/.test(o.id)) {
    problems.push(`session id ${JSON.stringify(o?.id)}: use 1 to 128 of the characters A-Z, a-z, 0-9, '_' and '-'`);
  }
  if (o?.unit !== undefined && o.unit !== "turns" && o.unit !== "tokens" && o.unit !== "messages") {
    problems.push(`unit ${JSON.stringify(o.unit)}: use "turns", "tokens" or "messages" (absent means turns)`);
  }
  if (!isOffset(o?.span) || o.span === 0) {
    problems.push(`span is ${String(o?.span)}: set how many of the latest offsets (an integer from 1 to 2^53) must survive every compaction verbatim`);
  }
  for (const [name, v] of [["head", o?.head], ["window", o?.window], ["trigger", o?.trigger]] as const) {
    if (v !== undefined && !isOffset(v)) problems.push(`${name} is ${String(v)}: it must be an integer from 0 to 2^53`);
  }
  if (o?.onRejected !== undefined && typeof o.onRejected !== "function") {
    problems.push("onRejected must be a function");
  }
  return problems;
}

/**
 * One open agent session. It publishes the session's events in order, each
 * stored in the events stream (its JetStream ack received) before the next
 * is sent, and tracks the head so that callers never compute offsets.
 *
 * Calls may overlap (from several async tasks): the session's events are
 * published one at a time, in the order the calls were made.
 * {@link Session.requestCompaction} holds the session only while it
 * subscribes and publishes, not while it waits for the verdict, so other
 * calls may append meanwhile. Recoveries do not hold it.
 *
 * Open one with {@link SeamguardClient.open}.
 */
export class Session {
  /** The session id. */
  readonly id: string;
  /** The unit the session's offsets count. */
  readonly unit: Unit;

  readonly #core: Core;
  readonly #mutex = new Mutex();
  #head: number;
  #pending: OutEvent | undefined; // an event whose ack never came; sent again first
  #closed = false;
  readonly #onRejected: ((err: RejectedError) => void) | undefined;
  #rejections: Subscription | undefined;
  readonly #ours = new Map<string, string>(); // event id → its Nats-Msg-Id

  /** @internal Use {@link SeamguardClient.open}. */
  constructor(core: Core, id: string, unit: Unit, head: number, onRejected: ((err: RejectedError) => void) | undefined) {
    this.#core = core;
    this.id = id;
    this.unit = unit;
    this.#head = head;
    this.#onRejected = onRejected;
  }

  /** The end offset of the last turn appended: the transcript is `[0, head)`. */
  get head(): number {
    return this.#head;
  }

  /** Whether {@link Session.close} was called. */
  get closed(): boolean {
    return this.#closed;
  }

  /** Whether an event whose publish failed waits to be sent again. */
  get pending(): boolean {
    return this.#pending !== undefined;
  }

  /** @internal Publishes `session.opened`; the caller checked the options. */
  async open(o: SessionOptions, call: CallOptions): Promise<void> {
    if (this.#onRejected !== undefined) {
      let subErr: Error | undefined;
      this.#rejections = this.#core.nc.subscribe(this.#core.subjects.verdicts(this.id, "rejected"), {
        callback: (err, m) => {
          if (err !== null) subErr = err; // a permission denied, the connection closed
          else this.#rejected(m);
        },
      });
      try {
        // The server has the subscription before the open can be rejected,
        // or has refused it.
        await raceAbort(this.#core.nc.flush(), call.signal);
        if (subErr !== undefined) throw subErr;
      } catch (err) {
        this.#stopListening();
        throw new NotPublishedError(
          this.id,
          "(none)",
          InputTypes.sessionOpened,
          this.#core.subjects.events(this.id),
          this.#core.config.stream,
          `subscribing to the session's rejections first: ${call.signal?.aborted ? abortReason(call.signal) : message(err)}`,
          { cause: err },
          false,
        );
      }
    }
    const unit = this.unit;
    try {
      await this.#send(
        InputTypes.sessionOpened,
        newId(),
        {
          unit,
          recovery_floor: { span: o.span, unit },
          ...(o.window !== undefined ? { window: o.window } : {}),
          ...(o.trigger !== undefined ? { trigger: o.trigger } : {}),
        },
        call,
      );
    } catch (err) {
      this.#stopListening();
      throw err;
    }
  }

  #rejected(m: Msg): void {
    const a = verifyVerdict(m, { trustedKeys: this.#core.config.trustedKeys, prefix: this.#core.config.prefix });
    if (!a.ok) {
      this.#unattributed(m.subject, a, m.data);
      return;
    }
    const ev = parseVerdictEvent(m.data);
    if (ev === undefined || ev.type !== VerdictTypes.eventRejected || this.#onRejected === undefined) return;
    let d;
    try {
      d = parseRejected(ev.data);
    } catch {
      return;
    }
    const id = rejects(
      ev,
      d,
      (x) => this.#ours.has(x),
      (m) => {
        for (const [id, mid] of this.#ours) if (mid === m) return id;
        return undefined;
      },
    );
    if (id === undefined) return;
    try {
      this.#onRejected(new RejectedError(this.id, id, d, a.signer));
    } catch {
      // The handler's own failure is its business; the session goes on.
    }
  }

  #remember(id: string): void {
    if (this.#onRejected === undefined) return;
    this.#ours.set(id, msgId(this.#core.config.source, id));
    if (this.#ours.size > REMEMBERED_IDS) {
      const oldest = this.#ours.values().next();
      if (oldest.done !== true) this.#ours.delete(oldest.value);
    }
  }

  #stopListening(): void {
    this.#rejections?.unsubscribe();
    this.#rejections = undefined;
  }

  /** Publishes one event holding the session. */
  #send(type: string, id: string, data: JsonObject, call: CallOptions, after?: () => void): Promise<void> {
    return this.#mutex.run(() => this.#sendLocked(type, id, data, call, after, true));
  }

  /**
   * Publishes, with the session held, first the pending event of an
   * earlier failed call, then this one. A failed publish leaves the event
   * pending (it is not lost and keeps its place) and throws a
   * {@link NotPublishedError}. `after` runs once the event is built, before
   * it is published, to advance the head.
   */
  async #sendLocked(
    type: string,
    id: string,
    data: JsonObject,
    call: CallOptions,
    after: (() => void) | undefined,
    remember: boolean,
  ): Promise<void> {
    if (this.#closed) {
      throw new SessionClosedError(this.id, "open a new session to publish more");
    }
    await this.#flushLocked(call, true);
    const ev = buildEvent(this.#core.config, this.id, type, id, data, this.#core.now());
    after?.();
    if (remember) this.#remember(id);
    try {
      await this.#core.publish(ev, call.signal);
    } catch (err) {
      this.#pending = ev;
      throw err;
    }
  }

  async #flushLocked(call: CallOptions, blocking: boolean): Promise<void> {
    if (this.#pending === undefined) return;
    try {
      await this.#core.publish(this.#pending, call.signal);
    } catch (err) {
      if (blocking && err instanceof NotPublishedError) {
        throw new NotPublishedError(
          err.session,
          err.eventId,
          err.eventType,
          err.subject,
          err.stream,
          `the earlier event is still unpublished, so nothing later is sent: ${err.detail}`,
          { cause: err.cause },
          false,
        );
      }
      throw err;
    }
    this.#pending = undefined;
  }

  /**
   * Publishes again, with the same id, an event whose earlier publish
   * failed. Does nothing when nothing is pending.
   */
  async flush(call: CallOptions = {}): Promise<void> {
    await this.#mutex.run(() => this.#flushLocked(call, false));
    if (this.#closed && this.#pending === undefined) this.#stopListening();
  }

  /**
   * Publishes `io.seamguard.turn.appended` for the turn at the session's
   * head and returns the range it occupies; the head moves past it.
   *
   * On a {@link NotPublishedError} with `kept` true the turn still counts
   * as appended: the session publishes it again, with the same id, before
   * anything else.
   */
  async append(turn: Turn = {}, call: CallOptions = {}): Promise<Range> {
    const size = turn.size === undefined || turn.size === 0 ? 1 : turn.size;
    const problems: string[] = [];
    if (!isOffset(size)) problems.push(`size is ${String(turn.size)}: it must be an integer from 1 to 2^53`);
    if (turn.tokens !== undefined && !isOffset(turn.tokens)) problems.push(`tokens is ${String(turn.tokens)}: it must be an integer from 0 to 2^53`);
    if (turn.role !== undefined && typeof turn.role !== "string") problems.push("role must be a string");
    if (turn.pinned !== undefined && typeof turn.pinned !== "boolean") problems.push("pinned must be a boolean");
    if (turn.content !== undefined) {
      try {
        if (JSON.stringify(turn.content) === undefined) problems.push("content is not a JSON value");
      } catch (err) {
        problems.push(`content cannot be encoded as JSON: ${message(err)}`);
      }
    }
    if (problems.length > 0) {
      throw new ArgumentError(`seamguard: turn of session ${this.id}: ${problems.join("; ")}`);
    }
    return this.#mutex.run(async () => {
      const start = this.#head;
      if (size > MAX_OFFSET - start) {
        throw new ArgumentError(`seamguard: a turn of size ${size} at offset ${start} of session ${this.id} ends beyond 2^53`);
      }
      const r: Range = { start, end: start + size };
      const data: JsonObject = {
        offset: start,
        size,
        ...(turn.role ? { role: turn.role } : {}),
        ...(turn.tokens !== undefined ? { tokens: turn.tokens } : {}),
        ...(turn.content !== undefined ? { content: turn.content } : {}),
        ...(turn.pinned === true ? { pinned: true } : {}),
      };
      await this.#sendLocked(InputTypes.turnAppended, newId(), data, call, () => {
        this.#head = r.end;
      }, true);
      return r;
    });
  }

  /**
   * Reports that budget enforcement removed `range` from the working
   * context: `io.seamguard.context.truncated`. The range must lie within
   * `[0, head)`; this is checked before anything is sent. `stage` names the
   * step that evicted it (such as `budget`).
   */
  async truncated(range: Range, stage?: string, call: CallOptions = {}): Promise<void> {
    await this.#rangeEvent(InputTypes.contextTruncated, range, "truncated range", call, stage ? { stage } : {});
  }

  /**
   * Pins the turns in `range`: `io.seamguard.context.pinned`. seamguard
   * refuses every later compaction that would drop them from the working
   * context (next `carry_pins`) until they are unpinned. The range must lie
   * within `[0, head)`.
   */
  async pin(range: Range, call: CallOptions = {}): Promise<void> {
    await this.#rangeEvent(InputTypes.contextPinned, range, "range to pin", call, {});
  }

  /**
   * Releases the turns in `range`: `io.seamguard.context.unpinned`, once
   * they no longer bind the agent. The range must lie within `[0, head)`.
   */
  async unpin(range: Range, call: CallOptions = {}): Promise<void> {
    await this.#rangeEvent(InputTypes.contextUnpinned, range, "range to unpin", call, {});
  }

  #rangeEvent(type: string, range: Range, what: string, call: CallOptions, extra: JsonObject): Promise<void> {
    return this.#mutex.run(async () => {
      if (range === undefined || range === null || !isOffset(range.start) || !isOffset(range.end) || range.start > range.end || range.end > this.#head) {
        throw new ArgumentError(
          `seamguard: ${what} [${String(range?.start)}, ${String(range?.end)}) of session ${this.id} must lie within [0, ${this.#head}), the turns appended so far`,
        );
      }
      await this.#sendLocked(type, newId(), { range: wireRange(range), ...extra }, call, undefined, true);
    });
  }

  /**
   * Reports that the agent applied the compaction `requestId`:
   * `io.seamguard.compaction.committed`. seamguard records the coverage of
   * that request's latest verdict as the summary's; committing a compaction
   * that was not allowed is recorded all the same and yields a
   * `compaction.violation` verdict.
   */
  async commit(requestId: string, call: CallOptions = {}): Promise<void> {
    if (typeof requestId !== "string" || requestId === "") {
      throw new ArgumentError("seamguard: commit needs the request id of the compaction that was applied");
    }
    await this.#send(InputTypes.compactionCommitted, newId(), { request_id: requestId }, call);
  }

  /**
   * Publishes `io.seamguard.session.closed`. Later calls that publish throw
   * {@link SessionClosedError}. Closing a closed session only publishes
   * what is still pending (the close itself, if its publish failed).
   */
  async close(call: CallOptions = {}): Promise<void> {
    await this.#mutex.run(async () => {
      if (this.#closed) {
        await this.#flushLocked(call, false);
        return;
      }
      await this.#sendLocked(InputTypes.sessionClosed, newId(), {}, call, () => {
        this.#closed = true;
      }, true);
    });
    this.#stopListening();
  }

  /**
   * Asks seamguard whether a compaction is safe and waits for its verdict.
   * An absent or empty `requestId` is filled with a fresh id.
   *
   * It subscribes to the session's verdict subjects before it publishes
   * the request (with a fresh event id), and returns the first verdict
   * whose causationid is that event id and whose request id is the
   * request's. It throws a {@link RejectedError} if seamguard rejected the
   * event, a {@link NoVerdictError} naming the request when the deadline
   * passes (or the signal aborts) first, and a {@link NotPublishedError}
   * when the request could not be stored.
   *
   * A refusal may be retryable (see {@link Session.retry} and
   * {@link Session.compact}). A halted session refuses every compaction
   * until an operator resumes it.
   */
  /** Reports a message that failed verification, and returns it. */
  #unattributed(subject: string, a: Attribution & { ok: false }, data: Uint8Array): Unattributed {
    let claims: Record<string, unknown> | undefined;
    try {
      const v = JSON.parse(new TextDecoder().decode(data)) as unknown;
      if (typeof v === "object" && v !== null && !Array.isArray(v)) claims = v as Record<string, unknown>;
    } catch {
      // not JSON: it claims nothing
    }
    const u: Unattributed = {
      subject,
      reason: a.reason,
      message: a.message,
      ...(a.signer === undefined ? {} : { signer: a.signer }),
      ...(claims === undefined ? {} : { claims }),
    };
    try {
      this.#core.config.onUnattributed?.(u);
    } catch {
      // The handler's own failure is its business; the session goes on.
    }
    return u;
  }

  async requestCompaction(req: CompactionRequest, opts: VerdictOptions = {}): Promise<Verdict> {
    const problems: string[] = [];
    checkRange(req?.summarizerInput, "summarizerInput", problems);
    checkRange(req?.summaryRange, "summaryRange", problems);
    if (!isOffset(req?.tailStart)) problems.push(`tailStart is ${String(req?.tailStart)}: it must be an integer from 0 to 2^53`);
    if (req?.requestId !== undefined && typeof req.requestId !== "string") problems.push("requestId must be a string");
    for (const [name, v] of [["occupancy", req?.occupancy], ["threshold", req?.threshold]] as const) {
      if (v !== undefined && !isOffset(v)) problems.push(`${name} is ${String(v)}: it must be an integer from 0 to 2^53`);
    }
    (req?.carriedPins ?? []).forEach((r, i) => checkRange(r, `carriedPins[${i}]`, problems));
    if (problems.length > 0) {
      throw new ArgumentError(`seamguard: compaction request of session ${this.id}: ${problems.join("; ")}`);
    }
    const timeoutMs = opts.timeoutMs ?? this.#core.config.verdictTimeoutMs;
    if (!Number.isFinite(timeoutMs) || timeoutMs <= 0) {
      throw new ArgumentError(`seamguard: timeoutMs is ${timeoutMs}: it must be a positive number of milliseconds`);
    }
    const sent: SentCompactionRequest = { ...req, requestId: req.requestId || newId() };
    const eventId = newId();
    const signal = withTimeout(opts.signal, timeoutMs);
    const verdictSubject = this.#core.subjects.verdicts(this.id, "*");

    let settle: { resolve: (v: Verdict) => void; reject: (e: Error) => void } | undefined;
    const answer = new Promise<Verdict>((resolve, reject) => {
      settle = { resolve, reject };
    });
    answer.catch(() => undefined); // awaited below, unless the publish fails first
    let sub: Subscription | undefined;
    let subErr: Error | undefined;
    const forged: Unattributed[] = [];
    try {
      await this.#mutex.run(async () => {
        if (this.#closed) {
          throw new SessionClosedError(this.id, "open a new session to compact");
        }
        sub = this.#core.nc.subscribe(verdictSubject, {
          callback: (err, m) => {
            if (err !== null) {
              subErr = err; // a permission denied, the connection closed
              settle?.reject(err);
              return;
            }
            const a = verifyVerdict(m, { trustedKeys: this.#core.config.trustedKeys, prefix: this.#core.config.prefix });
            const ev = parseVerdictEvent(m.data);
            if (!a.ok) {
              // Never an answer: reported, and kept if it claimed to be one.
              const u = this.#unattributed(m.subject, a, m.data);
              if (ev !== undefined && claimsToAnswer(ev, sent, this.#core.config.source, eventId)) forged.push(u);
              return;
            }
            if (ev === undefined) return;
            if (ev.type === VerdictTypes.eventRejected) {
              try {
                const d = parseRejected(ev.data);
                if (rejects(ev, d, ...answering(this.#core.config.source, eventId)) !== undefined) {
                  settle?.reject(new RejectedError(this.id, eventId, d, a.signer, [...forged]));
                }
              } catch {
                // not a rejection we can read
              }
              return;
            }
            const v = toVerdict(ev, sent, eventId, { signer: a.signer, trusted: a.trusted, unattributed: [...forged] });
            if (v !== undefined) settle?.resolve(v);
          },
        });
        try {
          // The server has the subscription before the request can be
          // decided, or has refused it: then nothing is published.
          await raceAbort(this.#core.nc.flush(), signal);
          if (subErr !== undefined) throw subErr;
        } catch (err) {
          throw new NotPublishedError(
            this.id,
            eventId,
            InputTypes.compactionRequested,
            this.#core.subjects.events(this.id),
            this.#core.config.stream,
            `subscribing to the verdicts of session ${this.id} first: ${signal.aborted ? abortReason(signal) : message(err)}`,
            { cause: err },
            false,
          );
        }
        await this.#sendLocked(InputTypes.compactionRequested, eventId, requestData(sent), { signal }, undefined, false);
      });
      try {
        return await raceAbort(answer, signal);
      } catch (err) {
        if (err instanceof RejectedError) throw err;
        const first = forged[0];
        const reason =
          signal.aborted && first !== undefined
            ? `${abortReason(signal)} before it arrived; ${forged.length} message(s) claiming to answer it failed verification, ` +
              `the first on ${first.subject}: ${first.reason}: ${first.message}`
            : signal.aborted
              ? `${abortReason(signal)} before it arrived; is the seamguard processor running? The verdict, once decided, ` +
                `is on ${this.#core.subjects.verdicts(this.id, "<kind>")} and in the verdict stream`
              : `the subscription to ${verdictSubject} failed: ${message(err)}`;
        throw new NoVerdictError(this.id, sent.requestId, eventId, reason, { cause: err }, [...forged]);
      }
    } finally {
      sub?.unsubscribe();
    }
  }

  /**
   * Requests again the compaction a retryable refusal answered (next
   * `retry`), with the same request id and a fresh event id, and waits for
   * its verdict. seamguard has spilled the transcript, so the retry is
   * allowed unless the session changed in between; keep the refusal's
   * spill handle to re-read what the compaction drops. Any other verdict
   * throws {@link NotRetryableError}.
   */
  async retry(refused: Verdict, opts: VerdictOptions = {}): Promise<Verdict> {
    if (!isRetryable(refused)) {
      throw new NotRetryableError('seamguard: verdict is not a retryable refusal: only a refusal with next "retry" can be retried');
    }
    return this.requestCompaction(refused.request, opts);
  }

  /**
   * Requests again the compaction a refusal with next `carry_pins`
   * answered, with the same request id, a fresh event id, and the pinned
   * turns it would drop added to `carriedPins`, and waits for its verdict.
   * The agent must then put those turns back into its new context
   * verbatim, outside the summary. Any other verdict throws
   * {@link NotRetryableError}.
   */
  async carryPins(refused: Verdict, opts: VerdictOptions = {}): Promise<Verdict> {
    if (!mustCarryPins(refused)) {
      throw new NotRetryableError('seamguard: verdict is not a refusal that asks to carry pins: only a refusal with next "carry_pins" does');
    }
    const { pins } = droppedPins(refused);
    return this.requestCompaction({ ...refused.request, carriedPins: [...(refused.request.carriedPins ?? []), ...pins] }, opts);
  }

  /**
   * Requests a compaction and follows the contract's flows until it is
   * allowed or refused for good: a refusal with next `retry` (seamguard
   * spilled the transcript) is retried, and one with next `carry_pins` is
   * requested again with the dropped pinned turns in `carriedPins` (the
   * agent must keep those turns, verbatim, in its new context: the allowed
   * verdict's `request.carriedPins` says which). It sends at most 4
   * requests, all with the same request id, each with its own deadline. It
   * returns the last verdict; its `previous` is the refusal before it, and
   * so on.
   */
  async compact(req: CompactionRequest, opts: VerdictOptions = {}): Promise<Verdict> {
    let v = await this.requestCompaction(req, opts);
    for (let step = 1; step < MAX_COMPACT_STEPS; step++) {
      let next: Verdict;
      if (isRetryable(v)) {
        next = await this.#again(v, () => this.retry(v, opts));
      } else if (mustCarryPins(v)) {
        next = await this.#again(v, () => this.carryPins(v, opts));
      } else {
        return v;
      }
      v = { ...next, previous: v };
    }
    return v;
  }

  async #again(v: RefusedVerdict, fn: () => Promise<Verdict>): Promise<Verdict> {
    try {
      return await fn();
    } catch (err) {
      if (err instanceof Error) {
        const spill = v.data.spill ? `${v.data.spill.bucket}/${v.data.spill.name}` : "none";
        err.message = `requesting compaction ${JSON.stringify(v.request.requestId)} again after its refusal (next ${v.data.next}, spill ${spill}): ${err.message}`;
      }
      throw err;
    }
  }

  /**
   * Reads the transcript that spill `handle` of this session holds, with
   * its whole chain (the handle's spill and the spills before it, oldest
   * first), into `sink`: JSON Lines, one accepted event of the session a
   * line, from its `session.opened` to the compaction request that caused
   * the spill, as `seamguard spill get` writes it. Returns the chain's
   * handles, oldest first.
   *
   * The spills are read through seamguard's recover service with requests
   * on `<prefix>.recover.<session>`: the agent needs no JetStream access.
   * `handle` is usually a refusal's `data.spill` or an allowed verdict's
   * `data.recoveredBy[0]`. Each object's size and SHA-256 digest are
   * checked against its handle, and the newest object's against `handle`.
   *
   * Throws a {@link NotRecoveredError}: a {@link SpillNotFoundError},
   * {@link SpillForbiddenError} or other {@link RecoverServiceError} for
   * the service's refusals, a {@link DigestMismatchError}, a
   * {@link BrokenChainError}, or a plain one when no processor answered in
   * time or the signal aborted. Bytes are given to the sink as they
   * arrive, and each object's digest is checked at its end: after an
   * error, discard what the sink received.
   */
  recover(handle: SpillHandle, sink: ChunkSink, opts: RecoverOptions = {}): Promise<SpillHandle[]> {
    checkRecover(this.id, handle, sink);
    return new Recovery(this.#core, this.id, opts.signal).run(handle, sink);
  }

  /** {@link Session.recover} into one buffer. */
  recoverTranscript(handle: SpillHandle, opts: RecoverOptions = {}): Promise<RecoveredTranscript> {
    return recoverToBuffer((sink) => this.recover(handle, sink, opts));
  }
}

/** The wire data of a compaction request. */
function requestData(r: SentCompactionRequest): JsonObject {
  return {
    request_id: r.requestId,
    summarizer_input: wireRange(r.summarizerInput),
    summary_range: wireRange(r.summaryRange),
    tail_start: r.tailStart,
    carries_prior_summary: r.carriesPriorSummary === true,
    ...(r.occupancy !== undefined ? { occupancy: r.occupancy } : {}),
    ...(r.threshold !== undefined ? { threshold: r.threshold } : {}),
    ...(r.carriedPins !== undefined && r.carriedPins.length > 0 ? { carried_pins: r.carriedPins.map(wireRange) } : {}),
  };
}
