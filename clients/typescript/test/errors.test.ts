// Typed errors against a real `seamguard serve`: rejections of the
// client's own events reach the caller (thrown for a compaction request,
// given to onRejected for the others), arguments are checked before
// anything is sent, a closed session refuses to publish, and only a
// retryable refusal can be retried.

import assert from "node:assert/strict";
import { after, before, describe, test } from "node:test";

import { jetstreamManager, type JetStreamManager } from "@nats-io/jetstream";
import type { NatsConnection } from "@nats-io/transport-node";

import { ArgumentError, NotRetryableError, RejectedError, SeamguardClient, SeamguardError, SessionClosedError } from "../src/index.js";
import { eventually, natsConnect, startServe, type Serve } from "./harness.js";

describe("errors", () => {
  let serve: Serve;
  let nc: NatsConnection;
  let jsm: JetStreamManager;
  before(async () => {
    serve = await startServe();
    nc = await natsConnect(serve.url);
    jsm = await jetstreamManager(nc);
  });
  after(async () => {
    await nc?.close();
    await serve?.stop();
  });

  /** How many events of the session the events stream holds. */
  async function stored(session: string): Promise<number> {
    const info = await jsm.streams.info("SEAMGUARD_EVENTS", { subjects_filter: `seamguard.partitioned.*.events.${session}` });
    return Object.values(info.state.subjects ?? {}).reduce((a, b) => a + b, 0);
  }

  for (const structured of [false, true]) {
    const mode = structured ? "structured" : "binary";
    test(`${mode} mode: a rejected compaction request is thrown as a RejectedError naming the field`, async () => {
      const client = new SeamguardClient(nc, { structured });
      const s = await client.open({ id: `odd-${mode}`, span: 4 });
      await s.append({});
      const start = Date.now();
      await assert.rejects(
        s.requestCompaction({ requestId: "r".repeat(300), summarizerInput: { start: 0, end: 1 }, summaryRange: { start: 0, end: 1 }, tailStart: 0 }),
        (err: unknown) => {
          assert.ok(err instanceof RejectedError, String(err));
          assert.ok(err instanceof SeamguardError);
          assert.equal(err.code, "rejected");
          assert.equal(err.session, `odd-${mode}`);
          assert.equal(err.rejection.code, "too_large");
          assert.equal(err.rejection.field, "data.request_id");
          assert.equal(err.rejection.input.subject, `seamguard.events.odd-${mode}`);
          assert.ok(err.rejection.input.streamSeq > 0);
          assert.equal(err.signer, serve.signingKey, "verified as any verdict is");
          assert.deepEqual(err.unattributed, []);
          assert.match(err.message, /too_large/);
          assert.match(err.message, /data\.request_id/);
          return true;
        },
      );
      assert.ok(Date.now() - start < 10_000, "not a wait until the deadline");
      await s.close();
    });
  }

  test("a rejection of another of the session's events reaches onRejected", async () => {
    const client = new SeamguardClient(nc);
    const first = await client.open({ id: "twice", span: 4 });
    await first.append({ content: "hello" });
    // Another process opens the same session with another recovery floor:
    // seamguard rejects that session.opened with already_open.
    const rejected: RejectedError[] = [];
    const second = await client.open({ id: "twice", span: 8, head: 1, onRejected: (e) => rejected.push(e) });
    const got = await eventually(() => rejected[0], 10_000, "the rejection of the second open");
    assert.equal(got.rejection.code, "already_open");
    assert.equal(got.session, "twice");
    assert.equal(got.rejection.input.subject, "seamguard.events.twice");
    assert.match(got.eventId, /^[A-Za-z0-9]{22}$/);
    assert.equal(got.signer, serve.signingKey);
    // The first session's own events are not the second's: no more reports.
    await first.append({ content: "again" });
    const v = await first.requestCompaction({ summarizerInput: { start: 0, end: 2 }, summaryRange: { start: 0, end: 0 }, tailStart: 0 });
    assert.equal(v.kind, "allowed", JSON.stringify(v.data));
    assert.equal(rejected.length, 1);
    await second.close();
    await first.close();
  });

  test("arguments are checked before anything is sent", async () => {
    const client = new SeamguardClient(nc);
    await assert.rejects(client.open({ id: "no spaces allowed", span: 2 }), ArgumentError);
    await assert.rejects(client.open({ id: "ok", span: 0, unit: "pages" as "turns" }), (err: unknown) => {
      assert.ok(err instanceof ArgumentError);
      assert.match(err.message, /span is 0/);
      assert.match(err.message, /"pages"/);
      return true;
    });
    const s = await client.open({ id: "short", span: 2 });
    assert.deepEqual(await s.append({ size: 3 }), { start: 0, end: 3 });

    await assert.rejects(s.truncated({ start: 1, end: 4 }, "budget"), (err: unknown) => {
      assert.ok(err instanceof ArgumentError);
      assert.match(err.message, /\[0, 3\)/);
      return true;
    });
    await assert.rejects(s.truncated({ start: 2, end: 1 }), ArgumentError);
    await assert.rejects(s.pin({ start: 0, end: 4 }), ArgumentError);
    await assert.rejects(s.unpin({ start: -1, end: 1 }), ArgumentError);
    await assert.rejects(s.commit(""), ArgumentError);
    await assert.rejects(s.append({ content: 10n }), ArgumentError);
    await assert.rejects(s.append({ content: () => 1 }), ArgumentError);
    await assert.rejects(s.append({ size: 1.5 }), ArgumentError);
    await assert.rejects(
      s.requestCompaction({ summarizerInput: { start: 0, end: Number.NaN }, summaryRange: { start: 0, end: 1 }, tailStart: -1 }),
      (err: unknown) => {
        assert.ok(err instanceof ArgumentError);
        assert.match(err.message, /summarizerInput/);
        assert.match(err.message, /tailStart/);
        return true;
      },
    );
    await assert.rejects(s.retry(undefined as never), NotRetryableError);
    assert.equal(s.head, 3);

    await s.close();
    await s.close(); // closing twice publishes nothing more
    await assert.rejects(s.append({}), SessionClosedError);
    await assert.rejects(s.requestCompaction({ summarizerInput: { start: 0, end: 3 }, summaryRange: { start: 0, end: 1 }, tailStart: 1 }), (err: unknown) => {
      assert.ok(err instanceof SessionClosedError);
      assert.match(err.message, /short/);
      return true;
    });
    assert.equal(await stored("short"), 3, "open, one turn, close: nothing invalid was published");
  });

  test("only a retryable refusal can be retried; only a carry_pins refusal carries pins", async () => {
    const client = new SeamguardClient(nc);
    const s = await client.open({ id: "retries", span: 2 });
    for (let i = 0; i < 6; i++) await s.append({});
    const allowed = await s.requestCompaction({ summarizerInput: { start: 0, end: 6 }, summaryRange: { start: 0, end: 4 }, tailStart: 4 });
    assert.equal(allowed.kind, "allowed", JSON.stringify(allowed.data));
    await assert.rejects(s.retry(allowed), NotRetryableError);
    await assert.rejects(s.carryPins(allowed), NotRetryableError);
    // A refusal with next "none": a tail that starts past the head is an invalid request.
    const invalid = await s.compact({ summarizerInput: { start: 0, end: 6 }, summaryRange: { start: 0, end: 4 }, tailStart: 100 });
    assert.equal(invalid.kind, "refused");
    assert.ok(invalid.kind === "refused");
    assert.equal(invalid.data.next, "none");
    assert.deepEqual(invalid.data.reasons.map((r) => r.code), ["invalid_request"]);
    assert.equal(invalid.data.spill, null);
    assert.equal(invalid.previous, undefined, "compact does not request again after a refusal for good");
    // A seam before the tail puts received turns at risk: spilled, then allowed.
    const seam = await s.compact({ summarizerInput: { start: 0, end: 6 }, summaryRange: { start: 0, end: 2 }, tailStart: 4 });
    assert.equal(seam.kind, "allowed");
    assert.ok(seam.previous?.kind === "refused");
    assert.deepEqual(seam.previous.data.reasons.map((r) => r.code), ["coverage_hole", "seam_gap"]);
    await assert.rejects(s.retry(invalid), NotRetryableError);
    await assert.rejects(s.carryPins(seam.previous), NotRetryableError);
    await s.close();
  });
});
