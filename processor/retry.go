package processor

import (
	"context"
	"log/slog"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/seamguard/seamguard/internal/jsfail"
)

// This file holds what makes retries end: which errors are worth waiting
// for, bounded backoff, and the keep-alive of a long input.

// starting runs f, the setting up of what the processor needs, again while
// it fails because NATS does not answer (a cluster restarting, electing
// its leaders), for at most timeout, and returns its last error.
//
// Each attempt gets at most a quarter of timeout (and at least 5s): a
// server without a JetStream quorum leaves API requests unanswered, and
// one would otherwise wait for ctx's own deadline.
func starting(ctx context.Context, log *slog.Logger, timeout time.Duration, what string, f func(context.Context) error) error {
	deadline := time.Now().Add(timeout)
	for attempt := 0; ; attempt++ {
		actx, cancel := context.WithTimeout(ctx, max(timeout/4, startAttemptMin))
		err := f(actx)
		cancel()
		if err == nil || !waitable(err) || ctx.Err() != nil || time.Now().After(deadline) {
			return err
		}
		log.Warn("NATS does not answer yet; retrying", "doing", what, "err", err, "attempt", attempt+1, "gives_up_in", time.Until(deadline).Round(time.Second))
		if sleep(ctx, min(backoff(attempt), time.Until(deadline))) != nil {
			return err
		}
	}
}

// waitable reports whether a failure (to set up, or of a spill) may pass
// by itself (jsfail.Waitable).
func waitable(err error) bool { return jsfail.Waitable(err) }

// Unreachable reports whether err says that NATS or JetStream did not
// answer at all (a timeout, no responders, a connection being
// re-established, a server shutting down), as while a server restarts:
// trying again later may succeed. The object store did not fail then; it
// was not reached, and halting a session for it would turn a restart into
// an operator's chore.
func Unreachable(err error) bool { return jsfail.Unreachable(err) }

// keepAlive tells the server every interval that m is still being worked on.
func keepAlive(ctx context.Context, m jetstream.Msg, every time.Duration) func() {
	if m == nil {
		return func() {} // catching up for a marker: nothing delivered here to keep
	}
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		t := time.NewTicker(every)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
				_ = m.InProgress()
			}
		}
	}()
	return func() { cancel(); <-done }
}

// backoff is the delay before retry attempt n: backoffFirst doubling to
// backoffMax.
func backoff(n int) time.Duration {
	d := backoffFirst << min(n, 6)
	return min(d, backoffMax)
}

func sleep(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}
