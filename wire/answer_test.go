package wire

import (
	"bytes"
	"fmt"
	"strings"
	"testing"
)

// ansResult is one ParseAnswer outcome, detached from its buffer.
type ansResult struct {
	n   int // -1 for ErrLineTooLong
	err error
	a   Answer
}

func (r ansResult) String() string {
	a := r.a
	return fmt.Sprintf("n=%d err=%v kind=%q key=%q token=%d ok=%v op=%q text=%q role=%q self=%q active=%q left=%d waiters=%d owner=%q group=%+v count=%d more=%v",
		r.n, r.err, a.Kind, a.Key, a.Token, a.OK, a.Op, a.Text, a.Role, a.Self, a.Active, a.Left, a.Waiters, a.Owner, a.Group, a.Count, a.More)
}

func detachAnswer(n int, err error, a *Answer) ansResult {
	if err == ErrLineTooLong {
		n = -1
	}
	c := *a
	for _, p := range []*[]byte{&c.Key, &c.Op, &c.Text, &c.Role, &c.Self, &c.Active, &c.Owner} {
		*p = bytes.Clone(*p)
	}
	return ansResult{n: n, err: err, a: c}
}

// equalAnswer compares answers field by field, telling nil from empty.
func equalAnswer(a, b *Answer) bool {
	eq := func(x, y []byte) bool { return bytes.Equal(x, y) && (x == nil) == (y == nil) }
	return a.Kind == b.Kind && a.Token == b.Token && a.OK == b.OK && eq(a.Key, b.Key) && eq(a.Op, b.Op) &&
		eq(a.Text, b.Text) && eq(a.Role, b.Role) && eq(a.Self, b.Self) && eq(a.Active, b.Active) &&
		a.Left == b.Left && a.Waiters == b.Waiters && eq(a.Owner, b.Owner) && a.Group == b.Group && a.Count == b.Count && a.More == b.More
}

func equalAnsResult(a, b ansResult) bool {
	return a.n == b.n && a.err == b.err && equalAnswer(&a.a, &b.a)
}

func b(s string) []byte { return []byte(s) }

func TestParseAnswer(t *testing.T) {
	long := strings.Repeat("k", MaxKey)
	for _, tc := range []struct {
		in   string
		want Answer
	}{
		{"A orders/42 1001\n", Answer{Kind: 'A', Key: b("orders/42"), Token: 1001}},
		{"A k 18446744073709551615\r\n", Answer{Kind: 'A', Key: b("k"), Token: 1<<64 - 1}},
		{"A " + long + " 1\n", Answer{Kind: 'A', Key: b(long), Token: 1}},
		{"T orders/42\n", Answer{Kind: 'T', Key: b("orders/42")}},
		{"T -\n", Answer{Kind: 'T', Key: b("-")}},
		{"R orders/42 OK\n", Answer{Kind: 'R', Key: b("orders/42"), OK: true}},
		{"R orders/42 STALE\n", Answer{Kind: 'R', Key: b("orders/42")}},
		{"X k OK\n", Answer{Kind: 'X', Key: b("k"), OK: true}},
		{"X k STALE\r\n", Answer{Kind: 'X', Key: b("k")}},
		{"C k OK\n", Answer{Kind: 'C', Key: b("k"), OK: true}},
		{"C k NONE\n", Answer{Kind: 'C', Key: b("k")}},
		{"E A orders/42 too many fields\n", Answer{Kind: 'E', Op: b("A"), Key: b("orders/42"), Text: b("too many fields")}},
		{"U OK\n", Answer{Kind: 'U', OK: true}},
		{"U OK\r\n", Answer{Kind: 'U', OK: true}},
		{"E U - bad credentials\n", Answer{Kind: 'E', Op: b("U"), Text: b("bad credentials")}},
		{"E - - line too long\r\n", Answer{Kind: 'E', Text: b("line too long")}},
		{"E GET / unknown op\n", Answer{Kind: 'E', Op: b("GET"), Key: b("/"), Text: b("unknown op")}},
		{"E A k  two  spaces \n", Answer{Kind: 'E', Op: b("A"), Key: b("k"), Text: b(" two  spaces ")}},
		{"E A k é\n", Answer{Kind: 'E', Op: b("A"), Key: b("k"), Text: b("é")}},
		{"M node1:7070\n", Answer{Kind: 'M', Text: b("node1:7070")}},
		{"M -\n", Answer{Kind: 'M'}},
		{"I standby node2:7070 node1:7070\n", Answer{Kind: 'I', Role: b("standby"), Self: b("node2:7070"),
			Active: b("node1:7070"), Text: b("standby node2:7070 node1:7070")}},
		{"I standby node2:7070 -\r\n", Answer{Kind: 'I', Role: b("standby"), Self: b("node2:7070"),
			Text: b("standby node2:7070 -")}},
		{"I active n1:7070 n1:7070 epoch=4 keys=10\n", Answer{Kind: 'I', Role: b("active"), Self: b("n1:7070"),
			Active: b("n1:7070"), Text: b("active n1:7070 n1:7070 epoch=4 keys=10")}},
		{"Q orders/42 FREE\n", Answer{Kind: 'Q', Key: b("orders/42")}},
		{"Q orders/42 7 28.14 2\n", Answer{Kind: 'Q', Key: b("orders/42"), Token: 7, Left: 28140, Waiters: 2}},
		{"Q k 1 0 0 owner=web-3:4121\r\n", Answer{Kind: 'Q', Key: b("k"), Token: 1, Owner: b("web-3:4121")}},
		{"Q k 1 0 0 since=3 owner=a x=y\n", Answer{Kind: 'Q', Key: b("k"), Token: 1, Owner: b("a")}},
		{"H FREE 18446744073709551615 86400 4096 owner=" + strings.Repeat("o", MaxOwner) + "\n",
			Answer{Kind: 'H', Key: b("FREE"), Token: 1<<64 - 1, Left: 86400000, Waiters: 4096, Owner: b(strings.Repeat("o", MaxOwner))}},
		{"H k 3 0.001 0\n", Answer{Kind: 'H', Key: b("k"), Token: 3, Left: 1}},
		{"L 0\n", Answer{Kind: 'L'}},
		{"L 1000 more\r\n", Answer{Kind: 'L', Count: 1000, More: true}},
	} {
		buf := []byte(tc.in + "garbage")
		var a Answer
		n, err := ParseAnswer(buf, &a)
		if n != len(tc.in) || err != nil || !equalAnswer(&a, &tc.want) {
			t.Errorf("%q: n %d err %v\n got %v\nwant %v", tc.in, n, err, detachAnswer(n, err, &a), ansResult{n: len(tc.in), a: tc.want})
		}
	}
}

func TestParseAnswerBad(t *testing.T) {
	long := strings.Repeat("k", MaxKey+1)
	for _, in := range []string{
		"\n", "\r\n", "A\n", "A \n", "AA k 1\n", "a k 1\n", "Z k\n", " A k 1\n",
		"A k\n", "A k 0\n", "A k -1\n", "A k 18446744073709551616\n", "A k 1 2\n", "A k 1 \n", "A  k 1\n",
		"A k\x01 1\n", "A " + long + " 1\n", "A k 1\r\r\n",
		"T\n", "T \n", "T k \n", "T k x\n", "T k\t\n",
		"R k\n", "R k ok\n", "R k NONE\n", "R k OK \n", "X k\n", "X k NONE\n",
		"C k\n", "C k STALE\n", "C k OK x\n",
		"E\n", "E A\n", "E A k\n", "E A k \n", "E A k bad\x01\n", "E A k bad\x7f\n",
		"E ABCDEFGHIJKLMNOPQ k x\n", "E é k x\n", "E  k x\n", "E A  x\n", "E A " + long + " x\n",
		"M\n", "M \n", "M a b\n", "M a\x01\n",
		"I\n", "I \n", "I active\n", "I active n1\n", "I active n1 \n", "I active n1 n2 \n",
		"I active n1 n2  x=1\n", "I active  n2\n", "I active n1 n2 x\x01\n",
		"U\n", "U \n", "U ok\n", "U OK \n", "U OK x\n", "U NO\n", "U  OK\n",
		"Q\n", "Q k\n", "Q k \n", "Q k free\n", "Q k FREE x\n", "Q k 0 1 1\n", "Q k 1 1\n", "Q k 1 1 \n",
		"Q k 1 x 1\n", "Q k 1 1 1 \n", "Q k 1 1 1 owner=\n", "Q k 1 1 1 owner=a owner=b\n", "Q k 1 1 1 x\n",
		"Q k 1 1 1 =x\n", "Q k 1 1 1 owner=é\n", "Q k 1 1 1  owner=a\n", "Q k 1 1.0001 1\n", "Q k 1 1 -1\n",
		"H k FREE\n", "H k 1 1\n", "H k 0 1 1\n",
		"L\n", "L \n", "L x\n", "L 1 \n", "L 1 More\n", "L 1 more x\n", "L -1\n", "L 18446744073709551616\n",
	} {
		var a Answer
		n, err := ParseAnswer([]byte(in), &a)
		if n != len(in) || err != ErrBadAnswer {
			t.Errorf("%q: n %d err %v, want %d %v (%v)", in, n, err, len(in), ErrBadAnswer, detachAnswer(n, err, &a))
		}
		if a.Kind != 0 {
			t.Errorf("%q: Kind %q set on a bad answer", in, a.Kind)
		}
	}
}

func TestParseAnswerFraming(t *testing.T) {
	for _, tc := range []struct {
		in  string
		n   int
		err error
	}{
		{"", 0, nil},
		{"A k 1", 0, nil},
		{"A k 1\r", 0, nil},
		{strings.Repeat("x", MaxLine-1), 0, nil},
		{strings.Repeat("x", MaxLine), 0, ErrLineTooLong},
		{"E A k " + strings.Repeat("x", MaxLine-7) + "\n", MaxLine, nil},
		{"E A k " + strings.Repeat("x", MaxLine-8) + "\r\n", MaxLine, nil},
		{"E A k " + strings.Repeat("x", MaxLine-7) + "\r\n", MaxLine + 1, ErrLineTooLong},
	} {
		var a Answer
		if n, err := ParseAnswer([]byte(tc.in), &a); n != tc.n || err != tc.err {
			t.Errorf("%.20q (%d bytes): n %d err %v, want %d %v", tc.in, len(tc.in), n, err, tc.n, tc.err)
		}
	}
}

func TestAnswerEncoders(t *testing.T) {
	k := []byte("orders/42")
	for _, tc := range []struct{ got, want string }{
		{string(AppendGrant(nil, k, 1001)), "A orders/42 1001\n"},
		{string(AppendGrant([]byte("x"), k, 1<<64-1)), "xA orders/42 18446744073709551615\n"},
		{string(AppendTimeout(nil, k)), "T orders/42\n"},
		{string(AppendReleased(nil, k, true)), "R orders/42 OK\n"},
		{string(AppendReleased(nil, k, false)), "R orders/42 STALE\n"},
		{string(AppendExtended(nil, k, true)), "X orders/42 OK\n"},
		{string(AppendExtended(nil, k, false)), "X orders/42 STALE\n"},
		{string(AppendCancelled(nil, k, true)), "C orders/42 OK\n"},
		{string(AppendCancelled(nil, k, false)), "C orders/42 NONE\n"},
		{string(AppendInfo(nil, "standby", "node2:7070", "node1:7070")), "I standby node2:7070 node1:7070\n"},
		{string(AppendInfo(nil, "active", "n1:7070", "", "epoch=4", "", "keys=10")), "I active n1:7070 - epoch=4 keys=10\n"},
		{string(AppendInfo(nil, "", "", "")), "I - - -\n"},
		{string(AppendRedirect(nil, "node1:7070")), "M node1:7070\n"},
		{string(AppendRedirect(nil, "")), "M -\n"},
		{string(AppendAuthOK(nil)), "U OK\n"},
		{string(AppendInspected(nil, k, 7, 28140, 2, nil, Group{})), "Q orders/42 7 28.14 2\n"},
		{string(AppendInspected(nil, k, 7, -5, 0, b("web-3:4121"), Group{})), "Q orders/42 7 0 0 owner=web-3:4121\n"},
		{string(AppendFree(nil, k)), "Q orders/42 FREE\n"},
		{string(AppendListed(nil, k, 1, 1, 4096, b("a"), Group{})), "H orders/42 1 0.001 4096 owner=a\n"},
		{string(AppendInspected(nil, k, 7, 1000, 1, nil, Group{Holders: 2, Slots: 3})), "Q orders/42 7 1 1 holders=2 limit=3\n"},
		{string(AppendListed(nil, k, 7, 1000, 0, b("a"), Group{Holders: 5, Shared: true})), "H orders/42 7 1 0 owner=a holders=5 mode=shared\n"},
		{string(AppendListed(nil, k, 7, 1000, 0, nil, Group{Holders: 5})), "H orders/42 7 1 0\n"},
		{string(AppendListEnd(nil, 0, false)), "L 0\n"},
		{string(AppendListEnd(nil, 100, true)), "L 100 more\n"},
		{string(AppendError(nil, []byte("A"), k, "too many fields")), "E A orders/42 too many fields\n"},
		{string(AppendError(nil, nil, []byte{}, "line too long")), "E - - line too long\n"},
		{string(AppendError(nil, nil, nil, "")), "E - - error\n"},
		{string(AppendError(nil, nil, nil, "a\nb\rc\x7fd\te")), "E - - a?b?c?d?e\n"},
		{string(AppendRefusal(nil, &Request{EchoOp: []byte("R"), EchoKey: k}, fmt.Errorf("engine: too many waiters"))),
			"E R orders/42 too many waiters\n"},
	} {
		if tc.got != tc.want {
			t.Errorf("got %q, want %q", tc.got, tc.want)
		}
	}
}

func TestAnswerRoundTrip(t *testing.T) {
	long := strings.Repeat("k", MaxKey)
	for _, want := range []Answer{
		{Kind: 'A', Key: b("orders/42"), Token: 1001},
		{Kind: 'A', Key: b(long), Token: 1<<64 - 1},
		{Kind: 'T', Key: b("k")},
		{Kind: 'R', Key: b("k"), OK: true},
		{Kind: 'R', Key: b("k")},
		{Kind: 'X', Key: b("k"), OK: true},
		{Kind: 'X', Key: b("k")},
		{Kind: 'C', Key: b("k"), OK: true},
		{Kind: 'C', Key: b("k")},
		{Kind: 'E', Op: b("A"), Key: b("orders/42"), Text: b("too many waiters")},
		{Kind: 'E', Text: b("line too long")},
		{Kind: 'E', Op: b("ABCDEFGHIJKLMNOP"), Key: b(long), Text: b(" spaced  out ")},
		{Kind: 'M', Text: b("node1:7070")},
		{Kind: 'M'},
		{Kind: 'U', OK: true},
		{Kind: 'I', Role: b("standby"), Self: b("n2:7070"), Active: b("n1:7070"), Text: b("standby n2:7070 n1:7070")},
		{Kind: 'I', Role: b("standby"), Self: b("n2:7070"), Text: b("standby n2:7070 -")},
		{Kind: 'I', Role: b("active"), Self: b("n1:7070"), Active: b("n1:7070"), Text: b("active n1:7070 n1:7070 epoch=4")},
		{Kind: 'Q', Key: b("k")},
		{Kind: 'Q', Key: b(long), Token: 1<<64 - 1, Left: 86400000, Waiters: 1<<64 - 1, Owner: b(strings.Repeat("~", MaxOwner))},
		{Kind: 'H', Key: b("orders/42"), Token: 7, Left: 1, Waiters: 0},
		{Kind: 'H', Key: b(long), Token: 1, Left: 0, Waiters: 3, Owner: b("web-3:4121")},
		{Kind: 'L', Count: 0},
		{Kind: 'L', Count: 1<<64 - 1, More: true},
	} {
		line := appendAnswer(nil, &want)
		var got Answer
		n, err := ParseAnswer(line, &got)
		if n != len(line) || err != nil || !equalAnswer(&got, &want) {
			t.Errorf("%q: n %d err %v\n got %v\nwant %v", line, n, err, detachAnswer(n, err, &got), ansResult{n: len(line), a: want})
		}
	}
}

// appendAnswer encodes a with the answer encoder for its kind.
func appendAnswer(dst []byte, a *Answer) []byte {
	switch a.Kind {
	case 'A':
		return AppendGrant(dst, a.Key, a.Token)
	case 'T':
		return AppendTimeout(dst, a.Key)
	case 'R':
		return AppendReleased(dst, a.Key, a.OK)
	case 'X':
		return AppendExtended(dst, a.Key, a.OK)
	case 'C':
		return AppendCancelled(dst, a.Key, a.OK)
	case 'E':
		return AppendError(dst, a.Op, a.Key, string(a.Text))
	case 'M':
		return AppendRedirect(dst, string(a.Text))
	case 'U':
		return AppendAuthOK(dst)
	case 'I':
		fields := strings.Split(string(a.Text), " ")
		return AppendInfo(dst, string(a.Role), string(a.Self), string(a.Active), fields[3:]...)
	case 'Q':
		if a.Token == 0 {
			return AppendFree(dst, a.Key)
		}
		return AppendInspected(dst, a.Key, a.Token, a.Left, a.Waiters, a.Owner, a.Group)
	case 'H':
		return AppendListed(dst, a.Key, a.Token, a.Left, a.Waiters, a.Owner, a.Group)
	case 'L':
		return AppendListEnd(dst, a.Count, a.More)
	case 'S':
		return AppendSessionEnd(dst, a.Count)
	}
	panic(fmt.Sprintf("appendAnswer: kind %q", a.Kind))
}

func TestParseAnswerAllocs(t *testing.T) {
	for _, line := range []string{
		"A orders/42 1001\n", "T orders/42\n", "R orders/42 OK\n", "X orders/42 STALE\n", "C orders/42 NONE\n",
		"E A orders/42 too many waiters\n", "M node1:7070\n", "I active n1:7070 n1:7070 epoch=4\n", "A k 0\n", "U OK\n",
		"Q orders/42 FREE\n", "Q orders/42 7 28.14 2 owner=web-3:4121\n", "H orders/42 7 28.14 2 x=y\n", "L 100 more\n", "Q k 1 1 1 x\n",
	} {
		buf := []byte(line)
		var a Answer
		if n := testing.AllocsPerRun(100, func() { ParseAnswer(buf, &a) }); n != 0 {
			t.Errorf("ParseAnswer(%q): %v allocs", line, n)
		}
	}
}

func TestEncoderAllocs(t *testing.T) {
	dst := make([]byte, 0, 1024)
	k := []byte("orders/42")
	req := &Request{EchoOp: []byte("A"), EchoKey: k}
	for name, f := range map[string]func(){
		"AppendGrant":        func() { dst = AppendGrant(dst[:0], k, 1<<63) },
		"AppendTimeout":      func() { dst = AppendTimeout(dst[:0], k) },
		"AppendReleased":     func() { dst = AppendReleased(dst[:0], k, false) },
		"AppendExtended":     func() { dst = AppendExtended(dst[:0], k, true) },
		"AppendCancelled":    func() { dst = AppendCancelled(dst[:0], k, false) },
		"AppendInfo":         func() { dst = AppendInfo(dst[:0], "active", "n1:7070", "", "epoch=4", "keys=10") },
		"AppendRedirect":     func() { dst = AppendRedirect(dst[:0], "node1:7070") },
		"AppendError":        func() { dst = AppendError(dst[:0], nil, k, "too many waiters") },
		"AppendRefusal":      func() { dst = AppendRefusal(dst[:0], req, ErrBadLease) },
		"AppendAcquire":      func() { dst = AppendAcquire(dst[:0], k, 30000, 2125) },
		"AppendRelease":      func() { dst = AppendRelease(dst[:0], k, 1001) },
		"AppendExtend":       func() { dst = AppendExtend(dst[:0], k, 1001, 500) },
		"AppendCancel":       func() { dst = AppendCancel(dst[:0], k) },
		"AppendInfoRequest":  func() { dst = AppendInfoRequest(dst[:0]) },
		"AppendSeconds":      func() { dst = AppendSeconds(dst[:0], 86399999) },
		"AppendInspected":    func() { dst = AppendInspected(dst[:0], k, 1001, 28140, 2, k, Group{Holders: 3, Slots: 4}) },
		"AppendFree":         func() { dst = AppendFree(dst[:0], k) },
		"AppendListed":       func() { dst = AppendListed(dst[:0], k, 1001, 28140, 2, nil, Group{Holders: 2, Shared: true}) },
		"AppendListEnd":      func() { dst = AppendListEnd(dst[:0], 1000, true) },
		"AppendAcquireOwner": func() { dst = AppendAcquireOwner(dst[:0], k, k, 30000, NoWait) },
		"AppendInspect":      func() { dst = AppendInspect(dst[:0], k) },
		"AppendList":         func() { dst = AppendList(dst[:0], 100, k) },
	} {
		if n := testing.AllocsPerRun(100, f); n != 0 {
			t.Errorf("%s: %v allocs", name, n)
		}
	}
}

const answers = "A orders/42 1001\r\n" +
	"T orders/42\n" +
	"R orders/42 OK\n" +
	"R orders/42 STALE\n" +
	"E A orders/42 too many fields\n" +
	"I standby node2:7070 node1:7070\n" +
	"bogus\n" +
	"M node1:7070\n"

func TestParseAnswerSplit(t *testing.T) {
	whole, _, _ := parseLines(t, []byte(answers), answerParser())
	if len(whole) != 8 {
		t.Fatalf("whole gave %d results", len(whole))
	}
	for _, cuts := range [][]byte{{1}, {2}, {3}, {5, 1, 7}, {255}} {
		split, _ := parseSplit(t, []byte(answers), cuts, answerParser())
		compareResults(t, whole, split, equalAnsResult)
	}
}

// answerParser is ParseAnswer as a lineParser.
func answerParser() lineParser[ansResult] {
	var a Answer
	return func(b []byte) (ansResult, int, error) {
		n, err := ParseAnswer(b, &a)
		return detachAnswer(n, err, &a), n, err
	}
}
