package embedded

import (
	"context"
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
