package processor

import (
	"fmt"
	"strings"
	"time"
)

// IdleAfterEveryBatch makes every shard turn every session it can into its
// snapshot after each batch, so that each is restored for its next event.
// It returns the function that puts things back. Call it only while no
// processor runs.
func IdleAfterEveryBatch() (restore func()) {
	idleAll = true
	return func() { idleAll = false }
}

// AnswerAnyReply turns the services' reply subject check off, as a build
// without it would be, so that a test can show what the check stops. It
// returns the function that turns it on again.
func AnswerAnyReply() (restore func()) {
	answerAnyReply.Store(true)
	return func() { answerAnyReply.Store(false) }
}

// OnRebuildHolding has every rebuild call f once it holds every
// partition's lease, before it reads anything (f may block, to hold the
// rebuild there). It returns the function that puts things back. Call it
// only while no rebuild runs.
func OnRebuildHolding(f func()) (restore func()) {
	rebuildHolding = f
	return func() { rebuildHolding = nil }
}

// LookupsLag has every catch-up lookup of a filter f returns true for
// answer that nothing follows, as a stream leader that has not applied its
// log yet does. It returns the function that puts things back. Call it
// only while no processor runs.
func LookupsLag(f func(filter string) bool) (restore func()) {
	lookupLags = f
	return func() { lookupLags = nil }
}

// SpillsFail has every spill attempt fail with f's error first, when f
// returns one, and a spill halt only after its failures span at least
// failFor. It returns the function that puts things back. Call it only
// while no processor runs.
func SpillsFail(f func() error, failFor time.Duration) (restore func()) {
	old := spillFailFor
	spillFails, spillFailFor = f, failFor
	return func() { spillFails, spillFailFor = nil, old }
}

// FirstRoundTakes has the first round of a shard wait until it holds n
// inputs, so that a test can put inputs in one round. It returns the
// function that puts things back.
func FirstRoundTakes(n int) (restore func()) {
	firstRoundTakes.Store(int32(n))
	return func() { firstRoundTakes.Store(0) }
}

// AckWindows describes each of p's ack windows (by consumer name) that
// holds inputs.
func (p *Processor) AckWindows() map[string]string {
	out := map[string]string{}
	p.windows.Range(func(k, v any) bool {
		if w := v.(*ackWindow); w.pending() > 0 {
			out[k.(string)] = w.describe()
		}
		return true
	})
	return out
}

// describe says what holds the window back, for a stalled test: its
// inputs, how many are finished and placeholders, and its first few.
func (w *ackWindow) describe() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	q := w.q[w.head:]
	var done, held int
	for _, p := range q {
		if p.done {
			done++
		}
		if p.msg == nil {
			held++
		}
	}
	var b strings.Builder
	fmt.Fprintf(&b, "%d inputs (%d finished, %d placeholders)", len(q), done, held)
	for i, p := range q[:min(len(q), 8)] {
		if i == 0 {
			b.WriteString(":")
		}
		fmt.Fprintf(&b, " %d", p.seq)
		if p.msg == nil {
			b.WriteString("/held")
		}
		if p.done {
			b.WriteString("/done")
		}
	}
	return b.String()
}

// FloorsOnEveryGroup has every group of states carry the partitions'
// floors, however few states it holds. It returns the function that puts
// things back. Call it only while no processor runs.
func FloorsOnEveryGroup() (restore func()) {
	floorMinGroup, floorEvery = 1, 0
	return func() { floorMinGroup, floorEvery = minAtomicBatch, 100*time.Millisecond }
}

// Configured is configured: whether a consumer's stored configuration is
// the one a processor gives it.
var Configured = configured
