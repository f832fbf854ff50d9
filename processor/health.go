package processor

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/seamguard/seamguard/spill"
)

// troubles are what keeps the processor from doing its work now: a session
// whose effects cannot be made durable (stuck), the leases bucket not
// answering, a consumer that cannot fetch. Ready reports unready while any
// is set. Safe for concurrent use.
type troubles struct {
	mu    sync.Mutex
	m     map[string]trouble
	stuck atomic.Int64 // how many keys name a session
}

type trouble struct {
	err   error
	since time.Time
}

// stuckPrefix starts the key of a stuck session.
const stuckPrefix = "session "

func (t *troubles) set(key string, err error) (first bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.m == nil {
		t.m = map[string]trouble{}
	}
	old, had := t.m[key]
	since := time.Now()
	if had {
		since = old.since
	} else if strings.HasPrefix(key, stuckPrefix) {
		t.stuck.Add(1)
	}
	t.m[key] = trouble{err: err, since: since}
	return !had
}

func (t *troubles) clear(key string) (was bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if _, ok := t.m[key]; !ok {
		return false
	}
	delete(t.m, key)
	if strings.HasPrefix(key, stuckPrefix) {
		t.stuck.Add(-1)
	}
	return true
}

// since returns when key became a trouble, if it is one now.
func (t *troubles) since(key string) (time.Time, bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	tr, ok := t.m[key]
	return tr.since, ok
}

// has reports whether key is a trouble now.
func (t *troubles) has(key string) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	_, ok := t.m[key]
	return ok
}

// err describes every trouble, the oldest first, or returns nil.
func (t *troubles) err() error {
	t.mu.Lock()
	defer t.mu.Unlock()
	if len(t.m) == 0 {
		return nil
	}
	keys := make([]string, 0, len(t.m))
	for k := range t.m {
		keys = append(keys, k)
	}
	slices.SortFunc(keys, func(a, b string) int {
		if c := t.m[a].since.Compare(t.m[b].since); c != 0 {
			return c
		}
		return strings.Compare(a, b)
	})
	const most = 8
	var b strings.Builder
	errs := []error{ErrNotReady}
	for i, k := range keys {
		errs = append(errs, t.m[k].err)
		if i == most {
			fmt.Fprintf(&b, "; and %d more", len(keys)-most)
			break
		}
		if i > 0 {
			b.WriteString("; ")
		}
		fmt.Fprintf(&b, "%s: %v (since %s)", k, t.m[k].err, t.m[k].since.UTC().Format(time.RFC3339))
	}
	return notReady{msg: ErrNotReady.Error() + ": " + b.String(), errs: errs}
}

// notReady is what Ready reports: ErrNotReady and every trouble's error,
// for errors.Is and errors.As, in one message.
type notReady struct {
	msg  string
	errs []error
}

func (e notReady) Error() string   { return e.msg }
func (e notReady) Unwrap() []error { return e.errs }

// StuckSessions returns how many sessions are stuck now: their inputs wait,
// unacknowledged, because their effects could not be made durable. Safe for
// concurrent use.
func (p *Processor) StuckSessions() int { return int(p.health.stuck.Load()) }

// budget bounds how long the transient failures of one batch are retried
// in place. It starts at the batch's first failure and is shared by every
// retry loop of the batch, so a server that stays away costs a batch
// RetryFor once, not once per session. The zero value never gives up (a
// Rebuild, which runs before consuming and fails as a whole).
type budget struct {
	limit  time.Duration
	first  time.Time
	notice func(error) // told of every failure; may be nil
}

// retry decides about attempt n's failure err: a permanent failure (see
// spill.Permanent) or a spent budget is returned wrapped, so that the
// caller gives up at once; otherwise it sleeps the backoff (never past the
// budget) and returns nil, or ctx's error.
func (b *budget) retry(ctx context.Context, n int, err error) error {
	if b != nil && b.notice != nil {
		b.notice(err)
	}
	if spill.Permanent(err) {
		return fmt.Errorf("%w: %w", errPermanent, err)
	}
	d := backoff(n)
	if b != nil && b.limit > 0 {
		now := time.Now()
		if b.first.IsZero() {
			b.first = now
		}
		left := b.limit - now.Sub(b.first)
		if left <= 0 {
			return fmt.Errorf("%w (%s): %w", errGaveUp, b.limit, err)
		}
		d = min(d, left)
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}
