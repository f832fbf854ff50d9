package events

import "time"

// parseTime parses an RFC 3339 timestamp (RFC 3339 section 5.6):
//
//	date-time = full-date "T" full-time
//	full-date = YYYY "-" MM "-" DD
//	full-time = hh ":" mm ":" ss [ "." 1*DIGIT ] ( "Z" / ( "+" / "-" ) hh ":" mm )
//
// with "T" and "Z" in either case, the day within its month, hours 00-23,
// minutes 00-59, seconds 00-59, and second 60 only for a leap second: one
// that falls on 23:59:60 UTC on the last day of a month (RFC 3339 section
// 5.7; which month ends take one is announced months ahead, so any is
// accepted). An offset hour may be 00-23 and "-00:00" means UTC. Fractional
// digits past nanoseconds are dropped.
//
// A leap second is represented as the last nanosecond before it ends,
// 23:59:59.999999999 UTC (in the offset it was written with), whatever its
// fraction: time.Time has no leap seconds, and that instant keeps the order
// of every timestamp around it and the date it was written on.
//
// The result is in UTC when the offset is zero, else in an unnamed fixed
// zone, so that it does not depend on the local time zone. Space, a
// missing offset, "24:00", month 13 and the like are refused.
func parseTime(s string) (time.Time, bool) {
	// YYYY-MM-DDThh:mm:ss is 19 bytes, and an offset at least one more.
	if len(s) < 20 || s[4] != '-' || s[7] != '-' || s[10]|0x20 != 't' || s[13] != ':' || s[16] != ':' {
		return time.Time{}, false
	}
	year, ok1 := digits(s[0:4])
	month, ok2 := digits(s[5:7])
	day, ok3 := digits(s[8:10])
	hour, ok4 := digits(s[11:13])
	minute, ok5 := digits(s[14:16])
	sec, ok6 := digits(s[17:19])
	if !(ok1 && ok2 && ok3 && ok4 && ok5 && ok6) ||
		month < 1 || month > 12 || day < 1 || day > daysIn(time.Month(month), year) ||
		hour > 23 || minute > 59 || sec > 60 {
		return time.Time{}, false
	}
	rest := s[19:]
	nsec := 0
	if rest[0] == '.' {
		n := 1
		for n < len(rest) && rest[n] >= '0' && rest[n] <= '9' {
			if n <= 9 {
				nsec = nsec*10 + int(rest[n]-'0')
			}
			n++
		}
		if n == 1 {
			return time.Time{}, false // "." needs a digit
		}
		for k := n; k <= 9; k++ {
			nsec *= 10
		}
		rest = rest[n:]
	}
	var offset int
	switch {
	case len(rest) == 1 && rest[0]|0x20 == 'z':
	case len(rest) == 6 && (rest[0] == '+' || rest[0] == '-') && rest[3] == ':':
		oh, ok1 := digits(rest[1:3])
		om, ok2 := digits(rest[4:6])
		if !ok1 || !ok2 || oh > 23 || om > 59 {
			return time.Time{}, false
		}
		offset = (oh*60 + om) * 60
		if rest[0] == '-' {
			offset = -offset
		}
	default:
		return time.Time{}, false
	}
	zone := time.UTC
	if offset != 0 {
		zone = time.FixedZone("", offset)
	}
	if sec < 60 {
		return time.Date(year, time.Month(month), day, hour, minute, sec, nsec, zone), true
	}
	// A leap second: 23:59:60 in UTC, on the last day of a month.
	t := time.Date(year, time.Month(month), day, hour, minute, 59, 999_999_999, zone)
	u := t.UTC()
	if u.Hour() != 23 || u.Minute() != 59 || u.Day() != daysIn(u.Month(), u.Year()) {
		return time.Time{}, false
	}
	return t, true
}

// digits parses s, made of ASCII digits only, as a decimal number.
func digits(s string) (int, bool) {
	n := 0
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c < '0' || c > '9' {
			return 0, false
		}
		n = n*10 + int(c-'0')
	}
	return n, true
}

// daysIn is the number of days of month m in year y (proleptic Gregorian).
func daysIn(m time.Month, y int) int {
	switch m {
	case time.February:
		if y%4 == 0 && (y%100 != 0 || y%400 == 0) {
			return 29
		}
		return 28
	case time.April, time.June, time.September, time.November:
		return 30
	}
	return 31
}
