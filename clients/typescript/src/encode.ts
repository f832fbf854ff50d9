/**
 * Building an input event as a CloudEvent on a session's events subject,
 * in binary or structured content mode (docs/contract.md, The envelope). Not part
 * of the package's public API.
 *
 * @module
 */

import { createHash } from "node:crypto";

import { headers, type MsgHdrs } from "@nats-io/transport-node";

import type { ResolvedConfig } from "./config.js";
import { subjects } from "./config.js";
import type { JsonObject } from "./types.js";

/** `Content-Type` of binary-mode data. */
export const CONTENT_TYPE_JSON = "application/json";
/** `Content-Type` of a structured-mode event. */
export const CONTENT_TYPE_CLOUDEVENTS_JSON = "application/cloudevents+json";

/**
 * One event of a session, built once and published as often as it takes:
 * every attempt sends the same id, headers and bytes.
 */
export interface OutEvent {
  readonly id: string;
  /** Its `Nats-Msg-Id`: {@link msgId} of the source and id. */
  readonly msgId: string;
  readonly type: string;
  readonly session: string;
  readonly subject: string;
  readonly headers: MsgHdrs;
  readonly body: Uint8Array;
  /**
   * An attempt was stored, or went out and no answer came back: a later
   * duplicate ack is this event's own.
   */
  mayBeStored: boolean;
}

/** Starts every message id {@link msgId} derives; names the derivation. */
export const MSG_ID_PREFIX = "ce1-";

/**
 * The `Nats-Msg-Id` of the event (`source`, `id`), the same as the Go
 * `events.MsgID`: `ce1-` and the lower-case hex SHA-256 of the two as
 * netstrings, `len(source) ":" source "," len(id) ":" id ","`, lengths in
 * UTF-8 bytes, in decimal. CloudEvents makes an event unique by source and
 * id together; so does this, so another agent's event with the same id is
 * not dropped by the events stream's dedupe.
 */
export function msgId(source: string, id: string): string {
  const s = encoder.encode(source);
  const i = encoder.encode(id);
  const h = createHash("sha256");
  h.update(`${s.length}:`).update(s).update(`,${i.length}:`).update(i).update(",");
  return MSG_ID_PREFIX + h.digest("hex");
}

const encoder = new TextEncoder();
const HEX = "0123456789ABCDEF";

/**
 * Encodes what the CloudEvents NATS binding's draft asks to encode in a
 * header value: space, `"`, `%` and every byte of the value's UTF-8 outside
 * printable ASCII.
 */
export function percentEncode(s: string): string {
  const bytes = encoder.encode(s);
  let out = "";
  for (const b of bytes) {
    if (b > 0x20 && b < 0x7f && b !== 0x22 && b !== 0x25) {
      out += String.fromCharCode(b);
    } else {
      out += "%" + HEX[b >> 4] + HEX[b & 15];
    }
  }
  return out;
}

/**
 * Builds the input event `type` with `data` for `session` under `id`, as
 * `config` asks (prefix, source, content mode). `now` stamps its time.
 */
export function buildEvent(
  config: ResolvedConfig,
  session: string,
  type: string,
  id: string,
  data: JsonObject,
  now: Date = new Date(),
): OutEvent {
  const subject = subjects(config.prefix).events(session);
  const time = now.toISOString();
  const h = headers();
  let body: Uint8Array;
  if (config.structured) {
    h.set("Content-Type", CONTENT_TYPE_CLOUDEVENTS_JSON);
    body = encoder.encode(
      JSON.stringify({
        specversion: "1.0",
        id,
        source: config.source,
        type,
        subject: session,
        time,
        datacontenttype: CONTENT_TYPE_JSON,
        data,
      }),
    );
  } else {
    // Header names as the NATS protocol binding writes them, lower case;
    // values percent-encoded as its draft asks.
    const attrs: [string, string][] = [
      ["ce-specversion", "1.0"],
      ["ce-id", id],
      ["ce-source", config.source],
      ["ce-type", type],
      ["ce-subject", session],
      ["ce-time", time],
    ];
    for (const [name, value] of attrs) {
      h.set(name, percentEncode(value));
    }
    h.set("Content-Type", CONTENT_TYPE_JSON);
    body = encoder.encode(JSON.stringify(data));
  }
  return { id, msgId: msgId(config.source, id), type, session, subject, headers: h, body, mayBeStored: false };
}
