// Package events is seamguard's wire codec: it turns NATS messages into
// validated, typed input events and typed outputs into verdict messages, as
// docs/contract.md lays down (subjects, the envelope, inputs and outputs).
// It does no I/O and keeps no state; the processor decodes with it, the
// ledger reads its types, spills write events back with it, and subscribers
// read verdicts with it.
//
// # Decoding
//
// DecodeMsg takes what arrived from NATS (subject, headers, body) and returns
// an *Event whose Body is a pointer to the typed data of its type, or an
// *Error carrying the contract's rejection code, the offending field (such as
// "subject", "data.recovery_floor.span") and a message saying what to fix.
// DecodeJSON does the same for one structured event from a file or a spill.
// DecodeMsgOwned is DecodeMsg for a caller that hands the header and body
// over (the processor, a spill's replay): the event keeps them rather than
// copies.
//
// There is one decoder (decode*.go), strict, on one path. The
// CloudEvents core attributes are a fixed, typed table (attrTable, in the
// style of sdk-go's binding/spec Kind) that says of each its name, its ce-
// header and how it is validated; the header reader, the structured
// reader, the validator and the encoder all consult it. A structured body
// and the data are read in place as JSON objects whose syntax is checked
// as encoding/json's Decoder checks it, and the data's fields go straight
// into the typed body; the decoder builds no maps but the extensions', and
// allocates little beyond the event. Every rejection is decided there, in
// a fixed order, so that an input with several faults always gets the same
// one, and built out of line (rejections.go); encoding/json is asked only
// to name a syntax error. decode_oracle_test.go holds the decoder to the
// expected outcome of every deterministic input (hand-written tables, and
// testdata/decode-outcomes.txt), and the fuzz targets hold every entry
// point to its promises on any input.
//
// The content mode is chosen as the CloudEvents NATS binding and sdk-go do:
//   - structured when the Content-Type header is application/cloudevents+json
//     (parameters allowed), or when there is no ce-specversion header (sdk-go
//     writes structured mode without any Content-Type). The body is the whole
//     event as a JSON object. If ce-* headers are present anyway, each must
//     agree with the body's attribute of that name, else the event is
//     malformed.
//   - binary otherwise: attributes come from ce-<name> headers, data is the
//     body, and datacontenttype is ce-datacontenttype or else Content-Type.
//
// Header names are read case-insensitively. A header given twice with
// different values is malformed.
//
// # Choices where the contract is silent
//
//   - Percent-decoding. Binary-mode header values are percent-decoded, as the
//     binding's draft asks; sdk-go does not encode, which is harmless for any
//     value without '%'. A '%' that does not start "%XX" (two hex digits),
//     such as "%zz" or a trailing '%', makes the event malformed: encode a
//     literal '%' as "%25". Decoded values must be UTF-8. PercentEncode is
//     the encoding a publisher applies (the client's binary mode does).
//   - UTF-8. Bodies and data must be valid UTF-8 (RFC 8259), so that the data
//     kept and spilled is exactly the data received.
//   - Attribute names are lower-case letters and digits (CloudEvents 1.0). A
//     JSON null attribute counts as absent, as the CloudEvents JSON format
//     says. Attributes given twice, and data fields given twice, are rejected
//     rather than resolved silently. Extension values are strings, numbers or
//     booleans; dataschema is kept among the extensions. A wrong JSON type
//     for an attribute is malformed, except specversion, whose every value
//     but "1.0" is bad_specversion.
//   - data_base64 is rejected (bad_data, field "data"): seamguard's data is
//     a JSON object, so it travels as "data" with application/json.
//   - Data is typed strictly: numbers are plain non-negative JSON integers
//     (no sign, fraction or exponent) of at most MaxOffset = 2^53, the
//     largest integer every JSON implementation represents exactly; offset +
//     size is bounded by it too. A null optional field counts as absent.
//     Unknown data fields are ignored, so that agents may send fields a later
//     version will read; they stay in Event.Data and in spills.
//   - A reversed context.truncated range is bad_data; a reversed range of a
//     compaction.requested, and its empty or absent request_id, decode, and
//     the ledger refuses them with invalid_request, so that the agent gets a
//     verdict it waits for rather than a rejection.
//   - Pins: turn.appended's pinned is true or false (anything else is
//     bad_data, field data.pinned); context.pinned and
//     context.unpinned carry a range, and a reversed one is bad_data, as
//     for context.truncated. compaction.requested's carried_pins decodes
//     whatever it holds: a list of {start, end} objects becomes
//     CarriedPins (reversed ranges included), and anything else (a string,
//     an object, an element that is no range, a number that is no offset)
//     leaves CarriedPinsInvalid saying what is wrong, for the ledger to
//     refuse the request with invalid_request as the contract asks.
//   - session.closed carries nothing: its data may be absent, null or any
//     object, and is not looked at.
//   - turn.appended content is any JSON and is kept raw, never walked: the
//     codec checks JSON iteratively, as encoding/json does, and rejects
//     nesting deeper than encoding/json's 10000 levels (malformed or
//     bad_data), so hostile input cannot exhaust the stack, and all work is
//     linear in the input size (an object with many members included).
//   - Event.Time keeps the offset it was sent with (UTC when zero); a
//     leap second (:60) is the last nanosecond before it ends (see parseTime).
//
// # Bounds
//
// No input can make seamguard keep or say much about it (docs/contract.md,
// "Bounds and failing closed"):
//   - id, source, every extension value (a string's bytes once decoded,
//     or a number's or a boolean's JSON spelling), and data.request_id of
//     compaction.requested and compaction.committed are at most MaxIDBytes
//     (256) bytes; data.note of session.resumed at most MaxNoteBytes (4
//     KiB). More is rejected with too_large, the field named (id, source,
//     the extension's name such as partitionkey, data.request_id,
//     data.note) and a message giving the size and the bound. When several
//     are too large, the first of id, source, then the extensions in name
//     order is named. Other attributes are bounded by their own checks
//     (subject is a session id, type one of a few names). Extension names,
//     and data fields such as role, stage and content, are not bounded
//     here: the NATS message size bounds them, and no output repeats more
//     than an excerpt of them.
//   - Excerpt is how any output quotes an input value: at most
//     MaxQuoteBytes (256) bytes of it, cut on a UTF-8 boundary and followed
//     by "…[N more bytes]". Every message and field of an *Error that
//     repeats input goes through it, so an *Error is at most a few KiB
//     whatever the input.
//   - EchoHeaders is what event.rejected shows of an input's NATS headers:
//     every name and value through Excerpt, at most MaxEchoValues (4) values
//     of a name, at most MaxEchoHeaders (32) names and MaxEchoBytes (16 KiB)
//     in all, counted as JSON. The identifying headers come first
//     (Nats-Msg-Id, ce-id, ce-source, ce-type, ce-subject, ce-specversion,
//     Content-Type), then the others in byte order of their names; what is
//     left out is counted in input.headers_omitted. So a 600 KB ce-id is
//     rejected as too_large with its first 256 bytes echoed, enough to find
//     the input (its stream sequence is echoed too).
//   - Outputs list at most MaxAtRiskRanges ranges in a list that could be
//     long (the at_risk lists of a refusal's reasons together,
//     unrecoverable, summary_coverage) and then say so with a *_truncated
//     flag and a *_total count of ranges and units (AtRiskTotal); the
//     ledger does the cutting. With these, every output is under
//     MaxOutputBytes (64 KiB) encoded.
//
// # Encoding
//
// Encoder.Encode writes an Output as one structured CloudEvent with a fixed
// member order: specversion, id, source, type, subject, time,
// datacontenttype, causationid, data. Its id is OutputID: a hash of the
// input it answers (source and id, or NATS subject and stream sequence when
// the input had no id) and the output type, so a redelivered input yields
// the same verdict id, which is also its Nats-Msg-Id. With a nil Now there is
// no time attribute and the bytes are a function of the output alone.
//
// A verdict goes to <prefix>.verdicts.<session>.<kind>. A rejection of an
// input whose session is unknowable (no subject attribute, an invalid id, a
// NATS subject with extra tokens) goes to <prefix>.verdicts._invalid.rejected
// (InvalidSession) and carries no subject attribute: "_invalid" is a token no
// well-behaved agent would choose, so subscribers can watch it as the place
// where unroutable input is reported. A session really named "_invalid" would
// share that subject; its verdicts still carry subject "_invalid", which
// rejections of unroutable input never do.
//
// MarshalStructured writes an input event back as one JSON line for spills;
// DecodeJSON reads it back to an equal event. DecodeVerdict reads outputs
// back for subscribers and tests.
//
// # The recover protocol
//
// recover.go names the protocol through which agents read their sessions'
// spills from the processor (Subjects.Recover, RecoverRequest, the reply
// headers and the bounds); the processor serves it and package client
// calls it. processor/doc.go describes it. A spill handle's digest is
// "SHA-256=" and the URL-safe base64 of the sum, padded or not:
// DecodeDigest reads it, and SameDigest compares two as sums.
package events
