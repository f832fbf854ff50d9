package read_test

import (
	"context"
	"log"
	"net/http"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/seamguard/seamguard/attest"
	"github.com/seamguard/seamguard/gateway/read"
)

// Mounting both endpoints on a mux, trusting the processor's signing key,
// on a loopback listener without credentials.
func ExampleHandler_Register() {
	nc, err := nats.Connect(nats.DefaultURL)
	if err != nil {
		log.Fatal(err)
	}
	js, _ := jetstream.New(nc)
	trust, err := attest.ParseKeys("NB3P...") // the processor's public key, as serve logs it (signing_key)
	if err != nil {
		log.Fatal(err)
	}
	h, err := read.New(js, read.Loopback{}, read.Config{Trust: trust})
	if err != nil {
		log.Fatal(err)
	}
	mux := http.NewServeMux()
	h.Register(mux) // or: mux.HandleFunc(read.PatternSpill, h.Spill); mux.HandleFunc(read.PatternVerdicts, h.Verdicts)
	srv := &http.Server{Addr: "127.0.0.1:8080", Handler: mux}
	srv.RegisterOnShutdown(h.Close)
	go func() { _ = srv.ListenAndServe() }()
	_ = srv.Shutdown(context.Background())
}
