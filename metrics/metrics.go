package metrics

import (
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/seamguard/seamguard/events"
	"github.com/seamguard/seamguard/processor"
)

// Label values for what falls outside the fixed sets.
const (
	// TypeInvalid is the type label of inputs that could not be decoded
	// (not a CloudEvent, an unknown type, bad data: they are rejected).
	TypeInvalid = "invalid"
	// Other is the label of a value outside its fixed set; the runtime
	// never produces one, but a label must never take an unbounded value.
	Other = "other"
	// ReasonNone is the reason label of a verdict that names no reason.
	ReasonNone = "none"
	// ReasonMultiple is the reason label of a verdict that names several.
	ReasonMultiple = "multiple"
)

// Buckets of the histograms, in seconds.
var (
	// DecisionBuckets spans a decision in memory (well under a
	// millisecond plus a publish round trip) to one that writes a large
	// spill (seconds).
	DecisionBuckets = []float64{.0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30}
	// SnapshotBuckets spans a KV write on one server to one through a
	// replicated cluster under load.
	SnapshotBuckets = []float64{.00025, .0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5}
	// SpillBuckets spans a small transcript to a large one read back and
	// verified.
	SpillBuckets = []float64{.005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60}
)

// ServiceDeniedReasons are the reason label values of
// seamguard_service_denied_total.
var ServiceDeniedReasons = []string{processor.DeniedReply, processor.DeniedOverload}

// InputTypes are the type label values of inputs: the short names of the
// contract's input types (without "io.seamguard."), and TypeInvalid.
var InputTypes = []string{
	short(events.TypeSessionOpened), short(events.TypeTurnAppended), short(events.TypeContextTruncated),
	short(events.TypeContextPinned), short(events.TypeContextUnpinned),
	short(events.TypeCompactionRequested), short(events.TypeCompactionCommitted),
	short(events.TypeSessionResumed), short(events.TypeSessionClosed), TypeInvalid,
}

// RejectionCodes are the contract's rejection codes.
var RejectionCodes = []events.Code{
	events.CodeMalformed, events.CodeMissingAttribute, events.CodeBadSpecversion, events.CodeBadSessionID,
	events.CodeSubjectMismatch, events.CodeUnknownType, events.CodeBadData, events.CodeUnknownSession,
	events.CodeAlreadyOpen, events.CodeSessionClosed, events.CodeOffsetConflict, events.CodeRangeOutOfBounds,
	events.CodeTooLarge, events.CodeStateLimit,
}

// ReasonCodes are the contract's reason codes: the checks, then rule 1.
var ReasonCodes = []events.ReasonCode{
	events.ReasonCoverageHole, events.ReasonFloorNotInInput, events.ReasonFloorNotInTail,
	events.ReasonPinDropped, events.ReasonReachNotInInput, events.ReasonSeamGap, events.ReasonSequenceGap, events.ReasonUnitMismatch,
	events.ReasonInvalidRequest, events.ReasonUnknownSession, events.ReasonSessionClosed, events.ReasonSessionHalted,
}

// Kinds are the verdict kinds.
var Kinds = []string{events.KindAllowed, events.KindRefused, events.KindSpilled, events.KindHalted, events.KindRejected, events.KindViolation}

func short(eventType string) string { return strings.TrimPrefix(eventType, events.TypePrefix) }

// Recorder holds seamguard's metrics in its own registry. It implements
// processor.Observer; its methods are safe for concurrent use. Create it
// with New.
type Recorder struct {
	reg *prometheus.Registry

	events          *prometheus.CounterVec
	rejections      *prometheus.CounterVec
	verdicts        *prometheus.CounterVec
	reasons         *prometheus.CounterVec
	spills          prometheus.Counter
	spillBytes      prometheus.Counter
	spillFailures   prometheus.Counter
	spillSeconds    prometheus.Histogram
	decision        prometheus.Histogram
	snapshot        prometheus.Histogram
	casConflicts    prometheus.Counter
	consumerLag     *prometheus.GaugeVec
	consumerPending *prometheus.GaugeVec
	pollErrors      prometheus.Counter
	stuck           prometheus.Gauge
	stuckSession    *prometheus.GaugeVec
	stuckMu         sync.Mutex
	stuckNamed      map[string]bool
	parked          prometheus.Gauge
	parkedSet       map[string]bool
	serviceDenied   *prometheus.CounterVec
	storeMissing    *prometheus.GaugeVec

	byType   map[string]prometheus.Counter // read-only after New
	okCode   map[events.Code]bool
	okReason map[events.ReasonCode]bool
	okKind   map[string]bool
}

var _ processor.Observer = (*Recorder)(nil)

// New returns a Recorder whose registry also holds the Go runtime's and the
// process's standard metrics. Every series of a fixed label set starts at 0,
// so that rates and dashboards work before the first event.
func New() *Recorder {
	r := &Recorder{
		reg: prometheus.NewRegistry(),
		events: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "seamguard_events_total",
			Help: "Input events stepped through a session's ledger, by type (short name; \"invalid\" for inputs that could not be decoded).",
		}, []string{"type"}),
		rejections: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "seamguard_rejections_total",
			Help: "event.rejected verdicts published, by rejection code.",
		}, []string{"code"}),
		verdicts: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "seamguard_verdicts_total",
			Help: "Verdicts published (acknowledged by the verdict stream), each counted once, by kind and reason: the one reason code a refusal names or an allowed verdict cured, \"multiple\" when it names several, \"none\" when it names none.",
		}, []string{"kind", "reason"}),
		reasons: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "seamguard_verdict_reasons_total",
			Help: "Reason codes named by published verdicts: once for each reason of a refusal and each check an allowed verdict cured, by kind and reason.",
		}, []string{"kind", "reason"}),
		spills: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "seamguard_spills_total",
			Help: "Transcripts spilled into the object store (written, and verified when --spill-verify is on).",
		}),
		spillBytes: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "seamguard_spill_bytes_total",
			Help: "Bytes of the transcripts spilled into the object store.",
		}),
		spillFailures: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "seamguard_spill_failures_total",
			Help: "Spills that failed (transcript no longer whole, object store failing after retries) and so halted their session.",
		}),
		spillSeconds: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "seamguard_spill_write_seconds",
			Help:    "Time to write one spill, reading the transcript from the events stream, and verifying it when configured.",
			Buckets: SpillBuckets,
		}),
		decision: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "seamguard_decision_latency_seconds",
			Help:    "From receiving a compaction.requested from the events stream to the verdict stream's ack of the verdict that answers it (allowed, refused or halted), spill included.",
			Buckets: DecisionBuckets,
		}),
		snapshot: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "seamguard_snapshot_write_seconds",
			Help:    "Time to store one session's state (ledger snapshot and last applied sequence) in the KV bucket with compare-and-swap, retries included.",
			Buckets: SnapshotBuckets,
		}),
		casConflicts: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "seamguard_cas_conflicts_total",
			Help: "Session state writes the KV bucket refused because the revision had moved (another instance took the session, or an earlier write's reply was lost).",
		}),
		consumerLag: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "seamguard_consumer_lag",
			Help: "Messages of the events stream a processor consumer has not delivered yet (num_pending), polled.",
		}, []string{"consumer"}),
		consumerPending: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "seamguard_consumer_ack_pending",
			Help: "Messages a processor consumer delivered that are not acknowledged yet (num_ack_pending), polled.",
		}, []string{"consumer"}),
		pollErrors: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "seamguard_consumer_poll_errors_total",
			Help: "Failed requests for a consumer's info while polling the consumer lag.",
		}),
		stuck: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "seamguard_sessions_stuck",
			Help: "Sessions whose effects could not be made durable: their inputs wait, unacknowledged, and the processor reports itself unready.",
		}),
		stuckSession: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "seamguard_session_stuck",
			Help: "1 for each stuck session, by session id (at most 64 are named; seamguard_sessions_stuck counts them all).",
		}, []string{"session"}),
		stuckNamed: map[string]bool{},
		parked: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "seamguard_sessions_parked",
			Help: "Sessions parked: stuck past --park-after on a failure retrying cannot fix; their inputs wait in the events stream, acknowledged into the session's park record, until an operator's seamguard resume applies them.",
		}),
		parkedSet: map[string]bool{},
		serviceDenied: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "seamguard_service_denied_total",
			Help: "Requests to the processor's services (the recover service) not served: reason reply_subject (a reply subject outside the inbox prefixes; no answer) or overloaded (a full queue; answered 503).",
		}, []string{"reason"}),
		storeMissing: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "seamguard_store_missing",
			Help: "1 while the stream behind one of the processor's stores (events, verdicts, sessions, spills, leases) does not exist, by stream name; the processor is unready meanwhile.",
		}, []string{"stream"}),
		byType:   map[string]prometheus.Counter{},
		okCode:   map[events.Code]bool{},
		okReason: map[events.ReasonCode]bool{},
		okKind:   map[string]bool{},
	}
	r.reg.MustRegister(r.events, r.rejections, r.verdicts, r.reasons, r.spills, r.spillBytes, r.spillFailures,
		r.spillSeconds, r.decision, r.snapshot, r.casConflicts, r.consumerLag, r.consumerPending, r.pollErrors,
		r.stuck, r.stuckSession, r.parked, r.serviceDenied, r.storeMissing,
		collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	for _, t := range InputTypes {
		r.byType[t] = r.events.WithLabelValues(t)
	}
	r.byType[Other] = r.events.WithLabelValues(Other)
	r.serviceDenied.WithLabelValues(processor.DeniedReply)
	r.serviceDenied.WithLabelValues(processor.DeniedOverload)
	for _, c := range RejectionCodes {
		r.okCode[c] = true
		r.rejections.WithLabelValues(string(c))
	}
	for _, k := range Kinds {
		r.okKind[k] = true
		r.verdicts.WithLabelValues(k, ReasonNone)
	}
	r.verdicts.WithLabelValues(events.KindRefused, ReasonMultiple)
	for _, c := range ReasonCodes {
		r.okReason[c] = true
		r.verdicts.WithLabelValues(events.KindRefused, string(c))
		r.reasons.WithLabelValues(events.KindRefused, string(c))
	}
	return r
}

// Registry returns the registry, to register more collectors.
func (r *Recorder) Registry() *prometheus.Registry { return r.reg }

// Handler serves the metrics in the format the scraper's Accept header asks
// for: the Prometheus text format (the default), the protobuf format, or
// OpenMetrics text (without _created samples).
func (r *Recorder) Handler() http.Handler {
	return promhttp.HandlerFor(r.reg, promhttp.HandlerOpts{Registry: r.reg, EnableOpenMetrics: true})
}

// Input counts an input by its type.
func (r *Recorder) Input(eventType string) {
	t := TypeInvalid
	if eventType != "" {
		t = short(eventType)
	}
	c, ok := r.byType[t]
	if !ok {
		c = r.byType[Other]
	}
	c.Inc()
}

// Published counts a verdict, its reasons and, for a rejection, its code,
// and observes the decision latency of the verdict that answers a request.
func (r *Recorder) Published(o events.Output, received time.Time) {
	kind := o.Kind()
	if !r.okKind[kind] {
		kind = Other
	}
	var codes []events.ReasonCode
	switch d := o.Data.(type) {
	case *events.CompactionRefused:
		for _, rs := range d.Reasons {
			codes = append(codes, rs.Code)
		}
	case *events.CompactionAllowed:
		codes = d.Cured
	case *events.EventRejected:
		c := string(d.Code)
		if !r.okCode[d.Code] {
			c = Other
		}
		r.rejections.WithLabelValues(c).Inc()
	}
	reason := ReasonNone
	switch len(codes) {
	case 0:
	case 1:
		reason = r.reason(codes[0])
	default:
		reason = ReasonMultiple
	}
	r.verdicts.WithLabelValues(kind, reason).Inc()
	for _, c := range codes {
		r.reasons.WithLabelValues(kind, r.reason(c)).Inc()
	}
	switch o.Type {
	case events.TypeCompactionAllowed, events.TypeCompactionRefused, events.TypeSessionHalted:
		if !received.IsZero() {
			r.decision.Observe(time.Since(received).Seconds())
		}
	}
}

func (r *Recorder) reason(c events.ReasonCode) string {
	if !r.okReason[c] {
		return Other
	}
	return string(c)
}

// Spilled counts a spill and its bytes and observes how long it took.
func (r *Recorder) Spilled(h events.SpillHandle, took time.Duration) {
	r.spills.Inc()
	r.spillBytes.Add(float64(h.Size))
	r.spillSeconds.Observe(took.Seconds())
}

// SpillFailed counts a spill that halted its session.
func (r *Recorder) SpillFailed() { r.spillFailures.Inc() }

// Stored observes a session state write.
func (r *Recorder) Stored(took time.Duration) { r.snapshot.Observe(took.Seconds()) }

// CASConflict counts a revision mismatch of the session bucket.
func (r *Recorder) CASConflict() { r.casConflicts.Inc() }

// ServiceDenied counts a request a service did not serve.
func (r *Recorder) ServiceDenied(reason string) {
	if reason != processor.DeniedReply && reason != processor.DeniedOverload {
		reason = Other
	}
	r.serviceDenied.WithLabelValues(reason).Inc()
}

// maxStuckNamed bounds the sessions seamguard_session_stuck names.
const maxStuckNamed = 64

// Stuck counts a session that became stuck (stuck true) or no longer is.
func (r *Recorder) Stuck(session string, stuck bool) {
	r.stuckMu.Lock()
	defer r.stuckMu.Unlock()
	if stuck {
		r.stuck.Inc()
		if len(r.stuckNamed) < maxStuckNamed {
			r.stuckNamed[session] = true
			r.stuckSession.WithLabelValues(session).Set(1)
		}
		return
	}
	r.stuck.Dec()
	if r.stuckNamed[session] {
		delete(r.stuckNamed, session)
		r.stuckSession.DeleteLabelValues(session)
	}
}

// Parked sets seamguard_sessions_parked as sessions are parked and let go.
func (r *Recorder) Parked(session string, parked bool) {
	r.stuckMu.Lock()
	defer r.stuckMu.Unlock()
	if parked == r.parkedSet[session] {
		return
	}
	if parked {
		r.parkedSet[session] = true
	} else {
		delete(r.parkedSet, session)
	}
	r.parked.Set(float64(len(r.parkedSet)))
}

// StoreMissing sets seamguard_store_missing for stream: 1 while it is
// missing, 0 once it exists again.
func (r *Recorder) StoreMissing(stream string, missing bool) {
	v := 0.0
	if missing {
		v = 1
	}
	r.storeMissing.WithLabelValues(stream).Set(v)
}

// SyncAlways sets seamguard_nats_sync_always: 1 when every NATS server
// the processor uses fsyncs before it acknowledges, 0 when one does not
// (a power cut may lose what it acknowledged), -1 when that could not be
// found out.
func (r *Recorder) SyncAlways(v float64) {
	g := prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "seamguard_nats_sync_always",
		Help: "1 when every NATS server used syncs to disk before acknowledging (sync_interval: always), 0 when one acknowledges first (a power cut may lose acknowledged data), -1 when unknown.",
	})
	g.Set(v)
	r.reg.MustRegister(g)
}

// WatchProcessor registers gauges and counters read from a processor when
// scraped: whether it consumes, and its runtime Stats.
func (r *Recorder) WatchProcessor(p *processor.Processor) {
	stat := func(name, help string, f func(processor.Stats) uint64) prometheus.Collector {
		return prometheus.NewCounterFunc(prometheus.CounterOpts{Name: name, Help: help}, func() float64 { return float64(f(p.Stats())) })
	}
	r.reg.MustRegister(
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "seamguard_ready",
			Help: "1 while the processor consumes and its NATS connection is up, else 0 (as /readyz).",
		}, func() float64 {
			if p.Ready() == nil {
				return 1
			}
			return 0
		}),
		stat("seamguard_inputs_handled_total", "Inputs decided by this instance (redeliveries of inputs already applied not counted).",
			func(s processor.Stats) uint64 { return s.Handled }),
		stat("seamguard_sessions_fenced_total", "Batches of a session whose state another instance had changed: this instance left its inputs to that one.",
			func(s processor.Stats) uint64 { return s.Fenced }),
		stat("seamguard_inputs_expired_total", "Inputs left undecided because the lease of their partition ended (a pause, a partition) after they were fetched: the partition's holder decides them.",
			func(s processor.Stats) uint64 { return s.Expired }),
		stat("seamguard_sessions_reloaded_total", "Cached sessions read again from the bucket after a break in delivery.",
			func(s processor.Stats) uint64 { return s.Reloaded }),
		stat("seamguard_caught_up_total", "Messages applied from the events stream ahead of their redelivery.",
			func(s processor.Stats) uint64 { return s.CaughtUp }),
	)
}
