package promcheck

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
)

// Matcher is a label matcher of a series selector: Label Op "Value", Op
// one of =, !=, =~, !~.
type Matcher struct {
	Label, Op, Value string
}

func (m Matcher) String() string { return m.Label + m.Op + strconv.Quote(m.Value) }

// Selector is a series selector: a series name and its matchers (a
// __name__ matcher with = gives the name).
type Selector struct {
	Metric   string
	Matchers []Matcher
}

// Refs is what a query names.
type Refs struct {
	Selectors []Selector
	// Labels are the labels named by by, without, on, ignoring,
	// group_left and group_right, in order, repeats included.
	Labels []string
}

// ErrQuery is what Parse's errors wrap.
var ErrQuery = errors.New("promcheck: query")

// functions are PromQL's functions (Prometheus 2 and 3), and start and
// end of the @ modifier: an identifier followed by "(" must be one of
// them or an aggregation.
var functions = setOf(
	"abs", "absent", "absent_over_time", "acos", "acosh", "asin", "asinh", "atan", "atanh",
	"avg_over_time", "ceil", "changes", "clamp", "clamp_max", "clamp_min", "cos", "cosh",
	"count_over_time", "day_of_month", "day_of_week", "day_of_year", "days_in_month", "deg",
	"delta", "deriv", "double_exponential_smoothing", "exp", "floor", "histogram_avg",
	"histogram_count", "histogram_fraction", "histogram_quantile", "histogram_stddev",
	"histogram_stdvar", "histogram_sum", "holt_winters", "hour", "idelta", "increase", "irate",
	"last_over_time", "ln", "log10", "log2", "mad_over_time", "max_over_time", "min_over_time",
	"minute", "month", "pi", "predict_linear", "present_over_time", "quantile_over_time", "rad",
	"rate", "resets", "round", "scalar", "sgn", "sin", "sinh", "sort", "sort_desc", "sqrt",
	"stddev_over_time", "stdvar_over_time", "sum_over_time", "tan", "tanh", "time", "timestamp",
	"vector", "year", "start", "end",
)

// aggregations are PromQL's aggregation operators; count_values, whose
// first argument names a label, is refused with the label functions.
var aggregations = setOf(
	"sum", "min", "max", "avg", "group", "stddev", "stdvar", "count", "bottomk", "topk",
	"quantile", "limitk", "limit_ratio",
)

// labelsAsStrings are the functions whose string arguments name labels:
// Parse does not follow them.
var labelsAsStrings = setOf("label_replace", "label_join", "sort_by_label", "sort_by_label_desc", "count_values", "info")

// grouping are the keywords followed by a list of label names.
var grouping = setOf("by", "without", "on", "ignoring", "group_left", "group_right")

// matchOps are the operators of label matchers.
var matchOps = setOf("=", "!=", "=~", "!~")

// keywords are the other identifiers that name no series.
var keywords = setOf("and", "or", "unless", "bool", "offset", "atan2", "inf", "nan")

func setOf(names ...string) map[string]bool {
	m := make(map[string]bool, len(names))
	for _, n := range names {
		m[n] = true
	}
	return m
}

// Parse returns the series selectors and grouping labels of the PromQL
// expression expr. See the package comment for what it does not check.
func Parse(expr string) (Refs, error) {
	toks, err := lex(expr)
	if err != nil {
		return Refs{}, err
	}
	p := parser{toks: toks}
	if err := p.walk(); err != nil {
		return Refs{}, err
	}
	return p.refs, nil
}

type tokenKind int

const (
	tIdent tokenKind = iota
	tString
	tNumber // numbers, durations and Grafana variables
	tPunct  // brackets, commas and operators
)

type token struct {
	kind tokenKind
	text string // a string's value, unquoted
}

// lex splits expr into tokens, dropping blanks and # comments.
func lex(expr string) ([]token, error) {
	var toks []token
	for i := 0; i < len(expr); {
		c := expr[i]
		switch {
		case c == ' ' || c == '\t' || c == '\n' || c == '\r':
			i++
		case c == '#':
			for i < len(expr) && expr[i] != '\n' {
				i++
			}
		case c == '"' || c == '\'' || c == '`':
			j := i + 1
			for j < len(expr) && expr[j] != c {
				if expr[j] == '\\' && c != '`' {
					j++
				}
				j++
			}
			if j >= len(expr) {
				return nil, fmt.Errorf("%w: unterminated string at %d", ErrQuery, i)
			}
			s, err := unquote(expr[i : j+1])
			if err != nil {
				return nil, fmt.Errorf("%w: string at %d: %v", ErrQuery, i, err)
			}
			toks = append(toks, token{tString, s})
			i = j + 1
		case isIdentStart(c):
			j := i + 1
			for j < len(expr) && (isIdentStart(expr[j]) || isDigit(expr[j])) {
				j++
			}
			toks = append(toks, token{tIdent, expr[i:j]})
			i = j
		case isDigit(c) || c == '.' && i+1 < len(expr) && isDigit(expr[i+1]):
			j := i + 1
			for j < len(expr) {
				d := expr[j]
				exp := (d == '+' || d == '-') && (expr[j-1] == 'e' || expr[j-1] == 'E') && !strings.HasPrefix(expr[i:], "0x")
				if !isIdentStart(d) && !isDigit(d) && d != '.' && !exp {
					break
				}
				j++
			}
			toks = append(toks, token{tNumber, expr[i:j]})
			i = j
		case c == '$':
			// A Grafana variable ($name, ${name}, ${name:format}),
			// standing for a value or a duration.
			j := i + 1
			if strings.HasPrefix(expr[j:], "{") {
				k := strings.IndexByte(expr[j:], '}')
				if k < 0 {
					return nil, fmt.Errorf("%w: ${ not closed at %d", ErrQuery, i)
				}
				j += k + 1
			} else {
				for j < len(expr) && (isIdentStart(expr[j]) || isDigit(expr[j])) {
					j++
				}
			}
			toks = append(toks, token{tNumber, expr[i:j]})
			i = j
		default:
			op := ""
			for _, o := range []string{"==", "!=", "=~", "!~", ">=", "<="} {
				if strings.HasPrefix(expr[i:], o) {
					op = o
					break
				}
			}
			if op == "" {
				if !strings.ContainsRune("(){}[],=<>+-*/%^@:", rune(c)) {
					return nil, fmt.Errorf("%w: unexpected %q at %d", ErrQuery, c, i)
				}
				op = expr[i : i+1]
			}
			toks = append(toks, token{tPunct, op})
			i += len(op)
		}
	}
	return toks, nil
}

func isIdentStart(c byte) bool {
	return c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c == '_' || c == ':'
}

func isDigit(c byte) bool { return c >= '0' && c <= '9' }

// unquote reads a PromQL string: Go's escapes, in double, single or back
// quotes.
func unquote(s string) (string, error) {
	if s[0] == '\'' {
		s = `"` + strings.ReplaceAll(strings.ReplaceAll(s[1:len(s)-1], `\'`, `'`), `"`, `\"`) + `"`
	}
	return strconv.Unquote(s)
}

type parser struct {
	toks []token
	i    int
	refs Refs
}

func (p *parser) peek(k int) (token, bool) {
	if p.i+k < len(p.toks) {
		return p.toks[p.i+k], true
	}
	return token{}, false
}

func (p *parser) isPunct(k int, s string) bool {
	t, ok := p.peek(k)
	return ok && t.kind == tPunct && t.text == s
}

func (p *parser) walk() error {
	for p.i < len(p.toks) {
		t := p.toks[p.i]
		switch {
		case t.kind == tPunct && t.text == "[":
			// A range or a subquery: durations only.
			for p.i < len(p.toks) && !p.isPunct(0, "]") {
				p.i++
			}
			p.i++
		case t.kind == tPunct && t.text == "{":
			if err := p.selector(""); err != nil {
				return err
			}
		case t.kind == tIdent:
			if err := p.ident(t.text); err != nil {
				return err
			}
		default:
			p.i++
		}
	}
	return nil
}

// ident reads the identifier at p.i: a keyword, a function or aggregation,
// or a series name.
func (p *parser) ident(name string) error {
	lower := strings.ToLower(name) // keywords and aggregations ignore case
	switch {
	case grouping[lower]:
		p.i++
		if p.isPunct(0, "(") {
			return p.labelList(name)
		}
		return nil // group_left with no labels
	case keywords[lower]:
		p.i++
		return nil
	case p.isPunct(1, "("):
		switch {
		case labelsAsStrings[name]:
			return fmt.Errorf("%w: %s names labels in strings, which this checker does not read", ErrQuery, name)
		case !functions[name] && !aggregations[lower]:
			return fmt.Errorf("%w: unknown function %s", ErrQuery, name)
		}
		p.i++
		return nil
	case aggregations[lower]:
		if next, ok := p.peek(1); ok && next.kind == tIdent && grouping[strings.ToLower(next.text)] {
			p.i++ // sum by (x) (…)
			return nil
		}
	}
	p.i++
	if p.isPunct(0, "{") {
		return p.selector(name)
	}
	p.refs.Selectors = append(p.refs.Selectors, Selector{Metric: name})
	return nil
}

// labelList reads "(a, b, …)" after the keyword kw.
func (p *parser) labelList(kw string) error {
	p.i++ // (
	for {
		t, ok := p.peek(0)
		switch {
		case !ok:
			return fmt.Errorf("%w: %s ( not closed", ErrQuery, kw)
		case t.kind == tPunct && t.text == ")":
			p.i++
			return nil
		case t.kind == tPunct && t.text == ",":
		case t.kind == tIdent || t.kind == tString:
			p.refs.Labels = append(p.refs.Labels, t.text)
		default:
			return fmt.Errorf("%w: %q in the labels of %s", ErrQuery, t.text, kw)
		}
		p.i++
	}
}

// selector reads "{matchers}" at p.i, of the series name (or "").
func (p *parser) selector(name string) error {
	sel := Selector{Metric: name}
	p.i++ // {
	for {
		t, ok := p.peek(0)
		if !ok {
			return fmt.Errorf("%w: { not closed after %q", ErrQuery, name)
		}
		p.i++
		switch {
		case t.kind == tPunct && t.text == "}":
			if sel.Metric == "" {
				return fmt.Errorf("%w: a selector without a series name: %v", ErrQuery, sel.Matchers)
			}
			p.refs.Selectors = append(p.refs.Selectors, sel)
			return nil
		case t.kind == tPunct && t.text == ",":
			continue
		case t.kind != tIdent && t.kind != tString:
			return fmt.Errorf("%w: %q in the selector of %q", ErrQuery, t.text, name)
		}
		op, okOp := p.peek(0)
		val, okVal := p.peek(1)
		if !okOp || op.kind != tPunct || !matchOps[op.text] || !okVal || val.kind != tString {
			if t.kind == tString && sel.Metric == "" { // {"name", …}: Prometheus 3's quoted series name
				sel.Metric = t.text
				continue
			}
			return fmt.Errorf("%w: matcher of %s in the selector of %q is not label op \"value\"", ErrQuery, t.text, name)
		}
		p.i += 2
		m := Matcher{Label: t.text, Op: op.text, Value: val.text}
		if m.Label == "__name__" && m.Op == "=" && sel.Metric == "" {
			sel.Metric = m.Value
			continue
		}
		sel.Matchers = append(sel.Matchers, m)
	}
}
