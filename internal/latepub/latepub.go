package latepub

import (
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// Future is the future of a publish sent later than it was asked for: it
// answers what the real publish, once sent, answers.
type Future struct {
	msg *nats.Msg
	ok  chan *jetstream.PubAck
	err chan error
}

// New returns the future of m, to be settled by Follow.
func New(m *nats.Msg) *Future {
	return &Future{msg: m, ok: make(chan *jetstream.PubAck, 1), err: make(chan error, 1)}
}

// Ok, Err and Msg make Future a jetstream.PubAckFuture.
func (f *Future) Ok() <-chan *jetstream.PubAck { return f.ok }
func (f *Future) Err() <-chan error            { return f.err }
func (f *Future) Msg() *nats.Msg               { return f.msg }

// Follow sends f's message now with js and settles f with its answer, in
// the background.
func (f *Future) Follow(js jetstream.JetStream, opts ...jetstream.PublishOpt) {
	real, err := js.PublishMsgAsync(f.msg, opts...)
	if err != nil {
		f.err <- err
		return
	}
	go func() {
		select {
		case a := <-real.Ok():
			f.ok <- a
		case e := <-real.Err():
			f.err <- e
		}
	}()
}
