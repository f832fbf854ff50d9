package forward

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"

	"github.com/cloudevents/sdk-go/v2/binding"
	"github.com/cloudevents/sdk-go/v2/event"
	cehttp "github.com/cloudevents/sdk-go/v2/protocol/http"
	"github.com/nats-io/nats.go"

	"github.com/seamguard/seamguard/attest"
	"github.com/seamguard/seamguard/events"
)

// Headers a forwarded request carries besides the CloudEvent's ce-*
// headers (docs/forward.md, "Verifying a forwarded verdict").
const (
	// HeaderSigner and HeaderSignature are the verdict's signature
	// headers as the processor wrote them (attest.HeaderSigner,
	// attest.HeaderSignature): they sign the structured CloudEvent as
	// stored, which HeaderEnvelope and HeaderDataOffset rebuild.
	HeaderSigner    = attest.HeaderSigner
	HeaderSignature = attest.HeaderSignature
	// HeaderEnvelope is the stored structured CloudEvent with the value of
	// its data member cut out, in unpadded URL-safe base64.
	HeaderEnvelope = "Seamguard-Envelope"
	// HeaderDataOffset is the byte offset in the decoded envelope where
	// the request body (the data, exactly as stored) goes back in.
	HeaderDataOffset = "Seamguard-Data-Offset"
	// HeaderVerdictSeq is the verdict's sequence in the verdict stream.
	HeaderVerdictSeq = "Seamguard-Verdict-Seq"
)

var b64 = base64.RawURLEncoding

// verdictMsg is a stored verdict: its subject, headers and exact body.
type verdictMsg struct {
	subject string
	header  nats.Header
	body    []byte
	seq     uint64
}

// dataSpan returns where the value of the top-level "data" member of the
// JSON object body starts and ends.
func dataSpan(body []byte) (start, end int, err error) {
	dec := json.NewDecoder(bytes.NewReader(body))
	tok, err := dec.Token()
	if err != nil || tok != json.Delim('{') {
		return 0, 0, fmt.Errorf("%w: the verdict is not a JSON object", ErrMalformed)
	}
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			return 0, 0, fmt.Errorf("%w: %v", ErrMalformed, err)
		}
		var raw json.RawMessage
		if err := dec.Decode(&raw); err != nil {
			return 0, 0, fmt.Errorf("%w: %v", ErrMalformed, err)
		}
		if tok == "data" {
			end := int(dec.InputOffset())
			return end - len(raw), end, nil
		}
	}
	return 0, 0, fmt.Errorf("%w: the verdict has no data", ErrMalformed)
}

// newRequest builds the binary-mode CloudEvents HTTP request that carries
// m to url: sdk-go's HTTP binding writes the ce-* headers from the stored
// structured event, whose data (exactly as stored) is the body; header
// values are then percent-encoded as the HTTP binding asks (printable
// ASCII other than space, '"' and '%' is left as it is).
func newRequest(ctx context.Context, url string, extra map[string]string, m verdictMsg) (*http.Request, error) {
	start, end, err := dataSpan(m.body)
	if err != nil {
		return nil, err
	}
	var ev event.Event
	if err := json.Unmarshal(m.body, &ev); err != nil {
		return nil, fmt.Errorf("%w: not a structured CloudEvent: %v", ErrMalformed, err)
	}
	if err := ev.Validate(); err != nil {
		return nil, fmt.Errorf("%w: not a valid CloudEvent: %v", ErrMalformed, err)
	}
	ev.DataEncoded = m.body[start:end]
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, nil)
	if err != nil {
		return nil, err
	}
	for k, v := range extra {
		req.Header.Set(k, v)
	}
	if err := cehttp.WriteRequest(ctx, binding.ToMessage(&ev), req); err != nil {
		return nil, fmt.Errorf("%w: %v", ErrMalformed, err)
	}
	for k, vs := range req.Header {
		if strings.HasPrefix(strings.ToLower(k), "ce-") {
			for i := range vs {
				vs[i] = events.PercentEncode(vs[i])
			}
		}
	}
	envelope := make([]byte, 0, len(m.body)-(end-start))
	envelope = append(append(envelope, m.body[:start]...), m.body[end:]...)
	req.Header.Set(HeaderEnvelope, b64.EncodeToString(envelope))
	req.Header.Set(HeaderDataOffset, strconv.Itoa(start))
	for _, h := range []string{HeaderSigner, HeaderSignature} {
		if v := m.header.Get(h); v != "" {
			req.Header.Set(h, events.PercentEncode(v))
		}
	}
	if m.seq > 0 {
		req.Header.Set(HeaderVerdictSeq, strconv.FormatUint(m.seq, 10))
	}
	body := m.body[start:end]
	req.Body = io.NopCloser(bytes.NewReader(body))
	req.GetBody = func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(body)), nil }
	req.ContentLength = int64(len(body))
	return req, nil
}

// VerifyRequest verifies a request a forwarder sent: it puts the body back
// into the envelope (HeaderEnvelope, HeaderDataOffset), verifies the
// verdict's signature over it with v (as watch does; a nil v trusts no key
// in particular), and checks that the ce-id, ce-type and ce-subject headers
// are the signed verdict's. The attribution's Verdict is the signed one:
// believe it, not the headers.
func VerifyRequest(v *attest.Verifier, h http.Header, body []byte) (attest.Attribution, error) {
	env, err := b64.DecodeString(h.Get(HeaderEnvelope))
	if err != nil || h.Get(HeaderEnvelope) == "" {
		return attest.Attribution{}, fmt.Errorf("%w: no readable %s header", ErrUnverifiable, HeaderEnvelope)
	}
	off, err := strconv.Atoi(h.Get(HeaderDataOffset))
	if err != nil || off < 0 || off > len(env) {
		return attest.Attribution{}, fmt.Errorf("%w: no usable %s header", ErrUnverifiable, HeaderDataOffset)
	}
	signed := make([]byte, 0, len(env)+len(body))
	signed = append(append(append(signed, env[:off]...), body...), env[off:]...)
	nh := nats.Header{}
	for _, k := range []string{HeaderSigner, HeaderSignature} {
		if s := h.Get(k); s != "" {
			nh.Set(k, s)
		}
	}
	if v == nil {
		v = &attest.Verifier{}
	}
	a, err := v.Verify("", nh, signed)
	if err != nil {
		return a, fmt.Errorf("%w: %w", ErrUnverifiable, err)
	}
	for k, want := range map[string]string{"Ce-Id": a.Verdict.ID, "Ce-Type": a.Verdict.Type, "Ce-Subject": a.Verdict.Session} {
		if got := percentDecode(h.Get(k)); got != want {
			return attest.Attribution{}, fmt.Errorf("%w: header %s is %q, the signed verdict says %q", ErrUnverifiable, k, got, want)
		}
	}
	return a, nil
}

// percentDecode undoes events.PercentEncode (the CloudEvents HTTP
// binding's encoding of header values); a malformed escape stays as it is.
func percentDecode(v string) string {
	if !strings.Contains(v, "%") {
		return v
	}
	var b []byte
	for i := 0; i < len(v); i++ {
		if v[i] == '%' && i+2 < len(v) {
			if n, err := strconv.ParseUint(v[i+1:i+3], 16, 8); err == nil {
				b = append(b, byte(n))
				i += 2
				continue
			}
		}
		b = append(b, v[i])
	}
	return string(b)
}
