package events

import (
	"strings"
	"testing"
)

// BenchmarkDecodeMsg decodes a binary-mode turn with 1 KiB and 8 KiB of
// content, as agents publish them; bytes/op against the input size is the
// allocation factor.
func BenchmarkDecodeMsg(b *testing.B) {
	subj := Subjects{Prefix: DefaultPrefix, Partitions: 16}
	for _, size := range []int{1 << 10, 8 << 10} {
		body := []byte(`{"offset":41,"size":1,"role":"user","tokens":256,"content":"` + strings.Repeat("lorem ipsum ", size/12) + `"}`)
		hdr := map[string][]string{
			"Ce-Specversion": {"1.0"}, "Ce-Id": {"s1-0042"}, "Ce-Source": {"urn:agent:bench"},
			"Ce-Type": {TypeTurnAppended}, "Ce-Subject": {"s1"}, "Ce-Time": {"2026-11-29T12:00:00.042Z"},
			"Content-Type": {ContentTypeJSON}, "Nats-Msg-Id": {"s1-0042"},
		}
		b.Run(map[bool]string{true: "8KiB", false: "1KiB"}[size > 1<<10], func(b *testing.B) {
			b.SetBytes(int64(len(body)))
			b.ReportAllocs()
			for b.Loop() {
				if _, err := DecodeMsg(subj.Events("s1"), hdr, body, subj); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
