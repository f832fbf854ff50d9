// Package jsread reads JetStream streams without creating a consumer.
//
// An identity that may create a consumer may create a push consumer, and a
// push consumer's deliver subject is in the request's body, where subject
// permissions cannot reach: the server would deliver the stream's messages
// wherever it says, on that identity's behalf. The operator's tools
// (inspect, replay, watch, spill get, resume's wait) therefore read with
// plain get requests, whose answers come only to the requester's own
// inbox, and the operator identity holds no consumer API at all.
//
// A Reader reads one stream in one of two ways:
//
//   - Batched direct get, for a stream with allow_direct (the verdict
//     stream, the object store's and KV buckets' streams): one request on
//     $JS.API.DIRECT.GET.<stream> with a body
//     {"seq":N,"next_by_subj":FILTER,"batch":K,"max_bytes":B} is answered
//     by up to K messages (each with the headers Nats-Stream,
//     Nats-Subject, Nats-Sequence, Nats-Time-Stamp, Nats-Num-Pending and
//     Nats-Last-Sequence added to its own), then a status message
//     "204 EOB" carrying Nats-Num-Pending (what matches after the batch)
//     and Nats-Last-Sequence; a request that finds nothing is answered
//     "404 Message Not Found". Any replica may answer, and a replica may
//     lag its leader: with Reader.Confirm, an end of the stream reached
//     before the sequence asked for is confirmed by the leader (below).
//   - $JS.API.STREAM.MSG.GET.<stream>, answered by the stream's leader
//     alone, one message a request (JSON, the message in base64), for
//     streams without allow_direct, or with Reader.Direct turned off (the
//     events stream, which allows direct gets for the processor's lookups
//     alone: the operator's tools read it from its leader). LeaderGet is
//     one such request, where an answer must not come from a replica (as
//     nats.go's Stream.GetMsg sends on a stream that allows direct gets). A
//     read of the whole stream keeps Reader.Window requests for
//     consecutive sequences in flight; a filtered read asks for the next
//     message on each filter subject (next_by_subj) from where the last
//     one was found, one request in flight per filter, and merges the
//     filters in sequence order.
//
// Read delivers the messages of a sequence range in order, each once,
// and never waits for messages not yet stored. Follow reads on from a
// sequence and then waits for more, woken by a core NATS subscription to
// the stream's subjects (when the identity may subscribe to them) or a
// poll, until its context ends.
//
// Every wait for an answer is bounded by Reader.Timeout. A request the
// server refuses for permissions gets no answer: the caller's context (see
// the CLI's denials) or that timeout ends the read.
//
// A Reader is a plain value; its methods may be called concurrently, each
// call using an inbox of its own.
package jsread
