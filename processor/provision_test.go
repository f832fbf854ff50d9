package processor_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/seamguard/seamguard/processor"
)

func TestProvisionIsIdempotent(t *testing.T) {
	e := newEnv(t)
	cfg := baseConfig()
	first, err := processor.Provision(e.ctx, e.JS, cfg)
	require.NoError(t, err)
	second, err := processor.Provision(e.ctx, e.JS, cfg)
	require.NoError(t, err)

	n := cfg.Names()
	for _, name := range []string{n.Events, n.Verdicts} {
		info := e.streamInfo(t, name)
		assert.Equal(t, jetstream.FileStorage, info.Config.Storage, name)
		assert.Equal(t, jetstream.LimitsPolicy, info.Config.Retention, name)
		assert.Equal(t, uint64(0), info.State.Msgs, name)
	}
	ev := e.streamInfo(t, n.Events)
	assert.Equal(t, []string{"seamguard.events.>", "seamguard.control.>"}, ev.Config.Subjects)
	assert.Equal(t, processor.DefaultEventsMaxAge, ev.Config.MaxAge)
	assert.Equal(t, processor.DefaultEventsDuplicates, ev.Config.Duplicates)
	assert.Equal(t, first.Events.CachedInfo().Created, second.Events.CachedInfo().Created, "the same stream, not a new one")
	assert.Equal(t, first.Events.CachedInfo().Config, second.Events.CachedInfo().Config)
	assert.Equal(t, []string{"seamguard.verdicts.>"}, e.streamInfo(t, n.Verdicts).Config.Subjects)
	assert.Equal(t, n.Sessions, second.Sessions.Bucket())
	_, err = e.JS.ObjectStore(e.ctx, n.Spills)
	require.NoError(t, err)

	// A third time, through New, with a processor's worth of data in it.
	r := e.start(t, cfg)
	e.publishAll(t, msgsOf(t, genWorkload(2), cfg.Subjects()))
	e.waitIdle(t, cfg, 20*time.Second)
	require.NoError(t, r.stop(t))
	_, err = processor.Provision(e.ctx, e.JS, cfg)
	require.NoError(t, err)
	assert.NotZero(t, e.streamInfo(t, n.Events).State.Msgs)
}

// TestProvisionAddsControlSubjects: an events stream made before control
// subjects existed (its subjects the events ones alone) gains them in place,
// its events kept.
func TestProvisionAddsControlSubjects(t *testing.T) {
	e := newEnv(t)
	cfg := baseConfig()
	cfg.Partitions = 4
	subj := cfg.Subjects()
	apart := subj // a stream made before control subjects were partitioned
	apart.ControlApart = true
	old, err := e.JS.CreateStream(e.ctx, jetstream.StreamConfig{
		Name: cfg.Names().Events, Subjects: []string{"seamguard.events.>"}, Storage: jetstream.FileStorage,
		SubjectTransform: &jetstream.SubjectTransformConfig{Source: apart.EventsWildcard(), Destination: apart.TransformDestination()},
		MaxAge:           processor.DefaultEventsMaxAge, Duplicates: processor.DefaultEventsDuplicates,
	})
	require.NoError(t, err)
	_, err = e.JS.Publish(e.ctx, subj.Events("before"), []byte("{}"))
	require.NoError(t, err)
	_, err = processor.Provision(e.ctx, e.JS, cfg)
	require.NoError(t, err)
	info := e.streamInfo(t, cfg.Names().Events)
	assert.Equal(t, []string{"seamguard.events.>", "seamguard.control.>"}, info.Config.Subjects)
	assert.Equal(t, old.CachedInfo().Created, info.Created, "the same stream")
	assert.Equal(t, uint64(1), info.State.Msgs, "its event kept")
	_, err = e.JS.Publish(e.ctx, subj.Control("before"), []byte("{}"))
	require.NoError(t, err, "the stream takes control subjects")
}

func TestProvisionRefusesIncompatibleStreams(t *testing.T) {
	cfg := baseConfig()
	n := cfg.Names()
	for _, tc := range []struct {
		name  string
		setup func(e *env) error
		field string
	}{
		{"other subjects", func(e *env) error {
			_, err := e.JS.CreateStream(e.ctx, jetstream.StreamConfig{Name: n.Events, Subjects: []string{"agents.>"}, Storage: jetstream.FileStorage})
			return err
		}, "subjects"},
		{"memory storage", func(e *env) error {
			_, err := e.JS.CreateStream(e.ctx, jetstream.StreamConfig{Name: n.Events, Subjects: []string{"seamguard.events.>"}, Storage: jetstream.MemoryStorage})
			return err
		}, "storage"},
		{"work queue retention", func(e *env) error {
			_, err := e.JS.CreateStream(e.ctx, jetstream.StreamConfig{Name: n.Verdicts, Subjects: []string{"seamguard.verdicts.>"}, Retention: jetstream.WorkQueuePolicy})
			return err
		}, "retention"},
		{"memory bucket", func(e *env) error {
			_, err := e.JS.CreateKeyValue(e.ctx, jetstream.KeyValueConfig{Bucket: n.Sessions, Storage: jetstream.MemoryStorage})
			return err
		}, "storage"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t)
			require.NoError(t, tc.setup(e))
			_, err := processor.Provision(e.ctx, e.JS, cfg)
			require.ErrorIs(t, err, processor.ErrIncompatible)
			assert.ErrorContains(t, err, tc.field)
			_, err = processor.New(e.ctx, e.JS, cfg)
			require.ErrorIs(t, err, processor.ErrIncompatible, "New provisions too")
		})
	}
}

func TestProvisionUpdatesRetentionInPlace(t *testing.T) {
	e := newEnv(t)
	cfg := baseConfig()
	n := cfg.Names()
	subj := cfg.Subjects()
	apart := subj // a stream made before control subjects were partitioned
	apart.ControlApart = true
	_, err := e.JS.CreateStream(e.ctx, jetstream.StreamConfig{
		Name: n.Events, Subjects: []string{"seamguard.events.>"}, Storage: jetstream.FileStorage,
		SubjectTransform: &jetstream.SubjectTransformConfig{Source: apart.EventsWildcard(), Destination: apart.TransformDestination()},
		MaxAge:           time.Hour, Duplicates: time.Minute,
	})
	require.NoError(t, err)
	_, err = e.JS.Publish(e.ctx, "seamguard.events.kept", []byte("{}"))
	require.NoError(t, err)

	cfg.EventsMaxAge = 48 * time.Hour
	cfg.EventsDuplicates = 5 * time.Minute
	cfg.VerdictsMaxAge = 24 * time.Hour
	_, err = processor.Provision(e.ctx, e.JS, cfg)
	require.NoError(t, err)
	info := e.streamInfo(t, n.Events)
	assert.Equal(t, 48*time.Hour, info.Config.MaxAge)
	assert.Equal(t, 5*time.Minute, info.Config.Duplicates)
	assert.Equal(t, uint64(1), info.State.Msgs, "updated in place: the stream keeps its messages")
	v := e.streamInfo(t, n.Verdicts)
	assert.Equal(t, 24*time.Hour, v.Config.MaxAge)

	// And back to the defaults.
	_, err = processor.Provision(e.ctx, e.JS, baseConfig())
	require.NoError(t, err)
	info = e.streamInfo(t, n.Events)
	assert.Equal(t, processor.DefaultEventsMaxAge, info.Config.MaxAge)
	assert.Equal(t, processor.DefaultEventsDuplicates, info.Config.Duplicates)
	assert.Equal(t, uint64(1), info.State.Msgs)
}

func TestConfigValidateReportsEveryProblem(t *testing.T) {
	require.NoError(t, processor.Config{}.Validate(), "the zero value is valid")
	err := processor.Config{
		Prefix:           "bad prefix.>",
		Replicas:         7,
		Shards:           -1,
		QueueDepth:       -2,
		AckWait:          500 * time.Millisecond,
		EventsMaxAge:     time.Minute,
		EventsDuplicates: time.Hour,
		Durable:          "a.b",
		Policy:           9,
		SigningKey:       "NOTASEED",
	}.Validate()
	require.Error(t, err)
	for _, want := range []string{"SigningKey", "Replicas is 7", "Shards is -1", "QueueDepth is -2", "AckWait 500ms", "EventsDuplicates 1h0m0s exceeds EventsMaxAge 1m0s", "Durable \"a.b\"", "policy 9", "prefix"} {
		assert.ErrorContains(t, err, want)
	}
	_, err = processor.Provision(t.Context(), nil, processor.Config{Shards: -1})
	require.ErrorContains(t, err, "Shards is -1", "Provision validates before it touches anything")
}

// TestProvisionKeepsTheStreamsPartitions: a configuration that leaves the
// partition count 0 takes the existing stream's (here 8, the earlier
// default), a new stream gets the default, and an explicit other count is
// refused, naming both.
func TestProvisionKeepsTheStreamsPartitions(t *testing.T) {
	e := newEnv(t)
	fresh := processor.Config{Prefix: "fresh"}
	res, err := processor.Provision(e.ctx, e.JS, fresh)
	require.NoError(t, err)
	assert.Equal(t, processor.DefaultPartitions, res.Partitions)
	laid, err := processor.ForStream(e.ctx, e.JS, fresh)
	require.NoError(t, err)
	assert.Equal(t, processor.DefaultPartitions, laid.Partitions)

	old := processor.Config{Partitions: 8}
	_, err = processor.Provision(e.ctx, e.JS, old)
	require.NoError(t, err)
	res, err = processor.Provision(e.ctx, e.JS, processor.Config{})
	require.NoError(t, err)
	assert.Equal(t, 8, res.Partitions)
	p, err := processor.New(e.ctx, e.JS, processor.Config{})
	require.NoError(t, err)
	assert.Equal(t, 8, p.Config().Partitions)
	assert.Equal(t, "seamguard.partitioned.{{partition(8,2)}}.{{wildcard(1)}}.{{wildcard(2)}}", p.Config().Subjects().TransformDestination())

	_, err = processor.Provision(e.ctx, e.JS, processor.Config{Partitions: 4})
	require.ErrorIs(t, err, processor.ErrIncompatible)
	assert.Contains(t, err.Error(), "partition(8,2)")
	assert.Contains(t, err.Error(), "partition(4,2)")
}

// TestProvisionSpillBucket: the spill object store discards new data when
// full and takes SpillBucketMaxBytes as its size limit, set on creation and
// updated in place; a bucket that would delete old spills is refused.
func TestProvisionSpillBucket(t *testing.T) {
	e := newEnv(t)
	cfg := baseConfig()
	cfg.SpillBucketMaxBytes = 2 << 20
	name := "OBJ_" + cfg.Names().Spills
	res, err := processor.Provision(e.ctx, e.JS, cfg)
	require.NoError(t, err)
	info := e.streamInfo(t, name)
	assert.Equal(t, jetstream.DiscardNew, info.Config.Discard)
	assert.Equal(t, int64(2<<20), info.Config.MaxBytes)
	_, err = res.Spills.PutString(e.ctx, "kept", "a spill")
	require.NoError(t, err)

	cfg.SpillBucketMaxBytes = 4 << 20
	_, err = processor.Provision(e.ctx, e.JS, cfg)
	require.NoError(t, err)
	assert.Equal(t, int64(4<<20), e.streamInfo(t, name).Config.MaxBytes, "updated in place")
	cfg.SpillBucketMaxBytes = 0
	_, err = processor.Provision(e.ctx, e.JS, cfg)
	require.NoError(t, err)
	assert.Equal(t, int64(-1), e.streamInfo(t, name).Config.MaxBytes, "no limit")
	got, err := res.Spills.GetString(e.ctx, "kept")
	require.NoError(t, err)
	assert.Equal(t, "a spill", got, "the bucket kept its objects")

	upd := e.streamInfo(t, name).Config
	upd.Discard = jetstream.DiscardOld
	_, err = e.JS.UpdateStream(e.ctx, upd)
	require.NoError(t, err)
	_, err = processor.Provision(e.ctx, e.JS, cfg)
	require.ErrorIs(t, err, processor.ErrIncompatible)
	assert.ErrorContains(t, err, "discard policy is DiscardOld, seamguard needs DiscardNew")

	for _, v := range []int64{-1, 1000} {
		err := processor.Config{SpillBucketMaxBytes: v}.Validate()
		assert.ErrorContains(t, err, "SpillBucketMaxBytes")
	}
	require.NoError(t, processor.Config{SpillBucketMaxBytes: processor.MinSpillBucketMaxBytes}.Validate())
}

// TestProvisionVerdictsAllowDirect: the verdict stream allows direct gets
// (operators read it without a consumer), a new one and an existing one
// made without them alike, which keeps its verdicts; so does the events
// stream (the prefetch's direct lookups; every other read of it asks its
// leader).
func TestProvisionVerdictsAllowDirect(t *testing.T) {
	e := newEnv(t)
	cfg := baseConfig()
	n := cfg.Names()
	old, err := e.JS.CreateStream(e.ctx, jetstream.StreamConfig{
		Name: n.Verdicts, Subjects: []string{"seamguard.verdicts.>"}, Storage: jetstream.FileStorage,
		MaxAge: processor.DefaultVerdictsMaxAge, Duplicates: processor.DefaultVerdictsDuplicates,
	})
	require.NoError(t, err)
	require.False(t, old.CachedInfo().Config.AllowDirect)
	_, err = e.JS.Publish(e.ctx, "seamguard.verdicts.s1.allowed", []byte("{}"))
	require.NoError(t, err)

	_, err = processor.Provision(e.ctx, e.JS, cfg)
	require.NoError(t, err)
	vd := e.streamInfo(t, n.Verdicts)
	assert.True(t, vd.Config.AllowDirect, "turned on in place")
	assert.Equal(t, old.CachedInfo().Created, vd.Created, "the same stream")
	assert.Equal(t, uint64(1), vd.State.Msgs, "its verdict kept")
	assert.True(t, e.streamInfo(t, n.Events).Config.AllowDirect, "the events stream answers the prefetch's direct lookups")

	// A new deployment.
	cfg2 := baseConfig()
	cfg2.Prefix = "other"
	_, err = processor.Provision(e.ctx, e.JS, cfg2)
	require.NoError(t, err)
	assert.True(t, e.streamInfo(t, cfg2.Names().Verdicts).Config.AllowDirect)
	assert.True(t, e.streamInfo(t, cfg2.Names().Events).Config.AllowDirect)
}

// TestProvisionConcurrently: instances started together each provision the
// same fresh resources; whichever creates one first, the others find it
// (however far the creator has got in updating it) and check it, none fails.
func TestProvisionConcurrently(t *testing.T) {
	e := newEnv(t)
	const rounds, instances = 40, 8
	for round := range rounds {
		cfg := baseConfig()
		cfg.Prefix = fmt.Sprintf("race%d", round)
		errs := make(chan error, instances)
		for range instances {
			go func() {
				_, err := processor.Provision(e.ctx, e.JS, cfg)
				errs <- err
			}()
		}
		for range instances {
			require.NoError(t, <-errs, "round %d", round)
		}
		info := e.streamInfo(t, cfg.Names().SessionsStream())
		assert.True(t, info.Config.AllowAtomicPublish, "round %d: the session bucket takes atomic batches", round)
	}
}
