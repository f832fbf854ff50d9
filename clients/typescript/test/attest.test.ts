// Attributable verdicts: the NKey decoding and signature checks of
// verifyVerdict on bodies signed here, and, against a real `seamguard
// serve`, a genuine verdict verified against the key serve logged while
// forgeries published straight on the session's verdict subject
// (unsigned, signed by another key, a genuine signature over a changed
// body, a verdict signed for another session) are reported and never
// taken for the answer.

import assert from "node:assert/strict";
import { generateKeyPairSync, sign, type KeyObject } from "node:crypto";
import { after, before, describe, test } from "node:test";

import { StorageType, jetstreamManager } from "@nats-io/jetstream";
import { headers, type NatsConnection } from "@nats-io/transport-node";

import { NoVerdictError, SeamguardClient, decodePublicNKey, parseTrustedKeys, verifyVerdict, type Unattributed } from "../src/index.js";
import { eventually, natsConnect, startServe, type Serve } from "./harness.js";

const B32 = "ABCDEFGHIJKLMNOPQRSTUVWXYZ234567";

function base32(b: Uint8Array): string {
  let out = "";
  let bits = 0;
  let value = 0;
  for (const byte of b) {
    value = (value << 8) | byte;
    bits += 8;
    while (bits >= 5) {
      out += B32[(value >>> (bits - 5)) & 31];
      bits -= 5;
    }
  }
  if (bits > 0) out += B32[(value << (5 - bits)) & 31];
  return out;
}

function crc16(b: Uint8Array): number {
  let crc = 0;
  for (const byte of b) {
    crc ^= byte << 8;
    for (let i = 0; i < 8; i++) crc = crc & 0x8000 ? ((crc << 1) ^ 0x1021) & 0xffff : (crc << 1) & 0xffff;
  }
  return crc;
}

/** An ed25519 key pair and its public NKey (server type, N…), made here. */
function newKey(): { priv: KeyObject; nkey: string } {
  const { publicKey, privateKey } = generateKeyPairSync("ed25519");
  const x = Buffer.from(publicKey.export({ format: "jwk" }).x as string, "base64url");
  const raw = new Uint8Array(35);
  raw[0] = 13 << 3;
  raw.set(x, 1);
  const crc = crc16(raw.subarray(0, 33));
  raw[33] = crc & 0xff;
  raw[34] = crc >> 8;
  return { priv: privateKey, nkey: base32(raw) };
}

function signed(key: { priv: KeyObject; nkey: string }, body: Uint8Array): [string, string[]][] {
  return [
    ["Seamguard-Signer", [key.nkey]],
    ["Seamguard-Signature", [sign(null, body, key.priv).toString("base64url")]],
  ];
}

const enc = new TextEncoder();

function allowedBody(session: string, causation = "e1", requestId = "r1", head = 10): Uint8Array {
  return enc.encode(
    JSON.stringify({
      specversion: "1.0",
      id: "sg-test",
      source: "urn:test",
      type: "io.seamguard.compaction.allowed",
      subject: session,
      datacontenttype: "application/json",
      causationid: causation,
      data: { request_id: requestId, head, summary_coverage: [], tail_start: 0, recovered_by: [], cured: [] },
    }),
  );
}

describe("attest", () => {
  test("public NKeys decode, and bad ones are refused", () => {
    const k = newKey();
    assert.equal(decodePublicNKey(k.nkey).length, 32);
    const last = k.nkey.at(-1) === "A" ? "B" : "A";
    assert.throws(() => decodePublicNKey(k.nkey.slice(0, 55) + last), /checksum/);
    assert.throws(() => decodePublicNKey(k.nkey.slice(0, 50)), /56 characters/);
    assert.throws(() => decodePublicNKey("S" + k.nkey.slice(1)), /seed/);
    const { keys, problems } = parseTrustedKeys([`${k.nkey}, ${k.nkey}`, "nonsense"]);
    assert.deepEqual(keys, [k.nkey]);
    assert.equal(problems.length, 1);
    assert.throws(() => new SeamguardClient({} as NatsConnection, { trustedKeys: ["SNOTAKEY"] }), /trusted key "SN…"|trusted key SN…/);
  });

  test("verifyVerdict checks headers, signature, trust and routing", () => {
    const proc = newKey();
    const other = newKey();
    const body = allowedBody("sess-a");
    const subject = "seamguard.verdicts.sess-a.allowed";
    const trust = { trustedKeys: [proc.nkey] };
    const changed = allowedBody("sess-a", "e1", "r1", 11);
    const cases: [string, Parameters<typeof verifyVerdict>[0], object, string | undefined][] = [
      ["genuine", { subject, headers: signed(proc, body), data: body }, trust, undefined],
      ["genuine, no trusted keys", { subject, headers: signed(proc, body), data: body }, {}, undefined],
      ["unsigned", { subject, data: body }, trust, "unsigned"],
      ["another key", { subject, headers: signed(other, body), data: body }, trust, "untrusted_signer"],
      ["body changed", { subject, headers: signed(proc, body), data: changed }, trust, "bad_signature"],
      ["body changed, no trusted keys", { subject, headers: signed(proc, body), data: changed }, {}, "bad_signature"],
      ["another session's subject", { subject: "seamguard.verdicts.sess-b.allowed", headers: signed(proc, body), data: body }, trust, "misrouted"],
      ["another kind's subject", { subject: "seamguard.verdicts.sess-a.refused", headers: signed(proc, body), data: body }, trust, "misrouted"],
    ];
    for (const [name, m, opts, want] of cases) {
      const a = verifyVerdict(m, opts);
      if (want === undefined) {
        assert.ok(a.ok, `${name}: ${JSON.stringify(a)}`);
        assert.equal(a.signer, proc.nkey);
        assert.equal(a.trusted, (opts as { trustedKeys?: string[] }).trustedKeys !== undefined, name);
      } else {
        assert.ok(!a.ok, `${name}: verified`);
        assert.equal(a.reason, want, `${name}: ${a.message}`);
      }
    }
  });

  describe("against seamguard serve", () => {
    let serve: Serve;
    let nc: NatsConnection;
    let forger: NatsConnection;
    before(async () => {
      serve = await startServe();
      nc = await natsConnect(serve.url);
      forger = await natsConnect(serve.url);
    });
    after(async () => {
      await forger?.close();
      await nc?.close();
      await serve?.stop();
    });

    test("a genuine verdict is trusted; forged ones are reported, never answers", async () => {
      const other = newKey();
      // A verdict the processor really signed, of another session, to copy.
      const plain = new SeamguardClient(nc, { trustedKeys: [serve.signingKey] });
      const donor = await plain.open({ id: "donor", span: 2 });
      for (let i = 0; i < 4; i++) await donor.append({ content: "x" });
      let copied: { data: Uint8Array; headers: [string, string[]][] } | undefined;
      const copySub = forger.subscribe("seamguard.verdicts.donor.allowed", {
        callback: (_err, m) => {
          copied = { data: m.data, headers: [...(m.headers ?? [])] };
        },
      });
      await forger.flush();
      const dv = await donor.requestCompaction({ summarizerInput: { start: 0, end: 4 }, summaryRange: { start: 0, end: 2 }, tailStart: 2 });
      assert.ok(dv.trusted);
      assert.equal(dv.signer, serve.signingKey);
      const genuineCopy = await eventually(() => copied, 10_000, "the donor's verdict");
      copySub.unsubscribe();

      // Session "forged" lives under prefix "lone", whose events stream no
      // processor reads: only the forger answers its requests, on the
      // verdict subjects, as soon as it sees them.
      const jsm = await jetstreamManager(nc);
      await jsm.streams.add({ name: "LONE_EVENTS", subjects: ["lone.events.>"], storage: StorageType.Memory });
      const forged = (body: Uint8Array, hs: [string, string[]][]): void => {
        const h = headers();
        for (const [k, vals] of hs) for (const v of vals) h.append(k, v);
        forger.publish("lone.verdicts.forged.allowed", body, { headers: h });
      };
      const processorHeaders = genuineCopy.headers.filter(([k]) => k.startsWith("Seamguard-"));
      const sub = forger.subscribe("lone.events.forged", {
        callback: (_err, m) => {
          if (m.headers?.get("ce-type") !== "io.seamguard.compaction.requested") return;
          const id = m.headers?.get("ce-id") ?? "";
          const req = JSON.parse(new TextDecoder().decode(m.data)) as { request_id: string };
          const body = allowedBody("forged", id, req.request_id, 99);
          forged(body, []);
          forged(body, signed(other, body));
          // The processor's signature of the donor's verdict over another body.
          forged(allowedBody("forged", id, req.request_id, 98), processorHeaders);
          forged(genuineCopy.data, processorHeaders);
        },
      });
      await forger.flush();
      const request = { requestId: "c1", summarizerInput: { start: 0, end: 4 }, summaryRange: { start: 0, end: 2 }, tailStart: 2 };

      const reported: Unattributed[] = [];
      const client = new SeamguardClient(nc, { prefix: "lone", trustedKeys: [serve.signingKey], onUnattributed: (u) => reported.push(u) });
      const s = await client.open({ id: "forged", span: 2 });
      for (let i = 0; i < 4; i++) await s.append({ content: "x" });
      await assert.rejects(s.requestCompaction(request, { timeoutMs: 3000 }), (err: unknown) => {
        assert.ok(err instanceof NoVerdictError, String(err));
        assert.match(err.message, /3 message\(s\) claiming to answer it failed verification, the first on lone\.verdicts\.forged\.allowed: unsigned/);
        assert.deepEqual(
          err.unattributed.map((u) => u.reason),
          ["unsigned", "untrusted_signer", "bad_signature"],
        );
        return true;
      });
      assert.deepEqual(
        reported.map((u) => u.reason),
        ["unsigned", "untrusted_signer", "bad_signature", "misrouted"],
      );
      for (const u of reported) assert.equal(u.subject, "lone.verdicts.forged.allowed");
      assert.equal((reported[3]?.claims as { subject?: string } | undefined)?.subject, "donor");

      // Without trusted keys, another key's good signature passes, and the
      // verdict says it is not trusted.
      const open = new SeamguardClient(nc, { prefix: "lone" });
      const s2 = await open.open({ id: "forged", span: 2, head: 4 });
      const v = await s2.requestCompaction({ ...request, requestId: "c2" }, { timeoutMs: 10_000 });
      sub.unsubscribe();
      assert.equal(v.trusted, false);
      assert.equal(v.signer, other.nkey);
      assert.deepEqual(
        v.unattributed.map((u) => u.reason),
        ["unsigned"],
      );
    });
  });
});
