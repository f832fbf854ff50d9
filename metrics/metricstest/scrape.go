package metricstest

import (
	"fmt"
	"io"
	"maps"
	"net/http"
	"slices"
	"strings"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

// Scrape is one parsed scrape: metric families by name.
type Scrape map[string]*dto.MetricFamily

// Parse reads the text exposition format. It fails on anything the
// Prometheus parser refuses (a missing TYPE before samples, a bad label, a
// histogram without its +Inf bucket, a family given twice).
func Parse(r io.Reader) (Scrape, error) {
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(r)
	if err != nil {
		return nil, fmt.Errorf("metricstest: %w", err)
	}
	return Scrape(fams), nil
}

// Get scrapes url (GET, text format) and parses it.
func Get(url string) (Scrape, string, error) {
	c := &http.Client{Timeout: 10 * time.Second}
	resp, err := c.Get(url)
	if err != nil {
		return nil, "", err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return nil, "", err
	}
	if resp.StatusCode != http.StatusOK {
		return nil, string(body), fmt.Errorf("metricstest: GET %s: %s", url, resp.Status)
	}
	if ct := resp.Header.Get("Content-Type"); !strings.HasPrefix(ct, "text/plain") {
		return nil, string(body), fmt.Errorf("metricstest: GET %s: Content-Type %q, want the text format", url, ct)
	}
	s, err := Parse(strings.NewReader(string(body)))
	return s, string(body), err
}

// Metric returns the sample of family name whose labels are exactly labels.
func (s Scrape) Metric(name string, labels map[string]string) (*dto.Metric, bool) {
	f := s[name]
	if f == nil {
		return nil, false
	}
	for _, m := range f.GetMetric() {
		got := map[string]string{}
		for _, lp := range m.GetLabel() {
			got[lp.GetName()] = lp.GetValue()
		}
		if maps.Equal(got, labels) {
			return m, true
		}
	}
	return nil, false
}

// Value returns the value of a counter, gauge or untyped sample, or false
// when there is no such sample.
func (s Scrape) Value(name string, labels map[string]string) (float64, bool) {
	m, ok := s.Metric(name, labels)
	if !ok {
		return 0, false
	}
	switch {
	case m.Counter != nil:
		return m.Counter.GetValue(), true
	case m.Gauge != nil:
		return m.Gauge.GetValue(), true
	case m.Untyped != nil:
		return m.Untyped.GetValue(), true
	}
	return 0, false
}

// LabelValues returns every value label takes in family name, sorted.
func (s Scrape) LabelValues(name, label string) []string {
	set := map[string]bool{}
	for _, m := range s[name].GetMetric() {
		for _, lp := range m.GetLabel() {
			if lp.GetName() == label {
				set[lp.GetValue()] = true
			}
		}
	}
	return slices.Sorted(maps.Keys(set))
}

// Has reports whether the scrape holds a series a PromQL query can select
// by name: a family, or the _bucket, _sum or _count series of a histogram
// (or the _sum or _count series of a summary).
func (s Scrape) Has(name string) bool {
	if s[name] != nil {
		return true
	}
	for _, suf := range []string{"_bucket", "_sum", "_count"} {
		base, ok := strings.CutSuffix(name, suf)
		if !ok {
			continue
		}
		f := s[base]
		if f == nil {
			continue
		}
		t := f.GetType()
		if t == dto.MetricType_HISTOGRAM || (t == dto.MetricType_SUMMARY && suf != "_bucket") {
			return true
		}
	}
	return false
}
