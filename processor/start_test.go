package processor_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/seamguard/seamguard/internal/embedded"
	"github.com/seamguard/seamguard/internal/longtest"
	"github.com/seamguard/seamguard/processor"
)

// TestStartWaitsForTheCluster starts the processor while two of the three
// servers of its cluster are down, as after a power cut of every node: New
// must wait (JetStream has no quorum and does not answer) and succeed once
// they are back, and give up with the error after StartTimeout when they
// stay away.
func TestStartWaitsForTheCluster(t *testing.T) {
	longtest.Skip(t)
	if testing.Short() {
		t.Skip("a three-server cluster")
	}
	cl := embedded.StartCluster(t, 3)
	e := clusterEnv(t, cl, 0)
	cl.Stop(1)
	cl.Stop(2)

	cfg := baseConfig()
	cfg.StartTimeout = 3 * time.Second
	began := time.Now()
	_, err := processor.New(e.ctx, e.JS, cfg)
	require.Error(t, err, "New cannot set up anything without a JetStream quorum")
	require.Less(t, time.Since(began), 30*time.Second, "New gave up long after StartTimeout")
	t.Logf("gave up after %s: %v", time.Since(began).Round(time.Millisecond), err)

	cfg.StartTimeout = time.Minute
	done := make(chan error, 1)
	go func() {
		p, err := processor.New(e.ctx, e.JS, cfg)
		if err == nil {
			ctx, cancel := context.WithTimeout(e.ctx, 2*time.Second)
			defer cancel()
			err = p.Run(ctx) // creates the consumers, then drains
		}
		done <- err
	}()
	time.Sleep(3 * time.Second)
	select {
	case err := <-done:
		t.Fatalf("New returned while the cluster had no quorum: %v", err)
	default:
	}
	cl.Start(t, 1)
	cl.Start(t, 2)
	select {
	case err := <-done:
		require.NoError(t, err, "New and Run, once the cluster is back")
	case <-time.After(90 * time.Second):
		t.Fatal("New did not return within 90s of the cluster's return")
	}
}
