// Package workload builds deterministic fleets of session scripts for tests,
// the chaos harness and load runs: healthy compaction chains, seed-like
// stories that need spills, gaps that halt and are resumed, sessions with
// broken events among good ones, and unit mismatches, interleaved by a fixed
// seed. Each event is a structured CloudEvent line, published in binary or
// structured mode, with its id as the Nats-Msg-Id.
package workload
