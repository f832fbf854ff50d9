package processor

import (
	"strconv"

	"github.com/nats-io/nats.go"
)

// This file holds the connections the shards read on: the batched state
// reads (multiget.go) and the direct lookups (direct.go).

// readConns is how many connections of its own the processor reads states
// and lookups on.
const readConns = 2

// openReads opens the processor's read connections, with the options of
// its own connection, and returns what closes them. A server answers a
// connection's direct gets in that connection's read loop, one after
// another: with the reads on connections of their own, the server answers
// them beside the processor's fetches, acknowledgements and writes, and
// the shards' reads on two loops at once. On failure the reads go on the
// processor's connection.
func (p *Processor) openReads() func() {
	nc := p.js.Conn()
	var conns []*nats.Conn
	for i := range readConns {
		opts := nc.Opts
		opts.Name = nc.Opts.Name + " (reads " + strconv.Itoa(i) + ")"
		// The caller's handlers are for its own connection.
		opts.ClosedCB, opts.DisconnectedCB, opts.DisconnectedErrCB, opts.ConnectedCB = nil, nil, nil, nil
		opts.ReconnectedCB, opts.ReconnectErrCB, opts.DiscoveredServersCB, opts.LameDuckModeHandler = nil, nil, nil, nil
		opts.AsyncErrorCB = func(_ *nats.Conn, _ *nats.Subscription, err error) {
			p.log.Warn("a read connection's error", "err", err)
		}
		c, err := opts.Connect()
		if err != nil {
			p.log.Warn("opening a connection for reads failed; reading on the processor's connection", "err", err)
			break
		}
		conns = append(conns, c)
	}
	p.reads = conns
	return func() {
		for _, c := range conns {
			c.Close()
		}
	}
}

// readConn is the connection shard reads on.
func (p *Processor) readConn(shard int) *nats.Conn {
	if len(p.reads) == 0 {
		return p.js.Conn()
	}
	return p.reads[shard%len(p.reads)]
}
