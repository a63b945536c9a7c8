package clientlib

import (
	"strconv"
	"testing"
)

// TestTakeSentMatchesOldest: an answer goes to the oldest outstanding call
// with its op and key, whichever calls were answered before it and in
// whatever order.
func TestTakeSentMatchesOldest(t *testing.T) {
	cn := &conn{}
	send := func(op byte, key string) *call {
		c := &call{op: op, key: key}
		cn.pend.sent = append(cn.pend.sent, c)
		return c
	}
	r1 := send('R', "a")
	x1 := send('X', "a")
	r2 := send('R', "b")
	r3 := send('R', "a")
	for i, step := range []struct {
		op   byte
		key  string
		want *call
	}{
		{'R', "b", r2}, // out of send order: leaves a hole
		{'R', "a", r1}, // the oldest R a
		{'C', "a", nil},
		{'R', "a", r3},
		{'R', "a", nil},
		{'X', "a", x1},
		{'X', "a", nil},
	} {
		if got := cn.takeSent(step.op, []byte(step.key)); got != step.want {
			t.Fatalf("step %d: %c %s matched %+v, want %+v", i, step.op, step.key, got, step.want)
		}
	}
	if len(cn.pend.sent) != 0 || cn.pend.sentHead != 0 {
		t.Fatalf("all answered, sent %d from %d", len(cn.pend.sent), cn.pend.sentHead)
	}
}

// TestTakeSentCompacts: answered calls at the front are dropped from sent
// once they are half of it, and the calls behind them still match.
func TestTakeSentCompacts(t *testing.T) {
	cn := &conn{}
	const n = 200
	calls := make([]*call, n)
	for i := range calls {
		calls[i] = &call{op: 'R', key: "k" + strconv.Itoa(i)}
		cn.pend.sent = append(cn.pend.sent, calls[i])
	}
	for i := range n / 2 {
		if got := cn.takeSent('R', []byte(calls[i].key)); got != calls[i] {
			t.Fatalf("call %d not matched", i)
		}
		if cn.pend.sentHead > 64 && cn.pend.sentHead >= len(cn.pend.sent)/2 {
			t.Fatalf("after %d answers: %d answered at the front of %d, not compacted", i+1, cn.pend.sentHead, len(cn.pend.sent))
		}
	}
	for i := n - 1; i >= n/2; i-- { // the rest from the back
		if got := cn.takeSent('R', []byte(calls[i].key)); got != calls[i] {
			t.Fatalf("call %d not matched after compaction", i)
		}
	}
	if len(cn.pend.sent) != 0 || cn.pend.sentHead != 0 {
		t.Fatalf("all answered, sent %d from %d", len(cn.pend.sent), cn.pend.sentHead)
	}
}
