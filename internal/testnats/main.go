// Command testnats runs a nats-server from a configuration file, for the
// tests of clients written in other languages (clients/typescript), on a
// machine with no nats-server binary. It loads the file as nats-server -c
// would (includes, accounts, permissions, passwords from the environment),
// then overrides what a test must choose itself:
//
//	go build -o /tmp/testnats ./internal/testnats
//	NATS_AGENT_PASSWORD=a NATS_PROCESSOR_PASSWORD=p NATS_RESPONDER_PASSWORD=r NATS_OPERATOR_PASSWORD=o NATS_FORWARDER_PASSWORD=f \
//	  /tmp/testnats -c deploy/nats/standalone.conf -store /tmp/store -port 0 -sync 2m
//
// -port 0 picks a free loopback port, -store replaces the JetStream store
// directory, the monitoring port is turned off, and -sync replaces
// sync_interval ("always", or a duration such as 2m; empty keeps the
// file's). It prints the client URL on standard output, one line, and
// serves until it gets SIGINT or SIGTERM (or, with -stdin-eof, until its
// standard input closes, so that it ends with the test process that holds
// the pipe); then it shuts the server down and exits 0. Errors go to
// standard error, exit 1.
package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/nats-io/nats-server/v2/server"
)

func main() {
	if err := run(os.Args[1:], os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "testnats:", err)
		os.Exit(1)
	}
}

func run(args []string, stdout io.Writer) error {
	fs := flag.NewFlagSet("testnats", flag.ContinueOnError)
	conf := fs.String("c", "", "nats-server configuration file (required)")
	port := fs.Int("port", 0, "client port on 127.0.0.1; 0 picks a free one")
	store := fs.String("store", "", "JetStream store directory (required)")
	sync := fs.String("sync", "", `sync_interval: "always" or a duration such as 2m; empty keeps the file's`)
	logs := fs.Bool("logs", false, "log the server's notices to standard error")
	stdinEOF := fs.Bool("stdin-eof", false, "also stop when standard input closes")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *conf == "" || *store == "" {
		return errors.New("-c and -store are required")
	}
	opts, err := server.ProcessConfigFile(*conf)
	if err != nil {
		return fmt.Errorf("config %s: %w", *conf, err)
	}
	opts.Host = "127.0.0.1"
	opts.Port = *port
	if opts.Port == 0 {
		opts.Port = server.RANDOM_PORT
	}
	opts.HTTPHost, opts.HTTPPort, opts.HTTPSPort = "", 0, 0
	opts.StoreDir = *store
	switch *sync {
	case "":
	case "always":
		opts.SyncAlways, opts.SyncInterval = true, 0
	default:
		d, err := time.ParseDuration(*sync)
		if err != nil || d <= 0 {
			return fmt.Errorf("-sync %q: use always or a positive duration such as 2m", *sync)
		}
		opts.SyncAlways, opts.SyncInterval = false, d
	}
	opts.NoSigs = true
	opts.NoLog = !*logs
	srv, err := server.NewServer(opts)
	if err != nil {
		return err
	}
	if *logs {
		srv.ConfigureLogger()
	}
	go srv.Start()
	defer func() {
		srv.Shutdown()
		srv.WaitForShutdown()
	}()
	if !srv.ReadyForConnections(30 * time.Second) {
		return fmt.Errorf("nats-server from %s not ready after 30s", *conf)
	}
	if _, err := fmt.Fprintln(stdout, srv.ClientURL()); err != nil {
		return err
	}

	stop := make(chan os.Signal, 1)
	signal.Notify(stop, syscall.SIGINT, syscall.SIGTERM)
	stdinClosed := make(chan struct{})
	if *stdinEOF {
		go func() {
			_, _ = io.Copy(io.Discard, os.Stdin)
			close(stdinClosed)
		}()
	}
	select {
	case <-stop:
	case <-stdinClosed:
	}
	return nil
}
