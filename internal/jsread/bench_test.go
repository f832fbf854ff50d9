package jsread_test

import (
	"bytes"
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/seamguard/seamguard/internal/embedded"
	"github.com/seamguard/seamguard/internal/jsread"
)

// The read rate of a Reader against nats.go's ordered consumer (what the
// operator's tools read with before), on the same stored messages: 20,000
// of 400 bytes each over 100 sessions, stored as the events stream stores
// them (E.partitioned.<p>.events.<session>, and E.partitioned.<p>.control.<session>
// for some). Whole reads every message; Session reads one session's two
// subjects (1% of the stream), OneFilter one of them (as a session's
// verdicts are read). Run with
//
//	go test -run '^$' -bench . -benchtime 5x ./internal/jsread/
//
// and compare msgs/s.

const (
	benchMsgs     = 20_000
	benchSessions = 100
)

func benchStream(b *testing.B, js jetstream.JetStream, name string, direct bool) {
	b.Helper()
	ctx := context.Background()
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: name, Subjects: []string{name + ".>"}, Storage: jetstream.MemoryStorage, AllowDirect: direct}); err != nil {
		b.Fatal(err)
	}
	body := bytes.Repeat([]byte("x"), 400)
	var futs []jetstream.PubAckFuture
	for i := range benchMsgs {
		m := nats.NewMsg(benchSubject(name, i))
		m.Header.Set("Content-Type", "application/cloudevents+json")
		m.Data = body
		f, err := js.PublishMsgAsync(m)
		if err != nil {
			b.Fatal(err)
		}
		futs = append(futs, f)
	}
	for _, f := range futs {
		select {
		case <-f.Ok():
		case err := <-f.Err():
			b.Fatal(err)
		}
	}
}

func benchSubject(stream string, i int) string {
	s := i % benchSessions
	kind := "events"
	if i%50 == 0 {
		kind = "control"
	}
	return fmt.Sprintf("%s.partitioned.%d.%s.s%d", stream, s%4, kind, s)
}

func sessionFilters(stream string) []string {
	return []string{stream + ".partitioned.3.events.s7", stream + ".partitioned.3.control.s7"}
}

// orderedRead reads as the operator's tools did: an ordered consumer on
// the filters, to the last message.
func orderedRead(b *testing.B, js jetstream.JetStream, stream string, filters []string) int {
	ctx := context.Background()
	str, err := js.Stream(ctx, stream)
	if err != nil {
		b.Fatal(err)
	}
	cons, err := str.OrderedConsumer(ctx, jetstream.OrderedConsumerConfig{FilterSubjects: filters})
	if err != nil {
		b.Fatal(err)
	}
	defer func() { _ = js.DeleteConsumer(ctx, stream, cons.CachedInfo().Name) }()
	it, err := cons.Messages()
	if err != nil {
		b.Fatal(err)
	}
	defer it.Stop()
	n := 0
	for {
		m, err := it.Next()
		if err != nil {
			b.Fatal(err)
		}
		n++
		md, _ := m.Metadata()
		if md.NumPending == 0 {
			return n
		}
	}
}

func readerRead(b *testing.B, js jetstream.JetStream, stream string, filters []string) int {
	ctx := context.Background()
	r, info, err := jsread.Open(ctx, js, stream)
	if err != nil {
		b.Fatal(err)
	}
	n := 0
	if err := r.Read(ctx, 1, info.State.LastSeq, filters, func(*jsread.Msg) error { n++; return nil }); err != nil {
		b.Fatal(err)
	}
	return n
}

func BenchmarkRead(b *testing.B) {
	e := embedded.StartTest(b)
	benchStream(b, e.JS, "LEADER", false)
	benchStream(b, e.JS, "DIRECT", true)
	for _, tc := range []struct {
		name   string
		stream string
		read   func(*testing.B, jetstream.JetStream, string, []string) int
	}{
		{"ordered", "LEADER", orderedRead},
		{"msgget", "LEADER", readerRead},
		{"direct", "DIRECT", readerRead},
	} {
		for _, scope := range []string{"Whole", "Session", "OneFilter"} {
			var filters []string
			switch scope {
			case "Session":
				filters = sessionFilters(tc.stream)
			case "OneFilter":
				filters = sessionFilters(tc.stream)[:1]
			}
			b.Run(scope+"/"+tc.name, func(b *testing.B) {
				n := 0
				start := time.Now()
				for range b.N {
					n += tc.read(b, e.JS, tc.stream, filters)
				}
				b.ReportMetric(float64(n)/time.Since(start).Seconds(), "msgs/s")
				if want := benchMsgs * b.N; scope == "Whole" && n != want {
					b.Fatalf("read %d, want %d", n, want)
				}
			})
		}
	}
}
