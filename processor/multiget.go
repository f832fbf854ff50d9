package processor

import (
	"context"
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
)

// This file holds the batch read of session states: the states of every
// session a batch must read go to the server as direct gets of the last
// message of each key's subject, many keys a request (JetStream's
// multi_last), instead of one request per key. The answers are what kv.Get
// answers for each key, read at once; a key with no state, or whose last
// message deletes it, is absent.

// maxMultiGet is the most keys one request asks for: the server answers at
// most 1024 messages a request.
const maxMultiGet = 1024

// multiGetWait bounds one request.
const multiGetWait = 5 * time.Second

// readStates reads the stored states of ids. A state that does not parse
// is left out (the batch reads it again and reports what is wrong with
// it). On an error nothing is returned, and the batch reads each state on
// its own.
func (p *Processor) readStates(ctx context.Context, nc *nats.Conn, ids []string) (map[string]prefetched, error) {
	out := make(map[string]prefetched, len(ids))
	for len(ids) > 0 {
		n := min(len(ids), maxMultiGet)
		if err := p.readStatesOnce(ctx, nc, ids[:n], out); err != nil {
			return nil, err
		}
		ids = ids[n:]
	}
	return out, nil
}

// readStatesOnce is one request of readStates.
func (p *Processor) readStatesOnce(ctx context.Context, nc *nats.Conn, ids []string, out map[string]prefetched) error {
	bucket := p.cfg.Names().Sessions
	prefix := KVPrefix(bucket)
	subjects := make([]string, len(ids))
	for i, id := range ids {
		subjects[i] = prefix + id
	}
	req, err := json.Marshal(struct {
		MultiLast []string `json:"multi_last"`
		Batch     int      `json:"batch"`
	}{subjects, len(subjects)})
	if err != nil {
		return err
	}
	inbox := nc.NewInbox() // not under the request mux: its subscription would get every answer too
	sub, err := nc.SubscribeSync(inbox)
	if err != nil {
		return fmt.Errorf("processor: reading %d states: %w", len(ids), err)
	}
	defer func() { _ = sub.Unsubscribe() }()
	if err := nc.PublishRequest("$JS.API.DIRECT.GET.KV_"+bucket, inbox, req); err != nil {
		return fmt.Errorf("processor: reading %d states: %w", len(ids), err)
	}
	rctx, cancel := context.WithTimeout(ctx, multiGetWait)
	defer cancel()
	bad := map[string]bool{}
	for {
		m, err := sub.NextMsgWithContext(rctx)
		if err != nil {
			return fmt.Errorf("processor: reading %d states: %w", len(ids), err)
		}
		if status := m.Header.Get("Status"); status != "" {
			switch {
			case status == "204" && m.Header.Get("Nats-Num-Pending") == "0", status == "404":
				// The end, every key answered (or none has a message):
				// a key not answered has no state.
				for _, id := range ids {
					if _, ok := out[id]; !ok && !bad[id] {
						out[id] = prefetched{}
					}
				}
				p.count.readAhead.Add(uint64(len(ids)))
				return nil
			case status == "204":
				// Cut short (the server's bound on bytes a request): the
				// keys not answered are read on their own.
				p.count.readAhead.Add(uint64(len(out)))
				return nil
			}
			return fmt.Errorf("processor: reading %d states: the server answered %s %s", len(ids), status, m.Header.Get("Description"))
		}
		id, ok := strings.CutPrefix(m.Header.Get("Nats-Subject"), prefix)
		if !ok {
			return fmt.Errorf("processor: reading %d states: an answer for subject %q", len(ids), m.Header.Get("Nats-Subject"))
		}
		rev, err := strconv.ParseUint(m.Header.Get("Nats-Sequence"), 10, 64)
		if err != nil {
			return fmt.Errorf("processor: reading %d states: sequence of %s: %w", len(ids), id, err)
		}
		if op := m.Header.Get("KV-Operation"); op == "DEL" || op == "PURGE" {
			// No state; its store swaps the deletion for one.
			out[id] = prefetched{rev: rev}
			continue
		}
		st, err := UnmarshalState(m.Data)
		if err != nil {
			bad[id] = true // read says what is wrong with it
			continue
		}
		out[id] = prefetched{rev: rev, state: &st}
	}
}
