package embedded

import (
	"errors"
	"fmt"
	"net"
	"strconv"
	"time"

	"github.com/nats-io/nats-server/v2/server"
)

// Config says how to start the server. The zero value listens on a random
// loopback port and stores JetStream data in a directory the caller must set.
type Config struct {
	Host     string        // listen host; empty means 127.0.0.1
	Port     int           // listen port; 0 means a random free port
	StoreDir string        // JetStream storage directory (required)
	Name     string        // server name; empty means "seamguard-embedded"
	Ready    time.Duration // how long to wait for it to accept clients; 0 means 10s
	Logs     bool          // print the server's own log lines to stderr
	// SyncInterval is how often JetStream fsyncs what it stored. Zero (the
	// default) fsyncs every write before it is acknowledged (the server's
	// sync_interval: always), so that an acknowledged message survives a
	// power cut. A positive interval acknowledges before the data is on
	// disk (the server's own default is 2m): faster, and a power cut loses
	// what was acknowledged since the last sync.
	SyncInterval time.Duration
}

// Durable reports whether the server c starts fsyncs before it acknowledges.
func (c Config) Durable() bool { return c.SyncInterval == 0 }

// Validate reports every problem with c at once.
func (c Config) Validate() error {
	var errs []error
	if c.StoreDir == "" {
		errs = append(errs, errors.New("embedded: StoreDir is required: JetStream needs a directory to store streams in"))
	}
	if c.SyncInterval < 0 {
		errs = append(errs, fmt.Errorf("embedded: SyncInterval %s is negative; use 0 to sync every write, or a positive interval", c.SyncInterval))
	}
	if c.Port < 0 || c.Port > 65535 {
		errs = append(errs, fmt.Errorf("embedded: port %d is out of range 0-65535", c.Port))
	}
	return errors.Join(errs...)
}

// Start starts a JetStream-enabled server and waits until it accepts clients.
// Stop it with Shutdown and WaitForShutdown.
func Start(c Config) (*server.Server, error) {
	if err := c.Validate(); err != nil {
		return nil, err
	}
	opts := &server.Options{
		ServerName: c.Name,
		Host:       c.Host,
		Port:       c.Port,
		JetStream:  true,
		StoreDir:   c.StoreDir,
		NoSigs:     true,
		NoLog:      !c.Logs,
	}
	if c.SyncInterval == 0 {
		opts.SyncAlways = true
	} else {
		opts.SyncInterval = c.SyncInterval
	}
	if opts.ServerName == "" {
		opts.ServerName = "seamguard-embedded"
	}
	if opts.Host == "" {
		opts.Host = "127.0.0.1"
	}
	if opts.Port == 0 {
		opts.Port = server.RANDOM_PORT
	}
	s, err := server.NewServer(opts)
	if err != nil {
		return nil, fmt.Errorf("embedded: %w", err)
	}
	if c.Logs {
		s.ConfigureLogger()
	}
	wait := c.Ready
	if wait == 0 {
		wait = 10 * time.Second
	}
	if err := startAndWait(s, net.JoinHostPort(opts.Host, strconv.Itoa(c.Port)), wait); err != nil {
		return nil, err
	}
	return s, nil
}
