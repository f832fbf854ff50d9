// The seed story against a real `seamguard serve`, in both content modes:
// refused with coverage_hole [0, 8), spilled, allowed on retry; the spill
// recovered through the processor's recover service and its digest
// checked; the pinned story's carry_pins flow.

import assert from "node:assert/strict";
import { createHash } from "node:crypto";
import { readFileSync } from "node:fs";
import { join } from "node:path";
import { after, before, describe, test } from "node:test";

import type { NatsConnection } from "@nats-io/transport-node";

import {
  DigestMismatchError,
  NotRecoveredError,
  SeamguardClient,
  SpillForbiddenError,
  SpillNotFoundError,
  sameDigest,
  type Session,
  type SpillHandle,
  type Verdict,
} from "../src/index.js";
import { natsConnect, repoRoot, startServe, storyTurns, type Serve } from "./harness.js";

interface GoldenVerdict {
  type: string;
  data: Record<string, unknown>;
}

/** The seed story's verdicts as the repository's golden file has them. */
function golden(): GoldenVerdict[] {
  return readFileSync(join(repoRoot, "testdata/stories/golden/seed-story.out.jsonl"), "utf8")
    .split("\n")
    .filter((l) => l.trim() !== "")
    .map((l) => JSON.parse(l) as GoldenVerdict);
}

/** Plays the seed story up to its compaction: 52 turns, [0, 8) truncated. */
async function seedSession(client: SeamguardClient, id: string): Promise<Session> {
  const s = await client.open({ id, span: 12, window: 200_000, trigger: 160_000 });
  for (const t of storyTurns("seed-story.jsonl")) {
    await s.append({ role: t.role, tokens: t.tokens, content: t.content });
  }
  assert.equal(s.head, 52);
  await s.truncated({ start: 0, end: 8 }, "budget");
  return s;
}

const seedRequest = {
  requestId: "compact-1",
  summarizerInput: { start: 8, end: 52 },
  summaryRange: { start: 8, end: 40 },
  tailStart: 40,
  occupancy: 163_000,
  threshold: 160_000,
};

/** The refusal before an allowed verdict, with its spill. */
function refusalOf(v: Verdict): { refused: Verdict & { kind: "refused" }; spill: SpillHandle } {
  assert.equal(v.kind, "allowed", JSON.stringify(v.data));
  const refused = v.previous;
  assert.ok(refused !== undefined && refused.kind === "refused", "a refusal came first");
  assert.ok(refused.data.spill !== null, "the refusal carries its spill");
  return { refused, spill: refused.data.spill };
}

describe("the seed story against seamguard serve", () => {
  let serve: Serve;
  let nc: NatsConnection;
  before(async () => {
    serve = await startServe();
    nc = await natsConnect(serve.url);
  });
  after(async () => {
    await nc?.close();
    await serve?.stop();
  });

  for (const structured of [false, true]) {
    const mode = structured ? "structured" : "binary";
    test(`${mode} mode: refused coverage_hole [0, 8), spilled, allowed on retry, committed, recovered`, async () => {
      const [spilledWant, refusedWant, allowedWant] = golden();
      assert.ok(spilledWant && refusedWant && allowedWant);
      const client = new SeamguardClient(nc, { source: "urn:agent:demo/worker-1", structured });
      const session = `ops-agent-42-${mode}`;
      const s = await seedSession(client, session);

      const v = await s.compact(seedRequest, { timeoutMs: 20_000 });
      const { refused, spill } = refusalOf(v);
      assert.ok(v.kind === "allowed");

      // The refusal: coverage_hole at [0, 8), next retry, as the golden file has it.
      assert.equal(refused.type, "io.seamguard.compaction.refused");
      assert.equal(refused.session, session);
      assert.equal(refused.causationId, refused.eventId);
      assert.deepEqual(
        refused.data.reasons.map((r) => ({ code: r.code, at_risk: r.atRisk })),
        (refusedWant.data["reasons"] as { code: string; at_risk: unknown }[]).map((r) => ({ code: r.code, at_risk: r.at_risk })),
      );
      assert.deepEqual(refused.data.reasons[0]?.atRisk, [{ start: 0, end: 8 }]);
      assert.match(refused.data.reasons[0]?.message ?? "", /\[0, 8\)/);
      assert.equal(refused.data.next, "retry");
      const goldenSpill = spilledWant.data;
      assert.deepEqual(spill.range, goldenSpill["range"]);
      assert.equal(spill.events, goldenSpill["events"]);
      assert.equal(spill.previous, null);
      assert.equal(spill.bucket, "seamguard-spills");
      assert.equal(spill.name, `${session}/1.jsonl`);

      // The retry: allowed, cured by the spill.
      assert.equal(v.type, "io.seamguard.compaction.allowed");
      assert.equal(v.causationId, v.eventId);
      assert.notEqual(v.eventId, refused.eventId, "a retry is a new event");
      assert.equal(v.request.requestId, "compact-1", "a retry keeps the request id");
      assert.equal(refused.request.requestId, "compact-1");
      assert.equal(v.data.head, allowedWant.data["head"]);
      assert.equal(v.data.tailStart, allowedWant.data["tail_start"]);
      assert.deepEqual(v.data.summaryCoverage, allowedWant.data["summary_coverage"]);
      assert.deepEqual(v.data.cured, allowedWant.data["cured"]);
      assert.deepEqual(v.data.recoveredBy, [spill]);
      await s.commit(v.request.requestId);

      // The spill, read back through the recover service: every accepted
      // event from session.opened to the refused request, digest checked.
      const { chain, transcript } = await s.recoverTranscript(spill);
      assert.deepEqual(chain, [spill]);
      assert.equal(transcript.length, spill.size);
      assert.ok(sameDigest(spill.digest, "SHA-256=" + createHash("sha256").update(transcript).digest("base64url")));
      const lines = Buffer.from(transcript).toString("utf8").trimEnd().split("\n").map((l) => JSON.parse(l) as Record<string, unknown>);
      assert.equal(lines.length, spill.events);
      assert.equal(lines[0]?.["type"], "io.seamguard.session.opened");
      const turns = lines.filter((l) => l["type"] === "io.seamguard.turn.appended");
      assert.deepEqual(
        turns.map((l) => (l["data"] as { content: string }).content),
        storyTurns("seed-story.jsonl").map((t) => t.content),
      );
      assert.match(String((turns[0]?.["data"] as { content: string }).content), /Do not touch anything under \/etc/);
      const last = lines[lines.length - 1];
      assert.equal(last?.["type"], "io.seamguard.compaction.requested");
      assert.equal(last?.["id"], refused.eventId);
      for (const l of lines) {
        assert.equal(l["subject"], session);
        assert.equal(l["source"], "urn:agent:demo/worker-1");
      }

      // The same through the client, without a Session (an agent that restarted).
      const again = await client.recoverTranscript(session, spill);
      assert.deepEqual(Buffer.from(again.transcript), Buffer.from(transcript));
      await s.close();
    });
  }

  test("recover: a chain of two spills, digest and size checks, unknown and foreign spills", async () => {
    const client = new SeamguardClient(nc);
    const session = "chained";
    const s = await seedSession(client, session);
    const first = await s.compact(seedRequest, { timeoutMs: 20_000 });
    const spill1 = refusalOf(first).spill;
    await s.commit("compact-1");

    // Eighteen more turns; [52, 58) truncated before any summary saw them.
    for (let i = 0; i < 18; i++) await s.append({ content: `more ${i}` });
    await s.truncated({ start: 52, end: 58 }, "budget");
    const second = await s.compact(
      { requestId: "compact-2", summarizerInput: { start: 40, end: 70 }, summaryRange: { start: 0, end: 58 }, tailStart: 58, carriesPriorSummary: true },
      { timeoutMs: 20_000 },
    );
    const spill2 = refusalOf(second).spill;
    assert.equal(spill2.name, `${session}/2.jsonl`);
    assert.equal(spill2.previous, spill1.name);
    assert.deepEqual(spill2.range, { start: 0, end: 70 });

    const parts: Uint8Array[] = [];
    const chain = await s.recover(spill2, (chunk) => {
      parts.push(chunk.slice());
    });
    assert.deepEqual(chain, [spill1, spill2]);
    const all = Buffer.concat(parts);
    assert.equal(all.length, spill1.size + spill2.size);
    const one = await s.recoverTranscript(spill1);
    assert.deepEqual(all.subarray(0, spill1.size), Buffer.from(one.transcript));
    const lines = all.toString("utf8").trimEnd().split("\n");
    assert.equal(lines.length, spill1.events + spill2.events);

    // A handle whose digest or size is not the object's.
    const zero = "SHA-256=" + Buffer.alloc(32).toString("base64url");
    await assert.rejects(s.recoverTranscript({ ...spill2, digest: zero }), DigestMismatchError);
    await assert.rejects(s.recoverTranscript({ ...spill2, size: spill2.size + 1 }), DigestMismatchError);
    // Padding does not matter: digests are compared as sums.
    await s.recoverTranscript({ ...spill2, digest: spill2.digest.replace(/=+$/, "") });

    await assert.rejects(s.recoverTranscript({ ...spill2, name: `${session}/99.jsonl` }), (err: unknown) => {
      assert.ok(err instanceof SpillNotFoundError);
      assert.ok(err instanceof NotRecoveredError);
      assert.equal(err.status, 404);
      assert.equal(err.code, "not_recovered");
      assert.match(err.message, /99\.jsonl/);
      return true;
    });
    await assert.rejects(s.recoverTranscript({ ...spill2, name: "someone-else/1.jsonl" }), (err: unknown) => {
      assert.ok(err instanceof SpillForbiddenError);
      assert.equal(err.status, 403);
      return true;
    });
    await s.close();
  });

  test("pinned story: compact carries the pinned rule back after carry_pins", async () => {
    const client = new SeamguardClient(nc, { structured: true });
    const turns = storyTurns("seed-story.jsonl");
    const s = await client.open({ id: "sess-pinned", span: 12 });
    for (const [i, t] of turns.entries()) {
      await s.append({ role: t.role, tokens: t.tokens, content: t.content, pinned: i === 0 });
    }
    await s.truncated({ start: 0, end: 8 }, "budget");

    const v = await s.compact({ ...seedRequest, requestId: "p1" }, { timeoutMs: 20_000 });
    assert.equal(v.kind, "allowed", JSON.stringify(v.data));
    assert.deepEqual(v.request.carriedPins, [{ start: 0, end: 1 }], "the agent must put turn 0 back");
    const refused = v.previous;
    assert.ok(refused?.kind === "refused");
    assert.equal(refused.data.next, "carry_pins");
    assert.deepEqual(
      refused.data.reasons.map((r) => [r.code, r.atRisk]),
      [
        ["coverage_hole", [{ start: 0, end: 8 }]],
        ["pin_dropped", [{ start: 0, end: 1 }]],
      ],
    );
    assert.ok(refused.data.spill !== null, "the hole needed a spill");
    assert.equal(refused.previous, undefined);
    assert.ok(v.kind === "allowed");
    assert.deepEqual(v.data.cured, ["coverage_hole"]);
    assert.deepEqual(v.data.recoveredBy, [refused.data.spill]);
    await s.commit("p1");

    // The same request without the pin: pin_dropped alone stands in the
    // way; the hole the spill holds is cured.
    const pinOnly = await s.requestCompaction({ ...seedRequest, requestId: "p2", carriesPriorSummary: true });
    assert.ok(pinOnly.kind === "refused", JSON.stringify(pinOnly.data));
    assert.equal(pinOnly.data.next, "carry_pins");
    assert.deepEqual(
      pinOnly.data.reasons.map((r) => [r.code, r.atRisk]),
      [["pin_dropped", [{ start: 0, end: 1 }]]],
    );
    assert.deepEqual(pinOnly.data.cured, ["coverage_hole"]);
    assert.equal(pinOnly.data.spill, null);

    // After unpinning, the plain request is allowed at once.
    await s.unpin({ start: 0, end: 1 });
    const plain = await s.requestCompaction({ ...seedRequest, requestId: "p3", carriesPriorSummary: true });
    assert.equal(plain.kind, "allowed", JSON.stringify(plain.data));
    await s.close();
  });
});
