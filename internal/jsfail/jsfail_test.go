package jsfail

import (
	"context"
	"errors"
	"fmt"
	"testing"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

func api(code jetstream.ErrorCode, desc string) error {
	return &jetstream.APIError{Code: 500, ErrorCode: code, Description: desc}
}

// TestClasses checks every class against the failures each is for, and
// against those it must not take: a failure read as waitable that is not
// retries forever, one read as permanent that is not halts a session.
func TestClasses(t *testing.T) {
	type want struct{ noAnswer, unreachable, waitable, full, permanent, missing bool }
	cases := []struct {
		name string
		err  error
		want want
	}{
		{"deadline", fmt.Errorf("get: %w", context.DeadlineExceeded), want{true, true, true, false, false, false}},
		{"timeout", nats.ErrTimeout, want{true, true, true, false, false, false}},
		{"no responders", nats.ErrNoResponders, want{true, true, true, false, false, false}},
		{"no stream response", jetstream.ErrNoStreamResponse, want{true, true, true, false, false, false}},
		{"reconnecting", nats.ErrConnectionReconnecting, want{true, true, true, false, false, false}},
		{"closed", nats.ErrConnectionClosed, want{false, true, true, false, false, false}},
		{"shutdown", jetstream.ErrServerShutdown, want{false, true, true, false, false, false}},
		{"not leader", api(CodeClusterNotLeader, "JetStream cluster can not handle request"), want{false, false, true, false, false, false}},
		{"unavailable", api(CodeClusterNotAvailable, ""), want{false, false, true, false, false, false}},
		{"stream offline", api(CodeStreamOfflineReason, "stream is offline: x"), want{false, false, true, false, false, false}},
		{"too many requests", api(CodeTooManyRequests, ""), want{false, false, true, false, false, false}},
		{"no peers", api(CodeClusterNoPeers, "no suitable peers"), want{false, false, true, false, false, false}},
		{"storage exhausted", api(CodeStorageResourcesExceeded, ""), want{false, false, false, true, true, false}},
		{"account limits", api(CodeAccountResourcesExceeded, ""), want{false, false, false, true, true, false}},
		{"insufficient", api(CodeInsufficientResources, ""), want{false, false, false, true, true, false}},
		{"discard new bytes", api(CodeStreamStoreFailed, "maximum bytes exceeded"), want{false, false, false, true, true, false}},
		{"discard new msgs", api(CodeStreamStoreFailed, "maximum messages exceeded"), want{false, false, false, true, true, false}},
		{"discard new per subject", api(CodeStreamStoreFailed, "maximum messages per subject exceeded"), want{false, false, false, true, true, false}},
		{"too large", api(CodeStreamStoreFailed, "message too large"), want{false, false, false, false, true, false}},
		{"store closed", api(CodeStreamStoreFailed, "store is closed"), want{}},
		{"store failed, words merely alike", api(CodeStreamStoreFailed, "not maximum bytes exceeded"), want{}},
		{"over max", jetstream.ErrStreamMessageExceedsMaximum, want{false, false, false, false, true, false}},
		{"header over max", api(CodeHeaderExceedsMaximum, ""), want{false, false, false, false, true, false}},
		{"max payload", nats.ErrMaxPayload, want{false, false, false, false, true, false}},
		{"permission", fmt.Errorf("%w: publish to x", nats.ErrPermissionViolation), want{false, false, false, false, true, false}},
		{"forbidden", &jetstream.APIError{Code: 403, ErrorCode: 10003}, want{false, false, false, false, true, false}},
		{"stream missing", jetstream.ErrStreamNotFound, want{false, false, false, false, false, true}},
		{"bucket missing", fmt.Errorf("open: %w", jetstream.ErrBucketNotFound), want{false, false, false, false, false, true}},
		{"stream missing, old API", &nats.APIError{Code: 404, ErrorCode: nats.JSErrCodeStreamNotFound}, want{false, false, false, false, false, true}},
		{"wrong last sequence", api(jetstream.JSErrCodeStreamWrongLastSequence, "wrong last sequence: 4"), want{}},
		{"words only", errors.New("insufficient resources"), want{}},
		{"nil", nil, want{}},
	}
	for _, c := range cases {
		got := want{NoAnswer(c.err), Unreachable(c.err), Waitable(c.err), StorageFull(c.err), Permanent(c.err), StreamMissing(c.err)}
		if got != c.want {
			t.Errorf("%s (%v): got %+v, want %+v", c.name, c.err, got, c.want)
		}
	}
}

func TestCode(t *testing.T) {
	if c, ok := Code(fmt.Errorf("wrapped: %w", api(CodeClusterNotLeader, ""))); !ok || c != CodeClusterNotLeader {
		t.Fatalf("Code = %d, %v; want %d, true", c, ok, CodeClusterNotLeader)
	}
	if c, ok := Code(&nats.APIError{ErrorCode: nats.JSErrCodeStreamNotFound}); !ok || c != jetstream.JSErrCodeStreamNotFound {
		t.Fatalf("Code of a nats.APIError = %d, %v", c, ok)
	}
	if _, ok := Code(errors.New("plain")); ok {
		t.Fatal("a plain error carries no code")
	}
}
