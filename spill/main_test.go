package spill

import (
	"os"
	"testing"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/seamguard/seamguard/internal/embedded"
)

func TestMain(m *testing.M) {
	if code, ok := embedded.ServeChild(); ok {
		os.Exit(code)
	}
	os.Exit(m.Run())
}

// startServerProcess runs the embedded server in a child process (this
// test binary again), so that the test's heap holds only the client's
// memory, and returns a JetStream context on it. The child stops when the
// test ends.
func startServerProcess(t testing.TB) jetstream.JetStream {
	t.Helper()
	url, _, stop, err := embedded.StartChild([]string{os.Args[0], "-test.run=^$"}, t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(stop)
	nc, err := nats.Connect(url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	return js
}
