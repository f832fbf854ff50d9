// Package attest makes verdicts attributable (docs/security.md): the
// processor signs the bytes of every output it publishes with its NKey, and
// subscribers check that signature against the public keys they trust
// before they believe a verdict.
//
// The verdict stream can hold messages the processor never decided: an
// identity that may create a push consumer chooses where it delivers (its
// deliver subject is in the request body, out of reach of subject
// permissions), so it can deliver any stored message onto a verdict
// subject; a permission granted too widely lets anyone publish on
// <prefix>.verdicts.>. What tells the processor's verdicts apart is a
// signature no one else can make.
//
// # On the wire
//
// Every output message carries two NATS headers:
//
//   - Seamguard-Signer (HeaderSigner): the signer's public NKey, the
//     56-character base32 form such as "NB3P…" (a server-type NKey when
//     seamguard makes the key; any ed25519 NKey type is accepted).
//   - Seamguard-Signature (HeaderSignature): the ed25519 signature of the
//     exact message body (the structured CloudEvent's bytes, nothing
//     else), in unpadded URL-safe base64 (RFC 4648 section 5): 86
//     characters.
//
// ed25519 is deterministic: the same body signed by the same key always
// gives the same signature, so a verdict published again after a
// redelivery is the same message, and its Nats-Msg-Id (the output id) is
// unchanged. Signing costs one ed25519 signature per output (see
// BenchmarkSign).
//
// # Verifying
//
// Verifier.Verify checks, in this order, and reports the first failure as
// an *Error whose Reason is one of:
//
//   - ReasonUnsigned: a header is missing (the message was not published
//     by a seamguard processor that signs);
//   - ReasonBadSignature: the signer is no ed25519 public NKey, the
//     signature does not decode, a header is given twice, or the signature
//     does not verify the body for the signer it names (the body was
//     changed, or the signature copied from another message);
//   - ReasonUntrusted: the signature is good, but the signer is none of the
//     trusted keys;
//   - ReasonMisrouted: the body is a genuine verdict, but not the one this
//     subject carries: its CloudEvent subject (the session) or its type
//     does not match the NATS subject <prefix>.verdicts.<session>.<kind> it
//     arrived on. A signed verdict copied onto another session's subject
//     is caught here. A rejection of an input with no usable session has
//     no subject attribute and belongs on the _invalid session token.
//
// A Verifier with no trusted keys checks everything but the signer's
// identity: a signature that is good for the key it names passes, and
// Attribution.Trusted says false. Anyone can make such a key; tools say so
// when they run without trusted keys (the docs' "Attributable verdicts"
// section).
//
// Several trusted keys may be given, which is how a key is rotated: add
// the new public key to every verifier, roll the processors to the new
// seed, and drop the old key once the verdict stream no longer holds
// verdicts it signed (docs/operating.md).
//
// # Keys
//
// A Signer holds an NKey seed ("S…"); NewSigner reads one, Generate makes
// one, LoadOrCreate keeps one in a file of mode 0600. Signer, Verifier and
// Trust are safe for concurrent use once made.
package attest
