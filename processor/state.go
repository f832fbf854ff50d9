package processor

import (
	"encoding/binary"
	"fmt"

	"github.com/seamguard/seamguard/processor/ledger"
)

const stateVersion = 1

// State is what the session bucket holds for one session: the ledger snapshot
// and the stream sequence of the last input applied to it. Inputs at or below
// Seq are skipped when redelivered.
type State struct {
	Seq    uint64
	Ledger ledger.Ledger
}

// MarshalState encodes a session's state: a version byte, the sequence as a
// varint, then the ledger snapshot.
func MarshalState(seq uint64, l *ledger.Ledger) ([]byte, error) {
	snap, err := l.MarshalBinary()
	if err != nil {
		return nil, err
	}
	return marshalState(seq, snap), nil
}

// marshalState is MarshalState of a ledger snapshot.
func marshalState(seq uint64, snap []byte) []byte {
	b := make([]byte, 0, len(snap)+11)
	b = append(b, stateVersion)
	b = binary.AppendUvarint(b, seq)
	return append(b, snap...)
}

// UnmarshalState decodes what MarshalState wrote.
func UnmarshalState(b []byte) (State, error) {
	if len(b) == 0 || b[0] != stateVersion {
		return State{}, fmt.Errorf("%w: unknown version", ErrBadState)
	}
	seq, n := binary.Uvarint(b[1:])
	if n <= 0 {
		return State{}, fmt.Errorf("%w: bad sequence", ErrBadState)
	}
	var st State
	st.Seq = seq
	if err := st.Ledger.UnmarshalBinary(b[1+n:]); err != nil {
		return State{}, fmt.Errorf("%w: %w", ErrBadState, err)
	}
	return st, nil
}
