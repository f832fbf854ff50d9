/**
 * What a client's sessions share: the connection, the configuration, and
 * the publish of one event with JetStream acks and retries. Not part of
 * the public API.
 *
 * @module
 */

import { jetstream, type JetStreamClient, type PubAck } from "@nats-io/jetstream";
import { NoRespondersError, RequestError, TimeoutError, nuid, type NatsConnection } from "@nats-io/transport-node";

import { subjects, type ResolvedConfig, type Subjects } from "./config.js";
import type { OutEvent } from "./encode.js";
import { NotPublishedError } from "./errors.js";
import { abortReason, message, raceAbort, sleep } from "./util.js";

/** A fresh event id: a NUID, 22 characters unique across processes without coordination. */
export function newId(): string {
  return nuid.next();
}

/** Reports whether another attempt of a publish or request may succeed. */
export function transient(err: unknown): boolean {
  let e: unknown = err;
  for (let depth = 0; e instanceof Error && depth < 8; depth++, e = e.cause) {
    if (e instanceof TimeoutError || e instanceof NoRespondersError) return true;
    if (e instanceof RequestError && e.isNoResponders()) return true;
  }
  return false;
}

/** Reports whether a publish surely never reached a stream (no responders). */
function refusedOrUnsent(err: unknown): boolean {
  let e: unknown = err;
  for (let depth = 0; e instanceof Error && depth < 8; depth++, e = e.cause) {
    if (e instanceof NoRespondersError) return true;
    if (e instanceof RequestError && e.isNoResponders()) return true;
  }
  return false;
}

/** A client's connection, configuration and publish. @internal */
export class Core {
  readonly nc: NatsConnection;
  readonly js: JetStreamClient;
  readonly config: ResolvedConfig;
  readonly subjects: Subjects;
  now: () => Date = () => new Date();

  constructor(nc: NatsConnection, config: ResolvedConfig) {
    this.nc = nc;
    this.js = jetstream(nc);
    this.config = config;
    this.subjects = subjects(config.prefix);
  }

  /**
   * Stores `ev` in the events stream: up to `publishAttempts` attempts,
   * each waiting `ackTimeoutMs` for the JetStream ack, all with
   * `Nats-Msg-Id` = {@link msgId}(source, id), so an attempt whose ack was
   * lost is dropped by the stream's dedupe window instead of stored twice.
   * Errors the next attempt cannot cure (a stream that refuses the message)
   * end it at once. Throws a {@link NotPublishedError}.
   *
   * A duplicate ack counts as stored only when an earlier attempt of the
   * event was stored or went unanswered. On a first attempt it means the
   * stream holds another message under the message id (ids are fresh
   * NUIDs): the client cannot read the stream to compare, and throws a
   * {@link NotPublishedError} whose `msgIdTaken` is true.
   */
  async publish(ev: OutEvent, signal: AbortSignal | undefined): Promise<PubAck> {
    let last: unknown;
    const fail = (detail: string, cause: unknown): NotPublishedError =>
      new NotPublishedError(ev.session, ev.id, ev.type, ev.subject, this.config.stream, detail, { cause });
    for (let attempt = 0; attempt < this.config.publishAttempts; attempt++) {
      if (attempt > 0) {
        try {
          await sleep(Math.min(attempt, 5) * 100, signal);
        } catch (err) {
          throw fail(`${message(last)}; then ${signal ? abortReason(signal) : message(err)}`, last);
        }
      }
      let ack: PubAck;
      try {
        ack = await raceAbort(
          this.js.publish(ev.subject, ev.body, {
            msgID: ev.msgId,
            expect: { streamName: this.config.stream },
            headers: ev.headers,
            timeout: this.config.ackTimeoutMs,
            retries: 1,
          }),
          signal,
        );
      } catch (err) {
        last = err;
        if (!refusedOrUnsent(err)) ev.mayBeStored = true; // it may have reached the stream
        if (signal?.aborted) {
          throw fail(abortReason(signal), err);
        }
        if (!transient(err)) {
          throw fail(message(err), err);
        }
        continue;
      }
      if (ack.duplicate && !ev.mayBeStored) {
        const err = fail(
          `the events stream holds another message under this event's message id (${ev.msgId}, stream sequence ${ack.seq}), and this event was never stored before: another publisher set the same Nats-Msg-Id; the session sends the event again once the stream's dedupe window has passed`,
          undefined,
        );
        err.msgIdTaken = true;
        throw err;
      }
      ev.mayBeStored = true;
      return ack;
    }
    throw fail(`${this.config.publishAttempts} attempt(s) failed, the last: ${message(last)}`, last);
  }
}
