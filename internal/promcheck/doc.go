// Package promcheck checks the PromQL of kunci's Grafana dashboard and
// Prometheus alerting rules (deploy/) against what nodes really export.
// Parse finds what a query names — its series selectors, their label
// matchers, and the labels of its by, without, on, ignoring, group_left
// and group_right clauses — and Exports indexes /metrics scrapes, in the
// text format, to look them up in (Check).
//
// Parse is a small extractor, not a PromQL parser: it reads the tokens of
// a query and knows which identifiers are functions, aggregations and
// keywords; everything else is a series name. It reads a Grafana variable
// ($__rate_interval, ${job}) where a number or duration may stand, and
// in a string. It does not check that the
// query is well formed (promtool does, for the rules), nor that its
// functions suit the types of their arguments. It refuses what it cannot
// follow rather than pass it unchecked: a function it does not know, and
// the functions that take label names as strings (label_replace,
// label_join, sort_by_label, count_values).
//
// The package is for tests; nothing in a node imports it. Its functions
// are safe for concurrent use; an Exports is not, while Add runs.
package promcheck
