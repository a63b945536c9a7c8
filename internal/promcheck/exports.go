package promcheck

import (
	"cmp"
	"fmt"
	"regexp"
	"slices"
	"strconv"
	"strings"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

// TargetLabels are the labels Prometheus gives every series it scrapes:
// a query may name them whatever the node exports.
var TargetLabels = []string{"instance", "job"}

// Exports is the series of one or more /metrics scrapes, by the name a
// query selects them with: a histogram family x is the series x_bucket
// (with le), x_sum and x_count, a summary's x (with quantile), x_sum and
// x_count. The zero Exports is empty, ready for Add.
type Exports struct {
	series map[string]*series
}

// series is what the scrapes showed of one series name.
type series struct {
	family string
	labels map[string]map[string]bool // label → values seen
}

// Add adds the series of a scrape in the text format.
func (e *Exports) Add(text string) error {
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(strings.NewReader(text))
	if err != nil {
		return fmt.Errorf("promcheck: a scrape: %w", err)
	}
	if e.series == nil {
		e.series = map[string]*series{}
	}
	for name, f := range fams {
		for _, m := range f.GetMetric() {
			switch f.GetType() {
			case dto.MetricType_HISTOGRAM:
				b := e.add(name+"_bucket", name, m)
				for _, bk := range m.GetHistogram().GetBucket() {
					b.see("le", model.FloatString(bk.GetUpperBound()).String())
				}
				b.see("le", "+Inf")
				e.add(name+"_sum", name, m)
				e.add(name+"_count", name, m)
			case dto.MetricType_SUMMARY:
				s := e.add(name, name, m)
				for _, q := range m.GetSummary().GetQuantile() {
					s.see("quantile", model.FloatString(q.GetQuantile()).String())
				}
				e.add(name+"_sum", name, m)
				e.add(name+"_count", name, m)
			default:
				e.add(name, name, m)
			}
		}
	}
	return nil
}

func (e *Exports) add(name, family string, m *dto.Metric) *series {
	s := e.series[name]
	if s == nil {
		s = &series{family: family, labels: map[string]map[string]bool{}}
		e.series[name] = s
	}
	for _, l := range m.GetLabel() {
		s.see(l.GetName(), l.GetValue())
	}
	return s
}

func (s *series) see(label, value string) {
	if s.labels[label] == nil {
		s.labels[label] = map[string]bool{}
	}
	s.labels[label][value] = true
}

// Families returns the metric families the scrapes exported, sorted.
func (e *Exports) Families() []string {
	var out []string
	for _, s := range e.series {
		if !slices.Contains(out, s.family) {
			out = append(out, s.family)
		}
	}
	slices.Sort(out)
	return out
}

// Has reports whether a scrape exported the series name.
func (e *Exports) Has(name string) bool { return e.series[name] != nil }

// Labels returns the labels the scrapes showed on the series name, sorted.
func (e *Exports) Labels(name string) []string {
	if s := e.series[name]; s != nil {
		return s.names()
	}
	return nil
}

// Check returns, one line each, what refs names that the scrapes did not
// export: a series; a matcher's label that its series never had; the
// value of an = matcher it never had, a =~ matcher's expression that
// matches none it had; a grouping label (or other, from extra: a Grafana
// legend's, say) that none of the query's series has. Labels are looked
// up on the series a query selects, not on what its aggregations keep: a
// legend naming a label that a sum by drops passes. The labels of
// TargetLabels always exist, and their values are not checked; nor is a
// value that holds a Grafana variable ($name), nor a != or !~ matcher's,
// nor an = matcher's "" (a series without the label).
func (e *Exports) Check(refs Refs, extra ...string) []string {
	var problems []string
	has := map[string]bool{}
	for _, l := range TargetLabels {
		has[l] = true
	}
	for _, sel := range refs.Selectors {
		s := e.series[sel.Metric]
		if s == nil {
			problems = append(problems, fmt.Sprintf("metric %s: no node exports it", sel.Metric))
			continue
		}
		for l := range s.labels {
			has[l] = true
		}
		for _, m := range sel.Matchers {
			if p := s.check(m); p != "" {
				problems = append(problems, fmt.Sprintf("metric %s, matcher %v: %s", sel.Metric, m, p))
			}
		}
	}
	for _, l := range append(slices.Clone(refs.Labels), extra...) {
		if !has[l] {
			problems = append(problems, fmt.Sprintf("label %s: none of the query's series has it", l))
		}
	}
	return problems
}

// check returns what is wrong with m on s, "" for nothing.
func (s *series) check(m Matcher) string {
	if slices.Contains(TargetLabels, m.Label) {
		return ""
	}
	values, ok := s.labels[m.Label]
	switch {
	case !ok:
		return fmt.Sprintf("no label %s (it has: %s)", m.Label, cmp.Or(strings.Join(s.names(), ", "), "none"))
	case strings.Contains(m.Value, "$"):
		return "" // a Grafana variable
	case m.Op == "=" && m.Value != "" && !values[m.Value]:
		return fmt.Sprintf("no series with %s=%s (seen: %s)", m.Label, strconv.Quote(m.Value), seen(values))
	case m.Op == "=~":
		re, err := regexp.Compile("^(?:" + m.Value + ")$")
		if err != nil {
			return fmt.Sprintf("bad expression: %v", err)
		}
		for v := range values {
			if re.MatchString(v) {
				return ""
			}
		}
		return fmt.Sprintf("matches none of %s", seen(values))
	}
	return ""
}

func (s *series) names() []string {
	out := make([]string, 0, len(s.labels))
	for l := range s.labels {
		out = append(out, l)
	}
	slices.Sort(out)
	return out
}

func seen(values map[string]bool) string {
	out := make([]string, 0, len(values))
	for v := range values {
		out = append(out, strconv.Quote(v))
	}
	slices.Sort(out)
	return strings.Join(out, ", ")
}
