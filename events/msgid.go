package events

import (
	"crypto/sha256"
	"encoding/hex"
	"strconv"
)

// MsgIDPrefix starts every message id MsgID derives; it names the
// derivation, so that another one can come later without ambiguity.
const MsgIDPrefix = "ce1-"

// MsgID returns the Nats-Msg-Id of the event (source, id): MsgIDPrefix and
// the lower-case hex SHA-256 of the two attributes as netstrings,
//
//	len(source) ":" source "," len(id) ":" id ","
//
// with lengths in bytes, in decimal. CloudEvents makes an event unique by
// source and id together, and so does this: two agents that both send id
// "1" get different message ids, and the events stream's dedupe drops
// neither. The length prefixes keep ("a:b", "c") and ("a", "b:c") apart.
// The result is 68 printable ASCII characters whatever the attributes
// hold, so it fits a NATS header. Any goroutine may call it.
func MsgID(source, id string) string {
	b := make([]byte, 0, len(source)+len(id)+24)
	b = strconv.AppendInt(b, int64(len(source)), 10)
	b = append(b, ':')
	b = append(b, source...)
	b = append(b, ',')
	b = strconv.AppendInt(b, int64(len(id)), 10)
	b = append(b, ':')
	b = append(b, id...)
	b = append(b, ',')
	sum := sha256.Sum256(b)
	return MsgIDPrefix + hex.EncodeToString(sum[:])
}
