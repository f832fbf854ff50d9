package processor

import (
	"math/rand"
	"slices"
	"testing"

	"github.com/nats-io/nats.go/jetstream"
)

// windowMsg stands for one delivery; the window only keeps and returns it.
type windowMsg struct {
	jetstream.Msg
	seq uint64
	n   int // which delivery of seq
}

// TestAckWindowOracle drives the window with random deliveries (with gaps,
// as other partitions' messages leave), placeholders, redeliveries,
// finishes in any order, terminations and prunes, and checks every release
// against a brute-force model of the server's pending set:
//   - safety: no ack or termination covers an input never finished;
//   - the acknowledgement of an input goes through its newest delivery;
//   - terminations come for exactly the rejected inputs delivered here;
//   - liveness: once everything is finished, the floor reaches the last
//     input delivered here and nothing but trailing placeholders is left.
func TestAckWindowOracle(t *testing.T) {
	for seed := int64(1); seed <= 400; seed++ {
		r := rand.New(rand.NewSource(seed))
		w := &ackWindow{}
		var next, floor uint64 = 1, 0
		finished := map[uint64]bool{}     // finished at least once
		latest := map[uint64]*windowMsg{} // newest delivery here; absent: placeholder
		open := map[uint64]bool{}         // tracked and not finished since its newest delivery
		rejected := map[uint64]string{}   // finished as rejected (newest finish)
		termSent := map[uint64]bool{}     // terminations sent
		fresh := func(hold bool) {
			next += uint64(r.Intn(3))
			seq := next
			next++
			open[seq] = true
			if hold {
				w.hold(seq)
				return
			}
			m := &windowMsg{seq: seq}
			latest[seq] = m
			w.add(seq, m)
		}
		pickOpen := func() (uint64, bool) {
			var keys []uint64
			for s := range open {
				keys = append(keys, s)
			}
			if len(keys) == 0 {
				return 0, false
			}
			slices.Sort(keys)
			return keys[r.Intn(len(keys))], true
		}
		release := func() {
			acts := w.release()
			var last uint64
			for i, a := range acts {
				m := a.msg.(*windowMsg)
				if m.seq < last {
					t.Fatalf("seed %d: release out of order: %d after %d", seed, m.seq, last)
				}
				last = m.seq
				if latest[m.seq] != m {
					t.Fatalf("seed %d: seq %d acknowledged through delivery %d, not the newest", seed, m.seq, m.n)
				}
				if a.term != "" {
					if rejected[m.seq] != a.term {
						t.Fatalf("seed %d: seq %d terminated with %q, finished with %q", seed, m.seq, a.term, rejected[m.seq])
					}
					termSent[m.seq] = true
				} else if i != len(acts)-1 {
					t.Fatalf("seed %d: a plain ack before the end of a release", seed)
				}
				floor = max(floor, m.seq)
			}
			for s := range latest {
				if s <= floor && !finished[s] {
					t.Fatalf("seed %d: floor %d covers seq %d, never finished", seed, floor, s)
				}
			}
			for s := range open {
				if s <= floor && !finished[s] {
					t.Fatalf("seed %d: floor %d covers placeholder %d, never finished", seed, floor, s)
				}
			}
		}
		for step := 0; step < 500; step++ {
			switch op := r.Intn(20); {
			case op < 7:
				fresh(false)
			case op == 7:
				fresh(true)
			case op == 8: // a redelivery of something not acknowledged yet
				var cand []uint64
				for s := range latest {
					if s > floor {
						cand = append(cand, s)
					}
				}
				if len(cand) == 0 {
					continue
				}
				slices.Sort(cand)
				s := cand[r.Intn(len(cand))]
				m := &windowMsg{seq: s, n: latest[s].n + 1}
				latest[s] = m
				open[s] = true
				delete(rejected, s)
				w.add(s, m)
			case op < 16:
				s, ok := pickOpen()
				if !ok {
					continue
				}
				term := ""
				if latest[s] != nil && r.Intn(6) == 0 {
					term = "rejected"
					rejected[s] = term
				}
				var m jetstream.Msg
				if latest[s] != nil {
					m = latest[s]
				}
				w.finish(s, m, term)
				finished[s] = true
				delete(open, s)
			case op < 19:
				release()
			default:
				w.prune(floor)
			}
		}
		for {
			s, ok := pickOpen()
			if !ok {
				break
			}
			var m jetstream.Msg
			if latest[s] != nil {
				m = latest[s]
			}
			w.finish(s, m, "")
			delete(rejected, s)
			finished[s] = true
			delete(open, s)
		}
		release()
		var lastReal uint64
		for s := range latest {
			lastReal = max(lastReal, s)
		}
		if floor < lastReal {
			t.Fatalf("seed %d: all finished, floor %d below the last delivery %d", seed, floor, lastReal)
		}
		w.mu.Lock()
		for _, p := range w.q[w.head:] {
			if p.msg != nil || p.seq < lastReal {
				t.Fatalf("seed %d: left in the window after the last release: %+v", seed, p)
			}
		}
		w.mu.Unlock()
		for s, term := range rejected {
			if term != "" && s <= floor && !termSent[s] {
				t.Fatalf("seed %d: seq %d was rejected and acknowledged without its termination", seed, s)
			}
		}
	}
}

// TestAckWindowExplicit: the window of the consumer of inputs that name no
// session releases each finished input at once, in any order.
func TestAckWindowExplicit(t *testing.T) {
	w := &ackWindow{explicit: true}
	a, b := &windowMsg{seq: 5}, &windowMsg{seq: 3}
	w.add(5, a)
	w.add(3, b)
	w.finish(5, a, "rejected")
	acts := w.release()
	if len(acts) != 1 || acts[0].msg != a || acts[0].term != "rejected" {
		t.Fatalf("release = %+v", acts)
	}
	if w.pending() != 0 {
		t.Fatalf("pending = %d", w.pending())
	}
	w.finish(3, b, "")
	if acts := w.release(); len(acts) != 1 || acts[0].msg != b || acts[0].term != "" {
		t.Fatalf("release = %+v", acts)
	}
}

// TestAckWindowWaits: an unfinished input holds back the acks of every
// later one; a placeholder is never acknowledged through, and a prune of the
// server's floor lets the window past what another instance acknowledged.
func TestAckWindowWaits(t *testing.T) {
	w := &ackWindow{}
	m := map[uint64]*windowMsg{}
	for _, s := range []uint64{10, 12, 13} {
		m[s] = &windowMsg{seq: s}
		w.add(s, m[s])
	}
	w.hold(11)
	w.finish(12, m[12], "")
	w.finish(13, m[13], "")
	if acts := w.release(); len(acts) != 0 {
		t.Fatalf("released %+v while 10 and 11 are open", acts)
	}
	w.finish(10, m[10], "")
	if acts := w.release(); len(acts) != 1 || acts[0].msg != m[10] {
		t.Fatalf("release = %+v, want the ack of 10 alone", acts)
	}
	w.prune(11) // another instance acknowledged 11
	acts := w.release()
	if len(acts) != 1 || acts[0].msg != m[13] {
		t.Fatalf("release = %+v, want the ack of 13", acts)
	}
	w.hold(20)
	w.finish(20, nil, "")
	if acts := w.release(); len(acts) != 0 {
		t.Fatalf("released %+v through a placeholder", acts)
	}
	m[21] = &windowMsg{seq: 21}
	w.add(21, m[21])
	w.finish(21, m[21], "")
	if acts := w.release(); len(acts) != 1 || acts[0].msg != m[21] {
		t.Fatalf("release = %+v, want the ack of 21", acts)
	}
	if w.pending() != 0 {
		t.Fatalf("pending = %d", w.pending())
	}
}

// TestAckWindowBlockedBehindPlaceholders: finished placeholders ahead of
// an unfinished one leave the window blocked (a delivery after them cannot
// be acknowledged), so that the fetcher reads the consumer's ack floor and
// prunes what another instance acknowledged meanwhile.
func TestAckWindowBlockedBehindPlaceholders(t *testing.T) {
	w := &ackWindow{}
	for _, s := range []uint64{3170, 3181, 3199} {
		w.hold(s)
	}
	w.finish(3170, nil, "")
	w.finish(3181, nil, "")
	m := &windowMsg{seq: 4000}
	w.add(4000, m)
	w.finish(4000, m, "")
	if acts := w.release(); len(acts) != 0 {
		t.Fatalf("released %+v while 3199 is open", acts)
	}
	if !w.blocked() {
		t.Fatal("not blocked: 3199 is open ahead of 4000, behind finished placeholders")
	}
	w.prune(3988) // another instance acknowledged up to 3988
	if w.blocked() {
		t.Fatal("blocked after the prune")
	}
	if acts := w.release(); len(acts) != 1 || acts[0].msg != m {
		t.Fatalf("release = %+v, want the ack of 4000", acts)
	}
	w.hold(5000)
	w.finish(5000, nil, "")
	if w.blocked() {
		t.Fatal("blocked by a finished placeholder alone")
	}
}

// TestAckWindowDescribe: what a stalled test prints of a window names its
// first inputs and which of them are placeholders and finished.
func TestAckWindowDescribe(t *testing.T) {
	w := &ackWindow{}
	w.add(3, windowMsg{seq: 3})
	w.hold(5)
	w.add(7, windowMsg{seq: 7})
	w.finish(5, nil, "")
	if got, want := w.describe(), "3 inputs (1 finished, 1 placeholders): 3 5/held/done 7"; got != want {
		t.Fatalf("describe = %q, want %q", got, want)
	}
	w.finish(3, windowMsg{seq: 3}, "")
	w.finish(7, windowMsg{seq: 7}, "")
	w.release()
	if got, want := w.describe(), "0 inputs (0 finished, 0 placeholders)"; got != want {
		t.Fatalf("describe after release = %q, want %q", got, want)
	}
}
