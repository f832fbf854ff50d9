package read

import (
	"bytes"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
)

func TestWriteData(t *testing.T) {
	for _, c := range []struct{ in, want string }{
		{`{"a":1}`, "data: {\"a\":1}\n\n"},
		{"", "data: \n\n"},
		{"a\nb", "data: a\ndata: b\n\n"},
		{"a\r\nb", "data: a\ndata: b\n\n"},
		{"a\rb\n", "data: a\ndata: b\ndata: \n\n"},
		{"a\n\nb", "data: a\ndata: \ndata: b\n\n"},
	} {
		var b bytes.Buffer
		writeData(&b, []byte(c.in))
		assert.Equal(t, c.want, b.String(), "%q", c.in)
		// What a client joins back is the input with its line breaks as LF.
		var lines []string
		for _, l := range strings.Split(strings.TrimSuffix(b.String(), "\n\n"), "\n") {
			lines = append(lines, strings.TrimPrefix(l, "data: "))
		}
		want := strings.NewReplacer("\r\n", "\n", "\r", "\n").Replace(c.in)
		assert.Equal(t, want, strings.Join(lines, "\n"))
	}
}

func TestSpillNumber(t *testing.T) {
	for in, want := range map[string]uint64{
		"1": 1, "3.jsonl": 3, "18446744073709551615": 1<<64 - 1,
		"0": 0, "01": 0, "+1": 0, "-1": 0, " 1": 0, "1 ": 0, "": 0, ".jsonl": 0, "1.JSONL": 0,
		"1.jsonl.jsonl": 0, "0x1": 0, "1e3": 0, "../1": 0, "1/2": 0, "18446744073709551616": 0,
	} {
		n, ok := spillNumber(in)
		assert.Equal(t, want, n, "%q", in)
		assert.Equal(t, want != 0, ok, "%q", in)
	}
}

func TestConfigValidate(t *testing.T) {
	assert.NoError(t, Config{}.Validate())
	err := Config{Prefix: "a..b", MaxStreams: -1, MaxSpillReads: -2, DigestCache: -3, Heartbeat: -1, WriteTimeout: 1, Poll: -1}.Validate()
	for _, s := range []string{"Prefix", "MaxStreams", "MaxSpillReads", "DigestCache", "Heartbeat", "WriteTimeout", "Poll"} {
		assert.ErrorContains(t, err, "Config."+s)
	}
	assert.ErrorContains(t, Config{Prefix: "a.*"}.Validate(), "wildcard")
	_, err = New(nil, nil, Config{MaxStreams: -1})
	assert.ErrorContains(t, err, "js is nil")
	assert.ErrorContains(t, err, "access is nil")
	assert.ErrorContains(t, err, "MaxStreams")
}
