// Package client is the Go client agents use to talk to seamguard: it
// publishes a session's events as CloudEvents to the events stream and
// waits for the verdicts on compaction requests.
//
//	c, _ := client.New(nc, client.Config{Source: "urn:agent:billing/worker-3"})
//	s, _ := c.Open(ctx, client.SessionConfig{ID: "ops-agent-42", Span: 12, // floor: the last 12 turns
//		OnRejected: func(e *client.RejectedError) { log.Print(e) }}) // events seamguard did not accept
//	s.Append(ctx, client.Turn{Role: "user", Content: "..."}) // at the head; the session counts offsets
//	s.Truncated(ctx, events.Range{Start: 0, End: 8}, "budget")
//	v, _ := s.Compact(ctx, events.CompactionRequested{...}) // request; retry after a spill, carry dropped pins
//	switch v.Kind() {
//	case events.KindAllowed: /* apply it */ s.Commit(ctx, v.Request.RequestID)
//	case events.KindRefused, events.KindHalted: // do not compact
//	}
//	s.Close(ctx)
//
// docs/agents.md maps every call to its name in the TypeScript client
// (clients/typescript), which offers the same.
//
// # Publishing
//
// Every event is a CloudEvents 1.0 event on <prefix>.events.<session>, in
// binary content mode by default (ce-specversion, ce-id, ce-source,
// ce-type, ce-subject and ce-time headers, values percent-encoded as the
// NATS protocol binding's draft asks; Content-Type application/json; the
// data as the body), or in structured mode with Config.Structured. Each is
// published with JetStream and its ack awaited before the session's next
// event is sent, so a session's events are stored in the order of the
// calls. The publish names the events stream it expects
// (Nats-Expected-Stream), so an event captured by some other stream is an
// error, not a silent loss.
//
// # Event ids and retries
//
// Event ids are random NUIDs, one per event, never derived from the session
// and a counter: an agent that restarts and resumes a session (see
// SessionConfig.Head) cannot collide with the ids it used before, which
// seamguard would drop as duplicates. Idempotence comes from reusing the id:
// every attempt to publish one event carries the same ce-id and the same
// Nats-Msg-Id, events.MsgID(source, id), so the stream's dedupe window (10
// minutes by default) drops an attempt whose first ack was lost. The
// message id is derived from the source and the id together, as CloudEvents
// identifies an event: another agent's event with the same id is a
// different message, and the stream keeps both. A duplicate ack counts as
// stored only after an attempt of the same event was stored or went
// unanswered; on the first attempt it means another message holds the
// message id, and the error wraps ErrMsgIDTaken (and ErrNotPublished): the
// client cannot read the stream to compare. When every attempt fails the
// method returns an error wrapping ErrNotPublished and the session keeps the
// event: it is sent again, same id, before the session's next event, or by
// Flush. Nothing later overtakes it. A turn in that state still counts as
// appended. The error is a *NotPublishedError naming the event; its Kept
// is false when the call sent nothing of its own because an earlier event
// is still pending. Session.Pending says whether one is.
//
// # Rejections
//
// A stored event is not an accepted one: seamguard reads it from the
// stream afterwards, and rejects what it cannot accept (a turn of a closed
// or unknown session, an offset that overlaps, a second open with another
// floor) with an event.rejected verdict on
// <prefix>.verdicts.<session>.rejected. The publish has succeeded by then,
// so the method returned nil. SessionConfig.OnRejected is called with
// each such rejection of the session's own events, as a *RejectedError;
// the session listens from before its session.opened until its close is
// stored. A rejected compaction request is RequestCompaction's error
// instead.
//
// # Verdicts
//
// RequestCompaction subscribes to <prefix>.verdicts.<session>.* (core NATS;
// the agent needs no JetStream API access), and only then publishes the
// request under a fresh event id. It returns the first allowed, refused or
// halted verdict whose causationid is that event id and whose request_id is
// the request's, or a *RejectedError if seamguard rejected the event. When
// the context ends first, the error is a *NoVerdictError naming the
// request; it wraps ErrNoVerdict and context.DeadlineExceeded. Switch on
// Verdict.Kind (events.KindAllowed, KindRefused, KindHalted) or on the
// type of its Data.
//
// A verdict heard on core NATS is heard as the verdict stream takes it,
// before it is stored. Should the stream fail to store it, the processor
// acknowledges nothing and decides the request again: the stream then
// holds that decision (the same verdict but for a halt for a spill that
// has since succeeded). The verdict stream, which a replay reads, is the
// record.
//
// A refusal with next "retry" carries a spill handle: seamguard wrote the
// whole transcript to the object store, so what the compaction drops can be
// re-read. Requesting the same compaction again is then allowed. Retry does
// it: same request_id (a compaction.committed names the request id, and
// counts its latest verdict), fresh event id.
//
// # Pinned turns
//
// A turn that is a rule the agent must keep in its working context for the
// session's life (a standing instruction, a constraint, the task
// statement) is appended with Turn.Pinned, or pinned later with Pin;
// Unpin releases it. seamguard then refuses every compaction that neither
// keeps the pinned turns in the tail nor lists them in carried_pins
// (events.CompactionRequested.CarriedPins: the turns the agent puts back
// into the new context verbatim, outside the summary), with next
// "carry_pins". A spill does not cure that: it keeps the transcript, not
// the context. MustCarryPins and DroppedPins read such a refusal;
// CarryPins requests the compaction again with the dropped pins added.
//
// Compact follows both flows: it retries after a refusal with next
// "retry", carries the pins after one with next "carry_pins", for at most
// a few requests under the same request id. The final verdict's Request
// says what was carried (the agent must put those turns back), and its
// Previous is the refusal before it.
//
// # Attributable verdicts
//
// Every message on the verdict subjects is verified before it counts
// (package attest): the processor signs each verdict's bytes with its
// NKey (headers Seamguard-Signer and Seamguard-Signature), and the
// verdict must be about the session and of the kind its subject names.
// Config.TrustedKeys lists the processors' public keys; without them a
// signature is checked against the key it names, which anyone can make.
// A message that fails is never returned as an answer: it is passed to
// Config.OnUnattributed, listed in the returned Verdict's Unattributed
// when it claimed to answer the request, and, when no genuine verdict
// comes before the context ends, named in the ErrNoVerdict error, which
// then also wraps ErrUnattributed. Verdict.Signer and Verdict.Trusted say
// who signed the answer.
//
// A core subscription is at-most-once: a verdict published while the
// client's connection is down is not delivered to it, and RequestCompaction
// then waits until its context ends. The verdict is still in the verdict
// stream (seamguard watch shows it); requesting the compaction again asks
// for a new evaluation.
//
// # Recovering a spill
//
// A refusal's spill (Verdict.Refused().Spill, or an allowed verdict's
// recovered_by) names the transcript seamguard kept in the object store.
// Session.Recover reads it back, with the whole chain of spills before it,
// oldest first, and writes it as JSON Lines (what `seamguard spill get`
// writes):
//
//	var transcript bytes.Buffer
//	chain, err := s.Recover(ctx, *v.Previous.Refused().Spill, &transcript)
//
// It needs no JetStream access: it asks the processor's recover service
// (a NATS micro service, see package processor) with requests on
// <prefix>.recover.<session>, one reply of at most 512 KiB each, and checks
// every object's size and SHA-256 digest against its handle.
// Session.RecoverTranscript does the same into memory and returns the
// transcript with its chain once every digest is checked. Errors wrap
// ErrNotRecovered and name the spill: a *RecoverError for the service's
// refusals (ErrSpillNotFound, ErrSpillForbidden for a spill of another
// session), ErrDigestMismatch, ErrBrokenChain, or the context's error.
// Each request waits at most AckTimeout and is sent at most 5 times while
// no processor answers; the context bounds the whole. Client.Recover and
// Client.RecoverTranscript do the same for a session id without a Session.
//
// # Concurrency
//
// A Client may be used by any number of goroutines. A Session is safe for
// concurrent use: publishes take its lock one at a time, and
// RequestCompaction holds the lock while it subscribes and publishes, not
// while it waits, so other goroutines may append meanwhile (the request
// then covers the head at the moment it was published). Recover takes no
// lock.
package client
