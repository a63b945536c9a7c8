package main

import (
	"encoding/json"
	"fmt"
	"io"
	"math"
	"os"
	"slices"
	"strings"
)

// tableCmd prints the comparison of --json summaries: one row per case
// (label), medians over its runs with min–max, kunci beside Redis.
func tableCmd(files []string, stdout, stderr io.Writer) int {
	if len(files) == 0 {
		fmt.Fprintln(stderr, "usage: bench table FILE.json...")
		return 2
	}
	var all []*Summary
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			fmt.Fprintf(stderr, "bench: %v\n", err)
			return 1
		}
		s := new(Summary)
		if err := json.Unmarshal(b, s); err != nil {
			fmt.Fprintf(stderr, "bench: %s: %v\n", f, err)
			return 1
		}
		all = append(all, s)
	}
	writeTable(stdout, all)
	return 0
}

// caseRuns are one case's runs, by target kind.
type caseRuns struct {
	label        string
	workload     string
	kunci, redis []*Summary
}

func groupCases(all []*Summary) []*caseRuns {
	var cases []*caseRuns
	byLabel := map[string]*caseRuns{}
	for _, s := range all {
		label := s.Label
		if label == "" {
			label = fmt.Sprintf("%s %s %d×%d", s.Workload, s.Mode, s.Conns, s.Depth)
		}
		c := byLabel[label]
		if c == nil {
			c = &caseRuns{label: label, workload: s.Workload}
			byLabel[label] = c
			cases = append(cases, c)
		}
		if s.Kind == targetRedis {
			c.redis = append(c.redis, s)
		} else {
			c.kunci = append(c.kunci, s)
		}
	}
	return cases
}

// stat is the median and range of one figure over runs.
type stat struct {
	med, lo, hi float64
	n           int
}

func statOf(runs []*Summary, f func(*Summary) (float64, bool)) stat {
	var v []float64
	for _, s := range runs {
		if x, ok := f(s); ok {
			v = append(v, x)
		}
	}
	if len(v) == 0 {
		return stat{}
	}
	slices.Sort(v)
	m := v[len(v)/2]
	if len(v)%2 == 0 {
		m = (v[len(v)/2-1] + v[len(v)/2]) / 2
	}
	return stat{med: m, lo: v[0], hi: v[len(v)-1], n: len(v)}
}

func (s stat) count() string {
	if s.n == 0 {
		return "–"
	}
	if s.n == 1 {
		return fmtCount(s.med)
	}
	return fmt.Sprintf("%s (%s–%s)", fmtCount(s.med), fmtCount(s.lo), fmtCount(s.hi))
}

func (s stat) us() string {
	if s.n == 0 {
		return "–"
	}
	d := func(v float64) string { return fmtNs(int64(v * 1000)) }
	if s.n == 1 {
		return d(s.med)
	}
	return fmt.Sprintf("%s (%s–%s)", d(s.med), d(s.lo), d(s.hi))
}

func ratio(a, b stat) string {
	if a.n == 0 || b.n == 0 || b.med == 0 {
		return "–"
	}
	return fmt.Sprintf("%.2f", a.med/b.med)
}

func latP(p func(*Percentiles) float64) func(*Summary) (float64, bool) {
	return func(s *Summary) (float64, bool) {
		l := s.Latency
		if s.Expiry != nil {
			l = s.Expiry.Lateness
		}
		if l == nil {
			return 0, false
		}
		return p(l), true
	}
}

func rate(s *Summary) (float64, bool) {
	if s.Expiry != nil {
		return s.Expiry.HeldPerSec, true
	}
	return s.CyclesPerSec, true
}

func cpuPct(server bool) func(*Summary) (float64, bool) {
	return func(s *Summary) (float64, bool) {
		if server {
			if s.Server == nil {
				return 0, false
			}
			return s.Server.PctOfWall, true
		}
		return s.Client.PctOfWall, true
	}
}

func pctStat(s stat) string {
	if s.n == 0 {
		return "–"
	}
	return fmt.Sprintf("%.0f%%", s.med)
}

func writeTable(w io.Writer, all []*Summary) {
	cases := groupCases(all)
	p := func(f string, a ...any) { fmt.Fprintf(w, f, a...) }
	p("| case | runs | kunci cycles/s | Redis cycles/s | kunci/Redis | kunci p50 | Redis p50 | kunci p99 | Redis p99 | p99 kunci/Redis | CPU client+server, kunci | Redis |\n")
	p("|---|---|---|---|---|---|---|---|---|---|---|---|\n")
	for _, c := range cases {
		kr, rr := statOf(c.kunci, rate), statOf(c.redis, rate)
		p50 := latP(func(p *Percentiles) float64 { return p.P50 })
		p99 := latP(func(p *Percentiles) float64 { return p.P99 })
		k50, r50 := statOf(c.kunci, p50), statOf(c.redis, p50)
		k99, r99 := statOf(c.kunci, p99), statOf(c.redis, p99)
		cpu := func(runs []*Summary) string {
			return pctStat(statOf(runs, cpuPct(false))) + " + " + pctStat(statOf(runs, cpuPct(true)))
		}
		p("| %s | %d+%d | %s | %s | **%s** | %s | %s | %s | %s | **%s** | %s | %s |\n", c.label,
			len(c.kunci), len(c.redis), kr.count(), rr.count(), ratio(kr, rr),
			k50.us(), r50.us(), k99.us(), r99.us(), ratio(k99, r99), cpu(c.kunci), cpu(c.redis))
	}
	var notes []string
	for _, c := range cases {
		switch c.workload {
		case workContended:
			notes = append(notes, fmt.Sprintf("- %s: grants per client vs the mean (median run): kunci %s; Redis %s. Release sent → next grant: kunci %s; Redis %s.",
				c.label, spread(c.kunci), spread(c.redis), handoffP(c.kunci), handoffP(c.redis)))
		case workExpiry:
			notes = append(notes, fmt.Sprintf("- %s (cycles/s = holder acquires/s; p50/p99 = lateness after the deadline): kunci %s; Redis %s.",
				c.label, expiryNote(c.kunci), expiryNote(c.redis)))
		}
	}
	if n := clientNote(cases); n != "" {
		notes = append(notes, n)
	}
	if len(notes) > 0 {
		p("\n%s\n", strings.Join(notes, "\n"))
	}
}

// clientNote compares kunci through clientlib with kunci over the raw
// protocol on as many connections: what a Go service gets of what the node
// can do. It is empty when the runs hold no such pair.
func clientNote(cases []*caseRuns) string {
	find := func(mode string, conns int, depth int) *caseRuns {
		for _, c := range cases {
			if len(c.kunci) == 0 || c.workload != workUncontended {
				continue
			}
			s := c.kunci[0]
			if s.Mode == mode && s.Conns == conns && (depth == 0 || s.Depth == depth) {
				return c
			}
		}
		return nil
	}
	cl := find(modeClient, 8, 0)
	if cl == nil {
		return ""
	}
	raw := find(modeRaw, cl.kunci[0].Conns, 16)
	if raw == nil {
		return ""
	}
	c, r := statOf(cl.kunci, rate), statOf(raw.kunci, rate)
	if r.med == 0 {
		return ""
	}
	return fmt.Sprintf("- kunci through clientlib (%s) against the raw protocol (%s): %.0f %% of its cycles/s (medians; the client runs span %.0f–%.0f %% of the raw median).",
		cl.label, raw.label, 100*c.med/r.med, 100*c.lo/r.med, 100*c.hi/r.med)
}

// median returns the run with the median cycles/s.
func median(runs []*Summary) *Summary {
	if len(runs) == 0 {
		return nil
	}
	r := slices.Clone(runs)
	slices.SortFunc(r, func(a, b *Summary) int {
		x, _ := rate(a)
		y, _ := rate(b)
		return int(math.Copysign(1, x-y))
	})
	return r[len(r)/2]
}

func spread(runs []*Summary) string {
	if len(runs) == 0 {
		return "–"
	}
	worst := 0.0
	for _, s := range runs {
		if c := s.Contended; c != nil {
			worst = max(worst, math.Abs(c.MinPct), math.Abs(c.MaxPct))
		}
	}
	s := median(runs)
	c := s.Contended
	if c == nil {
		return "–"
	}
	return fmt.Sprintf("%s…%s, stddev %.1f%% over %d clients (worst run ±%.1f%%), %s handoffs/s",
		signed(c.MinPct), signed(c.MaxPct), c.StdDevPct, c.Clients, worst, fmtCount(c.HandoffsPerSec))
}

func handoffP(runs []*Summary) string {
	st := statOf(runs, func(s *Summary) (float64, bool) {
		if s.Contended == nil || s.Contended.Handoff == nil {
			return 0, false
		}
		return s.Contended.Handoff.P50, true
	})
	st99 := statOf(runs, func(s *Summary) (float64, bool) {
		if s.Contended == nil || s.Contended.Handoff == nil {
			return 0, false
		}
		return s.Contended.Handoff.P99, true
	})
	if st.n == 0 {
		return "–"
	}
	return fmt.Sprintf("p50 %s, p99 %s", fmtNs(int64(st.med*1000)), fmtNs(int64(st99.med*1000)))
}

func expiryNote(runs []*Summary) string {
	if len(runs) == 0 {
		return "–"
	}
	var leases, worstUnreclaimed, early int64
	worstMax := 0.0
	for _, s := range runs {
		e := s.Expiry
		if e == nil {
			continue
		}
		leases = int64(e.Leases)
		worstUnreclaimed = max(worstUnreclaimed, e.Unreclaimed+int64(e.Leases)-e.Held)
		early += e.Early
		if e.Lateness != nil {
			worstMax = max(worstMax, e.Lateness.Max)
		}
	}
	return fmt.Sprintf("%s leases per run, at most %d not reclaimed in a run, %d early in all, worst lateness %s",
		fmtCount(float64(leases)), worstUnreclaimed, early, fmtNs(int64(worstMax*1000)))
}
