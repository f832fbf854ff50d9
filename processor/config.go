package processor

import (
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/seamguard/seamguard/attest"
	"github.com/seamguard/seamguard/events"
	"github.com/seamguard/seamguard/processor/ledger"
)

// Defaults of Config; a zero field means its default.
const (
	DefaultShards             = 8
	DefaultQueueDepth         = 1024
	DefaultMaxBatch           = 1024
	DefaultAckWait            = 60 * time.Second
	DefaultDurable            = "seamguard"
	DefaultEventsMaxAge       = 7 * 24 * time.Hour
	DefaultEventsDuplicates   = 10 * time.Minute
	DefaultVerdictsMaxAge     = 0 // keep the audit log until an operator says otherwise
	DefaultVerdictsDuplicates = 10 * time.Minute
	DefaultReplicas           = 1
	DefaultSpillRetries       = 3
	DefaultPartitions         = 4
	DefaultLeaseTTL           = 15 * time.Second
	DefaultRetryFor           = 30 * time.Second
	DefaultParkAfter          = 10 * time.Minute
	DefaultStartTimeout       = 2 * time.Minute
	DefaultDrainTimeout       = 25 * time.Second
	DefaultMaxSessions        = 250_000
	DefaultSweepEvery         = 5 * time.Minute
	DefaultSweepMinAge        = 10 * time.Minute
)

// Config configures a Processor. Its zero value is a working single-server
// setup with the names of docs/contract.md: prefix "seamguard", streams
// SEAMGUARD_EVENTS and SEAMGUARD_VERDICTS, bucket seamguard-sessions,
// object store seamguard-spills and the partition leases' bucket
// seamguard-leases. Call Validate to see every problem at once.
type Config struct {
	// Prefix is the first token(s) of every subject and the stem of every
	// stream, bucket and object store name; empty means "seamguard".
	Prefix string

	// Replicas of every stream, bucket and object store; 0 means 3 when
	// the server seamguard connects to is in a cluster of three or more
	// servers, and 1 otherwise.
	Replicas int
	// EventsMaxAge is how long input events are kept; 0 means 7 days. A
	// spill needs every event of the session it writes: sessions older than
	// this halt instead of spilling.
	EventsMaxAge time.Duration
	// EventsDuplicates is the events stream's dedupe window on Nats-Msg-Id;
	// 0 means 10 minutes. It must not exceed EventsMaxAge.
	EventsDuplicates time.Duration
	// VerdictsMaxAge is how long verdicts are kept; 0 means forever.
	VerdictsMaxAge time.Duration
	// VerdictsDuplicates is the verdict stream's dedupe window; 0 means 10
	// minutes. A redelivered input re-publishes its verdicts under the same
	// ids, so this must cover the longest redelivery delay (restarts).
	VerdictsDuplicates time.Duration
	// MemoryStorage keeps streams in memory instead of files (tests only).
	MemoryStorage bool

	// Partitions is the number of partitions sessions are spread over.
	// 0 means the existing events stream's count (Provision reads it from
	// the stream's subject transform), or 4 for a new stream. Every
	// partition's consumer scans the stream for its own subjects, so the
	// broker's cost per event grows with the count: use as many as
	// instances are to share the load, not more. Each partition is stored
	// under its own subjects and read through its own durable consumer,
	// "<Durable>-p<n>", by the one instance that holds its lease in the
	// leases bucket (see LeaseTTL). The count is fixed once the stream
	// exists: Provision refuses another.
	Partitions int
	// controlApart is the layout of an existing events stream that stores
	// control subjects as published (events.Subjects.ControlApart): set
	// from the stream by Provision and ForStream, never by the user.
	controlApart bool
	// LeaseTTL is how long a partition's lease outlives the last renewal
	// of an instance that stopped (it renews every LeaseTTL/4), and so
	// bounds failover; 0 means 15s. It is the leases bucket's MaxAge, so
	// every instance of a deployment must use the same.
	LeaseTTL time.Duration

	// Durable is the stem of the events consumers' names; empty means
	// "seamguard".
	Durable string
	// Shards is the number of owner goroutines; 0 means 8. A session always
	// goes to the same shard.
	Shards int
	// QueueDepth bounds each shard's queue; 0 means 1024.
	QueueDepth int
	// MaxBatch bounds how many messages a shard handles per group commit;
	// 0 means 1024. Under load a batch fills up, and a session touched by
	// it is stored once for all its messages in it, its verdicts and
	// states written with other shards' in one atomic batch each: the
	// larger the batch, the fewer durable writes an event costs. Each
	// fetch asks for twice as many.
	MaxBatch int
	// AckWait is the consumer's ack deadline; 0 means 60s.
	AckWait time.Duration
	// MaxAckPending bounds unacknowledged messages; 0 means Shards*QueueDepth.
	MaxAckPending int

	// Source is the CloudEvents source of every verdict; empty means
	// "urn:seamguard:processor".
	Source string
	// Policy says whether an unrecoverable compaction spills (the default)
	// or halts.
	Policy ledger.Policy
	// Limits bound each session's ledger (ranges in a set, remembered
	// request ids, snapshot bytes, spill quota); the zero value is
	// ledger's defaults. An event that would pass one is rejected
	// (state_limit) and halts its session. The snapshot limit in force is
	// also kept under the session bucket's value limit and the server's
	// max payload. Every instance, and every replay or check of the same
	// events, must use the same limits to decide alike.
	Limits ledger.Limits
	// SpillRetries is how many times a failing object store put is tried;
	// 0 means 3.
	SpillRetries int
	// SpillVerify reads every spill back after writing it and checks its
	// digest.
	SpillVerify bool

	// RetryFor bounds how long a batch retries transient failures in
	// place (NATS not answering, a publish or state write unconfirmed);
	// 0 means 30s. Past it, each session still waiting is left stuck: its
	// inputs stay unacknowledged and are tried again on redelivery, the
	// processor reports itself unready, and every other session goes on.
	// Failures that retrying cannot fix are not retried at all.
	RetryFor time.Duration
	// ParkAfter is how long a session may stay stuck on a failure that
	// retrying cannot fix (a state over the bucket's value limit, a
	// permission denied) before it is parked; 0 means 10m. A parked
	// session has a record of its own in the session bucket, with the
	// cause, and its inputs are acknowledged into that record: they wait
	// in the events stream, unapplied, so the partition's other sessions
	// go on. An operator's input on its control subject (seamguard resume)
	// takes it out of the park and applies every waiting input, in order,
	// at once (park.go).
	ParkAfter time.Duration
	// StartTimeout bounds how long New and the start of Run wait for
	// NATS to answer while they set up the streams, buckets and consumers
	// (a cluster still electing its leaders after a restart answers with
	// timeouts and no responders); 0 means 2m. Past it, or on an error
	// that waiting cannot cure, they return the error.
	StartTimeout time.Duration
	// DrainTimeout bounds a drain (Run's ctx cancelled); 0 means 25s. Past
	// it, Run stops as Abort does, whatever is stuck, and still hands its
	// partitions over, so that another instance takes them at once.
	DrainTimeout time.Duration
	// MaxSessions bounds the sessions a processor keeps in memory, live or
	// as idle snapshots; 0 means 250,000. Past it, the sessions used least
	// lately are dropped from memory (their state is in the bucket) and
	// read again when they are next used.
	MaxSessions int
	// SpillBucketMaxBytes is the most bytes the spill object store may
	// hold (its stream's MaxBytes); 0 means no limit beyond the server's
	// store. The bucket discards new data: once full it refuses the next
	// spill, whose session halts (the spill fails with spill.ErrStorageFull),
	// and never deletes a spill it holds. Provision sets it on a new bucket
	// and updates an existing one in place. At least 1 MiB when set.
	SpillBucketMaxBytes int64
	// SweepEvery is how often the spill bucket is swept for orphaned
	// chunks (those of a write that died before it finished: a process
	// killed mid-spill); 0 means 5 minutes, a negative value never. A
	// sweep also runs when Run starts.
	SweepEvery time.Duration
	// SweepMinAge is how old unnamed chunks must be before a sweep purges
	// them; 0 means 10 minutes. Chunks a live write registered are never
	// purged, whatever their age; a write's registration lapses after
	// SweepMinAge unrenewed (at most a minute).
	SweepMinAge time.Duration

	// SigningKey is the NKey seed ("S…", see package attest) whose key
	// signs every output: the Seamguard-Signer and Seamguard-Signature
	// headers, which subscribers verify against the public keys they
	// trust. Empty means none configured: New makes a key for the
	// Processor's lifetime (its public key is logged and given by
	// SigningPublicKey), which no verifier can trust across restarts.
	// serve always sets one: from --signing-key-file or
	// SEAMGUARD_SIGNING_KEY, else a key it keeps in its data directory.
	SigningKey string

	// NoRecoverService turns off the recover service, a NATS micro
	// service ("seamguard", on <prefix>.recover.<session>) through which
	// agents read their own sessions' spills; the zero value runs it on
	// every instance while it runs (see the package doc).
	NoRecoverService bool
	// NoAtomicBatches writes every verdict and every session state as a
	// message of its own. By default the verdicts of a shard's batch go to
	// the verdict stream as one atomic batch, and then its sessions' states
	// to the session bucket as another: a server that syncs every write
	// stores each batch with one fsync instead of one per message. What is
	// written, and when an input is acknowledged, is the same either way.
	NoAtomicBatches bool
	// ReplyPrefixes are the inbox prefixes the processor's services (the
	// recover service and its discovery) may answer to: a request is
	// answered only when its reply subject is <prefix>.<token>[.<token>...]
	// for one of them, with no wildcard; any other request gets no answer
	// and is counted and logged as denied. Empty means DefaultReplyPrefixes.
	// Choose prefixes under which nothing but inboxes lives: no prefix may
	// begin with '$' (JetStream, KV, object store, system subjects) or share
	// a first token with Prefix.
	ReplyPrefixes []string
}

// DefaultReplyPrefixes are the inboxes the services answer by default:
// NATS's default inbox prefix, which agents use (also with a token of their
// own after it, "_INBOX.<name>", where each agent is narrowed to its own
// inbox), and the seamguard CLI's default, "_INBOX_operator".
var DefaultReplyPrefixes = []string{"_INBOX", "_INBOX_operator"}

// replyPrefixes returns c.ReplyPrefixes or the default.
func (c Config) replyPrefixes() []string {
	if len(c.ReplyPrefixes) == 0 {
		return DefaultReplyPrefixes
	}
	return c.ReplyPrefixes
}

// checkReplyPrefixes reports every ReplyPrefixes entry that is not a
// plain subject, or that could let a reply reach JetStream's or
// seamguard's own subjects.
func (c Config) checkReplyPrefixes() []error {
	var errs []error
	own, _, _ := strings.Cut(c.Subjects().Prefix, ".")
	if own == "" {
		own = events.DefaultPrefix
	}
	for _, p := range c.ReplyPrefixes {
		first, _, _ := strings.Cut(p, ".")
		switch {
		case p == "" || (events.Subjects{Prefix: p}).Validate() != nil:
			errs = append(errs, fmt.Errorf("processor: ReplyPrefixes entry %q is not a subject of dot-separated tokens without wildcards or spaces", p))
		case strings.HasPrefix(p, "$"):
			errs = append(errs, fmt.Errorf("processor: ReplyPrefixes entry %q begins with '$', where JetStream, KV, the object store and the system account live; use an inbox prefix such as _INBOX", p))
		case first == own:
			errs = append(errs, fmt.Errorf("processor: ReplyPrefixes entry %q shares its first token with seamguard's subjects (%s.>); use an inbox prefix such as _INBOX", p, own))
		}
	}
	return errs
}

// MinSpillBucketMaxBytes is the smallest SpillBucketMaxBytes other than 0.
const MinSpillBucketMaxBytes = 1 << 20

// WithDefaults returns c with every zero field set to its default, as a
// Processor runs it.
func (c Config) WithDefaults() Config { return c.withDefaults() }

// withDefaults returns c with every zero field set to its default.
func (c Config) withDefaults() Config {
	set := func(v *int, d int) {
		if *v == 0 {
			*v = d
		}
	}
	setD := func(v *time.Duration, d time.Duration) {
		if *v == 0 {
			*v = d
		}
	}
	if c.Prefix == "" {
		c.Prefix = events.DefaultPrefix
	}
	setD(&c.EventsMaxAge, DefaultEventsMaxAge)
	setD(&c.EventsDuplicates, DefaultEventsDuplicates)
	setD(&c.VerdictsDuplicates, DefaultVerdictsDuplicates)
	if c.EventsDuplicates > c.EventsMaxAge {
		c.EventsDuplicates = c.EventsMaxAge
	}
	if c.VerdictsMaxAge > 0 && c.VerdictsDuplicates > c.VerdictsMaxAge {
		c.VerdictsDuplicates = c.VerdictsMaxAge
	}
	if c.Durable == "" {
		c.Durable = DefaultDurable
	}
	set(&c.Shards, DefaultShards)
	set(&c.QueueDepth, DefaultQueueDepth)
	set(&c.MaxBatch, DefaultMaxBatch)
	setD(&c.AckWait, DefaultAckWait)
	set(&c.MaxAckPending, c.Shards*c.QueueDepth)
	if c.Source == "" {
		c.Source = events.DefaultSource
	}
	set(&c.SpillRetries, DefaultSpillRetries)
	set(&c.Partitions, DefaultPartitions)
	setD(&c.LeaseTTL, DefaultLeaseTTL)
	setD(&c.RetryFor, DefaultRetryFor)
	setD(&c.ParkAfter, DefaultParkAfter)
	setD(&c.StartTimeout, DefaultStartTimeout)
	setD(&c.DrainTimeout, DefaultDrainTimeout)
	set(&c.MaxSessions, DefaultMaxSessions)
	setD(&c.SweepEvery, DefaultSweepEvery)
	setD(&c.SweepMinAge, DefaultSweepMinAge)
	return c
}

// Validate reports every problem with c at once.
func (c Config) Validate() error {
	var errs []error
	if err := c.Subjects().Validate(); err != nil {
		errs = append(errs, err)
	}
	errs = append(errs, c.checkReplyPrefixes()...)
	for _, f := range []struct {
		name string
		v    int
	}{{"Replicas", c.Replicas}, {"Partitions", c.Partitions}, {"Shards", c.Shards}, {"QueueDepth", c.QueueDepth}, {"MaxBatch", c.MaxBatch}, {"MaxAckPending", c.MaxAckPending}, {"SpillRetries", c.SpillRetries}, {"MaxSessions", c.MaxSessions}} {
		if f.v < 0 {
			errs = append(errs, fmt.Errorf("processor: %s is %d; it must be 0 (the default) or more", f.name, f.v))
		}
	}
	if c.SpillBucketMaxBytes < 0 || c.SpillBucketMaxBytes > 0 && c.SpillBucketMaxBytes < MinSpillBucketMaxBytes {
		errs = append(errs, fmt.Errorf("processor: SpillBucketMaxBytes is %d; use 0 for no limit, or at least %d (1 MiB)", c.SpillBucketMaxBytes, MinSpillBucketMaxBytes))
	}
	if c.Partitions > 1024 {
		errs = append(errs, fmt.Errorf("processor: Partitions is %d; use at most 1024 (each is a consumer)", c.Partitions))
	}
	if c.LeaseTTL > 0 && c.LeaseTTL < time.Second {
		errs = append(errs, fmt.Errorf("processor: LeaseTTL %s is under a second; partitions would move between instances that are merely slow to renew", c.LeaseTTL))
	}
	if c.Replicas > 5 {
		errs = append(errs, fmt.Errorf("processor: Replicas is %d; JetStream allows at most 5", c.Replicas))
	}
	for _, f := range []struct {
		name string
		v    time.Duration
	}{{"LeaseTTL", c.LeaseTTL}, {"EventsMaxAge", c.EventsMaxAge}, {"EventsDuplicates", c.EventsDuplicates}, {"VerdictsMaxAge", c.VerdictsMaxAge}, {"VerdictsDuplicates", c.VerdictsDuplicates}, {"AckWait", c.AckWait}, {"RetryFor", c.RetryFor}, {"ParkAfter", c.ParkAfter}, {"StartTimeout", c.StartTimeout}, {"DrainTimeout", c.DrainTimeout}, {"SweepMinAge", c.SweepMinAge}} {
		if f.v < 0 {
			errs = append(errs, fmt.Errorf("processor: %s is %s; it must be 0 (the default) or more", f.name, f.v))
		}
	}
	if c.EventsMaxAge > 0 && c.EventsDuplicates > c.EventsMaxAge {
		errs = append(errs, fmt.Errorf("processor: EventsDuplicates %s exceeds EventsMaxAge %s; JetStream needs the dedupe window within the retention", c.EventsDuplicates, c.EventsMaxAge))
	}
	if c.AckWait > 0 && c.AckWait < time.Second {
		errs = append(errs, fmt.Errorf("processor: AckWait %s is under a second; messages would be redelivered while they are being handled", c.AckWait))
	}
	if c.SweepMinAge > 0 && c.SweepMinAge < 2*time.Second {
		errs = append(errs, fmt.Errorf("processor: SweepMinAge %s is under 2s; a write's registration would lapse between its renewals", c.SweepMinAge))
	}
	if c.Durable != "" && strings.ContainsAny(c.Durable, ".*> \t") {
		errs = append(errs, fmt.Errorf("processor: Durable %q may not hold '.', '*', '>' or white space", c.Durable))
	}
	if err := (ledger.Config{Policy: c.Policy, Limits: c.Limits}).Validate(); err != nil {
		errs = append(errs, err)
	}
	if c.SigningKey != "" {
		if _, err := attest.NewSigner([]byte(c.SigningKey)); err != nil {
			errs = append(errs, fmt.Errorf("processor: SigningKey: %w", err))
		}
	}
	return errors.Join(errs...)
}

// Subjects returns the subject names of this configuration.
func (c Config) Subjects() events.Subjects {
	n := c.Partitions
	if n == 0 {
		n = DefaultPartitions
	}
	return events.Subjects{Prefix: c.Prefix, Partitions: n, ControlApart: c.controlApart}
}

// ConsumerName is the durable consumer of partition p; p < 0 names the
// consumer of events whose subject names no session.
func (c Config) ConsumerName(p int) string {
	d := c.Durable
	if d == "" {
		d = DefaultDurable
	}
	if p < 0 {
		return d + "-invalid"
	}
	return fmt.Sprintf("%s-p%d", d, p)
}

// ConsumerConfig is the configuration of the durable consumer of partition
// p (p < 0: the consumer of events whose subject names no session) on the
// events stream, as Run creates it. Unset fields of c take their defaults.
func (c Config) ConsumerConfig(p int) jetstream.ConsumerConfig {
	c = c.withDefaults()
	// A partition reads its sessions' stored inputs, events and control, in
	// stream order, through one filter (a consumer with more than one
	// filter reads the stream several times slower); with ControlApart it
	// also reads every control subject of one token and leaves those of
	// other partitions' sessions to them (see foreign).
	filters := c.Subjects().PartitionFilters(p)
	// A partition's inputs are acknowledged a batch at a time (see
	// ackWindow); the rare inputs that name no session one by one.
	ackPolicy := jetstream.AckAllPolicy
	if p < 0 {
		ackPolicy = jetstream.AckExplicitPolicy
	}
	return jetstream.ConsumerConfig{
		Durable:        c.ConsumerName(p),
		Description:    "seamguard processor",
		FilterSubjects: filters,
		AckPolicy:      ackPolicy,
		AckWait:        c.AckWait,
		MaxAckPending:  c.MaxAckPending,
		MaxDeliver:     -1,
		DeliverPolicy:  jetstream.DeliverAllPolicy,
	}
}

// Names are the JetStream resources of one deployment.
type Names struct {
	Events   string // input stream
	Verdicts string // verdict stream
	Sessions string // KV bucket of snapshots
	Spills   string // object store
	Leases   string // KV bucket of partition leases and instances
}

// Names derives the resource names from the prefix: "seamguard" gives
// SEAMGUARD_EVENTS, SEAMGUARD_VERDICTS, seamguard-sessions, seamguard-spills.
func (c Config) Names() Names {
	p := c.Prefix
	if p == "" {
		p = events.DefaultPrefix
	}
	stem := strings.NewReplacer(".", "_", "-", "_").Replace(strings.ToUpper(p))
	bucket := strings.ReplaceAll(p, ".", "-")
	return Names{
		Events:   stem + "_EVENTS",
		Verdicts: stem + "_VERDICTS",
		Sessions: bucket + "-sessions",
		Spills:   bucket + "-spills",
		Leases:   bucket + "-leases",
	}
}
