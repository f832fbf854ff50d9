package metrics

import (
	"context"
	"log/slog"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// WatchConsumers sets seamguard_consumer_lag and
// seamguard_consumer_ack_pending for each named consumer of stream, asking
// the server every interval (the first time one interval after the call, when
// the processor has created its consumers) until ctx ends. It returns when
// ctx ends. A consumer whose info cannot be read keeps its last values and
// counts in seamguard_consumer_poll_errors_total; the first failure of a
// streak is logged at warn, the rest at debug.
func (r *Recorder) WatchConsumers(ctx context.Context, js jetstream.JetStream, stream string, consumers []string, every time.Duration, log *slog.Logger) {
	if every <= 0 {
		every = 15 * time.Second
	}
	failing := false
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		failing = !r.pollConsumers(ctx, js, stream, consumers, log, failing)
	}
}

// pollConsumers reads every consumer's info once; it reports whether all
// could be read.
func (r *Recorder) pollConsumers(ctx context.Context, js jetstream.JetStream, stream string, consumers []string, log *slog.Logger, failing bool) bool {
	ok := true
	for _, name := range consumers {
		cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		info, err := consumerInfo(cctx, js, stream, name)
		cancel()
		if err != nil {
			if ctx.Err() != nil {
				return ok
			}
			r.pollErrors.Inc()
			level := slog.LevelWarn
			if failing || !ok {
				level = slog.LevelDebug
			}
			log.Log(ctx, level, "cannot read a consumer's state for the lag metric", "consumer", name, "err", err)
			ok = false
			continue
		}
		r.consumerLag.WithLabelValues(name).Set(float64(info.NumPending))
		r.consumerPending.WithLabelValues(name).Set(float64(info.NumAckPending))
	}
	return ok
}

func consumerInfo(ctx context.Context, js jetstream.JetStream, stream, name string) (*jetstream.ConsumerInfo, error) {
	c, err := js.Consumer(ctx, stream, name)
	if err != nil {
		return nil, err
	}
	return c.CachedInfo(), nil
}
