package processor

import "time"

// The processor's fixed tunables, named once with what each bounds. Those
// an operator sets are in Config; these are not worth a setting.
const (
	// leaseMinLeft is the least time a lease must have left for a batch of
	// its partition to begin under it.
	leaseMinLeft = 50 * time.Millisecond
	// leaseMinRound is the shortest round of lease renewals (a quarter of
	// the TTL otherwise).
	leaseMinRound = 10 * time.Millisecond
	// leaseTakeMaxWait bounds the pause between a rebuild's attempts to
	// take every lease (a twentieth of the TTL otherwise, at least
	// leaseMinRound).
	leaseTakeMaxWait = 100 * time.Millisecond
	// releaseWait bounds handing leases over at the end of Run, or giving
	// them back after a refused rebuild.
	releaseWait = 5 * time.Second
	// parkWait bounds storing or deleting one park record.
	parkWait = 10 * time.Second
	// infoWait bounds one look at a stream's info (placement for a log
	// line, a check that a store exists).
	infoWait = 5 * time.Second
	// subscribeWait bounds the flush after the recover service subscribes,
	// which brings a refused subscription's error back.
	subscribeWait = 2 * time.Second
	// startAttemptMin is the least time one attempt of a start step gets
	// (a quarter of StartTimeout otherwise).
	startAttemptMin = 5 * time.Second
	// backoffFirst and backoffMax bound retries' backoff: backoffFirst
	// doubling to backoffMax.
	backoffFirst = 50 * time.Millisecond
	backoffMax   = 2 * time.Second
)
