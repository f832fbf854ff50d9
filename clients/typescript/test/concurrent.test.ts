// Concurrency against a real `seamguard serve`: many sessions at once,
// each through refuse, spill, retry; and one session whose turns are
// appended while two compactions are requested, stored in call order.

import assert from "node:assert/strict";
import { after, before, describe, test } from "node:test";

import { jetstreamManager } from "@nats-io/jetstream";
import type { NatsConnection } from "@nats-io/transport-node";

import { SeamguardClient, type Verdict } from "../src/index.js";
import { natsConnect, startServe, type Serve } from "./harness.js";

describe("concurrency", () => {
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

  test("twelve sessions at once, both modes, each refused, spilled and allowed on retry", async () => {
    const clients = [new SeamguardClient(nc), new SeamguardClient(nc, { structured: true })];
    const run = async (i: number): Promise<Verdict> => {
      const s = await (clients[i % 2] as SeamguardClient).open({ id: `fleet-${i}`, span: 4 });
      for (let t = 0; t < 12; t++) await s.append({ role: t % 2 === 0 ? "user" : "assistant", content: `session ${i} turn ${t}` });
      await s.truncated({ start: 0, end: 3 }, "budget");
      const v = await s.compact(
        { requestId: `c-${i}`, summarizerInput: { start: 3, end: 12 }, summaryRange: { start: 3, end: 8 }, tailStart: 8 },
        { timeoutMs: 30_000 },
      );
      await s.commit(v.request.requestId);
      await s.close();
      return v;
    };
    const verdicts = await Promise.all(Array.from({ length: 12 }, (_, i) => run(i)));
    const ids = new Set<string>();
    verdicts.forEach((v, i) => {
      assert.equal(v.kind, "allowed", JSON.stringify(v.data));
      assert.equal(v.session, `fleet-${i}`);
      assert.equal(v.request.requestId, `c-${i}`);
      assert.equal(v.causationId, v.eventId);
      const refused = v.previous;
      assert.ok(refused?.kind === "refused");
      assert.deepEqual(refused.data.reasons.map((r) => [r.code, r.atRisk]), [["coverage_hole", [{ start: 0, end: 3 }]]]);
      assert.equal(refused.data.spill?.name, `fleet-${i}/1.jsonl`);
      assert.equal(refused.data.spill?.events, 15);
      ids.add(v.id).add(refused.id);
    });
    assert.equal(ids.size, 24, "every verdict its own");
  });

  test("appends while two compactions are requested: each request gets its own verdict, turns stored in order", async () => {
    const client = new SeamguardClient(nc);
    const s = await client.open({ id: "busy", span: 4 });
    for (let i = 0; i < 10; i++) await s.append({});
    const ask = (requestId: string): Promise<Verdict> =>
      s.requestCompaction({ requestId, summarizerInput: { start: 0, end: 10 }, summaryRange: { start: 0, end: 6 }, tailStart: 6 });
    const appends = (async () => {
      const ranges = [];
      for (let i = 0; i < 20; i++) ranges.push(await s.append({ content: "more" }));
      return ranges;
    })();
    // Calls made at once from several tasks: appends interleave with the requests.
    const [left, right, ranges, burst] = await Promise.all([
      ask("left"),
      ask("right"),
      appends,
      Promise.all(Array.from({ length: 10 }, () => s.append({ content: "burst" }))),
    ]);
    for (const [v, id] of [[left, "left"], [right, "right"]] as const) {
      assert.equal(v.request.requestId, id);
      assert.equal(v.causationId, v.eventId);
      assert.equal(v.session, "busy");
    }
    assert.notEqual(left.id, right.id);
    assert.equal(s.head, 40);
    const all = [...ranges, ...burst].sort((a, b) => a.start - b.start);
    all.forEach((r, i) => assert.deepEqual(r, { start: 10 + i, end: 11 + i }, "contiguous, each offset once"));

    // Stream order is offset order.
    const jsm = await jetstreamManager(nc);
    const info = await jsm.streams.info("SEAMGUARD_EVENTS");
    let next = 0;
    let events = 0;
    for (let seq = info.state.first_seq; seq <= info.state.last_seq; seq++) {
      const m = await jsm.streams.getMessage("SEAMGUARD_EVENTS", { seq });
      if (m === null || !m.subject.endsWith(".busy")) continue;
      events++;
      if (m.header.get("ce-type") === "io.seamguard.turn.appended") {
        const turn = m.json<{ offset: number; size: number }>();
        assert.equal(turn.offset, next, `the turn at seq ${seq}`);
        next += turn.size;
      }
    }
    assert.equal(next, 40);
    assert.equal(events, 1 + 40 + 2);
    await s.close();
  });
});
