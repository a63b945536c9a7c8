package wire

import (
	"bytes"
	"fmt"
	"strings"
	"testing"
)

// requestSeeds are real request lines: PROTOCOL.md's examples, every op,
// refusals of every kind, and framing edge cases.
var requestSeeds = []string{
	"A orders/42 30 5\n",
	"S 8841\n",
	"A orders/42 30 5 seen=1041\n",
	"A doc 30 - mode=shared seen=7 owner=w\n",
	"A orders/42 30 0.5\n",
	"R orders/42 1001\n",
	"A orders/42 30 0 lots\n",
	"I\n",
	"X orders/42 1001 60\n",
	"C orders/42\n",
	"A ключ/1 2.125 0\r\n",
	"R k 18446744073709551615\n",
	"R k 18446744073709551616\n",
	"A k 86400.001 1\n",
	"A k 1 86400.001\n",
	"A k 9223372036854775.808 1\n",
	"A k 1.2345 .5\n",
	"A k 0 0\n",
	"A  k 1 1\n",
	"a k\n",
	"GET / HTTP/1.1\r\n",
	"\r\n",
	"I x\n",
	"C k\r\r\n",
	"X k 0 0\n",
	pipeline,
	"A k 30 " + strings.Repeat("0", 504) + "\n",
	"A k 30 " + strings.Repeat("0", 503) + "\r\n",
	strings.Repeat("x", 600) + "\nI\n",
	"A k 30 5\nR k",
	"U app s3cret\n",
	"U app s3cret\r\nA k 30 5\n",
	"U app\n",
	"U app s3cret extra\n",
	"U  s3cret\n",
	"U app s3\x01cret\n",
	"U " + strings.Repeat("n", 250) + " " + strings.Repeat("s", 250) + "\n",
	"A orders/42 30 -\n",
	"A orders/42 30 - owner=web-3:4121\n",
	"A orders/42 30 5 owner=web-3:4121\r\n",
	"A k 30 0 owner=\n",
	"A k 30 0 owner=a b\n",
	"A k 30 -- owner=a\n",
	"A k 30 0 limit=3\n",
	"A k 30 - owner=a limit=1024\n",
	"A k 30 0 mode=shared\n",
	"A k 30 0 mode=exclusive owner=a\n",
	"A k 30 0 limit=2 mode=shared\n",
	"A k 30 0 limit=0\n",
	"A k 30 0 limit=2 limit=2\n",
	"A " + strings.Repeat("k", 250) + " 86400 86400 owner=" + strings.Repeat("o", 64) + "\n",
	"Q orders/42\n",
	"Q orders/42 x\n",
	"L 100\n",
	"L 0 orders/\r\n",
	"L x orders/\n",
	"L 10 a b\n",
	"L 18446744073709551616\n",
}

// addSeeds adds each seed twice: fed byte by byte, and in pieces of other
// sizes.
func addSeeds(f *testing.F, seeds []string) {
	for i, s := range seeds {
		f.Add([]byte(s), []byte{1}) // byte by byte
		f.Add([]byte(s), []byte{byte(i + 2), 1, 3})
	}
}

// parseBothWays parses data whole and split at cuts, each with a parser of
// its own from newParser, checks that both give the same, and returns what
// they gave.
func parseBothWays[T fmt.Stringer](t *testing.T, data, cuts []byte, newParser func() lineParser[T], equal func(a, b T) bool) []T {
	t.Helper()
	whole, _, tooLong := parseLines(t, data, newParser())
	split, splitTooLong := parseSplit(t, data, cuts, newParser())
	if tooLong != splitTooLong {
		t.Fatalf("too long: whole %v, split %v", tooLong, splitTooLong)
	}
	compareResults(t, whole, split, equal)
	return whole
}

func FuzzParseRequest(f *testing.F) {
	addSeeds(f, requestSeeds)
	f.Add([]byte(pipeline), []byte{7, 0, 200})
	f.Fuzz(func(t *testing.T, data, cuts []byte) {
		whole := parseBothWays(t, data, cuts, func() lineParser[reqResult] { return requestParser(nil) }, equalReqResult)

		var line []byte
		for _, r := range whole {
			if r.n > MaxLine {
				t.Fatalf("accepted a %d-byte line: %v", r.n, r)
			}
			if r.err != nil {
				checkRefusal(t, &r)
				continue
			}
			// Re-encode and parse: the same request.
			line = appendRequest(line[:0], &r.req)
			var again Request
			n, err := ParseRequest(line, nil, &again)
			if n != len(line) || err != nil || !equalRequest(&again, &r.req) {
				t.Fatalf("%v → %q → n %d err %v %+v", r, line, n, err, again)
			}
		}
	})
}

// checkRefusal checks a refusal's echo fields, and that its E line parses
// back to the same echoes and reason.
func checkRefusal(t *testing.T, r *reqResult) {
	t.Helper()
	if o := r.req.EchoOp; o != nil && (len(o) == 0 || len(o) > 16 || !isPrint(o)) {
		t.Fatalf("%v: EchoOp breaks the echo rule", r)
	}
	if k := r.req.EchoKey; k != nil && !ValidKey(k) {
		t.Fatalf("%v: EchoKey is not a valid key", r)
	}
	e := AppendRefusal(nil, &r.req, r.err)
	var a Answer
	n, err := ParseAnswer(e, &a)
	if n != len(e) || err != nil || a.Kind != 'E' || string(a.Text) != Reason(r.err) ||
		!bytes.Equal(a.Op, dash(r.req.EchoOp)) || !bytes.Equal(a.Key, dash(r.req.EchoKey)) {
		t.Fatalf("%v: E line %q parses as %v", r, e, detachAnswer(n, err, &a))
	}
}

// answerSeeds are real answer lines.
var answerSeeds = []string{
	"A orders/42 1001\n",
	"T orders/42\n",
	"R orders/42 OK\n",
	"R orders/42 STALE\n",
	"X orders/42 OK\n",
	"X orders/42 STALE\r\n",
	"C orders/42 OK\n",
	"C orders/42 NONE\n",
	"E A orders/42 too many fields\n",
	"E - - line too long\n",
	"E A orders/42 too many waiters\n",
	"I standby node2:7070 node1:7070\n",
	"I active node1:7070 node1:7070 epoch=3 keys=12\n",
	"I standby node2:7070 -\n",
	"M node1:7070\n",
	"M -\n",
	"A k 0\n",
	"E A k \n",
	answers,
	strings.Repeat("x", 600) + "\nM -\n",
	"E A k " + strings.Repeat("x", 505) + "\n",
	"U OK\n",
	"U OK\r\n",
	"U NO\n",
	"E U - bad credentials\n",
	"E A k auth required\n",
	"E A k key forbidden\n",
	"E - - idle\n",
	"Q orders/42 FREE\n",
	"Q orders/42 7 28.14 2\n",
	"Q orders/42 7 28.14 2 owner=web-3:4121\r\n",
	"Q orders/42 7 28.14 2 since=1 owner=a\n",
	"H orders/42 7 28.14 2 owner=web-3:4121\n",
	"H k 1 0 0\n",
	"Q pool 7 28.14 2 holders=3 limit=4\n",
	"H doc 7 1 0 owner=a holders=2 mode=shared\n",
	"H doc 7 1 0 holders=2\n",
	"Q k 7 1 0 holders=2 limit=2 mode=shared\n",
	"Q k 7 1 0 limit=0\n",
	"L 2\n",
	"L 1000 more\n",
	"S 0\n",
	"S 12\n",
	"E S 12 session already named\n",
	"E Q orders/42 key forbidden\n",
	"E L x bad limit\n",
}

func FuzzParseAnswer(f *testing.F) {
	addSeeds(f, answerSeeds)
	f.Fuzz(func(t *testing.T, data, cuts []byte) {
		whole := parseBothWays(t, data, cuts, answerParser, equalAnsResult)

		var line []byte
		for _, r := range whole {
			if r.err != nil {
				if r.a.Kind != 0 {
					t.Fatalf("%v: Kind set on an error", r)
				}
				continue
			}
			line = appendAnswer(line[:0], &r.a)
			var again Answer
			n, err := ParseAnswer(line, &again)
			if n != len(line) || err != nil || !equalAnswer(&again, &r.a) {
				t.Fatalf("%v → %q → %v", r, line, detachAnswer(n, err, &again))
			}
		}
	})
}

// FuzzParseLockLine checks parseLockLine, ParseRequest's one-pass parse of
// the lock cycle's lines, against parseLine, which parses every line: on
// every line the first takes, both agree on length and request, under the
// default limits and under small ones.
func FuzzParseLockLine(f *testing.F) {
	addSeeds(f, requestSeeds)
	for _, s := range []string{
		"A k 30 0\n", "R k 1\n", "A k 30 -\r\n", "A k 0.125 2.5\n", "R k 0001\n",
		"A k 30 0 owner=o\n", "R k 18446744073709551615\n", "R k 18446744073709551616\n",
		"A k 999999999999999 0\n", "A k 9999999999999999 0\n", "A k 5. 0\n", "A k 30 -1\n",
		"R k 1\rx\n", "A \x80\xff 1 1\n", "R k\x7f 1\n", "A k 0 0\n", "R k 0\n",
	} {
		f.Add([]byte(s), []byte{})
	}
	lims := []*Limits{nil, {MaxLease: 1500, MaxWait: 10}}
	f.Fuzz(func(t *testing.T, data, _ []byte) {
		for _, lim := range lims {
			var fast, slow Request
			n := parseLockLine(data, lim, &fast)
			if n == 0 {
				continue
			}
			m, err := parseLine(data, lim, &slow)
			if m != n || err != nil || !equalRequest(&fast, &slow) ||
				string(fast.EchoOp) != string(slow.EchoOp) || string(fast.EchoKey) != string(slow.EchoKey) {
				t.Fatalf("%q: one pass %d %+v, parseLine %d %v %+v", data, n, fast, m, err, slow)
			}
		}
	})
}
