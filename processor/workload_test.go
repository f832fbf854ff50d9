package processor_test

import (
	"testing"

	"github.com/nats-io/nats.go"
	"github.com/stretchr/testify/require"

	"github.com/seamguard/seamguard/events"
	"github.com/seamguard/seamguard/internal/workload"
)

// The processor's tests build their sessions with package workload.
type sessionScript = workload.Script

func rng(a, b uint64) map[string]uint64 { return workload.R(a, b) }

func genWorkload(sessions int) *workload.Workload { return workload.Generate(sessions) }

// msgsOf returns fresh NATS messages of the workload.
func msgsOf(t testing.TB, w *workload.Workload, subj events.Subjects) []*nats.Msg {
	t.Helper()
	msgs, err := w.Msgs(subj)
	require.NoError(t, err)
	return msgs
}

func binaryMsg(t testing.TB, subj events.Subjects, line []byte) *nats.Msg {
	t.Helper()
	m, err := workload.BinaryMsg(subj, line)
	require.NoError(t, err)
	return m
}

func structuredMsg(t testing.TB, subj events.Subjects, line []byte) *nats.Msg {
	t.Helper()
	m, err := workload.StructuredMsg(subj, line)
	require.NoError(t, err)
	return m
}

func TestWorkloadShape(t *testing.T) {
	w := genWorkload(50)
	require.GreaterOrEqual(t, len(w.Items), 2000)
}
