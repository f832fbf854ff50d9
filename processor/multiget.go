package processor

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
)

// This file holds the batch read of session states: the states of every
// session a batch must read go to the server as direct gets of the last
// message of each key's subject, many keys a request (JetStream's
// multi_last), instead of one request per key. The answers are what kv.Get
// answers for each key, read at once; a key with no state, or whose last
// message deletes it, is absent.
//
// The same request reads each session's park record and the floor of each
// session's partition (floor.go): the server answers a request from one
// view of the bucket, as of one stream sequence.

// maxMultiGet is the most keys one request asks for: the server answers at
// most 1024 messages a request.
const maxMultiGet = 1024

// multiGetWait bounds one request.
const multiGetWait = 5 * time.Second

// readStates reads the stored states of ids, with their park records and
// the floors of their partitions (parts, by index; -1 for none). A state
// that does not parse is left out (the batch reads it again and reports
// what is wrong with it). On an error nothing is returned, and the batch
// reads each state on its own.
func (p *Processor) readStates(ctx context.Context, nc *nats.Conn, ids []string, parts []int) (map[string]prefetched, error) {
	// Two keys a session, and the floors; the requests go at once.
	per := max(1, (maxMultiGet-p.cfg.Partitions)/2)
	n := (len(ids) + per - 1) / per
	outs := make([]map[string]prefetched, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		from, to := i*per, min(len(ids), (i+1)*per)
		outs[i] = make(map[string]prefetched, to-from)
		wg.Go(func() { errs[i] = p.readStatesOnce(ctx, nc, ids[from:to], parts[from:to], outs[i]) })
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	if n == 1 {
		return outs[0], nil
	}
	out := make(map[string]prefetched, len(ids))
	for _, o := range outs {
		maps.Copy(out, o)
	}
	return out, nil
}

// readStatesOnce is one request of readStates.
func (p *Processor) readStatesOnce(ctx context.Context, nc *nats.Conn, ids []string, parts []int, out map[string]prefetched) error {
	bucket := p.cfg.Names().Sessions
	prefix := KVPrefix(bucket)
	subjects := make([]string, 0, 2*len(ids)+p.cfg.Partitions)
	for _, id := range ids {
		subjects = append(subjects, prefix+id, prefix+ParkedKey(id))
	}
	floorOf, floorLow := map[int]uint64{}, map[int]uint64{}
	floorKnown := map[int]bool{}
	floorKeys := map[string]int{} // key -> partition
	for _, part := range parts {
		if _, ok := floorKnown[part]; part >= 0 && !ok {
			floorKnown[part] = false
			k := FloorKey(p.cfg.Partitions, part)
			floorKeys[k] = part
			subjects = append(subjects, prefix+k)
		}
	}
	parkRev := map[string]uint64{}
	// A view that ends before what this processor has stored is behind
	// its own writes (a replica behind, a bucket put back): no floor is
	// taken from it.
	var mine uint64
	if p.floors != nil {
		mine = p.floors.maxRev.Load()
	}
	// fill gives each session read the view's floor and park record; the
	// view is whole only when every key was answered.
	fill := func(whole bool) {
		for i, id := range ids {
			got, ok := out[id]
			if !ok {
				continue
			}
			got.parkRev = parkRev[id]
			if part := parts[i]; whole && part >= 0 && floorKnown[part] {
				got.floor, got.floorLow, got.floorOK = floorOf[part], floorLow[part], true
			}
			out[id] = got
		}
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
				upTo, err := strconv.ParseUint(m.Header.Get("Nats-UpTo-Sequence"), 10, 64)
				fill(status == "204" && err == nil && upTo >= mine)
				p.count.readAhead.Add(uint64(len(ids)))
				return nil
			case status == "204":
				// Cut short (the server's bound on bytes a request): the
				// keys not answered are read on their own, and no floor
				// is taken (a park record may be among them).
				fill(false)
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
		op := m.Header.Get("KV-Operation")
		deleted := op == "DEL" || op == "PURGE"
		if parked, ok := strings.CutPrefix(id, ParkedKeyPrefix); ok {
			parkRev[parked] = rev // a record, or its deletion
			continue
		}
		if part, ok := floorKeys[id]; ok {
			if low, x, ok := parseFloor(m.Data); ok && !deleted {
				floorOf[part], floorLow[part], floorKnown[part] = x, low, true
			}
			continue
		}
		if deleted {
			// No state; its store swaps the deletion for one.
			out[id] = prefetched{rev: rev}
			continue
		}
		st, err := UnmarshalState(m.Data)
		if err != nil {
			bad[id] = true // read says what is wrong with it
			continue
		}
		out[id] = prefetched{rev: rev, state: &st, byProcessor: m.Header.Get(StateHeader) != ""}
	}
}
