package events

import (
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func TestParseTimeAccepts(t *testing.T) {
	pst := time.FixedZone("", -8*3600)
	for _, tc := range []struct {
		in   string
		want time.Time
	}{
		{"2025-01-02T15:04:05Z", time.Date(2025, 1, 2, 15, 4, 5, 0, time.UTC)},
		{"2026-01-01t00:00:00z", time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)},
		{"2026-01-01T00:00:00z", time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)},
		{"2026-01-01t00:00:00Z", time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)},
		{"1985-04-12T23:20:50.52Z", time.Date(1985, 4, 12, 23, 20, 50, 520_000_000, time.UTC)},
		{"1996-12-19T16:39:57-08:00", time.Date(1996, 12, 19, 16, 39, 57, 0, pst)},
		{"1937-01-01T12:00:27.87+00:20", time.Date(1937, 1, 1, 12, 0, 27, 870_000_000, time.FixedZone("", 20*60))},
		{"2025-01-02T15:04:05-00:00", time.Date(2025, 1, 2, 15, 4, 5, 0, time.UTC)},
		{"2025-01-02T15:04:05+23:59", time.Date(2025, 1, 2, 15, 4, 5, 0, time.FixedZone("", 23*3600+59*60))},
		{"2025-01-02T15:04:05.123456789Z", time.Date(2025, 1, 2, 15, 4, 5, 123_456_789, time.UTC)},
		{"2025-01-02T15:04:05.1234567891234Z", time.Date(2025, 1, 2, 15, 4, 5, 123_456_789, time.UTC)},
		{"2024-02-29T00:00:00Z", time.Date(2024, 2, 29, 0, 0, 0, 0, time.UTC)},
		{"2000-02-29T00:00:00Z", time.Date(2000, 2, 29, 0, 0, 0, 0, time.UTC)},
		{"0000-01-01T00:00:00Z", time.Date(0, 1, 1, 0, 0, 0, 0, time.UTC)},
		{"9999-12-31T23:59:59.999999999Z", time.Date(9999, 12, 31, 23, 59, 59, 999_999_999, time.UTC)},
		// Leap seconds: the last nanosecond before they end.
		{"2016-12-31T23:59:60Z", time.Date(2016, 12, 31, 23, 59, 59, 999_999_999, time.UTC)},
		{"2016-12-31t23:59:60.5z", time.Date(2016, 12, 31, 23, 59, 59, 999_999_999, time.UTC)},
		{"1990-12-31T15:59:60-08:00", time.Date(1990, 12, 31, 15, 59, 59, 999_999_999, pst)},
		{"2015-06-30T23:59:60Z", time.Date(2015, 6, 30, 23, 59, 59, 999_999_999, time.UTC)},
		{"2017-01-01T05:29:60+05:30", time.Date(2017, 1, 1, 5, 29, 59, 999_999_999, time.FixedZone("", 5*3600+30*60))},
	} {
		got, ok := parseTime(tc.in)
		require.True(t, ok, "%s refused", tc.in)
		require.True(t, tc.want.Equal(got), "%s: got %v, want %v", tc.in, got, tc.want)
		_, wantOff := tc.want.Zone()
		_, gotOff := got.Zone()
		require.Equal(t, wantOff, gotOff, "%s keeps its offset", tc.in)
		if wantOff == 0 {
			require.Equal(t, time.UTC, got.Location(), "%s: a zero offset is UTC", tc.in)
		}
	}
}

func TestParseTimeRefuses(t *testing.T) {
	for _, in := range []string{
		"",
		"2025-01-02",
		"2025-01-02T15:04:05",          // no offset
		"2025-01-02T15:04Z",            // no seconds
		"2025-01-02 15:04:05Z",         // space for T
		"2025-01-02_15:04:05Z",         // anything else for T
		"2025-01-02T24:00:00Z",         // hour 24
		"2025-13-02T15:04:05Z",         // month 13
		"2025-00-02T15:04:05Z",         // month 0
		"2025-01-00T15:04:05Z",         // day 0
		"2025-01-32T15:04:05Z",         // day 32
		"2025-02-29T15:04:05Z",         // not a leap year
		"1900-02-29T15:04:05Z",         // not a leap year either
		"2025-04-31T15:04:05Z",         // April has 30
		"2025-01-02T15:60:05Z",         // minute 60
		"2025-01-02T15:04:61Z",         // second 61
		"2025-01-02T15:04:60Z",         // 60 where no leap second can be
		"2016-12-30T23:59:60Z",         // not the last day of the month
		"2016-12-31T23:58:60Z",         // not the last minute
		"2016-12-31T23:59:60+01:00",    // 22:59:60 UTC
		"2025-01-02T15:04:05.Z",        // a dot without digits
		"2025-01-02T15:04:05,5Z",       // a comma
		"2025-01-02T15:04:05+24:00",    // offset hour 24
		"2025-01-02T15:04:05+01:60",    // offset minute 60
		"2025-01-02T15:04:05+0100",     // offset without colon
		"2025-01-02T15:04:05+01",       // offset without minutes
		"2025-01-02T15:04:05UTC",       // a zone name
		"2025-01-02T15:04:05ZZ",        // trailing
		"2025-01-02T15:04:05Z ",        // trailing space
		" 2025-01-02T15:04:05Z",        // leading space
		"+2025-01-02T15:04:05Z",        // a sign
		"20250-01-02T15:04:05Z",        // five digits of year
		"2025-1-02T15:04:05Z",          // one digit of month
		"2025-01-02T5:04:05Z",          // one digit of hour
		"2025-01-02T15:04:05.5.5Z",     // two fractions
		"2025-01-02T15:04:05.-5Z",      // a sign in the fraction
		"2025-01-02T15:04:05\u00a0Z",   // not ASCII
		"２０２５-01-02T15:04:05Z",         // not ASCII digits
		"2025-01-02T15:04:05.123+1:00", // one digit of offset hour
	} {
		_, ok := parseTime(in)
		require.False(t, ok, "%q accepted", in)
	}
}

// TestTimeBothModes decodes RFC 3339 times that Go's time.Parse refuses in
// the ce-time header (binary mode) and in a structured event, through both
// decoders, and refuses the same malformed ones in both.
func TestTimeBothModes(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want time.Time // zero: refused
	}{
		{"2016-12-31T23:59:60Z", time.Date(2016, 12, 31, 23, 59, 59, 999_999_999, time.UTC)},
		{"2026-01-01t00:00:00z", time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)},
		{"2026-01-01t00:00:00.25+05:30", time.Date(2026, 1, 1, 0, 0, 0, 250_000_000, time.FixedZone("", 5*3600+30*60))},
		{"2026-01-01 00:00:00Z", time.Time{}},
		{"2026-01-01T24:00:00Z", time.Time{}},
	} {
		s := newSpec(TypeTurnAppended, map[string]any{"time": tc.in}, nil)
		body := s.structured(t)
		h, data, ok := s.binary()
		require.True(t, ok)
		checkDecode(t, testNATSSubject, nil, body, Subjects{})
		checkDecode(t, testNATSSubject, h, data, Subjects{})
		checkDecodeJSON(t, body)
		for mode, dec := range map[string]func() (*Event, error){
			"structured": func() (*Event, error) { return DecodeMsg(testNATSSubject, nil, body, Subjects{}) },
			"binary":     func() (*Event, error) { return DecodeMsg(testNATSSubject, h, data, Subjects{}) },
			"json line":  func() (*Event, error) { return DecodeJSON(body, Meta{Subject: testNATSSubject}) },
		} {
			ev, err := dec()
			if tc.want.IsZero() {
				requireCode(t, err, CodeMalformed, "time")
				continue
			}
			require.NoError(t, err, "%s %s", mode, tc.in)
			require.True(t, tc.want.Equal(ev.Time), "%s %s: got %v", mode, tc.in, ev.Time)
		}
	}
}

// FuzzParseTime checks parseTime two ways: every time formatted as RFC 3339
// (with any offset, any case of T and Z, any number of fractional digits)
// parses back to the same instant and offset; and on any string, it agrees
// with time.Parse wherever time.Parse accepts a string of RFC 3339's
// fixed-width fields, and wherever parseTime
// accepts something time.Parse refuses, that is a lower-case t or z or a
// leap second, which time.Parse does not take.
func FuzzParseTime(f *testing.F) {
	f.Add(int64(0), int32(0), int32(0), uint8(0), "")
	f.Add(int64(1483228799), int32(999999999), int32(-8*3600), uint8(3), "2016-12-31T23:59:60Z")
	f.Add(int64(-62135596800), int32(1), int32(23*3600+59*60), uint8(1), "2026-01-01t00:00:00z")
	f.Add(int64(253402300799), int32(5e8), int32(-(23*3600 + 59*60)), uint8(2), "2025-01-02T15:04:05,5Z")
	f.Fuzz(func(t *testing.T, sec int64, nsec, offset int32, style uint8, s string) {
		// Round trip of a formatted time within RFC 3339's years.
		lo, hi := time.Date(0, 1, 1, 0, 0, 0, 0, time.UTC).Unix()+86400, time.Date(9999, 12, 31, 0, 0, 0, 0, time.UTC).Unix()
		sec = lo + (sec%(hi-lo)+(hi-lo))%(hi-lo)
		nsec = (nsec%1e9 + 1e9) % 1e9
		offset = (offset%(24*60) + 24*60) % (24 * 60) * 60 // whole minutes, under a day
		if style&4 != 0 {
			offset = -offset
		}
		zone := time.UTC
		if offset != 0 {
			zone = time.FixedZone("", int(offset))
		}
		tm := time.Unix(sec, int64(nsec)).In(zone)
		layout := time.RFC3339Nano
		if style&8 != 0 {
			layout = "2006-01-02T15:04:05.000000000Z07:00" // trailing zeros kept
		}
		text := tm.Format(layout)
		if style&1 != 0 {
			text = strings.Replace(text, "T", "t", 1)
		}
		if style&2 != 0 {
			text = strings.Replace(text, "Z", "z", 1)
		}
		got, ok := parseTime(text)
		require.True(t, ok, "%q refused", text)
		require.True(t, tm.Equal(got), "%q: got %v, want %v", text, got, tm)
		_, off := got.Zone()
		require.Equal(t, int(offset), off, "%q keeps its offset", text)

		// Agreement with time.Parse on any string.
		mine, ok := parseTime(s)
		theirs, err := time.Parse(time.RFC3339Nano, s)
		// Go also takes a comma for the fractional dot and one-digit
		// fields (through its general parser); RFC 3339 takes neither.
		fixed := len(s) >= 20 && s[4] == '-' && s[7] == '-' && s[10] == 'T' && s[13] == ':' && s[16] == ':'
		if err == nil && fixed && !strings.Contains(s, ",") {
			require.True(t, ok, "%q: time.Parse takes it, parseTime refuses", s)
			require.True(t, theirs.Equal(mine), "%q: %v, time.Parse %v", s, mine, theirs)
			_, o1 := mine.Zone()
			_, o2 := theirs.Zone()
			require.Equal(t, o2, o1, "%q offset", s)
		}
		if ok && err != nil {
			leap := len(s) >= 19 && s[17:19] == "60"
			lower := strings.ContainsAny(s, "tz")
			require.True(t, leap || lower, "%q: parseTime takes it, time.Parse refuses: %v", s, err)
		}
	})
}
