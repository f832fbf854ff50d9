package forward

import "github.com/prometheus/client_golang/prometheus"

// metrics are a forwarder's Prometheus metrics. Labels have bounded values:
// reasons are the Reason* constants, failures the classes of classify.
type metrics struct {
	delivered     prometheus.Counter
	failures      *prometheus.CounterVec
	undeliverable *prometheus.CounterVec
	inFlight      prometheus.Gauge
	seconds       prometheus.Histogram
}

func newMetrics(reg prometheus.Registerer) *metrics {
	m := &metrics{
		delivered: prometheus.NewCounter(prometheus.CounterOpts{Name: "seamguard_forward_delivered_total",
			Help: "Verdicts delivered: the receiver answered 2xx and the verdict was acknowledged."}),
		failures: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "seamguard_forward_attempts_failed_total",
			Help: "Delivery attempts that failed, by class: status_4xx, status_5xx, status_429, status_408, status_other, timeout, connection."}, []string{"class"}),
		undeliverable: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "seamguard_forward_undeliverable_total",
			Help: "Verdicts kept in the undeliverable stream, by reason: rejected, exhausted, unverifiable, malformed (seamguard forward failed lists them)."}, []string{"reason"}),
		inFlight: prometheus.NewGauge(prometheus.GaugeOpts{Name: "seamguard_forward_in_flight",
			Help: "Verdicts being delivered or waiting to be retried."}),
		seconds: prometheus.NewHistogram(prometheus.HistogramOpts{Name: "seamguard_forward_request_seconds",
			Help: "Duration of one delivery attempt (an HTTP request).", Buckets: prometheus.ExponentialBuckets(0.001, 4, 10)}),
	}
	for _, r := range []string{ReasonRejected, ReasonExhausted, ReasonUnverifiable, ReasonMalformed} {
		m.undeliverable.WithLabelValues(r)
	}
	if reg != nil {
		reg.MustRegister(m.delivered, m.failures, m.undeliverable, m.inFlight, m.seconds)
	}
	return m
}
