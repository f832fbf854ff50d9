package deploy

import (
	"encoding/json"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
)

// dashboardPath is the example Grafana dashboard. Whether every metric it
// queries is in a real scrape is checked by TestServeMetrics in
// cmd/seamguard, which runs the seed story through serve; here, its shape.
var dashboardPath = filepath.Join(root, "deploy", "grafana", "seamguard.json")

type dashboard struct {
	UID        string `json:"uid"`
	Title      string `json:"title"`
	Templating struct {
		List []struct {
			Name  string `json:"name"`
			Type  string `json:"type"`
			Query string `json:"query"`
		} `json:"list"`
	} `json:"templating"`
	Panels []struct {
		ID         int    `json:"id"`
		Type       string `json:"type"`
		Title      string `json:"title"`
		Datasource *struct {
			Type string `json:"type"`
			UID  string `json:"uid"`
		} `json:"datasource"`
		GridPos struct{ X, Y, W, H int } `json:"gridPos"`
		Targets []struct {
			RefID string `json:"refId"`
			Expr  string `json:"expr"`
		} `json:"targets"`
	} `json:"panels"`
}

// metricName finds seamguard metric names in a PromQL expression.
var metricName = regexp.MustCompile(`\bseamguard_[a-z_]+\b`)

// TestGrafanaDashboard checks the dashboard's shape: it parses, picks its
// Prometheus data source through a variable, every panel has a unique id and
// a place on the 24-column grid that no other panel takes, and every query
// is a well-bracketed expression over seamguard metrics, whose counters are
// only read through rate or increase.
func TestGrafanaDashboard(t *testing.T) {
	b, err := os.ReadFile(dashboardPath)
	if err != nil {
		t.Fatal(err)
	}
	var d dashboard
	dec := json.NewDecoder(strings.NewReader(string(b)))
	if err := dec.Decode(&d); err != nil {
		t.Fatalf("%s: %v", dashboardPath, err)
	}
	if d.UID == "" || d.Title == "" {
		t.Errorf("the dashboard needs a uid and a title")
	}
	hasDS := slices.ContainsFunc(d.Templating.List, func(v struct {
		Name  string `json:"name"`
		Type  string `json:"type"`
		Query string `json:"query"`
	}) bool {
		return v.Name == "datasource" && v.Type == "datasource" && v.Query == "prometheus"
	})
	if !hasDS {
		t.Errorf("the dashboard needs a datasource variable of type prometheus, so that it imports into any Grafana")
	}
	ids := map[int]bool{}
	type cell struct{ x, y int }
	taken := map[cell]string{}
	queries := 0
	for _, p := range d.Panels {
		if ids[p.ID] {
			t.Errorf("panel id %d is used twice", p.ID)
		}
		ids[p.ID] = true
		g := p.GridPos
		if g.W <= 0 || g.H <= 0 || g.X < 0 || g.Y < 0 || g.X+g.W > 24 {
			t.Errorf("panel %q: gridPos %+v is off the 24-column grid", p.Title, g)
		}
		for x := g.X; x < g.X+g.W; x++ {
			for y := g.Y; y < g.Y+g.H; y++ {
				if other, ok := taken[cell{x, y}]; ok {
					t.Errorf("panel %q overlaps %q at (%d, %d)", p.Title, other, x, y)
				}
				taken[cell{x, y}] = p.Title
			}
		}
		if p.Type == "row" {
			continue
		}
		if p.Datasource == nil || p.Datasource.UID != "${datasource}" {
			t.Errorf("panel %q does not use the ${datasource} variable", p.Title)
		}
		if len(p.Targets) == 0 {
			t.Errorf("panel %q queries nothing", p.Title)
		}
		refs := map[string]bool{}
		for _, q := range p.Targets {
			queries++
			if refs[q.RefID] || q.RefID == "" {
				t.Errorf("panel %q: refId %q is empty or repeated", p.Title, q.RefID)
			}
			refs[q.RefID] = true
			checkPromQL(t, p.Title, q.Expr)
		}
	}
	if queries < 10 {
		t.Errorf("only %d queries; the dashboard should show verdicts, refusals, spills, latency and lag", queries)
	}
}

// checkPromQL checks what can be checked of an expression without a
// Prometheus: balanced brackets and quotes, seamguard metrics only, and
// counters (_total) and histogram series read through rate or increase.
func checkPromQL(t *testing.T, panel, expr string) {
	t.Helper()
	var stack []rune
	inQuote := false
	for _, r := range expr {
		if inQuote {
			inQuote = r != '"'
			continue
		}
		switch r {
		case '"':
			inQuote = true
		case '(', '{', '[':
			stack = append(stack, r)
		case ')', '}', ']':
			open := map[rune]rune{')': '(', '}': '{', ']': '['}[r]
			if len(stack) == 0 || stack[len(stack)-1] != open {
				t.Errorf("panel %q: unbalanced %q in %s", panel, r, expr)
				return
			}
			stack = stack[:len(stack)-1]
		}
	}
	if len(stack) != 0 || inQuote {
		t.Errorf("panel %q: unclosed brackets or quotes in %s", panel, expr)
	}
	names := metricName.FindAllStringIndex(expr, -1)
	if len(names) == 0 {
		t.Errorf("panel %q: %s reads no seamguard metric", panel, expr)
	}
	for _, loc := range names {
		name := expr[loc[0]:loc[1]]
		cumulative := strings.HasSuffix(name, "_total") || strings.HasSuffix(name, "_bucket") || strings.HasSuffix(name, "_sum") || strings.HasSuffix(name, "_count")
		if !cumulative {
			continue
		}
		before := expr[:loc[0]]
		if !strings.HasSuffix(before, "rate(") && !strings.HasSuffix(before, "increase(") {
			t.Errorf("panel %q: %s is cumulative and must be read through rate( or increase(: %s", panel, name, expr)
		}
	}
}
