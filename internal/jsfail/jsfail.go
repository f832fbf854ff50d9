package jsfail

import (
	"context"
	"errors"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// JetStream error codes (nats-server's jetstream_errors_generated.go)
// read here or by callers, beyond those nats.go names
// (jetstream.JSErrCode...).
const (
	CodeAccountResourcesExceeded jetstream.ErrorCode = 10002 // JSAccountResourcesExceededErr
	CodeClusterIncomplete        jetstream.ErrorCode = 10004 // JSClusterIncompleteErr: incomplete results
	CodeClusterNoPeers           jetstream.ErrorCode = 10005 // JSClusterNoPeersErrF: no suitable peers for placement
	CodeClusterNotAvailable      jetstream.ErrorCode = 10008 // JSClusterNotAvailErr: temporarily unavailable
	CodeClusterNotLeader         jetstream.ErrorCode = 10009 // JSClusterNotLeaderErr: cannot handle the request
	CodeInsufficientResources    jetstream.ErrorCode = 10023 // JSInsufficientResourcesErr
	CodeMemoryResourcesExceeded  jetstream.ErrorCode = 10028 // JSMemoryResourcesExceededErr
	CodeStorageResourcesExceeded jetstream.ErrorCode = 10047 // JSStorageResourcesExceededErr
	CodeStreamStoreFailed        jetstream.ErrorCode = 10077 // JSStreamStoreFailedF: the store's own error as description
	CodeHeaderExceedsMaximum     jetstream.ErrorCode = 10097 // JSStreamHeaderExceedsMaximumErr
	CodeStreamOffline            jetstream.ErrorCode = 10118 // JSStreamOfflineErr
	CodeConsumerOffline          jetstream.ErrorCode = 10119 // JSConsumerOfflineErr
	CodeTooManyRequests          jetstream.ErrorCode = 10167 // JSStreamTooManyRequests
	CodeAtomicPublishDisabled    jetstream.ErrorCode = 10174 // JSAtomicPublishDisabledErr
	CodeStreamOfflineReason      jetstream.ErrorCode = 10194 // JSStreamOfflineReasonErrF
	CodeConsumerOfflineReason    jetstream.ErrorCode = 10195 // JSConsumerOfflineReasonErrF
)

// The store's messages a CodeStreamStoreFailed answer carries as its whole
// description (nats-server's store.go).
const (
	storeMaxBytes           = "maximum bytes exceeded"
	storeMaxMsgs            = "maximum messages exceeded"
	storeMaxMsgsPerSubject  = "maximum messages per subject exceeded"
	storeMsgTooLarge        = "message too large"
	permissionDeniedAPICode = 403
)

// Code returns the JetStream error code err carries, from either of
// nats.go's API error types, and whether it carries one.
func Code(err error) (jetstream.ErrorCode, bool) {
	var api *jetstream.APIError
	if errors.As(err, &api) {
		return api.ErrorCode, true
	}
	var napi *nats.APIError
	if errors.As(err, &napi) {
		return jetstream.ErrorCode(napi.ErrorCode), true
	}
	return 0, false
}

// NoAnswer reports whether err says that a request or publish got no
// answer on a connection that may come back: a timeout, no responders, the
// connection disconnected or being re-established.
func NoAnswer(err error) bool {
	for _, target := range []error{
		context.DeadlineExceeded, nats.ErrTimeout, nats.ErrNoResponders,
		jetstream.ErrNoStreamResponse, nats.ErrConnectionReconnecting, nats.ErrDisconnected,
	} {
		if errors.Is(err, target) {
			return true
		}
	}
	return false
}

// Unreachable reports whether err says that NATS or JetStream did not
// answer at all (NoAnswer, the connection closed, JetStream not enabled,
// a server shutting down), as while a server restarts: trying again later
// may succeed.
func Unreachable(err error) bool {
	if NoAnswer(err) {
		return true
	}
	for _, target := range []error{nats.ErrConnectionClosed, jetstream.ErrJetStreamNotEnabled, jetstream.ErrServerShutdown} {
		if errors.Is(err, target) {
			return true
		}
	}
	return false
}

// Waitable reports whether a failure may pass by itself: Unreachable, or a
// JetStream cluster saying that it cannot place or reach a stream now (no
// quorum, peers offline, a leader not yet elected, too many requests).
func Waitable(err error) bool {
	if Unreachable(err) {
		return true
	}
	code, ok := Code(err)
	if !ok {
		return false
	}
	switch code {
	case CodeClusterIncomplete, CodeClusterNoPeers, CodeClusterNotAvailable, CodeClusterNotLeader,
		CodeStreamOffline, CodeConsumerOffline, CodeStreamOfflineReason, CodeConsumerOfflineReason,
		CodeTooManyRequests:
		return true
	}
	return false
}

// StorageFull reports whether JetStream refused a write for want of
// storage: a stream (or bucket) with DiscardNew at its limits, or the
// server or account out of resources.
func StorageFull(err error) bool {
	var api *jetstream.APIError
	if !errors.As(err, &api) {
		code, ok := Code(err)
		return ok && storageCode(code)
	}
	if api.ErrorCode == CodeStreamStoreFailed {
		switch api.Description {
		case storeMaxBytes, storeMaxMsgs, storeMaxMsgsPerSubject:
			return true
		}
		return false
	}
	return storageCode(api.ErrorCode)
}

func storageCode(code jetstream.ErrorCode) bool {
	switch code {
	case CodeAccountResourcesExceeded, CodeInsufficientResources, CodeMemoryResourcesExceeded, CodeStorageResourcesExceeded:
		return true
	}
	return false
}

// Permanent reports whether another attempt of the same write cannot
// succeed: StorageFull, a message or header over the server's limits, a
// payload over the connection's, a permission denied.
func Permanent(err error) bool {
	if err == nil {
		return false
	}
	if StorageFull(err) {
		return true
	}
	for _, target := range []error{nats.ErrMaxPayload, nats.ErrPermissionViolation, nats.ErrAuthorization, jetstream.ErrStreamMessageExceedsMaximum} {
		if errors.Is(err, target) {
			return true
		}
	}
	var api *jetstream.APIError
	if errors.As(err, &api) {
		switch {
		case api.ErrorCode == jetstream.JSErrCodeStreamMessageExceedsMaximum, api.ErrorCode == CodeHeaderExceedsMaximum:
			return true
		case api.ErrorCode == CodeStreamStoreFailed && api.Description == storeMsgTooLarge:
			return true
		case api.Code == permissionDeniedAPICode:
			return true
		}
	}
	return false
}

// StreamMissing reports whether err says that a stream, bucket or object
// store does not exist.
func StreamMissing(err error) bool {
	if errors.Is(err, jetstream.ErrStreamNotFound) || errors.Is(err, jetstream.ErrBucketNotFound) ||
		errors.Is(err, nats.ErrStreamNotFound) || errors.Is(err, nats.ErrBucketNotFound) {
		return true
	}
	code, ok := Code(err)
	return ok && code == jetstream.JSErrCodeStreamNotFound
}
