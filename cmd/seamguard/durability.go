package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
)

// syncState is what serve knows of whether the NATS servers it uses fsync a
// message before they acknowledge it. Only then does an acknowledged event,
// verdict or spill survive a power cut.
type syncState struct {
	// Known is false when no server could be asked (the system account's
	// VARZ request is refused and no monitoring URL was given).
	Known bool
	// Lazy names each server reached that acknowledges before it syncs,
	// with its interval ("2m0s"); empty when every one syncs first.
	Lazy []string
	// Servers is how many servers answered.
	Servers int
}

// Durable reports whether every server asked syncs before acknowledging.
func (s syncState) Durable() bool { return s.Known && len(s.Lazy) == 0 }

// Gauge is the value of seamguard_nats_sync_always: 1 durable, 0 not, -1
// unknown.
func (s syncState) Gauge() float64 {
	switch {
	case !s.Known:
		return -1
	case len(s.Lazy) == 0:
		return 1
	}
	return 0
}

// jsConfig is the part of a server's VARZ that says how it syncs.
type jsConfig struct {
	ServerName string `json:"server_name"`
	JetStream  struct {
		Config *struct {
			SyncAlways   bool          `json:"sync_always"`
			SyncInterval time.Duration `json:"sync_interval"`
		} `json:"config"`
	} `json:"jetstream"`
}

// lazy returns the server's sync interval when it acknowledges before it
// syncs, and "" when it syncs first (or runs without JetStream).
func (c jsConfig) lazy() string {
	jc := c.JetStream.Config
	if jc == nil || jc.SyncAlways {
		return ""
	}
	if jc.SyncInterval == 0 {
		return "sync_interval 2m0s (the server's default)"
	}
	return "sync_interval " + jc.SyncInterval.String()
}

// askSync finds out how the servers behind nc sync: by the system
// account's VARZ request to every server (which answers only where this
// connection's user is in the system account), and by GET /varz on each
// monitoring URL given. It waits at most wait.
func askSync(ctx context.Context, nc *nats.Conn, monitor []string, wait time.Duration) syncState {
	var st syncState
	seen := map[string]bool{}
	add := func(c jsConfig) {
		if seen[c.ServerName] && c.ServerName != "" {
			return
		}
		seen[c.ServerName] = true
		st.Known = true
		st.Servers++
		if l := c.lazy(); l != "" {
			st.Lazy = append(st.Lazy, c.ServerName+": "+l)
		}
	}
	for _, u := range monitor {
		c, err := varzHTTP(ctx, u, wait)
		if err == nil {
			add(c)
		}
	}
	for _, c := range varzSys(ctx, nc, wait) {
		add(c)
	}
	slices.Sort(st.Lazy)
	return st
}

// varzSys asks every server for its VARZ through the system account and
// gathers the answers that come within wait (none when the request is not
// permitted or has no responder).
func varzSys(ctx context.Context, nc *nats.Conn, wait time.Duration) []jsConfig {
	inbox := nc.NewRespInbox()
	replies := make(chan *nats.Msg, 64)
	sub, err := nc.ChanSubscribe(inbox, replies)
	if err != nil {
		return nil
	}
	defer sub.Unsubscribe()
	if err := nc.PublishRequest("$SYS.REQ.SERVER.PING.VARZ", inbox, nil); err != nil {
		return nil
	}
	var out []jsConfig
	deadline := time.NewTimer(wait)
	defer deadline.Stop()
	quiet := (*time.Timer)(nil)
	var quietC <-chan time.Time
	for {
		select {
		case m := <-replies:
			if m.Header.Get("Status") == "503" {
				return out // no responders: this user may not ask
			}
			var r struct {
				Data jsConfig `json:"data"`
			}
			if len(m.Data) > 0 && json.Unmarshal(m.Data, &r) == nil && r.Data.ServerName != "" {
				out = append(out, r.Data)
			}
			// Servers answer together; once they go quiet, all have.
			if quiet == nil {
				quiet = time.NewTimer(250 * time.Millisecond)
				defer quiet.Stop()
			} else {
				quiet.Reset(250 * time.Millisecond)
			}
			quietC = quiet.C
		case <-quietC:
			return out
		case <-deadline.C:
			return out
		case <-ctx.Done():
			return out
		}
	}
}

// varzHTTP reads one server's /varz from its monitoring endpoint.
func varzHTTP(ctx context.Context, base string, wait time.Duration) (jsConfig, error) {
	ctx, cancel := context.WithTimeout(ctx, wait)
	defer cancel()
	u := strings.TrimSuffix(base, "/")
	if !strings.HasSuffix(u, "/varz") {
		u += "/varz"
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		return jsConfig{}, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return jsConfig{}, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return jsConfig{}, fmt.Errorf("GET %s: %s", u, resp.Status)
	}
	var c jsConfig
	if err := json.NewDecoder(io.LimitReader(resp.Body, 4<<20)).Decode(&c); err != nil {
		return jsConfig{}, fmt.Errorf("GET %s: %w", u, err)
	}
	if c.ServerName == "" {
		c.ServerName = base
	}
	return c, nil
}
