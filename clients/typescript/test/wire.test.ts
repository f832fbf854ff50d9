// What the client puts on the wire, in both content modes, and that the
// processor accepts it; idempotent re-publishes (same id, one event); an
// event kept while the stream is away and sent again with the same id.

import assert from "node:assert/strict";
import { after, before, describe, test } from "node:test";

import { jetstream, jetstreamManager, type JetStreamManager } from "@nats-io/jetstream";
import { type Msg, type NatsConnection } from "@nats-io/transport-node";

import { resolveConfig } from "../src/config.js";
import { Core, newId } from "../src/core.js";
import { buildEvent, msgId } from "../src/encode.js";
import { NotPublishedError, RejectedError, SeamguardClient } from "../src/index.js";
import { eventually, natsConnect, startServe, type Serve } from "./harness.js";

const decoder = new TextDecoder();

/** Subscribes to every events subject of `prefix` and collects what arrives. */
async function capture(nc: NatsConnection, prefix = "seamguard"): Promise<{ msgs: Msg[]; stop(): void }> {
  const msgs: Msg[] = [];
  const sub = nc.subscribe(`${prefix}.events.>`, {
    callback: (err, m) => {
      if (err === null) msgs.push(m);
    },
  });
  await nc.flush();
  return { msgs, stop: () => sub.unsubscribe() };
}

describe("the wire", () => {
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

  const source = 'urn:agent:tëst "100%"';
  for (const structured of [false, true]) {
    const mode = structured ? "structured" : "binary";
    test(`${mode} mode: CloudEvents with Nats-Msg-Id = msgId(source, id), percent-encoded headers, offsets counted by the session; the processor accepts them`, async () => {
      const cap = await capture(nc);
      const rejected: RejectedError[] = [];
      const client = new SeamguardClient(nc, { source, structured });
      const session = `wire-${mode}`;
      const s = await client.open({ id: session, unit: "tokens", span: 300, window: 200_000, onRejected: (e) => rejected.push(e) });
      assert.deepEqual(await s.append({ size: 120, role: "user", content: { text: "héllo" } }), { start: 0, end: 120 });
      assert.deepEqual(await s.append({ size: 80, content: ["raw", 1] }), { start: 120, end: 200 });
      await s.truncated({ start: 0, end: 120 }, "budget");
      await s.pin({ start: 120, end: 200 });
      await s.unpin({ start: 120, end: 200 });
      await s.commit("c-1");
      // A verdict comes after every earlier event of the session is decided:
      // no rejection came before it, and the spill it wrote holds every
      // event, so the processor accepted them all.
      const v = await s.requestCompaction({ summarizerInput: { start: 0, end: 200 }, summaryRange: { start: 0, end: 0 }, tailStart: 0 });
      assert.equal(v.kind, "refused", JSON.stringify(v.data));
      assert.ok(v.kind === "refused");
      assert.equal(v.data.spill?.events, 8, "open, two turns, truncation, pin, unpin, commit and the request");
      assert.deepEqual(rejected, []);
      await s.close();
      assert.equal(s.head, 200);

      const want: [string, unknown][] = [
        ["io.seamguard.session.opened", { unit: "tokens", recovery_floor: { span: 300, unit: "tokens" }, window: 200_000 }],
        ["io.seamguard.turn.appended", { offset: 0, size: 120, role: "user", content: { text: "héllo" } }],
        ["io.seamguard.turn.appended", { offset: 120, size: 80, content: ["raw", 1] }],
        ["io.seamguard.context.truncated", { range: { start: 0, end: 120 }, stage: "budget" }],
        ["io.seamguard.context.pinned", { range: { start: 120, end: 200 } }],
        ["io.seamguard.context.unpinned", { range: { start: 120, end: 200 } }],
        ["io.seamguard.compaction.committed", { request_id: "c-1" }],
        [
          "io.seamguard.compaction.requested",
          { request_id: v.request.requestId, summarizer_input: { start: 0, end: 200 }, summary_range: { start: 0, end: 0 }, tail_start: 0, carries_prior_summary: false },
        ],
        ["io.seamguard.session.closed", {}],
      ];
      const msgs = await eventually(() => (cap.msgs.length >= want.length ? cap.msgs : undefined), 5000, "events captured");
      cap.stop();
      assert.equal(msgs.length, want.length);
      const ids = new Set<string>();
      msgs.forEach((m, i) => {
        const [type, data] = want[i] as [string, unknown];
        assert.equal(m.subject, `seamguard.events.${session}`);
        const h = m.headers;
        assert.ok(h !== undefined);
        let ev: Record<string, unknown>;
        if (structured) {
          assert.equal(h.get("Content-Type"), "application/cloudevents+json");
          assert.equal(h.get("ce-specversion"), "");
          ev = JSON.parse(decoder.decode(m.data)) as Record<string, unknown>;
          assert.equal(ev["specversion"], "1.0");
          assert.equal(ev["datacontenttype"], "application/json");
          assert.equal(ev["source"], source);
        } else {
          assert.equal(h.get("Content-Type"), "application/json");
          assert.equal(h.get("ce-specversion"), "1.0");
          assert.equal(h.get("ce-source"), "urn:agent:t%C3%ABst%20%22100%25%22");
          ev = {
            id: h.get("ce-id"),
            type: h.get("ce-type"),
            subject: h.get("ce-subject"),
            time: decodeURIComponent(h.get("ce-time")),
            data: JSON.parse(decoder.decode(m.data)) as unknown,
          };
        }
        assert.equal(ev["type"], type, `event ${i}`);
        assert.deepEqual(ev["data"], data, `event ${i}`);
        assert.equal(ev["subject"], session);
        assert.equal(h.get("Nats-Msg-Id"), msgId(source, String(ev["id"])), "Nats-Msg-Id is derived from the source and id");
        assert.equal(h.get("Nats-Expected-Stream"), "SEAMGUARD_EVENTS");
        assert.ok(Math.abs(Date.parse(String(ev["time"])) - Date.now()) < 60_000, "time is now");
        assert.match(String(ev["id"]), /^[A-Za-z0-9]{22}$/, "a NUID");
        assert.ok(!ids.has(String(ev["id"])), "every event has its own id");
        ids.add(String(ev["id"]));
      });
      assert.equal(ids.has(v.eventId), true, "the request's event id is the verdict's causationid");
    });
  }

  test("idempotent re-publish: the same event id twice is one event", async () => {
    const rejected: RejectedError[] = [];
    const client = new SeamguardClient(nc);
    const core = new Core(nc, resolveConfig({}));
    const session = "dup";
    const opened = buildEvent(core.config, session, "io.seamguard.session.opened", newId(), { unit: "turns", recovery_floor: { span: 1, unit: "turns" } });
    const first = await core.publish(opened, undefined);
    assert.equal(first.duplicate, false);
    assert.equal(first.stream, "SEAMGUARD_EVENTS");
    // A retry after a lost ack sends the same built event again.
    const again = await core.publish(opened, undefined);
    assert.equal(again.duplicate, true);
    assert.equal(again.seq, first.seq);

    const turn = buildEvent(core.config, session, "io.seamguard.turn.appended", newId(), { offset: 0, size: 1, content: "once" });
    const t1 = await core.publish(turn, undefined);
    const t2 = await core.publish(turn, undefined);
    assert.equal(t2.duplicate, true);
    assert.equal(t2.seq, t1.seq);

    // The processor saw one turn: head 1, and no offset_conflict rejection
    // (which would come before the verdict).
    const s = await client.open({ id: session, span: 1, head: 1, onRejected: (e) => rejected.push(e) });
    const v = await s.requestCompaction({ summarizerInput: { start: 0, end: 1 }, summaryRange: { start: 0, end: 0 }, tailStart: 0 });
    assert.equal(v.kind, "allowed", JSON.stringify(v.data));
    assert.ok(v.kind === "allowed");
    assert.equal(v.data.head, 1);
    assert.deepEqual(rejected, []);
    await s.close();
  });

  test("two sources with the same event ids: both sessions are stored and decided", async () => {
    const verdicts: Record<string, unknown>[] = [];
    const sub = nc.subscribe("seamguard.verdicts.>", {
      callback: (err, m) => {
        if (err === null) verdicts.push(JSON.parse(decoder.decode(m.data)) as Record<string, unknown>);
      },
    });
    await nc.flush();
    try {
      for (const [source, session] of [
        ["urn:agent:ts-a", "ts-same-ids-a"],
        ["urn:agent:ts-b", "ts-same-ids-b"],
      ] as const) {
        const core = new Core(nc, resolveConfig({ source }));
        const evs = [
          buildEvent(core.config, session, "io.seamguard.session.opened", "1", { unit: "turns", recovery_floor: { span: 1, unit: "turns" } }),
          buildEvent(core.config, session, "io.seamguard.turn.appended", "2", { offset: 0, size: 1 }),
          buildEvent(core.config, session, "io.seamguard.turn.appended", "3", { offset: 1, size: 1 }),
          buildEvent(core.config, session, "io.seamguard.compaction.requested", "4", {
            request_id: "r",
            summarizer_input: { start: 0, end: 2 },
            summary_range: { start: 0, end: 1 },
            tail_start: 1,
          }),
        ];
        for (const ev of evs) {
          const ack = await core.publish(ev, undefined);
          assert.equal(ack.duplicate, false, `${source} ${ev.id}`);
        }
      }
      const decided = await eventually(
        () => {
          const got = verdicts.filter((v) => v["causationid"] === "4").map((v) => `${String(v["subject"])} ${String(v["type"])}`);
          return got.length >= 2 ? got.sort() : undefined;
        },
        30_000,
        "the verdicts of both sessions",
      );
      assert.deepEqual(decided, ["ts-same-ids-a io.seamguard.compaction.allowed", "ts-same-ids-b io.seamguard.compaction.allowed"]);
    } finally {
      sub.unsubscribe();
    }
  });

  test("a duplicate ack on an event's first publish is not stored: msgIdTaken", async () => {
    const core = new Core(nc, resolveConfig({ source: "urn:agent:ts-taken" }));
    const js = jetstream(nc);
    await js.publish("seamguard.events.ts-elsewhere", "{}", { msgID: msgId("urn:agent:ts-taken", "x-1") });
    const ev = buildEvent(core.config, "ts-taken", "io.seamguard.session.opened", "x-1", { unit: "turns", recovery_floor: { span: 1, unit: "turns" } });
    await assert.rejects(core.publish(ev, undefined), (err: unknown) => {
      assert.ok(err instanceof NotPublishedError);
      assert.equal(err.msgIdTaken, true);
      assert.match(err.message, /another message under this event's message id/);
      return true;
    });
  });

  test("an event not stored stays first: kept with its id, nothing overtakes it, flush sends it again", async () => {
    // A stream of its own, so the processor's is not touched: prefix "other".
    const streamConfig = { name: "OTHER_EVENTS", subjects: ["other.events.>"], duplicate_window: 60_000_000_000 };
    await jsm.streams.add(streamConfig);
    const client = new SeamguardClient(nc, { prefix: "other", ackTimeoutMs: 500, publishAttempts: 2 });
    assert.equal(client.config.stream, "OTHER_EVENTS");
    const s = await client.open({ id: "flaky", span: 2 });
    await s.append({ content: 0 });

    await jsm.streams.delete("OTHER_EVENTS");
    const notStored = await s.append({ content: 1 }).then(
      () => assert.fail("published without a stream"),
      (err: unknown) => err,
    );
    assert.ok(notStored instanceof NotPublishedError, String(notStored));
    assert.equal(notStored.kept, true, "the turn counts");
    assert.equal(notStored.session, "flaky");
    assert.equal(notStored.eventType, "io.seamguard.turn.appended");
    assert.equal(notStored.stream, "OTHER_EVENTS");
    assert.match(notStored.message, /flaky/);
    assert.equal(s.head, 2, "the turn counts as appended");
    assert.equal(s.pending, true);

    for (const call of [() => s.append({ content: 2 }), () => s.truncated({ start: 0, end: 1 })]) {
      await assert.rejects(call(), (err: unknown) => {
        assert.ok(err instanceof NotPublishedError);
        assert.equal(err.kept, false, "the call changed nothing");
        assert.equal(err.eventId, notStored.eventId, "it names the event still waiting");
        assert.match(err.message, /still unpublished/);
        return true;
      });
    }
    assert.equal(s.head, 2, "nothing past the pending turn");

    await jsm.streams.add(streamConfig);
    await s.flush();
    assert.equal(s.pending, false);
    await s.flush(); // nothing pending
    assert.deepEqual(await s.append({ content: 2 }), { start: 2, end: 3 });

    const stored = [1, 2].map(async (seq) => jsm.streams.getMessage("OTHER_EVENTS", { seq }));
    const [m1, m2] = await Promise.all(stored);
    assert.equal(m1?.header.get("ce-id"), notStored.eventId, "sent again under the same id");
    assert.equal(m1?.header.get("Nats-Msg-Id"), msgId(client.config.source, notStored.eventId));
    assert.deepEqual(m1?.json(), { offset: 1, size: 1, content: 1 });
    assert.deepEqual(m2?.json(), { offset: 2, size: 1, content: 2 });
    assert.equal((await jsm.streams.info("OTHER_EVENTS")).state.messages, 2);
    await s.close();
    await jsm.streams.delete("OTHER_EVENTS");
  });

  test("a publish that lands in another stream fails at once", async () => {
    const client = new SeamguardClient(nc, { stream: "SOMEONE_ELSES" });
    const start = Date.now();
    await assert.rejects(client.open({ id: "lost", span: 2 }), (err: unknown) => {
      assert.ok(err instanceof NotPublishedError);
      assert.match(err.message, /SOMEONE_ELSES/);
      return true;
    });
    assert.ok(Date.now() - start < 2000, "not retried");
  });
});
