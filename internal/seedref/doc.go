// Package seedref is the reference compaction check of the seed document
// (shared/seed/unrecoverable-tail-invariant.md), ported to Go as it stands:
// the ledger's tests hold seamguard to refusing whatever it refuses, and the
// benchmark compares the ledger's decision cost with its scan.
package seedref
