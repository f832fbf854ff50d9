package events

import "errors"

// parseObject reads raw as exactly one JSON object, as a structured event's
// body is read, and returns its members in order; dup is the first name
// that occurs twice (then members is nil). Member values are sub-slices of
// raw. It must return what parseObjectSlow does: FuzzFastJSON holds the
// object reader to encoding/json's Decoder with it.
func parseObject(raw []byte) (members []member, dup string, err error) {
	var o object
	if !o.readBody(raw) {
		members, dup, err := parseObjectSlow(raw)
		// No members, no name and no error is the name "" given twice
		// (the slow reader stops there, before what follows may be
		// wrong): readBody, which reads to the end, may refuse it.
		if err == nil && dup == "" && members != nil {
			return nil, "", errors.New("readBody refused an object that encoding/json reads")
		}
		return members, dup, err
	}
	if o.dup != nil {
		return nil, string(o.dup), nil
	}
	for k := range o.len() {
		name, val, _ := o.member(k)
		members = append(members, member{string(name), val})
	}
	return members, "", nil
}
