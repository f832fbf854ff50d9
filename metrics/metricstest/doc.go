// Package metricstest parses a Prometheus text scrape for tests: it reads
// the exposition format with the Prometheus parser, so that a test holds
// seamguard's /metrics to what Prometheus itself would read, and looks up
// samples by name and labels.
package metricstest
