package spill

import "github.com/nats-io/nats.go/jetstream"

// SessionOf returns the session whose spill info describes, as Write
// stored it in the object's metadata, or "" for an object Write did not
// write. Reader.Spill checks it against the session a request may read.
func SessionOf(info *jetstream.ObjectInfo) string {
	if info == nil {
		return ""
	}
	return info.Metadata[metaSession]
}
