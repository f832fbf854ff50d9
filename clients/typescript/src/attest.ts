/**
 * Attributable verdicts: the processor signs the bytes of every verdict
 * with its NKey (ed25519), in the headers `Seamguard-Signer` (the public
 * NKey) and `Seamguard-Signature` (the signature, unpadded URL-safe
 * base64). {@link verifyVerdict} checks a message read from a verdict
 * subject against the public keys the caller trusts, with node:crypto
 * alone; NKeys are decoded here (base32, a prefix byte, a CRC-16).
 *
 * @module
 */

import { createPublicKey, verify, type KeyObject } from "node:crypto";

/** Header names of a signed verdict. */
export const SignatureHeaders = {
  signer: "Seamguard-Signer",
  signature: "Seamguard-Signature",
} as const;

/**
 * Why a message is not attributable: `unsigned` (a header is missing),
 * `bad_signature` (the signer is no public NKey, the signature does not
 * decode or does not match the body), `untrusted_signer` (a good
 * signature by a key not trusted), `misrouted` (a verdict of another
 * session or kind than its subject names), `malformed` (signed, but not a
 * verdict). The same reasons as the Go tools give.
 */
export type UnattributedReason = "unsigned" | "bad_signature" | "untrusted_signer" | "misrouted" | "malformed";

/** The outcome of {@link verifyVerdict}. */
export type Attribution =
  | { readonly ok: true; readonly signer: string; readonly trusted: boolean }
  | { readonly ok: false; readonly reason: UnattributedReason; readonly message: string; readonly signer?: string };

/** A message read from NATS, as far as verification needs it. */
export interface SignedMessage {
  readonly subject?: string;
  /** Header values by name (names are matched case-insensitively). */
  readonly headers?: Iterable<readonly [string, readonly string[]]>;
  readonly data: Uint8Array;
}

const B32 = "ABCDEFGHIJKLMNOPQRSTUVWXYZ234567";

function base32Decode(s: string): Uint8Array | undefined {
  const out: number[] = [];
  let bits = 0;
  let value = 0;
  for (const ch of s) {
    const i = B32.indexOf(ch);
    if (i < 0) return undefined;
    value = (value << 5) | i;
    bits += 5;
    if (bits >= 8) {
      out.push((value >>> (bits - 8)) & 0xff);
      bits -= 8;
    }
  }
  return Uint8Array.from(out);
}

/** CRC-16/XMODEM (polynomial 0x1021, initial 0), as NKeys use. */
function crc16(b: Uint8Array): number {
  let crc = 0;
  for (const byte of b) {
    crc ^= byte << 8;
    for (let i = 0; i < 8; i++) {
      crc = crc & 0x8000 ? ((crc << 1) ^ 0x1021) & 0xffff : (crc << 1) & 0xffff;
    }
  }
  return crc;
}

// Prefix bytes of ed25519 public NKeys: server N, user U, account A,
// operator O, cluster C.
const PUBLIC_PREFIXES = new Set([13 << 3, 20 << 3, 0, 14 << 3, 2 << 3]);

/**
 * Decodes a public NKey (56 characters such as `NB3P…`) to its 32-byte
 * ed25519 key, or throws an Error saying what is wrong with it.
 */
export function decodePublicNKey(key: string): Uint8Array {
  if (typeof key !== "string" || key.length !== 56) {
    throw new Error(`a public NKey has 56 characters, this has ${typeof key === "string" ? key.length : 0}`);
  }
  if (key.startsWith("S")) throw new Error("this is a seed (a secret), not a public key");
  const raw = base32Decode(key);
  if (raw === undefined || raw.length !== 35) throw new Error("not base32");
  const prefix = raw[0] as number;
  if (!PUBLIC_PREFIXES.has(prefix)) throw new Error("not an ed25519 public NKey (N…, U…, A…, O… or C…)");
  const want = (raw[33] as number) | ((raw[34] as number) << 8);
  if (crc16(raw.subarray(0, 33)) !== want) throw new Error("its checksum does not match: check that it was copied whole");
  return raw.slice(1, 33);
}

const keyCache = new Map<string, KeyObject>();

function publicKey(key: string): KeyObject {
  let k = keyCache.get(key);
  if (k === undefined) {
    const raw = decodePublicNKey(key);
    k = createPublicKey({ key: { kty: "OKP", crv: "Ed25519", x: Buffer.from(raw).toString("base64url") }, format: "jwk" });
    if (keyCache.size < 64) keyCache.set(key, k);
  }
  return k;
}

/**
 * Reads trusted keys: each element may hold several, separated by commas
 * or white space. Returns the keys and a list of problems (empty when all
 * are public NKeys).
 */
export function parseTrustedKeys(list: readonly string[] | undefined): { keys: string[]; problems: string[] } {
  const keys: string[] = [];
  const problems: string[] = [];
  for (const item of list ?? []) {
    for (const k of String(item).split(/[\s,]+/).filter((x) => x !== "")) {
      try {
        decodePublicNKey(k);
        if (!keys.includes(k)) keys.push(k);
      } catch (err) {
        const shown = k.startsWith("S") ? `${k.slice(0, 2)}…` : JSON.stringify(k.slice(0, 60));
        problems.push(`trusted key ${shown}: ${(err as Error).message}`);
      }
    }
  }
  return { keys, problems };
}

function header(m: SignedMessage, name: string): string[] {
  const out: string[] = [];
  const want = name.toLowerCase();
  for (const [k, vals] of m.headers ?? []) {
    if (k.toLowerCase() === want) out.push(...vals);
  }
  return out;
}

/** Options of {@link verifyVerdict}. */
export interface VerifyOptions {
  /** The trusted public keys; empty: any signer's good signature passes, `trusted` false. */
  readonly trustedKeys?: readonly string[];
  /** The deployment's subject prefix; default `seamguard`. */
  readonly prefix?: string;
}

/**
 * Checks a message read from a verdict subject: its signature headers,
 * the signature over its exact body, the signer against the trusted keys,
 * and (when the message has a subject) that the verdict's session and type
 * match the subject `<prefix>.verdicts.<session>.<kind>` it arrived on.
 */
export function verifyVerdict(m: SignedMessage, opts: VerifyOptions = {}): Attribution {
  const signers = header(m, SignatureHeaders.signer);
  const sigs = header(m, SignatureHeaders.signature);
  if (signers.length === 0 || sigs.length === 0) {
    return {
      ok: false,
      reason: "unsigned",
      message: `the message lacks the ${signers.length === 0 ? SignatureHeaders.signer : SignatureHeaders.signature} header: no seamguard processor published it`,
    };
  }
  if (signers.length > 1 || sigs.length > 1) {
    return { ok: false, reason: "bad_signature", message: "a signed verdict has one signer and one signature header" };
  }
  const signer = signers[0] as string;
  let key: KeyObject;
  try {
    key = publicKey(signer);
  } catch (err) {
    return { ok: false, reason: "bad_signature", message: `the signer is not an ed25519 public NKey: ${(err as Error).message}` };
  }
  const sig = sigs[0] as string;
  const raw = /^[A-Za-z0-9_-]{86}$/.test(sig) ? Buffer.from(sig, "base64url") : undefined;
  if (raw === undefined || raw.length !== 64 || !verify(null, m.data, key, raw)) {
    return {
      ok: false,
      reason: "bad_signature",
      signer,
      message: `the signature does not match the body for signer ${signer}: the body was changed after signing, or the signature comes from another message`,
    };
  }
  const trusted = parseTrustedKeys(opts.trustedKeys).keys;
  if (trusted.length > 0 && !trusted.includes(signer)) {
    return {
      ok: false,
      reason: "untrusted_signer",
      signer,
      message: `signed by ${signer}, which is none of the ${trusted.length} trusted key(s)`,
    };
  }
  let ev: Record<string, unknown>;
  try {
    const parsed = JSON.parse(new TextDecoder().decode(m.data)) as unknown;
    if (typeof parsed !== "object" || parsed === null || Array.isArray(parsed)) throw new Error("not an object");
    ev = parsed as Record<string, unknown>;
    if (typeof ev["type"] !== "string" || !ev["type"].startsWith("io.seamguard.")) throw new Error("no seamguard type");
  } catch (err) {
    return { ok: false, reason: "malformed", signer, message: `the signed body is not a seamguard verdict: ${(err as Error).message}` };
  }
  if (m.subject !== undefined && m.subject !== "") {
    const prefix = (opts.prefix || "seamguard") + ".verdicts.";
    const rest = m.subject.startsWith(prefix) ? m.subject.slice(prefix.length).split(".") : [];
    const session = typeof ev["subject"] === "string" && ev["subject"] !== "" ? ev["subject"] : "_invalid";
    const kind = kindOf(ev["type"] as string);
    if (rest.length !== 2) {
      return { ok: false, reason: "misrouted", signer, message: `it arrived on ${JSON.stringify(m.subject)}, which is not a verdict subject` };
    }
    if (rest[0] !== session) {
      return {
        ok: false,
        reason: "misrouted",
        signer,
        message: `the verdict is about session ${JSON.stringify(session)} but arrived on ${JSON.stringify(m.subject)}: a genuine verdict copied onto another session's subject`,
      };
    }
    if (rest[1] !== kind) {
      return {
        ok: false,
        reason: "misrouted",
        signer,
        message: `the verdict is of type ${ev["type"] as string} but arrived on ${JSON.stringify(m.subject)}, a subject of kind ${JSON.stringify(rest[1])}`,
      };
    }
  }
  return { ok: true, signer, trusted: trusted.length > 0 };
}

function kindOf(type: string): string {
  switch (type) {
    case "io.seamguard.compaction.allowed":
      return "allowed";
    case "io.seamguard.compaction.refused":
      return "refused";
    case "io.seamguard.transcript.spilled":
      return "spilled";
    case "io.seamguard.session.halted":
      return "halted";
    case "io.seamguard.event.rejected":
      return "rejected";
    case "io.seamguard.compaction.violation":
      return "violation";
  }
  return "";
}
