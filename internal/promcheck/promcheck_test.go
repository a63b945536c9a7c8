package promcheck

import (
	"errors"
	"reflect"
	"strings"
	"testing"
)

func TestParse(t *testing.T) {
	for _, tc := range []struct {
		expr   string
		want   []Selector
		labels []string
	}{
		{expr: "kunci_keys_held", want: []Selector{{Metric: "kunci_keys_held"}}},
		{
			expr: `sum by (reason) (rate(kunci_errors_total{instance=~"$instance", reason!="bad key"}[$__rate_interval]))`,
			want: []Selector{{Metric: "kunci_errors_total", Matchers: []Matcher{
				{"instance", "=~", "$instance"}, {"reason", "!=", "bad key"},
			}}},
			labels: []string{"reason"},
		},
		{
			expr:   `histogram_quantile(0.99, sum without (instance) (rate(kunci_wait_seconds_bucket[5m]))) > 0.5`,
			want:   []Selector{{Metric: "kunci_wait_seconds_bucket"}},
			labels: []string{"instance"},
		},
		{
			// Keywords in any case; on, group_left; bool; offset and @.
			expr: `kunci_a - ON(job) GROUP_LEFT(kind) kunci_b offset 5m > bool 1 or kunci_c @ start() unless kunci_d[1h:1m]`,
			want: []Selector{
				{Metric: "kunci_a"}, {Metric: "kunci_b"}, {Metric: "kunci_c"}, {Metric: "kunci_d"},
			},
			labels: []string{"job", "kind"},
		},
		{
			expr: `SUM(kunci_x) BY (role) # a comment naming no_metric
			  / count(kunci_y{__name__="ignored", 'q'="a\"b"})`,
			want: []Selector{
				{Metric: "kunci_x"}, {Metric: "kunci_y", Matchers: []Matcher{{"__name__", "=", "ignored"}, {"q", "=", `a"b`}}},
			},
			labels: []string{"role"},
		},
		{
			expr: `{__name__="kunci_z", kind="lock"} * 1e-3 + 0x10`,
			want: []Selector{{Metric: "kunci_z", Matchers: []Matcher{{"kind", "=", "lock"}}}},
		},
		{expr: `group_left`, want: nil}, // a keyword, no series
	} {
		got, err := Parse(tc.expr)
		if err != nil {
			t.Errorf("Parse(%q): %v", tc.expr, err)
			continue
		}
		if !reflect.DeepEqual(got.Selectors, tc.want) || !reflect.DeepEqual(got.Labels, tc.labels) {
			t.Errorf("Parse(%q) = %+v, want selectors %+v and labels %q", tc.expr, got, tc.want, tc.labels)
		}
	}
}

func TestParseRefuses(t *testing.T) {
	for expr, want := range map[string]string{
		`rat(kunci_grants_total[5m])`:                          "unknown function rat",
		`label_replace(kunci_role, "r", "$1", "role", "(.*)")`: "names labels in strings",
		`count_values("v", kunci_role)`:                        "names labels in strings",
		`kunci_role{role="active"`:                             "not closed",
		`kunci_role{role}`:                                     "is not label op",
		`{role="active"}`:                                      "without a series name",
		`kunci_role{role="active}`:                             "unterminated string",
		`sum by (role kunci_role`:                              "not closed",
		`kunci_role ; 1`:                                       "unexpected",
	} {
		_, err := Parse(expr)
		if !errors.Is(err, ErrQuery) || !strings.Contains(err.Error(), want) {
			t.Errorf("Parse(%q) = %v, want an error saying %q", expr, err, want)
		}
	}
}

const scrape = `# HELP kunci_role 1 for this node's role.
# TYPE kunci_role gauge
kunci_role{role="active"} 1
# TYPE kunci_errors_total counter
kunci_errors_total{reason="bad key"} 0
kunci_errors_total{reason="bad lease"} 2
# TYPE kunci_keys_held gauge
kunci_keys_held 3
# TYPE kunci_wait_seconds histogram
kunci_wait_seconds_bucket{le="0.001"} 1
kunci_wait_seconds_bucket{le="+Inf"} 2
kunci_wait_seconds_sum 0.5
kunci_wait_seconds_count 2
# TYPE go_gc_duration_seconds summary
go_gc_duration_seconds{quantile="0.5"} 0.001
go_gc_duration_seconds_sum 0.01
go_gc_duration_seconds_count 4
`

// standby is a second scrape: values of a label add up over scrapes.
const standby = `# TYPE kunci_role gauge
kunci_role{role="standby"} 1
`

func TestCheck(t *testing.T) {
	var e Exports
	for _, s := range []string{scrape, standby} {
		if err := e.Add(s); err != nil {
			t.Fatal(err)
		}
	}
	for expr, want := range map[string][]string{
		`sum by (role) (kunci_role{role="active"}) + on(instance, job) kunci_role{role="standby"}`: nil,
		`kunci_role{role=~"act.*|x"}`:                                        nil,
		`kunci_role{role=~"leader"}`:                                         {`metric kunci_role, matcher role=~"leader": matches none of "active", "standby"`},
		`kunci_role{role="leader"}`:                                          {`metric kunci_role, matcher role="leader": no series with role="leader" (seen: "active", "standby")`},
		`kunci_role{role!="leader", role=~"$role", role=""}`:                 nil,
		`kunci_role{state="x"}`:                                              {`metric kunci_role, matcher state="x": no label state (it has: role)`},
		`kunci_keys_held{job="kunci", instance=~"$i"}`:                       nil,
		`sum by (reason) (rate(kunci_errors_total{reason="bad lease"}[5m]))`: nil,
		`sum by (reasons) (rate(kunci_errors_total[5m]))`:                    {"label reasons: none of the query's series has it"},
		`kunci_keys_hold`:                                                    {"metric kunci_keys_hold: no node exports it"},
		`kunci_wait_seconds`:                                                 {"metric kunci_wait_seconds: no node exports it"}, // a histogram is its _bucket, _sum, _count
		`histogram_quantile(0.9, sum by (le) (rate(kunci_wait_seconds_bucket{le!="+Inf"}[5m])))`: nil,
		`rate(kunci_wait_seconds_sum[5m]) / rate(kunci_wait_seconds_count{le="1"}[5m])`:          {`metric kunci_wait_seconds_count, matcher le="1": no label le (it has: none)`},
		`go_gc_duration_seconds{quantile="0.5"} + go_gc_duration_seconds_count`:                  nil,
	} {
		refs, err := Parse(expr)
		if err != nil {
			t.Fatalf("Parse(%q): %v", expr, err)
		}
		if got := e.Check(refs); !reflect.DeepEqual(got, want) {
			t.Errorf("Check(%q) = %q, want %q", expr, got, want)
		}
	}
	// A legend's labels, checked as grouping labels.
	refs, _ := Parse(`kunci_role`)
	if got := e.Check(refs, "role", "job", "node"); !reflect.DeepEqual(got, []string{"label node: none of the query's series has it"}) {
		t.Errorf("legend labels: %q", got)
	}
	if got, want := e.Families(), []string{"go_gc_duration_seconds", "kunci_errors_total", "kunci_keys_held", "kunci_role", "kunci_wait_seconds"}; !reflect.DeepEqual(got, want) {
		t.Errorf("Families() = %q, want %q", got, want)
	}
	if !e.Has("kunci_wait_seconds_bucket") || !reflect.DeepEqual(e.Labels("kunci_wait_seconds_bucket"), []string{"le"}) {
		t.Errorf("kunci_wait_seconds_bucket: %v %q", e.Has("kunci_wait_seconds_bucket"), e.Labels("kunci_wait_seconds_bucket"))
	}
}
