package processor

import "github.com/seamguard/seamguard/spill"

// This file names where the processor's state is stored, spelled here once
// for the processor, the CLI and the bench: a JetStream KV bucket B is the
// stream KV_B, and its key K is the last message on $KV.B.K. The spill
// object store's layout is package spill's (spill.StreamName and the
// subjects beside it).

// KVStream is the stream that holds KV bucket bucket.
func KVStream(bucket string) string { return "KV_" + bucket }

// KVPrefix is the start of the subject of every key of KV bucket bucket.
func KVPrefix(bucket string) string { return "$KV." + bucket + "." }

// KVSubjects is the wildcard of every key subject of KV bucket bucket.
func KVSubjects(bucket string) string { return KVPrefix(bucket) + ">" }

// SessionsStream is the stream of the bucket of session states.
func (n Names) SessionsStream() string { return KVStream(n.Sessions) }

// LeasesStream is the stream of the bucket of partition leases.
func (n Names) LeasesStream() string { return KVStream(n.Leases) }

// SpillsStream is the stream of the spill object store.
func (n Names) SpillsStream() string { return spill.StreamName(n.Spills) }

// SessionSubject is the subject of session id's state in the bucket.
func (n Names) SessionSubject(id string) string { return KVPrefix(n.Sessions) + id }
