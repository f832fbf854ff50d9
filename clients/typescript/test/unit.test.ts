// Tests that need no server: percent-encoding, digests, configuration, ranges.

import assert from "node:assert/strict";
import { createHash } from "node:crypto";
import { readFileSync } from "node:fs";
import { join } from "node:path";
import { test } from "node:test";

import { repoRoot } from "./harness.js";
import {
  ArgumentError,
  MSG_ID_PREFIX,
  SeamguardClient,
  decodeDigest,
  formatRange,
  msgId,
  percentEncode,
  resolveConfig,
  sameDigest,
  streamName,
  validateConfig,
  validateSessionOptions,
} from "../src/index.js";
import type { NatsConnection } from "@nats-io/transport-node";

test("msgId derives the same Nats-Msg-Id as the Go events.MsgID (events/testdata/msgid.json)", () => {
  const golden = JSON.parse(readFileSync(join(repoRoot, "events", "testdata", "msgid.json"), "utf8")) as { source: string; id: string; msgid: string }[];
  assert.ok(golden.length > 0);
  for (const c of golden) {
    assert.equal(msgId(c.source, c.id), c.msgid, `source ${JSON.stringify(c.source)} id ${JSON.stringify(c.id)}`);
  }
  assert.notEqual(msgId("a:b", "c"), msgId("a", "b:c"));
  assert.ok(msgId("urn:agent:a", "1").startsWith(MSG_ID_PREFIX));
});

test("percentEncode encodes space, quote, percent and every byte outside printable ASCII", () => {
  const cases: [string, string][] = [
    ["", ""],
    ["urn:agent:demo/worker-1", "urn:agent:demo/worker-1"],
    ["a b", "a%20b"],
    ['"100%"', "%22100%25%22"],
    ["ë", "%C3%AB"],
    ["tab\there\x7f", "tab%09here%7F"],
    ["😀", "%F0%9F%98%80"],
  ];
  for (const [input, want] of cases) {
    assert.equal(percentEncode(input), want, JSON.stringify(input));
    assert.equal(decodeURIComponent(percentEncode(input)), input, "decodes back");
  }
});

test("digests are compared as sums, padded or not", () => {
  const sum = createHash("sha256").update("hello").digest();
  const padded = "SHA-256=" + sum.toString("base64url") + "=";
  const raw = "SHA-256=" + sum.toString("base64url");
  assert.deepEqual(Buffer.from(decodeDigest(padded) ?? []), sum);
  assert.ok(sameDigest(padded, raw));
  assert.ok(sameDigest("sha-256=" + sum.toString("base64url"), raw), "the algorithm's case does not matter");
  assert.ok(!sameDigest(raw, "SHA-256=" + createHash("sha256").update("other").digest("base64url")));
  for (const bad of ["", "SHA-256", "MD5=" + sum.toString("base64url"), "SHA-256=" + sum.toString("base64"), "SHA-256=AAAA", "SHA-256=" + "!".repeat(43)]) {
    assert.equal(decodeDigest(bad), undefined, bad);
    assert.ok(!sameDigest(bad, raw), bad);
  }
});

test("configuration: defaults, every problem at once, stream names", () => {
  assert.deepEqual(resolveConfig({}), {
    prefix: "seamguard",
    stream: "SEAMGUARD_EVENTS",
    source: "urn:seamguard:client",
    structured: false,
    ackTimeoutMs: 5000,
    publishAttempts: 5,
    verdictTimeoutMs: 30000,
    trustedKeys: [],
  });
  assert.equal(resolveConfig({ prefix: "acme.guard-x" }).stream, "ACME_GUARD_X_EVENTS");
  assert.equal(streamName(""), "SEAMGUARD_EVENTS");
  assert.equal(streamName("acme.guard-x"), "ACME_GUARD_X_EVENTS");
  assert.deepEqual(validateConfig({ prefix: "acme.guard", stream: "ACME_GUARD_EVENTS", source: "urn:agent:x", ackTimeoutMs: 1000, publishAttempts: 1 }), []);

  const problems = validateConfig({ prefix: "a..b", stream: "X.Y", source: "urn:\n", ackTimeoutMs: -1, publishAttempts: -2 });
  assert.equal(problems.length, 5, problems.join("\n"));
  const fake = {} as NatsConnection;
  assert.throws(
    () => new SeamguardClient(fake, { prefix: "a..b", stream: "X.Y", source: "urn:\n", ackTimeoutMs: -1, publishAttempts: 1.5 }),
    (err: unknown) => {
      assert.ok(err instanceof ArgumentError);
      assert.equal(err.code, "invalid_argument");
      for (const want of ["prefix", "stream", "source", "ackTimeoutMs", "publishAttempts"]) assert.match(err.message, new RegExp(want));
      return true;
    },
  );
  assert.throws(() => new SeamguardClient(undefined as unknown as NatsConnection), ArgumentError);
});

test("session options: every problem at once", () => {
  assert.deepEqual(validateSessionOptions({ id: "s-1", span: 4 }), []);
  const problems = validateSessionOptions({ id: "bad.id", span: 0, unit: "pages" as "turns", head: -1 });
  assert.equal(problems.length, 4, problems.join("\n"));
  assert.match(problems.join("\n"), /"bad\.id"/);
  assert.match(problems.join("\n"), /"pages"/);
  assert.match(problems.join("\n"), /span is 0/);
  assert.match(problems.join("\n"), /head is -1/);
});

test("formatRange writes a half-open interval, as the Go events.Range.String", () => {
  assert.equal(formatRange({ start: 0, end: 5 }), "[0, 5)");
  assert.equal(formatRange({ start: 0, end: 0 }), "[0, 0)");
  assert.equal(formatRange({ start: 2 ** 53, end: 2 ** 53 }), "[9007199254740992, 9007199254740992)");
});
