package deploy_test

// The operators' Grafana dashboard (grafana/) and Prometheus alerting rules
// (prometheus/), checked against running nodes: every series and label
// their PromQL names must be one that a single node, or the active or the
// standby of a cluster, exports on /metrics (internal/promcheck says what
// that covers). With promtool on PATH, the rules and the dashboard's
// queries are parsed by Prometheus itself, and the rules' unit tests run.

import (
	"cmp"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"

	"go.yaml.in/yaml/v3"

	"github.com/kunci/kunci/internal/promcheck"
	"github.com/kunci/kunci/internal/testcert"
	"github.com/kunci/kunci/internal/testhttp"
	"github.com/kunci/kunci/internal/testnode"
	"github.com/kunci/kunci/server"
)

const (
	dashboardFile  = "grafana/kunci-dashboard.json"
	rulesFile      = "prometheus/kunci-alerts.yml"
	rulesTestFile  = "prometheus/kunci-alerts.test.yml"
	operationsFile = "../docs/operations.md"
	// runbookURL is where every alert's runbook_url points, followed by
	// its section's anchor.
	runbookURL = "https://github.com/kunci/kunci/blob/main/docs/operations.md#"
	// datasource is how every panel and variable names its data source:
	// the dashboard's variable, which an import sets from DS_PROMETHEUS.
	datasource = "${datasource}"
)

// wantAlerts are the conditions operators asked to be alerted on (issue
// 37), each an alert of the rules.
var wantAlerts = []string{
	"KunciNoActive", "KunciTwoActives", "KunciClusterKeyMismatch", "KunciStandbyBehind",
	"KunciStandbyUnlinked", "KunciStorageUnavailable", "KunciTokenCeilingNearEnd",
	"KunciBufferBudgetPressure", "KunciClientsShed", "KunciAuthFailureBurst", "KunciNodeRestarted",
}

// query is a PromQL expression of the dashboard or the rules.
type query struct {
	where string   // "panel \"Wait time\" A", "alert KunciNoActive"
	expr  string   // as written, Grafana variables included
	extra []string // labels it names outside the expression: its legend's, a variable's
}

func TestMonitoringQueriesNameExportedSeries(t *testing.T) {
	t.Parallel()
	queries := append(dashboardQueries(t), ruleQueries(t)...)
	exports := scrapeNodes(t)
	checked := 0
	for _, q := range queries {
		refs, err := promcheck.Parse(q.expr)
		if err != nil {
			t.Errorf("%s: %v\n\t%s", q.where, err, q.expr)
			continue
		}
		if len(refs.Selectors) == 0 {
			t.Errorf("%s names no series\n\t%s", q.where, q.expr)
		}
		for _, p := range exports.Check(refs, q.extra...) {
			t.Errorf("%s: %s\n\t%s", q.where, p, q.expr)
		}
		checked += len(refs.Selectors)
	}
	t.Logf("%d queries, %d series selectors checked against three nodes' /metrics", len(queries), checked)

	// The metrics table of docs/operations.md names every metric of kunci's own.
	doc, err := os.ReadFile(operationsFile)
	if err != nil {
		t.Fatal(err)
	}
	var table strings.Builder
	for line := range strings.Lines(string(doc)) {
		if strings.HasPrefix(line, "| `kunci_") {
			table.WriteString(line)
		}
	}
	for _, f := range exports.Families() {
		if strings.HasPrefix(f, "kunci_") && !strings.Contains(table.String(), "`"+f) {
			t.Errorf("%s: %s is exported but not in its metrics table", operationsFile, f)
		}
	}
}

// scrapeNodes starts a single node serving TLS beside TCP, with a data
// directory, and a cluster of two, and returns what their admin endpoints
// export: the single node's, the active's and the standby's /metrics.
func scrapeNodes(t *testing.T) *promcheck.Exports {
	t.Helper()
	dir := t.TempDir()
	ca := testcert.NewCA(t, "kunci test CA")
	certFile, keyFile := ca.Issue(t, "node", testcert.Options{}).Write(t, dir, "node")
	single := testnode.Start(t, server.Config{
		Admin:       "127.0.0.1:0",
		DataDir:     filepath.Join(dir, "data"),
		TLSListen:   "127.0.0.1:0",
		TLSCert:     certFile,
		TLSKey:      keyFile,
		TLSClientCA: ca.Write(t, dir, "ca"),
	})

	tc := testnode.NewCluster(t, 2, func(_ int, c *server.Config) { c.Admin = "127.0.0.1:0" })
	t.Cleanup(func() { // the standby first: the active then stops without a handoff
		if tc.Nodes[1] != nil {
			tc.Stop(1)
		}
	})
	tc.StartAll()
	tc.WaitActive(0)

	// The roles may change again (a loaded machine's node rejoins after
	// a stall): the scrapes that count are of an active streaming to its
	// synced standby.
	var bodies [3]string
	testnode.WaitFor(t, "the active's /metrics showing its standby synced, the standby's its role", func() bool {
		for i, n := range []*server.Node{single, tc.Nodes[0], tc.Nodes[1]} {
			bodies[i] = scrape(t, n)
		}
		return strings.Contains(bodies[1], `kunci_role{role="active"} 1`) &&
			strings.Contains(bodies[1], `kunci_replication_synced{standby="`+tc.Addrs[1]+`"} 1`) &&
			strings.Contains(bodies[2], `kunci_role{role="standby"} 1`)
	})
	var e promcheck.Exports
	for _, body := range bodies {
		if err := e.Add(body); err != nil {
			t.Fatal(err)
		}
	}
	return &e
}

// scrape returns n's /metrics.
func scrape(t *testing.T, n *server.Node) string {
	t.Helper()
	code, body := testhttp.Get(t, "http://"+n.AdminAddr()+"/metrics")
	if code != 200 {
		t.Fatalf("%s /metrics: %d %s", n.AdminAddr(), code, body)
	}
	return body
}

// dashboard is what the test reads of the dashboard's JSON.
type dashboard struct {
	UID           string  `json:"uid"`
	Title         string  `json:"title"`
	SchemaVersion int     `json:"schemaVersion"`
	Panels        []panel `json:"panels"`
	Inputs        []struct {
		Name, Type, PluginID string
	} `json:"__inputs"`
	Templating struct {
		List []struct {
			Name       string          `json:"name"`
			Type       string          `json:"type"`
			Query      json.RawMessage `json:"query"`
			Datasource *dsRef          `json:"datasource"`
			Current    struct {
				Value any `json:"value"`
			} `json:"current"`
		} `json:"list"`
	} `json:"templating"`
}

type panel struct {
	ID         int     `json:"id"`
	Type       string  `json:"type"`
	Title      string  `json:"title"`
	Datasource *dsRef  `json:"datasource"`
	Panels     []panel `json:"panels"` // a collapsed row's
	GridPos    struct {
		H, W, X, Y int
	} `json:"gridPos"`
	Targets []struct {
		RefID        string `json:"refId"`
		Expr         string `json:"expr"`
		LegendFormat string `json:"legendFormat"`
		Datasource   *dsRef `json:"datasource"`
	} `json:"targets"`
}

type dsRef struct {
	Type string `json:"type"`
	UID  string `json:"uid"`
}

func (d *dsRef) String() string {
	if d == nil {
		return "none"
	}
	return d.Type + "/" + d.UID
}

// legendLabels are the labels a legend format names: {{label}}.
var legendLabels = regexp.MustCompile(`\{\{\s*([a-zA-Z_]\w*)\s*\}\}`)

// labelValues is a query variable's Grafana query: label_values(selector, label).
var labelValues = regexp.MustCompile(`^label_values\((.+),\s*([a-zA-Z_]\w*)\)$`)

// dashboardQueries reads the dashboard, checks that it is a Grafana
// dashboard that imports as is, and returns its panels' and variables'
// queries.
func dashboardQueries(t *testing.T) []query {
	t.Helper()
	b, err := os.ReadFile(dashboardFile)
	if err != nil {
		t.Fatal(err)
	}
	var d dashboard
	if err := json.Unmarshal(b, &d); err != nil {
		t.Fatalf("%s: %v", dashboardFile, err)
	}
	if d.UID == "" || d.Title == "" || d.SchemaVersion == 0 {
		t.Errorf("%s: uid %q, title %q, schemaVersion %d: a dashboard has all three", dashboardFile, d.UID, d.Title, d.SchemaVersion)
	}
	if !slices.ContainsFunc(d.Inputs, func(in struct{ Name, Type, PluginID string }) bool {
		return in.Name == "DS_PROMETHEUS" && in.Type == "datasource" && in.PluginID == "prometheus"
	}) {
		t.Errorf("%s: no __inputs DS_PROMETHEUS, a prometheus data source, for the import to ask for: %+v", dashboardFile, d.Inputs)
	}

	var qs []query
	vars := map[string]bool{}
	for _, v := range d.Templating.List {
		vars[v.Name] = true
		switch v.Type {
		case "datasource":
			var q string
			if err := json.Unmarshal(v.Query, &q); err != nil || q != "prometheus" || v.Current.Value != "${DS_PROMETHEUS}" {
				t.Errorf("variable %s: query %s, current %v; want prometheus, ${DS_PROMETHEUS}", v.Name, v.Query, v.Current.Value)
			}
		case "query":
			if v.Datasource.String() != "prometheus/"+datasource {
				t.Errorf("variable %s: data source %v, want prometheus/%s", v.Name, v.Datasource, datasource)
			}
			var q string
			if err := json.Unmarshal(v.Query, &q); err != nil {
				t.Errorf("variable %s: query %s is not a string: %v", v.Name, v.Query, err)
				continue
			}
			m := labelValues.FindStringSubmatch(q)
			if m == nil {
				t.Errorf("variable %s: query %q is not label_values(selector, label)", v.Name, q)
				continue
			}
			qs = append(qs, query{where: "variable " + v.Name, expr: m[1], extra: []string{m[2]}})
		}
	}
	for _, name := range []string{"datasource", "job", "instance"} {
		if !vars[name] {
			t.Errorf("%s: no variable %s", dashboardFile, name)
		}
	}

	ids := map[int]string{}
	var walk func([]panel)
	walk = func(ps []panel) {
		for _, p := range ps {
			if other, ok := ids[p.ID]; ok || p.ID == 0 {
				t.Errorf("panel %q: id %d, also %q's", p.Title, p.ID, other)
			}
			ids[p.ID] = p.Title
			if g := p.GridPos; g.W <= 0 || g.H <= 0 || g.X < 0 || g.X+g.W > 24 {
				t.Errorf("panel %q: gridPos %+v is off the 24 columns", p.Title, g)
			}
			if p.Type == "row" {
				walk(p.Panels)
				continue
			}
			if p.Datasource.String() != "prometheus/"+datasource {
				t.Errorf("panel %q: data source %v, want prometheus/%s", p.Title, p.Datasource, datasource)
			}
			if len(p.Targets) == 0 {
				t.Errorf("panel %q has no query", p.Title)
			}
			for _, tg := range p.Targets {
				where := fmt.Sprintf("panel %q %s", p.Title, tg.RefID)
				if tg.Datasource.String() != "prometheus/"+datasource {
					t.Errorf("%s: data source %v, want prometheus/%s", where, tg.Datasource, datasource)
				}
				var legend []string
				for _, m := range legendLabels.FindAllStringSubmatch(tg.LegendFormat, -1) {
					legend = append(legend, m[1])
				}
				qs = append(qs, query{where: where, expr: tg.Expr, extra: legend})
			}
		}
	}
	walk(d.Panels)
	return qs
}

// rules is what the test reads of a Prometheus rules file.
type rules struct {
	Groups []struct {
		Name  string `yaml:"name"`
		Rules []struct {
			Alert       string            `yaml:"alert"`
			Record      string            `yaml:"record"`
			Expr        string            `yaml:"expr"`
			Labels      map[string]string `yaml:"labels"`
			Annotations map[string]string `yaml:"annotations"`
		} `yaml:"rules"`
	} `yaml:"groups"`
}

// ruleQueries reads the alerting rules, checks that each alert has a
// severity and a runbook_url pointing at its own section of
// docs/operations.md (and each section there an alert), and returns
// their expressions.
func ruleQueries(t *testing.T) []query {
	t.Helper()
	b, err := os.ReadFile(rulesFile)
	if err != nil {
		t.Fatal(err)
	}
	var rs rules
	if err := yaml.Unmarshal(b, &rs); err != nil {
		t.Fatalf("%s: %v", rulesFile, err)
	}
	sections := runbookSections(t)
	var qs []query
	alerts, anchors := map[string]bool{}, map[string]bool{}
	for _, g := range rs.Groups {
		for _, r := range g.Rules {
			name := cmp.Or(r.Alert, r.Record)
			qs = append(qs, query{where: "rule " + name, expr: r.Expr})
			if r.Alert == "" {
				continue
			}
			alerts[r.Alert] = true
			if r.Labels["severity"] == "" {
				t.Errorf("alert %s has no severity label", r.Alert)
			}
			anchor := strings.ToLower(r.Alert)
			anchors[anchor] = true
			if url := r.Annotations["runbook_url"]; url != runbookURL+anchor {
				t.Errorf("alert %s: runbook_url %q, want %s%s", r.Alert, url, runbookURL, anchor)
			}
			if !sections[anchor] {
				t.Errorf("alert %s: %s has no section %q (### %s) for its runbook", r.Alert, operationsFile, anchor, r.Alert)
			}
		}
	}
	for _, a := range wantAlerts {
		if !alerts[a] {
			t.Errorf("%s has no alert %s", rulesFile, a)
		}
	}
	for s := range sections {
		if !anchors[s] {
			t.Errorf("%s has a runbook section %q for no alert of %s", operationsFile, s, rulesFile)
		}
	}
	return qs
}

// runbookSections returns the anchors (GitHub's) of the ### sections of
// docs/operations.md's "## Alerts".
func runbookSections(t *testing.T) map[string]bool {
	t.Helper()
	b, err := os.ReadFile(operationsFile)
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]bool{}
	in := false
	for line := range strings.Lines(string(b)) {
		line = strings.TrimSpace(line)
		switch {
		case strings.HasPrefix(line, "## "):
			in = line == "## Alerts"
		case in && strings.HasPrefix(line, "### "):
			out[anchor(strings.TrimPrefix(line, "### "))] = true
		}
	}
	if len(out) == 0 {
		t.Fatalf("%s has no ## Alerts with ### sections", operationsFile)
	}
	return out
}

// anchor is GitHub's anchor of a heading: lower case, punctuation dropped,
// spaces to hyphens.
func anchor(heading string) string {
	var b strings.Builder
	for _, r := range strings.ToLower(heading) {
		switch {
		case r >= 'a' && r <= 'z', r >= '0' && r <= '9', r == '-', r == '_':
			b.WriteRune(r)
		case r == ' ':
			b.WriteByte('-')
		}
	}
	return b.String()
}

// grafanaVars are the values promtool is given for the dashboard's
// variables: Grafana's intervals, and a match-all for the others (all of
// them in label matchers' strings).
var grafanaVars = map[string]string{"__rate_interval": "5m", "__interval": "1m", "__range": "1h"}

var grafanaVar = regexp.MustCompile(`\$\{?(\w+)\}?`)

// TestMonitoringPromtool has promtool check the rules and run their unit
// tests, and parse the dashboard's queries, given as recording rules. It
// is skipped, saying so, without promtool (Debian's prometheus package;
// make test-go installs it when it can).
func TestMonitoringPromtool(t *testing.T) {
	t.Parallel()
	promtool, err := exec.LookPath("promtool")
	if err != nil {
		t.Skip("promtool is not on PATH: the rules, their unit tests and the dashboard's queries were not checked by Prometheus's own parser " +
			"(Debian/Ubuntu: apt-get install prometheus; make test-go installs it when run as root)")
	}
	run := func(args ...string) (string, bool) {
		t.Helper()
		out, err := exec.Command(promtool, args...).CombinedOutput()
		if err != nil {
			t.Errorf("promtool %s: %v\n%s", strings.Join(args, " "), err, out)
			return string(out), false
		}
		t.Logf("promtool %s:\n%s", strings.Join(args, " "), out)
		return string(out), true
	}
	run("check", "rules", rulesFile)
	run("test", "rules", rulesTestFile)

	type rule struct {
		Record string `yaml:"record"`
		Expr   string `yaml:"expr"`
	}
	queries := dashboardQueries(t)
	var recorded []rule
	for i, q := range queries {
		expr := grafanaVar.ReplaceAllStringFunc(q.expr, func(v string) string {
			return cmp.Or(grafanaVars[grafanaVar.FindStringSubmatch(v)[1]], ".*")
		})
		recorded = append(recorded, rule{Record: fmt.Sprintf("kunci_dashboard:query_%d", i), Expr: expr})
	}
	b, err := yaml.Marshal(map[string]any{"groups": []map[string]any{{"name": "dashboard", "rules": recorded}}})
	if err != nil {
		t.Fatal(err)
	}
	f := filepath.Join(t.TempDir(), "dashboard-queries.yml")
	if err := os.WriteFile(f, b, 0o600); err != nil {
		t.Fatal(err)
	}
	if out, ok := run("check", "rules", f); !ok {
		// Name the panels of the rules promtool refused.
		for _, m := range recordName.FindAllStringSubmatch(out, -1) {
			i, _ := strconv.Atoi(m[1])
			t.Errorf("%s is the dashboard's %s:\n\t%s", m[0], queries[i].where, queries[i].expr)
		}
	}
}

// recordName is the name of a dashboard query given to promtool.
var recordName = regexp.MustCompile(`kunci_dashboard:query_(\d+)`)
