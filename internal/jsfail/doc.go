// Package jsfail tells JetStream's failures apart, once for the whole
// project: the processor, package spill and the client ask it whether a
// failure may pass by itself or can never be cured by another attempt.
//
// It reads typed errors only: the error codes of JetStream API errors
// (jetstream.APIError, nats.APIError), and nats.go's sentinels by
// errors.Is. The one place a server puts its reason only in words is the
// generic store failure (CodeStreamStoreFailed), whose description is the
// store's own error; that description is compared whole with the store's
// fixed messages, never searched.
//
// Three questions, three answers:
//
//   - Unreachable: NATS or JetStream did not answer at all (a timeout, no
//     responders, a connection being re-established or closed, a server
//     shutting down). Trying again later may succeed.
//   - Waitable: Unreachable, or a JetStream cluster saying it cannot serve
//     now (no quorum, peers offline, a leader not yet elected, too many
//     requests).
//   - Refused (StorageFull or Permanent): the server will refuse the same
//     write again: storage or an account's resources exhausted, a stream
//     at its limits, a message or header over the server's limits, a
//     permission denied.
package jsfail
