// Package seedref is the classic compaction check, ported to Go as it
// stands: the floor's unit must be the truncator's, the summarizer's input
// must start at or before the floor's start (tail_start minus the span),
// and no prior truncation may meet the floor's reach [tail_start - span,
// tail_start). It keeps every prior truncation and scans them all. The
// ledger's tests hold seamguard to refusing whatever it refuses, and the
// benchmark compares the ledger's decision cost with its scan.
package seedref
