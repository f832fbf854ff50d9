package processor

import (
	"context"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// pendingAfter is a delivery whose consumer had n messages to deliver after
// it.
func pendingAfter(seq, n uint64) delivery {
	return delivery{meta: &jetstream.MsgMetadata{Sequence: jetstream.SequencePair{Stream: seq}, NumPending: n}}
}

// slowLinger makes the shard wait for a backlog's deliveries gap each and
// most in all for the rest of t, slower than its own, so that the
// machine's load does not make a pause of a test's steady deliveries.
func slowLinger(t *testing.T, gap, most time.Duration) {
	g, m := lingerGap, lingerMax
	lingerGap, lingerMax = gap, most
	t.Cleanup(func() { lingerGap, lingerMax = g, m })
}

func seqsOf(batch []delivery) []uint64 {
	out := make([]uint64, len(batch))
	for i, d := range batch {
		out[i] = d.seq()
	}
	return out
}

// TestTakeLoneInputAtOnce: a delivery after which the consumer had nothing
// more is decided at once, whatever arrives a moment later.
func TestTakeLoneInputAtOnce(t *testing.T) {
	s := &shard{q: make(chan delivery, 8)}
	go func() {
		time.Sleep(50 * time.Millisecond)
		s.q <- pendingAfter(2, 0)
	}()
	start := time.Now()
	batch := s.take(context.Background(), append(make([]delivery, 0, 8), pendingAfter(1, 0)))
	assert.Equal(t, []uint64{1}, seqsOf(batch))
	assert.Less(t, time.Since(start), 40*time.Millisecond, "a lone input waited for the next")
}

// TestTakeWaitsOutABacklog: while the consumer reports more on its way,
// the batch takes what arrives, until a delivery after which nothing is
// pending.
func TestTakeWaitsOutABacklog(t *testing.T) {
	slowLinger(t, time.Second, 5*time.Second)
	s := &shard{q: make(chan delivery, 8)}
	go func() {
		for seq := uint64(2); seq <= 4; seq++ {
			time.Sleep(5 * time.Millisecond)
			s.q <- pendingAfter(seq, 4-seq)
		}
		time.Sleep(5 * time.Millisecond)
		s.q <- pendingAfter(5, 0) // a later fetch's: not waited for
	}()
	batch := s.take(context.Background(), append(make([]delivery, 0, 8), pendingAfter(1, 3)))
	require.Equal(t, []uint64{1, 2, 3, 4}, seqsOf(batch))
}

// TestTakeBounded: a backlog that pauses, or that trickles on past
// lingerMax, or a full batch, ends the wait.
func TestTakeBounded(t *testing.T) {
	t.Run("a pause", func(t *testing.T) {
		s := &shard{q: make(chan delivery, 8)}
		start := time.Now()
		batch := s.take(context.Background(), append(make([]delivery, 0, 8), pendingAfter(1, 100)))
		assert.Equal(t, []uint64{1}, seqsOf(batch))
		assert.GreaterOrEqual(t, time.Since(start), lingerGap)
		assert.Less(t, time.Since(start), lingerMax+50*time.Millisecond)
	})
	t.Run("a trickle", func(t *testing.T) {
		slowLinger(t, 100*time.Millisecond, 300*time.Millisecond)
		s := &shard{q: make(chan delivery, 1024)}
		stop := make(chan struct{})
		defer close(stop)
		go func() {
			for seq := uint64(2); ; seq++ {
				select {
				case <-stop:
					return
				case <-time.After(5 * time.Millisecond):
				}
				select {
				case s.q <- pendingAfter(seq, 1000):
				case <-stop:
					return
				}
			}
		}()
		start := time.Now()
		batch := s.take(context.Background(), append(make([]delivery, 0, 1024), pendingAfter(1, 1000)))
		took := time.Since(start)
		assert.Greater(t, len(batch), 1)
		assert.GreaterOrEqual(t, took, lingerMax-lingerGap)
		assert.Less(t, took, lingerMax+lingerGap)
	})
	t.Run("full", func(t *testing.T) {
		slowLinger(t, time.Second, 5*time.Second)
		s := &shard{q: make(chan delivery, 8)}
		for seq := uint64(2); seq <= 6; seq++ {
			s.q <- pendingAfter(seq, 100)
		}
		start := time.Now()
		batch := s.take(context.Background(), append(make([]delivery, 0, 4), pendingAfter(1, 100)))
		assert.Equal(t, []uint64{1, 2, 3, 4}, seqsOf(batch))
		assert.Less(t, time.Since(start), lingerGap/2, "a full batch waited")
		assert.Len(t, s.q, 2)
	})
	t.Run("closed", func(t *testing.T) {
		s := &shard{q: make(chan delivery, 8)}
		s.q <- pendingAfter(2, 100)
		close(s.q)
		batch := s.take(context.Background(), append(make([]delivery, 0, 8), pendingAfter(1, 100)))
		assert.Equal(t, []uint64{1, 2}, seqsOf(batch))
	})
}

// TestTakeNoWaitWithARoundPending: under load, while the shard's last
// round is being stored, a batch is what queued meanwhile.
func TestTakeNoWaitWithARoundPending(t *testing.T) {
	slowLinger(t, time.Second, 5*time.Second)
	s := &shard{q: make(chan delivery, 8), pending: &round{}}
	s.q <- pendingAfter(2, 100)
	start := time.Now()
	batch := s.take(context.Background(), append(make([]delivery, 0, 8), pendingAfter(1, 100)))
	assert.Equal(t, []uint64{1, 2}, seqsOf(batch))
	assert.Less(t, time.Since(start), lingerGap/2, "waited with a round pending")
}
