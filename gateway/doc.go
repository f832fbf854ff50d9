// Package gateway is seamguard's HTTP gateway for agents without a NATS
// client: CloudEvents over HTTP (contract v1.3, section 9), served by
// `seamguard serve --http-listen`.
//
// # POST /v1/events
//
// A request is read with sdk-go's CloudEvents HTTP protocol binding
// (binding/http's Message and its ReadEncoding, ReadBinary, ReadStructured),
// in binary, structured or batched (application/cloudevents-batch+json)
// mode. Each event is then turned into the NATS message it would be (ce-*
// headers and Content-Type for binary mode, the JSON body for structured
// mode; nothing else of the request, its Authorization header above all)
// and validated by events.DecodeMsg, the processor's own decoder: HTTP and
// NATS reject the same inputs with the same code and field. A rejection is
// a 400 whose body is an io.seamguard.event.rejected CloudEvent naming the
// field and the fix, with batchindex naming the failing event of a batch.
//
// Every event of a request is decoded and authorised before any is
// published; then each is published in order on its session's subject
// with Nats-Msg-Id events.MsgID(source, id), waiting for the JetStream ack.
// The answer is 202 once all are stored. The events stream does not take
// atomic batches, so a broker failing in the middle of a batch leaves its
// first events stored: the answer (503 or 502) says which, and the whole
// batch may be sent again, since each event is deduplicated by its message
// id within the stream's dedupe window. A duplicate ack is read back
// (Config.Reader) and compared: the same event sent before is a 202 with
// duplicate true (and Seamguard-Duplicates counting them); another event
// under the same (source, id) is a 409, never reported as stored.
//
// ?wait=DURATION (at most MaxWait) with one compaction.requested waits for
// its verdict after the ack: the gateway subscribes to the session's
// verdict subjects before it publishes and matches the verdict ids
// events.OutputID derives from the request's (source, id). A verdict
// comes back as 200 with its exact bytes (application/cloudevents+json)
// and its signature headers; no verdict in time is a 202. The verdict is
// answered as it is heard on NATS, as an agent subscribed on NATS hears
// it: as the verdict stream takes it, a fsync before a durable server has
// stored it. Should that store fail, the processor acknowledges nothing
// and decides the request again, and the stream holds that decision.
// Waiting for the store would cost every answer that fsync.
//
// # Credentials and no deputy
//
// Auth maps bearer tokens to roles through a token file of SHA-256 hashes
// (Tokens; ParseTokens has the format; Reload on SIGHUP). An agent token
// reaches its sessions only and never sends control events; an operator
// token reaches every session and may send session.resumed. Without a
// token file every caller is the operator, and CheckListen allows only a
// loopback address. Auth's Session and Operator are what handlers mounted
// beside POST /v1/events (Server.Mount; the read endpoints) call before
// they answer.
//
// Nothing in a request chooses where the gateway writes: the subject is
// built by events.Subjects from the decoded, validated session id, and a
// control subject only for session.resumed from an operator token. Events
// are published on Config.Agent and control events on Config.Operator,
// separate NATS connections that serve gives the shipped agent and
// operator identities (--http-agent-*, --http-operator-*), so the NATS
// permissions still bound a slip in this code. Agent tokens narrowed to
// some sessions are narrowed by the gateway alone: the one agent NATS
// identity may publish to every session's events subject.
//
// A Server is safe for concurrent use; its zero Config fields mean the
// defaults of Config.
package gateway
