package embedded

import (
	"net"
	"strings"
	"testing"
	"time"

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

// ShippedUsers are the users of deploy/nats/accounts.conf. Each reads its
// password from NATS_<USER>_PASSWORD; a configuration that names one must
// find it set, or the server refuses the file.
var ShippedUsers = []string{"agent", "processor", "responder", "operator", "forwarder"}

// StartShippedTest starts the nats-server configuration file at path (one
// of deploy/nats, which include the shipped users) on a random loopback
// port with storage in a temporary directory of t, every shipped user's
// password being "<user>-test". It returns the server, stopped when the
// test ends.
func StartShippedTest(t testing.TB, path string) *server.Server {
	t.Helper()
	for _, u := range ShippedUsers {
		t.Setenv("NATS_"+strings.ToUpper(u)+"_PASSWORD", u+"-test")
	}
	opts, err := server.ProcessConfigFile(path)
	if err != nil {
		t.Fatal(err)
	}
	opts.Port = server.RANDOM_PORT
	opts.HTTPPort = 0
	opts.StoreDir = t.TempDir()
	opts.NoLog, opts.NoSigs = true, true
	s, err := server.NewServer(opts)
	if err != nil {
		t.Fatal(err)
	}
	go s.Start()
	t.Cleanup(func() { s.Shutdown(); s.WaitForShutdown() })
	if !s.ReadyForConnections(10 * time.Second) {
		t.Fatalf("the server of %s did not start in 10s", path)
	}
	return s
}
