// The whole flow as the least-privilege `agent` of the shipped
// deploy/nats/standalone.conf, against `seamguard serve` running as the
// `processor` identity: open, turns, truncation, refuse-spill-retry,
// commit, recover, a foreign spill refused, close, without one permission
// violation. And deadlines: while no processor runs, a compaction request
// ends in a NoVerdictError naming it; once one runs, its verdict comes.

import assert from "node:assert/strict";
import { after, before, describe, test } from "node:test";

import type { NatsConnection } from "@nats-io/transport-node";

import { NoVerdictError, NotPublishedError, SeamguardClient, SpillForbiddenError } from "../src/index.js";
import { eventually, natsConnect, startServe, startTestNats, type Serve, type TestNats } from "./harness.js";

describe("as the least-privilege agent identity", () => {
  let nats: TestNats;
  let serve: Serve | undefined;
  let nc: NatsConnection;
  const problems: string[] = [];
  const startProcessor = (): Promise<Serve> =>
    startServe({
      natsUrl: nats.url,
      user: "processor",
      password: nats.passwords.processor,
      // the recover service answers as the responder, which may publish to inboxes alone
      args: ["--responder-user", "responder", "--responder-password", nats.passwords.responder],
    });

  before(async () => {
    nats = await startTestNats();
    serve = await startProcessor();
    // Agents keep NATS's default inbox prefix, _INBOX (deploy/nats/permissions.conf).
    nc = await natsConnect(nats.url, { user: "agent", pass: nats.passwords.agent });
    void (async () => {
      for await (const s of nc.status()) {
        if (s.type === "error") problems.push(String(s.error));
      }
    })();
  });
  after(async () => {
    await nc?.close();
    await serve?.stop();
    await nats?.stop();
  });

  test("refuse, spill, retry, commit, recover and close with no permission violation", async () => {
    for (const structured of [false, true]) {
      const client = new SeamguardClient(nc, { source: "urn:agent:least-privilege", structured });
      const id = `least-privilege-${structured ? "structured" : "binary"}`;
      const rejected: unknown[] = [];
      const s = await client.open({ id, span: 4, onRejected: (e) => rejected.push(e) });
      for (let i = 0; i < 12; i++) await s.append({ content: `turn ${i}` });
      await s.truncated({ start: 0, end: 3 }, "budget");
      const v = await s.compact({ requestId: "c1", summarizerInput: { start: 3, end: 12 }, summaryRange: { start: 3, end: 8 }, tailStart: 8 });
      assert.equal(v.kind, "allowed", JSON.stringify(v.data));
      const refused = v.previous;
      assert.ok(refused?.kind === "refused");
      assert.equal(refused.data.next, "retry");
      assert.deepEqual(refused.data.reasons.map((r) => [r.code, r.atRisk]), [["coverage_hole", [{ start: 0, end: 3 }]]]);
      const spill = refused.data.spill;
      assert.ok(spill !== null);
      await s.commit("c1");

      const { chain, transcript } = await s.recoverTranscript(spill);
      assert.deepEqual(chain, [spill]);
      assert.equal(transcript.length, spill.size);
      await assert.rejects(s.recoverTranscript({ ...spill, name: "someone-else/1.jsonl" }), SpillForbiddenError);
      await s.close();
      assert.deepEqual(rejected, []);
    }
    await nc.flush();
    assert.deepEqual(problems, [], "no permission violation");
  });

  test("no processor: a NoVerdictError names the request; the verdict comes once one runs", async () => {
    const client = new SeamguardClient(nc);
    const s = await client.open({ id: "late", span: 1 });
    await s.append({});
    await serve?.stop();
    serve = undefined;

    // Listen as a subscriber would, to see the verdict once it is decided.
    const late: string[] = [];
    const sub = nc.subscribe("seamguard.verdicts.late.*", {
      callback: (err, m) => {
        if (err === null) late.push(m.string());
      },
    });
    const start = Date.now();
    const err = await s
      .requestCompaction({ requestId: "r-late", summarizerInput: { start: 0, end: 1 }, summaryRange: { start: 0, end: 1 }, tailStart: 0 }, { timeoutMs: 500 })
      .then(
        () => assert.fail("a verdict without a processor"),
        (e: unknown) => e,
      );
    const took = Date.now() - start;
    assert.ok(err instanceof NoVerdictError, String(err));
    assert.equal(err.code, "no_verdict");
    assert.equal(err.requestId, "r-late");
    assert.equal(err.session, "late");
    assert.match(err.eventId, /^[A-Za-z0-9]{22}$/);
    assert.deepEqual(err.unattributed, []);
    assert.match(err.message, /"r-late"/);
    assert.match(err.message, /session late/);
    assert.match(err.message, /deadline/);
    assert.ok(took >= 450 && took < 5000, `the deadline held: ${took} ms`);
    // An aborted signal ends the wait too.
    await assert.rejects(
      s.requestCompaction(
        { requestId: "r-abort", summarizerInput: { start: 0, end: 1 }, summaryRange: { start: 0, end: 1 }, tailStart: 0 },
        { signal: AbortSignal.timeout(300) },
      ),
      (e: unknown) => e instanceof NoVerdictError && e.requestId === "r-abort",
    );

    serve = await startProcessor();
    const verdict = await eventually(
      () => late.map((l) => JSON.parse(l) as { type: string; causationid: string; data: { request_id: string } }).find((v) => v.causationid === err.eventId),
      20_000,
      "the verdict of r-late",
    );
    sub.unsubscribe();
    assert.equal(verdict.type, "io.seamguard.compaction.allowed");
    assert.equal(verdict.data.request_id, "r-late");
    // The session goes on.
    const v = await s.requestCompaction({ summarizerInput: { start: 0, end: 1 }, summaryRange: { start: 0, end: 1 }, tailStart: 0 });
    assert.equal(v.kind, "allowed", JSON.stringify(v.data));
    await s.close();
    assert.deepEqual(problems, [], "no permission violation");
  });

  // Last: it makes the server report a permission violation on purpose.
  test("a subscription the identity may not make fails the call at once, before anything is published", async () => {
    const client = new SeamguardClient(nc, { prefix: "other" }); // the agent may not hear other.verdicts.>
    const start = Date.now();
    await assert.rejects(client.open({ id: "elsewhere", span: 1, onRejected: () => undefined }), (err: unknown) => {
      assert.ok(err instanceof NotPublishedError, String(err));
      assert.equal(err.kept, false, "nothing was published");
      assert.match(err.message, /Permissions Violation/i);
      return true;
    });
    assert.ok(Date.now() - start < 2000, "not a wait for a deadline");
    assert.ok(problems.some((p) => /other\.verdicts\.elsewhere\.rejected/.test(p)), problems.join("\n"));
  });
});
