package embedded

import (
	"net"
	"testing"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// Test is a server started for one test, with a connection and a JetStream
// context on it; all are closed and the server stopped when the test ends.
type Test struct {
	Server *server.Server
	Dir    string
	NC     *nats.Conn
	JS     jetstream.JetStream
}

// StartTest starts a server on a random loopback port with storage in a
// temporary directory of t, and connects to it.
func StartTest(t testing.TB) *Test {
	t.Helper()
	dir := t.TempDir()
	s, err := Start(Config{StoreDir: dir})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Shutdown(); s.WaitForShutdown() })
	nc, err := nats.Connect(s.ClientURL())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	return &Test{Server: s, Dir: dir, NC: nc, JS: js}
}

// Restart stops the server and starts it again on the same port and storage,
// as after a crash of the broker. Existing connections reconnect.
func (e *Test) Restart(t testing.TB) {
	t.Helper()
	port := 0
	if a, ok := e.Server.Addr().(*net.TCPAddr); ok {
		port = a.Port
	}
	e.Server.Shutdown()
	e.Server.WaitForShutdown()
	s, err := Start(Config{StoreDir: e.Dir, Port: port})
	if err != nil {
		t.Fatal(err)
	}
	e.Server = s
	t.Cleanup(func() { s.Shutdown(); s.WaitForShutdown() })
}
