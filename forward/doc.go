// Package forward delivers verdicts to HTTP endpoints as CloudEvents in
// binary mode (seamguard forward; docs/forward.md), for subscribers that
// have no NATS client: Knative, Argo Events, paging relays, a function.
//
// A Forwarder reads the verdict stream through a durable pull consumer
// whose name (Config.Name, by default DefaultName of the URL and filters)
// several forwarder processes share: each verdict goes to one of them. The
// consumer filters by the verdict subjects <prefix>.verdicts.<session>.<kind>
// for Config.Session and Config.Kinds, and starts, when it is first
// created, where Config.From says (by default at the verdicts decided after
// that); later it resumes where it stands.
//
// Each worker (Config.Concurrency, default 1: stream order) pulls one
// verdict at a time, verifies its signature (attest, as watch does), and
// POSTs it: sdk-go's HTTP binding writes the stored event's attributes as
// ce-* headers (percent-encoded as the binding asks) and its data, exactly
// as stored, as the body, with Content-Type application/json. The verdict's
// signature headers go along with Seamguard-Envelope and
// Seamguard-Data-Offset, from which VerifyRequest rebuilds the signed
// bytes, so a receiver can check the verdict is the processor's.
//
// At least once: a verdict is acknowledged only after a 2xx. A 5xx, 408,
// 429, timeout or connection failure is tried again after an exponential
// backoff with jitter (at least what a Retry-After asks, up to
// Config.MaxRetryAfter), while the message is kept in progress so that no
// other forwarder takes it, up to Config.MaxAttempts. Any other answer, an
// exhausted bound, a verdict that fails verification or is no CloudEvent:
// the verdict is kept in the Undeliverable stream (<PREFIX>_UNDELIVERABLE,
// file storage) with the reason, last status and attempts, and only then
// terminated in the consumer. Undeliverable.List and Redeliver are what
// seamguard forward failed and retry run; a kept verdict is removed only
// after a 2xx.
//
// Config is a plain value whose zero fields mean the defaults; Validate
// reports every problem at once. A Forwarder's Run is called once; Stats
// is safe from any goroutine. An Undeliverable is safe for concurrent use.
package forward
