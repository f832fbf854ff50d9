// Package metrics exposes what seamguard's processor does as Prometheus
// metrics.
//
// A Recorder is a processor.Observer: pass it to processor.New with
// processor.WithObserver, and serve Handler on /metrics. Every label has a
// bounded set of values: input types and rejection codes come from the
// contract's fixed sets (anything else is counted as "invalid" or "other"),
// reasons are the contract's reason codes, consumers are the processor's own
// durable consumers. No label ever holds a session id.
//
// Decision latency is measured from the moment the processor received a
// compaction.requested message from the events stream (its fetch delivered
// it) until the verdict stream acknowledged the verdict that answers it
// (allowed, refused or halted). It includes the wait in the shard's queue,
// decoding, the decision, a spill when one is written, and the publish; it
// does not include storing the session state and acknowledging the input,
// which follow. A request applied by a catch-up (read from the stream ahead of
// its own delivery, as when a session is first read while its later messages
// are already on their way) is timed from the receipt of the message whose
// handling caught the session up.
//
// Consumer lag is polled: WatchConsumers asks the server for each consumer's
// info at an interval and sets the number of messages not yet delivered
// (num_pending) and delivered but not yet acknowledged (num_ack_pending).
// Every instance reports the same consumers, so aggregate with max, not sum.
package metrics
