package inspect

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strings"

	"github.com/seamguard/seamguard/events"
	"github.com/seamguard/seamguard/processor/ledger"
	"github.com/seamguard/seamguard/spill"
)

// SpillCheck is what VerifySpill found of a spill and its chain.
type SpillCheck struct {
	Name  string               `json:"name"`
	Chain []events.SpillHandle `json:"chain"` // oldest first; the last is Name's
	Lines uint64               `json:"lines"` // events the chain holds
	Bytes uint64               `json:"bytes"`
	// Accepted counts the session's accepted events up to the chain's last
	// sequence, derived again from the events stream.
	Accepted uint64 `json:"accepted"`
	// Problems says how the chain differs from those events; empty when it
	// holds exactly them, in order, each object its own stretch.
	Problems []string `json:"problems"`
}

// maxProblems bounds the differences a SpillCheck lists.
const maxProblems = 10

// VerifySpill reads the whole chain of the spill called name (named
// "<session>/<n>.jsonl"), verifying each object's digest, and checks it
// against the session's events: the chain's lines must be the session's
// accepted events from its first to the chain's last sequence, in order,
// derived again from the events stream with the pure core under cfg, and
// each object must hold the accepted events of its own stretch (after the
// previous spill's last sequence, up to its own). An unreadable or broken
// chain is an error; differences are listed in Problems.
func (s Source) VerifySpill(ctx context.Context, name string, cfg ledger.Config) (*SpillCheck, error) {
	session, _, ok := strings.Cut(name, "/")
	if !ok || !events.ValidSessionID(session) {
		return nil, fmt.Errorf("inspect: %q is not a spill name: they look like <session>/<n>.jsonl", name)
	}
	names := s.Config.Names()
	store := &spill.Store{JS: s.JS, Stream: names.Events, Subjects: s.Config.Subjects(), Bucket: names.Spills}
	chk := &SpillCheck{Name: name, Problems: []string{}}
	problem := func(format string, args ...any) {
		if len(chk.Problems) < maxProblems {
			chk.Problems = append(chk.Problems, fmt.Sprintf(format, args...))
		}
	}

	// The chain's lines: their (source, id), read as they are copied.
	type key struct{ source, id string }
	var lines []key
	pr, pw := io.Pipe()
	scanned := make(chan error, 1)
	go func() {
		sc := bufio.NewScanner(pr)
		sc.Buffer(nil, 64<<20)
		for sc.Scan() {
			var e struct {
				ID     string `json:"id"`
				Source string `json:"source"`
			}
			if err := json.Unmarshal(sc.Bytes(), &e); err != nil {
				lines = append(lines, key{"", fmt.Sprintf("(line %d is not JSON)", len(lines)+1)})
				continue
			}
			lines = append(lines, key{e.Source, e.ID})
		}
		_, _ = io.Copy(io.Discard, pr) // a line too long: keep the reader going
		scanned <- sc.Err()
	}()
	chain, err := store.GetChain(ctx, name, pw)
	pw.CloseWithError(err)
	serr := <-scanned
	if err != nil {
		return nil, fmt.Errorf("inspect: read the chain of %s: %w", name, err)
	}
	if serr != nil {
		return nil, fmt.Errorf("inspect: read the chain of %s: %w", name, serr)
	}
	chk.Chain, chk.Lines = chain, uint64(len(lines))
	for _, h := range chain {
		chk.Bytes += h.Size
	}
	last := chain[len(chain)-1].LastSeq

	// The accepted events, derived again; spill requests are answered as
	// Rebuild answers them.
	_, outcomes, err := s.History(ctx, session)
	if err != nil {
		return nil, err
	}
	d := &Deriver{Subjects: s.Config.Subjects(), Config: cfg, Spill: s.SpillAnswers(outcomes, nil)}
	var accepted []key
	var seqs []uint64
	err = s.readStream(ctx, names.Events, s.eventsFilters(session), nil, func(m message) error {
		seq := m.Seq
		if seq > last {
			return errStop
		}
		a, err := d.Apply(ctx, m.Subject, m.Header, m.Data, seq)
		if err != nil {
			return err
		}
		if a.Accepted {
			accepted = append(accepted, key{a.Source, a.EventID})
			seqs = append(seqs, seq)
		}
		return nil
	})
	if err != nil && !errors.Is(err, errStop) {
		return nil, err
	}
	chk.Accepted = uint64(len(accepted))

	if first := chain[0].FirstSeq; len(seqs) == 0 || seqs[0] != first {
		problem("the chain starts at stream sequence %d, but the events stream's first accepted event of session %s is %s (events aged out or purged cannot be checked)",
			first, session, firstSeq(seqs))
	}
	if len(lines) != len(accepted) {
		problem("the chain holds %d events, but session %s accepted %d up to stream sequence %d", len(lines), session, len(accepted), last)
	}
	for i := range min(len(lines), len(accepted)) {
		if lines[i] != accepted[i] {
			problem("line %d of the chain is event %q of %q, but the session's accepted event %d is %q of %q (stream sequence %d)",
				i+1, lines[i].id, lines[i].source, i+1, accepted[i].id, accepted[i].source, seqs[i])
			break
		}
	}
	// Each object holds its own stretch.
	var prevLast uint64
	for _, h := range chain {
		var n uint64
		for _, q := range seqs {
			if q > prevLast && q <= h.LastSeq {
				n++
			}
		}
		if n != h.Events {
			problem("%s holds %d events (stream sequences %d to %d), but session %s accepted %d after %d up to %d", h.Name, h.Events, h.FirstSeq, h.LastSeq, session, n, prevLast, h.LastSeq)
		}
		prevLast = h.LastSeq
	}
	return chk, nil
}

// errStop ends a readStream early.
var errStop = errors.New("inspect: stop")

func firstSeq(seqs []uint64) string {
	if len(seqs) == 0 {
		return "none"
	}
	return fmt.Sprintf("at %d", seqs[0])
}
