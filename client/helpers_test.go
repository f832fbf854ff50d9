package client_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/seamguard/seamguard/events"
	"github.com/seamguard/seamguard/internal/embedded"
	"github.com/seamguard/seamguard/processor"
)

// seamguard is what an agent talks to, all in-process: an embedded
// nats-server with JetStream on loopback, a connection to it, and (unless
// asked not to) a processor running against it.
type seamguard struct {
	srv  *server.Server
	dir  string
	nc   *nats.Conn
	js   jetstream.JetStream
	cfg  processor.Config
	proc *processor.Processor
	stop context.CancelFunc
	done chan error
}

// processorConfig is the processor configuration of these tests: one
// partition (one consumer), a short pinned TTL, file storage.
func processorConfig() processor.Config {
	return processor.Config{Partitions: 1, LeaseTTL: 2 * time.Second}
}

// startSeamguard starts the server and provisions seamguard's streams;
// with run it also starts the processor. Close stops everything.
func startSeamguard(cfg processor.Config, run bool) (*seamguard, error) {
	dir, err := os.MkdirTemp("", "seamguard-client-")
	if err != nil {
		return nil, err
	}
	sg := &seamguard{dir: dir, cfg: cfg}
	if sg.srv, err = embedded.Start(embedded.Config{StoreDir: dir}); err != nil {
		sg.Close()
		return nil, err
	}
	if sg.nc, err = nats.Connect(sg.srv.ClientURL()); err != nil {
		sg.Close()
		return nil, err
	}
	if sg.js, err = jetstream.New(sg.nc); err != nil {
		sg.Close()
		return nil, err
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if sg.proc, err = processor.New(ctx, sg.js, cfg, processor.WithClock(fixedNow)); err != nil {
		sg.Close()
		return nil, err
	}
	if run {
		sg.Run()
	}
	return sg, nil
}

// fixedNow stamps every verdict.
func fixedNow() time.Time { return time.Date(2026, 11, 2, 10, 0, 0, 0, time.UTC) }

// Run starts the processor.
func (sg *seamguard) Run() {
	ctx, cancel := context.WithCancel(context.Background())
	sg.stop, sg.done = cancel, make(chan error, 1)
	go func() { sg.done <- sg.proc.Run(ctx) }()
}

// Close drains the processor, closes the connection, stops the server and
// removes its storage. It returns the processor's error, if any.
func (sg *seamguard) Close() error {
	var err error
	if sg.stop != nil {
		sg.stop()
		select {
		case err = <-sg.done:
		case <-time.After(30 * time.Second):
			sg.proc.Abort()
			err = errors.New("the processor did not drain within 30s")
			<-sg.done
		}
		sg.stop = nil
	}
	if sg.nc != nil {
		sg.nc.Close()
	}
	if sg.srv != nil {
		sg.srv.Shutdown()
		sg.srv.WaitForShutdown()
	}
	os.RemoveAll(sg.dir)
	return err
}

// mustStart is startSeamguard for examples, which have no *testing.T.
func mustStart(run bool) *seamguard {
	sg, err := startSeamguard(processorConfig(), run)
	if err != nil {
		panic(fmt.Sprintf("starting nats-server and the seamguard processor: %v", err))
	}
	return sg
}

// newSeamguard is startSeamguard for tests.
func newSeamguard(t *testing.T, run bool) *seamguard {
	t.Helper()
	sg, err := startSeamguard(processorConfig(), run)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := sg.Close(); err != nil {
			t.Errorf("processor: %v", err)
		}
	})
	return sg
}

// testContext is a context that ends with the test, or after a minute.
func testContext(t *testing.T) context.Context {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	t.Cleanup(cancel)
	return ctx
}

// verdicts reads the verdict stream from the start until it holds want
// verdicts (or the deadline passes) and returns them, decoded, in order.
func (sg *seamguard) verdicts(ctx context.Context, want int, within time.Duration) ([]*events.Verdict, error) {
	ctx, cancel := context.WithTimeout(ctx, within)
	defer cancel()
	cons, err := sg.js.OrderedConsumer(ctx, sg.cfg.Names().Verdicts, jetstream.OrderedConsumerConfig{})
	if err != nil {
		return nil, err
	}
	var out []*events.Verdict
	for len(out) < want {
		m, err := cons.Next(jetstream.FetchContext(ctx))
		if err != nil {
			return out, fmt.Errorf("after %d of %d verdicts: %w", len(out), want, err)
		}
		v, err := events.DecodeVerdict(m.Data())
		if err != nil {
			return out, fmt.Errorf("verdict on %s: %w", m.Subject(), err)
		}
		out = append(out, v)
	}
	return out, nil
}

// eventsInStream returns the number of messages in the events stream.
func (sg *seamguard) eventsInStream(ctx context.Context) (uint64, error) {
	s, err := sg.js.Stream(ctx, sg.cfg.Names().Events)
	if err != nil {
		return 0, err
	}
	info, err := s.Info(ctx)
	if err != nil {
		return 0, err
	}
	return info.State.Msgs, nil
}

// rangesString writes ranges as "[a, b) [c, d)".
func rangesString(rs []events.Range) string {
	s := ""
	for i, r := range rs {
		if i > 0 {
			s += " "
		}
		s += fmt.Sprintf("[%d, %d)", r.Start, r.End)
	}
	return s
}
