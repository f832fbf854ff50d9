package events

import (
	"bytes"
	"crypto/sha256"
	"encoding/base64"
	"errors"
	"fmt"
	"strings"
)

// PercentEncode encodes a CloudEvents attribute for a ce-* header in binary
// content mode, as the CloudEvents NATS binding's draft asks (and its HTTP
// binding does): space, '"', '%' and every byte outside printable ASCII
// become %XX, upper-case hex of each UTF-8 byte. The decoder reads it back.
// A value with nothing to encode is returned as it is.
func PercentEncode(s string) string {
	const hex = "0123456789ABCDEF"
	var b []byte
	for i := 0; i < len(s); i++ {
		ch := s[i]
		if ch > ' ' && ch < 0x7f && ch != '"' && ch != '%' {
			if b != nil {
				b = append(b, ch)
			}
			continue
		}
		if b == nil {
			b = append(make([]byte, 0, len(s)+8), s[:i]...)
		}
		b = append(b, '%', hex[ch>>4], hex[ch&15])
	}
	if b == nil {
		return s
	}
	return string(b)
}

// DecodeDigest decodes the digest of a spill handle (the JetStream object
// store's): "SHA-256=" and the URL-safe base64 of the sum, with or without
// padding, the algorithm's name in any case. It returns the 32 bytes of the
// sum.
func DecodeDigest(d string) ([]byte, error) {
	alg, enc, ok := strings.Cut(d, "=")
	if !ok || !strings.EqualFold(alg, "SHA-256") {
		return nil, errors.New(`not "SHA-256=" and base64`)
	}
	sum, err := base64.RawURLEncoding.DecodeString(strings.TrimRight(enc, "="))
	if err != nil {
		return nil, err
	}
	if len(sum) != sha256.Size {
		return nil, fmt.Errorf("%d bytes, not a SHA-256 sum", len(sum))
	}
	return sum, nil
}

// SameDigest reports whether two spill digests name the same SHA-256 sum,
// padded or not: compare digests with it, not as strings. A digest that
// does not decode is the same as none.
func SameDigest(a, b string) bool {
	da, err1 := DecodeDigest(a)
	db, err2 := DecodeDigest(b)
	return err1 == nil && err2 == nil && bytes.Equal(da, db)
}
