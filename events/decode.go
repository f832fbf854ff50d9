package events

// ContentTypeCloudEventsJSON is the media type of a structured-mode event.
const ContentTypeCloudEventsJSON = "application/cloudevents+json"

// ContentTypeJSON is the only data content type seamguard accepts.
const ContentTypeJSON = "application/json"

// DecodeMsg decodes and validates one input message as it arrived from NATS:
// its subject, headers (nats.Header is a map[string][]string) and body.
// Either CloudEvents content mode is accepted (see the package doc). The
// event's subject attribute must equal the session token of the NATS subject.
//
// On success the returned event's Meta holds the NATS subject and a copy of
// the headers; the caller sets Meta.Seq. Every failure is an *Error carrying
// the rejection code and the offending field. DecodeMsg does not retain its
// arguments and is safe for concurrent use.
func DecodeMsg(subject string, header map[string][]string, body []byte, subjects Subjects) (*Event, error) {
	ev, err := decodeMsg(subject, header, body, subjects, false)
	if err != nil {
		return nil, err
	}
	ev.Meta = Meta{Subject: subject, Headers: copyHeaderPacked(header), Control: subjects.IsControl(subject)}
	return ev, nil
}

// DecodeMsgOwned is DecodeMsg for a caller that hands header and body over,
// such as the consumer of a NATS delivery, whose header and data are its
// own: the event's Meta.Headers is header itself (nil when header is
// empty), and its Data may be body itself or a part of it, not copies. The
// caller must change neither afterwards; the result is otherwise the same
// as DecodeMsg's.
func DecodeMsgOwned(subject string, header map[string][]string, body []byte, subjects Subjects) (*Event, error) {
	ev, err := decodeMsg(subject, header, body, subjects, true)
	if err != nil {
		return nil, err
	}
	if len(header) == 0 {
		header = nil
	}
	ev.Meta = Meta{Subject: subject, Headers: header, Control: subjects.IsControl(subject)}
	return ev, nil
}

// decodeMsg is DecodeMsg without Meta. With own, the event's Data may be
// body itself or a part of it.
//
// The content mode is binary when there is a ce-specversion header and the
// Content-Type is not application/cloudevents+json; structured otherwise,
// and then the ce-* headers, if any, must agree with the body.
func decodeMsg(subject string, header map[string][]string, body []byte, subjects Subjects, own bool) (*Event, *Error) {
	var hd headers
	if err := readHeaders(header, &hd); err != nil {
		return nil, err
	}
	env := &hd.env
	if env.has(attrSpecversion) && !(hd.hasCT && isMediaType(hd.ct, ContentTypeCloudEventsJSON)) {
		if !env.has(attrDataContentType) && hd.hasCT {
			env.setString(attrDataContentType, jsonText(hd.ct))
		}
		if err := env.readBinary(body, own); err != nil {
			return nil, err
		}
	} else {
		var st envelope
		if err := st.readStructured(body, own); err != nil {
			return nil, err
		}
		if env.have != 0 || len(env.ext) > 0 {
			if err := headersAgree(env, &st); err != nil {
				return nil, err
			}
		}
		env = &st
	}
	return env.validate(origin{subject: subject, subjects: subjects, fromNATS: true})
}

// DecodeJSON decodes and validates one structured-mode event, such as a line
// of a spill or of an offline input file. meta is stored in the event as is.
// There is no NATS subject to check, but the subject attribute must still be
// a valid session id. Every failure is an *Error. DecodeJSON does not retain
// line and is safe for concurrent use.
func DecodeJSON(line []byte, meta Meta) (*Event, error) {
	var env envelope
	if err := env.readStructured(line, false); err != nil {
		return nil, err
	}
	ev, err := env.validate(origin{})
	if err != nil {
		return nil, err
	}
	ev.Meta = meta
	return ev, nil
}
