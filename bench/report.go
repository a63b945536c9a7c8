package main

import (
	"encoding/json"
	"fmt"
	"io"
	"math"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"
)

// Summary is a run's result, printed at its end and written by --json.
// Rates and latencies cover the measurement window (after --warmup, up to
// --duration or the last of --ops); errors and the per-client grants of a
// contended run cover the whole run, drain included.
type Summary struct {
	Label    string `json:"label,omitempty"`
	Target   string `json:"target"`
	Kind     string `json:"kind"` // kunci or redis
	Mode     string `json:"mode"`
	TLS      bool   `json:"tls,omitempty"` // kunci over TLS
	Workload string `json:"workload"`
	// Acquire is what the acquires asked for: lock, shared,
	// semaphore/LIMIT or rw/READS.
	Acquire string    `json:"acquire,omitempty"`
	Conns   int       `json:"conns"`
	Depth   int       `json:"depth"`
	Slots   int       `json:"slots"` // in-flight slots: conns × depth
	Keys    int       `json:"keys"`
	LeaseMs int64     `json:"lease_ms"`
	WaitMs  int64     `json:"wait_ms"`
	Seed    uint64    `json:"seed"`
	Prefix  string    `json:"prefix"`
	Start   time.Time `json:"start"`

	WindowS      float64 `json:"window_s"`
	Cycles       int64   `json:"cycles"` // acquired and released, in the window
	CyclesPerSec float64 `json:"cycles_per_s"`
	Grants       int64   `json:"grants"`  // in the window
	Drained      int64   `json:"drained"` // cycles finished after the window
	// Latency: acquire sent → granted (for a contended key, the wait in the
	// queue; for Redis, from the first attempt, retries included).
	Latency *Percentiles     `json:"latency,omitempty"`
	Errors  map[string]int64 `json:"errors"`

	Client CPU  `json:"client_cpu"`
	Server *CPU `json:"server_cpu,omitempty"`

	Contended *ContendedStats `json:"contended,omitempty"`
	Expiry    *ExpiryStats    `json:"expiry,omitempty"`
}

// CPU is a process's CPU use over the window.
type CPU struct {
	UserS     float64 `json:"user_s"`
	SysS      float64 `json:"sys_s"`
	PctOfWall float64 `json:"pct_of_wall"` // 100 = one core busy
	UsPerOp   float64 `json:"us_per_op"`   // per cycle (expiry: per lease reclaimed)
}

// ContendedStats are the fairness and handoff figures of contended and zipf
// runs.
type ContendedStats struct {
	Clients    int     `json:"clients"` // in-flight slots
	GrantsMean float64 `json:"grants_mean"`
	GrantsMin  int64   `json:"grants_min"`
	GrantsMax  int64   `json:"grants_max"`
	MinPct     float64 `json:"min_pct"`    // (min − mean) / mean, %
	MaxPct     float64 `json:"max_pct"`    // (max − mean) / mean, %
	StdDevPct  float64 `json:"stddev_pct"` // stddev / mean, %
	// HandoffsPerSec counts grants of a key whose acquire was sent before
	// the previous holder's release; Handoff is release sent → that grant.
	HandoffsPerSec float64      `json:"handoffs_per_s"`
	Handoff        *Percentiles `json:"handoff,omitempty"`
}

func writeJSON(path string, s *Summary) error {
	b, err := json.MarshalIndent(s, "", "  ")
	if err != nil {
		return err
	}
	return os.WriteFile(path, append(b, '\n'), 0o644)
}

// writeSummary prints s for a reader.
func writeSummary(w io.Writer, s *Summary) {
	p := func(f string, a ...any) { fmt.Fprintf(w, f, a...) }
	p("%s %s %s %s: %d conns × %d", s.Kind, s.Mode, s.Workload, s.Acquire, s.Conns, s.Depth)
	if s.TLS {
		p(", TLS")
	}
	if s.Mode == modeClient {
		p(" (%d goroutines)", s.Slots)
	}
	p(", %d keys, lease %s, wait %s, seed %d\n", s.Keys, ms(s.LeaseMs), ms(s.WaitMs), s.Seed)
	if s.Expiry == nil {
		p("  cycles       %s in %.2fs = %s cycles/s (%s more drained)\n",
			fmtCount(float64(s.Cycles)), s.WindowS, fmtCount(s.CyclesPerSec), fmtCount(float64(s.Drained)))
		if s.Latency != nil {
			p("  latency      %s   (acquire sent → granted)\n", fmtPct(s.Latency))
		}
	}
	if c := s.Contended; c != nil {
		p("  grants/slot  mean %.1f, min %d (%s), max %d (%s), stddev %.1f%% over %d slots\n",
			c.GrantsMean, c.GrantsMin, signed(c.MinPct), c.GrantsMax, signed(c.MaxPct), c.StdDevPct, c.Clients)
		if c.Handoff != nil {
			p("  handoffs     %s/s; release sent → next grant %s\n", fmtCount(c.HandoffsPerSec), fmtPct(c.Handoff))
		}
	}
	if e := s.Expiry; e != nil {
		p("  leases       %d of %s held (%s acquires/s), %d reclaimed and handed on, %d not, %d early\n",
			e.Held, fmtCount(float64(e.Leases)), fmtCount(e.HeldPerSec), e.Reclaimed, e.Unreclaimed, e.Early)
		if e.Lateness != nil {
			p("  lateness     %s   (handed on − earliest deadline)\n", fmtPct(e.Lateness))
		}
	}
	keys := make([]string, 0, len(s.Errors))
	for k := range s.Errors {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	var errs []string
	for _, k := range keys {
		errs = append(errs, fmt.Sprintf("%s %d", k, s.Errors[k]))
	}
	if len(errs) == 0 {
		errs = []string{"none"}
	}
	p("  errors       %s\n", strings.Join(errs, ", "))
	p("  client CPU   %s\n", fmtCPU(s.Client))
	if s.Server != nil {
		p("  server CPU   %s\n", fmtCPU(*s.Server))
	}
}

// signed formats a percentage with its sign and one decimal, "+0.0" for
// anything that rounds to zero.
func signed(pct float64) string {
	return fmt.Sprintf("%+.1f%%", math.Round(pct*10)/10+0)
}

func fmtCPU(c CPU) string {
	return fmt.Sprintf("%.0f%% of wall (user %.2fs, sys %.2fs), %.2f µs/op", c.PctOfWall, c.UserS, c.SysS, c.UsPerOp)
}

func fmtPct(p *Percentiles) string {
	us := func(v float64) string { return fmtNs(int64(v * 1000)) }
	return fmt.Sprintf("p50 %s  p90 %s  p99 %s  p99.9 %s  max %s  (n %d)",
		us(p.P50), us(p.P90), us(p.P99), us(p.P999), us(p.Max), p.Count)
}

// fmtNs formats a duration in ns with three significant digits.
func fmtNs(ns int64) string {
	d := float64(ns)
	switch {
	case d < 1e3:
		return fmt.Sprintf("%.0fns", d)
	case d < 1e6:
		return sig3(d/1e3) + "µs"
	case d < 1e9:
		return sig3(d/1e6) + "ms"
	}
	return sig3(d/1e9) + "s"
}

func sig3(f float64) string {
	switch {
	case f < 10:
		return strconv.FormatFloat(f, 'f', 2, 64)
	case f < 100:
		return strconv.FormatFloat(f, 'f', 1, 64)
	}
	return strconv.FormatFloat(f, 'f', 0, 64)
}

// fmtCount formats a count with thousands separators.
func fmtCount(f float64) string {
	n := int64(f + 0.5)
	s := strconv.FormatInt(n, 10)
	if n < 0 {
		return s
	}
	var b []byte
	for i := range len(s) {
		if i > 0 && (len(s)-i)%3 == 0 {
			b = append(b, ',')
		}
		b = append(b, s[i])
	}
	return string(b)
}

func ms(v int64) string {
	if v == 0 {
		return "unbounded"
	}
	return (time.Duration(v) * time.Millisecond).String()
}
