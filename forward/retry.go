package forward

import (
	"context"
	"fmt"
	"net/http"

	"github.com/seamguard/seamguard/attest"
)

// Redeliver makes one attempt to deliver the kept verdict r to to (r.To
// when empty: a URL whose password was redacted there must be given
// again), after verifying its signature with v as a forwarder does. On a
// 2xx it removes r from the stream, and only then; otherwise r stays, and
// the error says why. client nil means a client with DefaultTimeout that
// follows no redirect.
func (u *Undeliverable) Redeliver(ctx context.Context, client *http.Client, v *attest.Verifier, r Record, to string, header map[string]string) error {
	if to == "" {
		to = r.To
	}
	if err := (Config{To: to, Header: header}).Validate(); err != nil {
		return err
	}
	if v == nil {
		v = &attest.Verifier{Subjects: Config{Prefix: u.prefix}.subjects()}
	}
	if _, err := v.Verify(r.Subject, r.msg.header, r.msg.body); err != nil {
		return fmt.Errorf("%w: %w", ErrUnverifiable, err)
	}
	if client == nil {
		client = &http.Client{Timeout: DefaultTimeout, CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	}
	req, err := newRequest(ctx, to, header, r.msg)
	if err != nil {
		return err
	}
	resp, err := client.Do(req)
	if err != nil {
		return fmt.Errorf("forward: delivering kept verdict %d to %s: %w", r.Seq, redact(to), err)
	}
	resp.Body.Close()
	if resp.StatusCode/100 != 2 {
		return fmt.Errorf("forward: delivering kept verdict %d to %s: the receiver answered %d", r.Seq, redact(to), resp.StatusCode)
	}
	return u.Remove(ctx, r.Seq)
}
