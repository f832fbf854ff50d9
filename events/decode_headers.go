package events

import (
	"slices"
	"strings"
	"unicode/utf8"
)

// headers are the parts of a NATS header that matter to decoding: the ce-*
// headers as an envelope's attributes, and the Content-Type.
type headers struct {
	env   envelope // the ce-* headers, percent-decoded
	ct    string   // the Content-Type, when hasCT
	hasCT bool
	// probe is set on readHeaders' pass in map order, which reports a
	// fault as errProbe; the pass in byte order builds the rejection.
	probe bool
}

// errProbe is the fault a probing pass over headers reports.
var errProbe = &Error{Code: CodeMalformed, Message: "a header is at fault"}

// readHeaders reads h. A header name is read in any case; a header given
// several times, under one name or under names that differ in case, must
// have one value. When h is at fault, the error is the one a reader of the
// names in byte order meets first, so that the same input always gets the
// same error: the names are read in map order, and again in byte order
// only when that finds a fault.
func readHeaders(h map[string][]string, out *headers) *Error {
	out.probe = true
	for k, vs := range h {
		if out.add(k, vs) != nil {
			return readHeadersSorted(h, out)
		}
	}
	out.probe = false
	return nil
}

// readHeadersSorted is readHeaders in byte order of the names.
func readHeadersSorted(h map[string][]string, out *headers) *Error {
	*out = headers{}
	keys := make([]string, 0, len(h))
	for k := range h {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	for _, k := range keys {
		if err := out.add(k, h[k]); err != nil {
			return err
		}
	}
	return nil
}

// add reads the header k with the values vs.
func (hd *headers) add(k string, vs []string) *Error {
	if kind, ok := attrByHeader(k); ok {
		return hd.addCore(k, kind, vs)
	}
	switch {
	case k == "Content-Type": // as the SDKs and Go's HTTP package spell it
		return hd.addContentType(vs)
	case k == "" || k[0]|0x20 != 'c':
		// Neither a ce- header nor Content-Type, in any case: no rune
		// but 'C' lowers to 'c'.
		return nil
	}
	return hd.addOther(k, vs)
}

// addContentType reads the values vs of a Content-Type header.
func (hd *headers) addContentType(vs []string) *Error {
	for _, v := range vs {
		if hd.hasCT && v != hd.ct {
			if hd.probe {
				return errProbe
			}
			return errContentTypeTwice(hd.ct, v)
		}
		hd.ct, hd.hasCT = v, true
	}
	return nil
}

// addOther is add for a header name spelled otherwise.
func (hd *headers) addOther(k string, vs []string) *Error {
	// lk is k in lower case as far as matching goes: an ASCII name is
	// matched ignoring case, any other is lowered as strings.ToLower does,
	// which turns some non-ASCII letters into ASCII ones.
	lk, ascii := k, isASCII(k)
	if !ascii {
		lk = strings.ToLower(k)
	}
	if asciiEqualFold(lk, "content-type") {
		return hd.addContentType(vs)
	}
	if len(lk) < 3 || !asciiEqualFold(lk[:3], "ce-") {
		return nil
	}
	if kind, ok := attrFolded(lk[3:]); ok {
		return hd.addCore(k, kind, vs)
	}
	name := lk[3:]
	if ascii {
		name = strings.ToLower(name)
	}
	switch {
	case hd.probe && (name == "data" || name == "data_base64" || !validAttrName(name)):
		return errProbe
	case name == "data" || name == "data_base64":
		return errDataHeader(k)
	case !validAttrName(name):
		return errHeaderName(k, name)
	}
	for _, v := range vs {
		if err := hd.addExt(k, name, v); err != nil {
			return err
		}
	}
	return nil
}

// addCore reads the values vs of the header k, which names core attribute
// kind.
func (hd *headers) addCore(k string, kind attrKind, vs []string) *Error {
	name := attrTable[kind].name
	for _, v := range vs {
		dv := v
		if strings.IndexByte(v, '%') >= 0 || !utf8.ValidString(v) {
			var err *Error
			if dv, err = hd.decodeValue(k, name, v); err != nil {
				return err
			}
		}
		if hd.env.has(kind) && hd.env.attr[kind] != dv {
			if hd.probe {
				return errProbe
			}
			return givenTwice(name, hd.env.attr[kind], dv)
		}
		hd.env.setString(kind, dv)
	}
	return nil
}

// addExt reads the value v of the header k, which names the extension
// attribute name.
func (hd *headers) addExt(k, name, v string) *Error {
	dv, err := hd.decodeValue(k, name, v)
	if err != nil {
		return err
	}
	val := jsonString(dv)
	if prev, seen := hd.env.ext[name]; seen {
		if string(prev) != string(val) { // jsonString spells each string one way
			if hd.probe {
				return errProbe
			}
			s, _ := asString(prev)
			return givenTwice(name, s, dv)
		}
		return nil
	}
	hd.env.addExt(name, val)
	return nil
}

// decodeValue percent-decodes the value v of the header k, which names
// the attribute name.
func (hd *headers) decodeValue(k, name, v string) (string, *Error) {
	dv, problem := percentDecode(v)
	switch {
	case problem == "":
		return dv, nil
	case hd.probe:
		return "", errProbe
	}
	return "", errHeaderValue(k, name, problem)
}

// percentDecode decodes %XX escapes in a header value. It says what is wrong
// when an escape is incomplete or the result is not UTF-8.
func percentDecode(s string) (string, string) {
	if strings.IndexByte(s, '%') < 0 {
		if !utf8.ValidString(s) {
			return "", "is not valid UTF-8"
		}
		return s, ""
	}
	buf := make([]byte, 0, len(s))
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c != '%' {
			buf = append(buf, c)
			continue
		}
		if i+2 >= len(s) {
			return "", "ends in an incomplete percent-escape"
		}
		hi, ok1 := unhex(s[i+1])
		lo, ok2 := unhex(s[i+2])
		if !ok1 || !ok2 {
			return "", "holds " + jsonQuote(s[i:i+3]) + ", which is not a percent-escape (% and two hex digits)"
		}
		buf = append(buf, hi<<4|lo)
		i += 2
	}
	if !utf8.Valid(buf) {
		return "", "does not decode to valid UTF-8"
	}
	return string(buf), ""
}

// jsonQuote returns s as a JSON string, for messages.
func jsonQuote(s string) string {
	return string(appendString(nil, s))
}

// unhex returns the value of the hex digit c.
func unhex(c byte) (byte, bool) {
	switch {
	case '0' <= c && c <= '9':
		return c - '0', true
	case 'a' <= c && c <= 'f':
		return c - 'a' + 10, true
	case 'A' <= c && c <= 'F':
		return c - 'A' + 10, true
	}
	return 0, false
}

// validAttrName reports whether name is a CloudEvents 1.0 attribute name:
// lower-case ASCII letters and digits.
func validAttrName[T string | []byte](name T) bool {
	if len(name) == 0 {
		return false
	}
	for i := 0; i < len(name); i++ {
		c := name[i]
		if !('a' <= c && c <= 'z' || '0' <= c && c <= '9') {
			return false
		}
	}
	return true
}

// mediaType returns the lower-case media type of a content type, without
// parameters.
func mediaType(ct string) string {
	if i := strings.IndexByte(ct, ';'); i >= 0 {
		ct = ct[:i]
	}
	return strings.ToLower(strings.TrimSpace(ct))
}

// isMediaType reports whether mediaType(ct) is want, a lower-case ASCII
// media type without parameters, sparing the work when ct is want exactly
// or shorter than want (no rune lowers to an ASCII one of more bytes).
func isMediaType(ct, want string) bool {
	return ct == want || len(ct) >= len(want) && mediaType(ct) == want
}

// asciiEqualFold reports whether s equals lower, an ASCII lower-case string,
// ignoring the case of ASCII letters in s only.
func asciiEqualFold(s, lower string) bool {
	if len(s) != len(lower) {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if 'A' <= c && c <= 'Z' {
			c += 'a' - 'A'
		}
		if c != lower[i] {
			return false
		}
	}
	return true
}

// isASCII reports whether s is ASCII text.
func isASCII(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] >= utf8.RuneSelf {
			return false
		}
	}
	return true
}

// jsonText is s as it reads back from the JSON string jsonString spells:
// s itself when it is valid UTF-8, else with each invalid byte replaced by
// U+FFFD.
func jsonText(s string) string {
	if utf8.ValidString(s) {
		return s
	}
	t, _ := asString(jsonString(s))
	return t
}

// headersAgree checks the ce-* headers of a structured-mode message against
// the attributes of its body, in byte order of their names.
func headersAgree(hd, body *envelope) *Error {
	names := make([]string, 0, int(numAttrs)+len(hd.ext))
	for k := range attrTable {
		if hd.has(attrTable[k].kind) {
			names = append(names, attrTable[k].name)
		}
	}
	for name := range hd.ext {
		names = append(names, name)
	}
	slices.Sort(names)
	for _, name := range names {
		hv, raw := hd.headerValue(name), body.attrJSON(name)
		if raw == nil {
			return errHeaderOnly(name, hv)
		}
		if !attrEqual(name, raw, hv) {
			return errContradicts(name, hv, raw)
		}
	}
	return nil
}

// headerValue returns the value the headers give the attribute name.
func (e *envelope) headerValue(name string) string {
	if k, ok := attrNamed(name); ok {
		return e.attr[k]
	}
	s, _ := asString(e.ext[name])
	return s
}

// attrJSON returns the attribute name as compacted JSON, nil when absent.
func (e *envelope) attrJSON(name string) []byte {
	if k, ok := attrNamed(name); ok {
		if !e.has(k) {
			return nil
		}
		return e.rawJSON(k)
	}
	return e.ext[name]
}

// attrEqual reports whether the body's attribute name, raw JSON, has the
// value hv of its header: the same string (the same instant, for time),
// or the same JSON spelling of a number or a boolean.
func attrEqual(name string, raw []byte, hv string) bool {
	s, isStr := asString(raw)
	if !isStr {
		return string(raw) == hv
	}
	if s == hv {
		return true
	}
	if name == "time" {
		t1, ok1 := parseTime(s)
		t2, ok2 := parseTime(hv)
		return ok1 && ok2 && t1.Equal(t2)
	}
	return false
}

// copyHeaderPacked copies h with all values in one allocation: each key's
// slice is a capped window of it, so appending to one never reaches
// another. nil value slices stay nil, empty ones stay empty.
func copyHeaderPacked(h map[string][]string) map[string][]string {
	if len(h) == 0 {
		return nil
	}
	n := 0
	for _, v := range h {
		n += len(v)
	}
	vals := make([]string, n)
	out := make(map[string][]string, len(h))
	for k, v := range h {
		if v == nil {
			out[k] = nil
			continue
		}
		m := copy(vals, v)
		out[k] = vals[:m:m]
		vals = vals[m:]
	}
	return out
}
