package processor

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/seamguard/seamguard/spill"
)

// Resources are the JetStream handles a processor works with.
type Resources struct {
	Events   jetstream.Stream
	Verdicts jetstream.Stream
	Sessions jetstream.KeyValue
	Spills   jetstream.ObjectStore
	Leases   jetstream.KeyValue
	// SessionsMaxValue is the session bucket's value limit, 0 for none.
	SessionsMaxValue int
	// StatesNotAtomic, when set, says why the session bucket does not
	// take atomic batches (its stream could not be updated to allow them):
	// states are then written one at a time.
	StatesNotAtomic error
	// Partitions is the partition count in force: the configuration's,
	// or, where it leaves it 0, the existing events stream's (the default
	// for a new stream).
	Partitions int
	// ControlApart is set for an existing events stream that stores
	// control subjects as published (see events.Subjects.ControlApart).
	ControlApart bool
}

// Provision creates the streams, the session and lease buckets and the
// spill object store of c, or checks and updates existing ones. It is idempotent. Settings
// that JetStream can change in place (retention age, dedupe window, replicas,
// the spill bucket's size limit) are updated to c; a difference that cannot be
// changed in place, or that would change what the resource holds (subjects,
// storage type, retention policy, discard policy), is an error wrapping
// ErrIncompatible that names the field and both values. The verdict stream
// allows direct gets (turned on in place in an existing one); the events
// stream does not.
func Provision(ctx context.Context, js jetstream.JetStream, c Config) (*Resources, error) {
	if err := c.Validate(); err != nil {
		return nil, err
	}
	c, err := ForStream(ctx, js, c) // a new stream: as it is
	if err != nil {
		return nil, err
	}
	c = c.withDefaults()
	if c.Replicas == 0 {
		c.Replicas = autoReplicas(js.Conn())
	}
	n := c.Names()
	subj := c.Subjects()
	storage := jetstream.FileStorage
	if c.MemoryStorage {
		storage = jetstream.MemoryStorage
	}
	res := Resources{Partitions: c.Partitions, ControlApart: c.controlApart}
	res.Events, err = ensureStream(ctx, js, jetstream.StreamConfig{
		Name:        n.Events,
		Description: "seamguard: session events published by agents",
		Subjects:    subj.StreamSubjects(),
		SubjectTransform: &jetstream.SubjectTransformConfig{
			Source:      subj.TransformSource(),
			Destination: subj.TransformDestination(),
		},
		Storage:    storage,
		Retention:  jetstream.LimitsPolicy,
		Discard:    jetstream.DiscardOld,
		MaxAge:     c.EventsMaxAge,
		Duplicates: c.EventsDuplicates,
		Replicas:   c.Replicas,
		// For the prefetch's lookups (direct.go), which trust only the
		// answers a replica behind its leader cannot give wrongly; every
		// other read of this stream asks its leader (STREAM.MSG.GET).
		AllowDirect: true,
	})
	if err != nil {
		return nil, err
	}
	res.Verdicts, err = ensureStream(ctx, js, jetstream.StreamConfig{
		Name:        n.Verdicts,
		Description: "seamguard: verdicts, the durable audit log",
		Subjects:    []string{subj.Prefix + ".verdicts.>"},
		Storage:     storage,
		Retention:   jetstream.LimitsPolicy,
		Discard:     jetstream.DiscardOld,
		MaxAge:      c.VerdictsMaxAge,
		Duplicates:  c.VerdictsDuplicates,
		Replicas:    c.Replicas,
		// Operators read verdicts with direct gets (no consumer); nothing
		// in the processor reads the verdict stream with GetMsg, which
		// direct gets would let a lagging replica answer.
		AllowDirect: true,
		// A batch's verdicts are written as one atomic batch (batch.go).
		AllowAtomicPublish: true,
	})
	if err != nil {
		return nil, err
	}
	res.Sessions, res.SessionsMaxValue, err = ensureSessions(ctx, js, n.Sessions, storage, c.Replicas)
	if err != nil {
		return nil, err
	}
	// An identity that may not update the bucket's stream still serves,
	// writing each state on its own.
	res.StatesNotAtomic = allowAtomic(ctx, js, n.SessionsStream())
	res.Spills, err = ensureSpills(ctx, js, n.Spills, storage, c)
	if err != nil {
		return nil, err
	}
	// The leases hold nothing that outlives LeaseTTL: the bucket's age
	// limit is kept equal to it, created or updated in place.
	res.Leases, err = js.CreateOrUpdateKeyValue(ctx, jetstream.KeyValueConfig{
		Bucket: n.Leases, Description: "seamguard: which instance consumes each partition, and the live instances",
		History: 1, TTL: c.LeaseTTL, Storage: storage, Replicas: c.Replicas,
	})
	if err != nil {
		return nil, fmt.Errorf("processor: bucket %s: %w", n.Leases, err)
	}
	return &res, nil
}

// ensureSessions creates the session bucket, or checks an existing one,
// and returns it with its value limit (0 for none).
func ensureSessions(ctx context.Context, js jetstream.JetStream, bucket string, storage jetstream.StorageType, replicas int) (jetstream.KeyValue, int, error) {
	kv, err := js.KeyValue(ctx, bucket)
	if errors.Is(err, jetstream.ErrBucketNotFound) {
		kv, err = js.CreateKeyValue(ctx, jetstream.KeyValueConfig{
			Bucket: bucket, Description: "seamguard: session ledgers and the last applied event sequence",
			History: 1, Storage: storage, Replicas: replicas,
		})
		switch {
		case errors.Is(err, jetstream.ErrBucketExists):
			// Another instance created it first and may already have
			// updated it (allowAtomic): it is checked as an existing one.
			kv, err = js.KeyValue(ctx, bucket)
		case err != nil:
			return nil, 0, fmt.Errorf("processor: create bucket %s: %w", bucket, err)
		}
	}
	if err != nil {
		return nil, 0, fmt.Errorf("processor: bucket %s: %w", bucket, err)
	}
	st, err := kv.Status(ctx)
	if err != nil {
		return nil, 0, fmt.Errorf("processor: bucket %s: %w", bucket, err)
	}
	info, ok := st.(*jetstream.KeyValueBucketStatus)
	if !ok {
		return kv, 0, nil
	}
	cfg := info.StreamInfo().Config
	if cfg.Storage != storage {
		return nil, 0, fmt.Errorf("%w: bucket %s has %s storage, the configuration asks for %s", ErrIncompatible, bucket, cfg.Storage, storage)
	}
	return kv, max(int(cfg.MaxMsgSize), 0), nil
}

// allowAtomicWait bounds allowAtomic's update.
const allowAtomicWait = 5 * time.Second

// allowAtomic turns on atomic batch publishes in the stream named (the
// session bucket's: a batch's states are written as one atomic batch, see
// batch.go), in place, where they are off.
func allowAtomic(ctx context.Context, js jetstream.JetStream, name string) error {
	s, err := js.Stream(ctx, name)
	if err != nil {
		return fmt.Errorf("processor: stream %s: %w", name, err)
	}
	cfg := s.CachedInfo().Config
	if cfg.AllowAtomicPublish {
		return nil
	}
	cfg.AllowAtomicPublish = true
	// An identity without the permission gets no answer: it waits only
	// so long.
	ctx, cancel := context.WithTimeout(ctx, allowAtomicWait)
	defer cancel()
	if _, err := js.UpdateStream(ctx, cfg); err != nil {
		return fmt.Errorf("processor: update stream %s (allow atomic batch publishes): %w", name, err)
	}
	return nil
}

// ensureSpills creates the spill object store, or checks an existing one:
// its stream must discard new data when full (a full bucket refuses a
// spill; it must never delete the spills it holds), and its size limit is
// updated in place to c's.
func ensureSpills(ctx context.Context, js jetstream.JetStream, bucket string, storage jetstream.StorageType, c Config) (jetstream.ObjectStore, error) {
	maxBytes := c.SpillBucketMaxBytes
	obs, err := js.ObjectStore(ctx, bucket)
	switch {
	case errors.Is(err, jetstream.ErrBucketNotFound) || errors.Is(err, jetstream.ErrStreamNotFound):
		// nats.go creates object stores with DiscardNew.
		obs, err = js.CreateObjectStore(ctx, jetstream.ObjectStoreConfig{
			Bucket: bucket, Description: "seamguard: lossless session transcripts",
			Storage: storage, Replicas: c.Replicas, MaxBytes: maxBytes,
		})
		switch {
		case errors.Is(err, jetstream.ErrBucketExists):
			// Created by another instance first: checked as an existing one.
			if obs, err = js.ObjectStore(ctx, bucket); err != nil {
				return nil, fmt.Errorf("processor: object store %s: %w", bucket, err)
			}
		case err != nil:
			return nil, fmt.Errorf("processor: create object store %s: %w", bucket, err)
		default:
			return obs, nil
		}
	case err != nil:
		return nil, fmt.Errorf("processor: object store %s: %w", bucket, err)
	}
	name := spill.StreamName(bucket)
	s, err := js.Stream(ctx, name)
	if err != nil {
		return nil, fmt.Errorf("processor: object store %s: %w", bucket, err)
	}
	have := s.CachedInfo().Config
	if have.Discard != jetstream.DiscardNew {
		return nil, fmt.Errorf("%w: object store %s: discard policy is %s, seamguard needs %s (a full bucket must refuse a spill, never delete an old one); change the discard policy of stream %s by hand",
			ErrIncompatible, bucket, have.Discard, jetstream.DiscardNew, name)
	}
	want := maxBytes
	if want == 0 {
		want = -1
	}
	if have.MaxBytes == want || have.MaxBytes <= 0 && want == -1 {
		return obs, nil
	}
	upd := have
	upd.MaxBytes = want
	if _, err := js.UpdateStream(ctx, upd); err != nil {
		return nil, fmt.Errorf("processor: update object store %s (max bytes %d): %w", bucket, want, err)
	}
	return obs, nil
}

// ForStream returns c laid out as its existing events stream is: with the
// stream's partition count where c leaves it 0, and the stream's layout of
// control subjects (events.Subjects.ControlApart), so that c.Subjects()
// names the subjects the stream stores inputs under. For a stream not made
// yet, c is returned as it is.
func ForStream(ctx context.Context, js jetstream.JetStream, c Config) (Config, error) {
	s, err := js.Stream(ctx, c.Names().Events)
	if errors.Is(err, jetstream.ErrStreamNotFound) {
		return c, nil
	}
	if err != nil {
		return c, fmt.Errorf("processor: stream %s: %w", c.Names().Events, err)
	}
	if c.Partitions == 0 {
		if c.Partitions, err = streamPartitions(s); err != nil {
			return c, err
		}
	}
	t := s.CachedInfo().Config.SubjectTransform
	c.controlApart = t != nil && t.Source == c.Subjects().EventsWildcard()
	return c, nil
}

// streamPartitions reads the partition count from s's subject transform. A
// stream whose transform is not seamguard's is an error wrapping
// ErrIncompatible.
func streamPartitions(s jetstream.Stream) (int, error) {
	name := s.CachedInfo().Config.Name
	t := s.CachedInfo().Config.SubjectTransform
	if t != nil {
		if _, rest, ok := strings.Cut(t.Destination, "{{partition("); ok {
			if num, _, ok := strings.Cut(rest, ","); ok {
				if n, err := strconv.Atoi(num); err == nil && n > 0 {
					return n, nil
				}
			}
		}
	}
	return 0, fmt.Errorf("%w: stream %s: subject transform is %s, not seamguard's partitioning; change the prefix or migrate the stream by hand", ErrIncompatible, name, transformString(t))
}

// ensureStream creates want, or checks an existing stream of that name
// against it and updates what may change in place.
func ensureStream(ctx context.Context, js jetstream.JetStream, want jetstream.StreamConfig) (jetstream.Stream, error) {
	s, err := js.Stream(ctx, want.Name)
	if errors.Is(err, jetstream.ErrStreamNotFound) {
		s, err = js.CreateStream(ctx, want)
		switch {
		case errors.Is(err, jetstream.ErrStreamNameAlreadyInUse):
			// Created by another instance first, with a configuration
			// since updated: checked as an existing one.
			s, err = js.Stream(ctx, want.Name)
		case err != nil:
			return nil, fmt.Errorf("processor: create stream %s: %w", want.Name, err)
		default:
			return s, nil
		}
	}
	if err != nil {
		return nil, fmt.Errorf("processor: stream %s: %w", want.Name, err)
	}
	have := s.CachedInfo().Config
	var bad []string
	// Subjects may be added in place (an events stream made before control
	// subjects existed gains them), never taken away.
	grow := !slices.Equal(have.Subjects, want.Subjects) && subset(have.Subjects, want.Subjects)
	if !slices.Equal(have.Subjects, want.Subjects) && !grow {
		bad = append(bad, fmt.Sprintf("subjects are %v, the configuration asks for %v", have.Subjects, want.Subjects))
	}
	if !sameTransform(have.SubjectTransform, want.SubjectTransform) {
		bad = append(bad, fmt.Sprintf("subject transform is %s, the configuration asks for %s (partitions cannot change on a stream that holds events)", transformString(have.SubjectTransform), transformString(want.SubjectTransform)))
	}
	if have.Storage != want.Storage {
		bad = append(bad, fmt.Sprintf("storage is %s, the configuration asks for %s", have.Storage, want.Storage))
	}
	if have.Retention != want.Retention {
		bad = append(bad, fmt.Sprintf("retention is %s, seamguard needs %s", have.Retention, want.Retention))
	}
	if have.Discard != want.Discard {
		bad = append(bad, fmt.Sprintf("discard policy is %s, seamguard needs %s", have.Discard, want.Discard))
	}
	if len(bad) > 0 {
		return nil, fmt.Errorf("%w: stream %s: %v; change the configuration (prefix, storage) or migrate the stream by hand", ErrIncompatible, want.Name, bad)
	}
	if have.MaxAge == want.MaxAge && have.Duplicates == want.Duplicates && have.Replicas == want.Replicas && !grow && (have.AllowDirect || !want.AllowDirect) && (have.AllowAtomicPublish || !want.AllowAtomicPublish) {
		return s, nil
	}
	upd := have
	upd.MaxAge, upd.Duplicates, upd.Replicas, upd.Subjects = want.MaxAge, want.Duplicates, want.Replicas, want.Subjects
	// Direct gets are turned on in place where seamguard needs them, and
	// left as they are elsewhere.
	upd.AllowDirect = have.AllowDirect || want.AllowDirect
	upd.AllowAtomicPublish = have.AllowAtomicPublish || want.AllowAtomicPublish
	s, err = js.UpdateStream(ctx, upd)
	if err != nil {
		return nil, fmt.Errorf("processor: update stream %s (subjects %v, max age %s, duplicates %s, replicas %d): %w", want.Name, want.Subjects, want.MaxAge, want.Duplicates, want.Replicas, err)
	}
	return s, nil
}

// subset reports whether every subject of a is in b.
func subset(a, b []string) bool {
	for _, s := range a {
		if !slices.Contains(b, s) {
			return false
		}
	}
	return true
}

func sameTransform(a, b *jetstream.SubjectTransformConfig) bool {
	if a == nil || b == nil {
		return a == b
	}
	return *a == *b
}

func transformString(t *jetstream.SubjectTransformConfig) string {
	if t == nil {
		return "none"
	}
	return fmt.Sprintf("%s -> %s", t.Source, t.Destination)
}

// autoReplicas is 3 when nc is connected to a cluster that has told it of
// three or more servers, and 1 otherwise.
func autoReplicas(nc *nats.Conn) int {
	if nc != nil && nc.ConnectedClusterName() != "" && len(nc.Servers()) >= 3 {
		return 3
	}
	return DefaultReplicas
}
