package embedded

import (
	"context"
	"fmt"
	"net"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"
)

func TestStartAndRestartKeepsStreams(t *testing.T) {
	e := StartTest(t)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	_, err := e.JS.CreateStream(ctx, jetstream.StreamConfig{Name: "T", Subjects: []string{"t.>"}, Storage: jetstream.FileStorage})
	require.NoError(t, err)
	_, err = e.JS.Publish(ctx, "t.a", []byte("x"))
	require.NoError(t, err)
	e.Restart(t)
	require.Eventually(t, func() bool {
		s, err := e.JS.Stream(ctx, "T")
		if err != nil {
			return false
		}
		info, err := s.Info(ctx)
		return err == nil && info.State.Msgs == 1
	}, 10*time.Second, 50*time.Millisecond)
}

func TestValidate(t *testing.T) {
	err := Config{Port: -2}.Validate()
	require.ErrorContains(t, err, "StoreDir")
	require.ErrorContains(t, err, "port -2")
}

// TestStartBusyPort: a port another socket holds fails the start at once,
// naming the address and the OS error, instead of after the ready wait.
func TestStartBusyPort(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer l.Close()
	port := l.Addr().(*net.TCPAddr).Port
	start := time.Now()
	s, err := Start(Config{Port: port, StoreDir: t.TempDir(), Ready: 20 * time.Second})
	took := time.Since(start)
	require.Nil(t, s)
	require.ErrorIs(t, err, ErrListen)
	require.ErrorIs(t, err, syscall.EADDRINUSE)
	require.ErrorContains(t, err, fmt.Sprintf("127.0.0.1:%d", port))
	require.ErrorContains(t, err, "address already in use")
	require.Less(t, took, 2*time.Second, "a busy port fails at once")
}
