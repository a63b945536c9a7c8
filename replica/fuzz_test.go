package replica

import (
	"bytes"
	"fmt"
	"strings"
	"testing"

	"github.com/kunci/kunci/engine"
)

// frameSeeds are real frames of both directions, refusals and framing edge
// cases.
var frameSeeds = []string{
	"P H 10.0.0.1:7070 a - 1733200000000000000 42 3145728 3145728 1 1733200000000000001 7\n",
	"P H 10.0.0.2:7070 s 10.0.0.1:7070 1733200000000000001 7 0 0 0 0 0\n",
	"P H 10.0.0.2:7070 l 10.0.0.1:7070 1 2 1048576 0 1 1 2\r\n",
	"P H 10.0.0.2:7070 r 10.0.0.1:7070 1 2 1048576 0 1 1 2\n",
	"P S\n", "P A 1234\n", "P T\n", "P D\n",
	"B 17\n", "H orders/42 3145729 29999706\n", "Z\n",
	"G 18 orders/42 3145730 30000000\n", "R 19 orders/42 3145730\n",
	"E 20 orders/42 3145730\n", "X 21 k 5 60000000\n",
	"O 22 1733200000000000000 43 4194304 5242880\n",
	"P H a x - 1 1 1 1 1 1 1\n", "P H 10.0.0.1:7070 a - 1 1 18446744073709551616 0 1 0 0\n",
	"G 1 k 0 1\n", "G 1 " + strings.Repeat("k", 251) + " 1 1\n", "P\n", "P  S\n", "\n",
	"B 1\nH k 1 1\nZ\nG 2 k 2 5\nR 3 k 2\n",
	strings.Repeat("x", 600) + "\nZ\n",
	"G 1 k 1 1",
	"H orders/42 3145729 29999706 web-3:4121\n",
	"K pool/db 3145729 29999706 3 web-3:4121\n",
	"K doc/7 3145729 29999706 0\n",
	"J 18 pool/db 3145730 30000000 3\n",
	"J 18 doc/7 3145730 30000000 0 reader-1\n",
	"G 18 orders/42 3145730 30000000 web-3:4121\n",
	"G 18 orders/42 3145730 30000000 " + strings.Repeat("o", 65) + "\n",
	"X 21 k 5 60000000 web-3\n",
	"H k 1 1 a b\n",
	"B 1\nH k 1 1 o\nZ\nG 2 k 2 5 o2\nX 3 k 2 9\nR 4 k 2\n",
	"g orders/42 _3o 1mDQ0\n", "r orders/42 _3o\n", "e k 5\n", "x k 5 0\n",
	"g orders/42 _3o 1mDQ0 web-3:4121\n", "g k 1 1 o\nr k 1\nJ 3 k 2 5 0\ng k 3 1\n",
	"g k 01 1\n", "g k 1 1\r\n", "r k\n1 1\n", "g k 1\n", "r k 1 1\n", "x k 5 0 o\n",
	"g k f0000000000 1\n", "g k @0000000000 1\n", "m k 1\n", "G 0 k 1 1\n", "R 0 k 1\n",
	// Grants of a session.
	"Y orders/42 3145729 29999706 8841\n", "Y orders/42 3145729 29999706 8841 web-3:4121\n",
	"V pool/db 3145729 29999706 3 8841 web-3:4121\n", "V doc/7 1 1 0 18446744073709551615\n",
	"F 18 orders/42 3145730 30000000 8841\n", "F 18 orders/42 3145730 30000000 8841 web-3:4121\n",
	"W 18 doc/7 3145730 30000000 0 8841 reader-1\n", "W 18 pool/db 3145730 30000000 3 8841\n",
	"f orders/42 _3o 1mDQ0 2I9\n", "f orders/42 _3o 1mDQ0 2I9 web-3:4121\n", "f k 1 1 0\n", "f k 1 1\n",
	"F 18 k 1 1 0\n", "Y k 1 1\n", "F 18 k 1 1 1 o x\n", "B 1\nY k 1 1 7\nZ\nf k 2 5 7\nr k 2\n",
}

func FuzzParse(f *testing.F) {
	for i, s := range frameSeeds {
		f.Add([]byte(s), []byte{1})
		f.Add([]byte(s), []byte{byte(i + 2), 1, 3})
	}
	f.Fuzz(func(t *testing.T, data, cuts []byte) {
		whole := parseAll(data, nil)
		split := parseAll(data, cuts)
		if len(whole) != len(split) {
			t.Fatalf("whole %d frames, split %d", len(whole), len(split))
		}
		for i := range whole {
			if whole[i] != split[i] {
				t.Fatalf("frame %d: whole %s, split %s", i, whole[i], split[i])
			}
		}
		var f Frame
		for len(data) > 0 {
			n, err := Parse(data, &f)
			if n == 0 {
				return
			}
			if n > MaxLine {
				t.Fatalf("took a %d-byte line", n)
			}
			// The one-pass record parser agrees with the general one
			// on every line it takes.
			line := bytes.TrimSuffix(bytes.TrimSuffix(data[:n], []byte("\n")), []byte("\r"))
			var fast, general Frame
			if parseRecord(line, &fast) && (!parseFields(line, &general) || fmt.Sprintf("%+v", fast) != fmt.Sprintf("%+v", general)) {
				t.Fatalf("%q: records parser %+v, general %+v", line, fast, general)
			}
			// A record of a plain lock says the same in either form.
			if err == nil && f.Key != nil && f.Mode == (engine.Mode{}) && f.Kind != Holder {
				other := f
				if f.Seq == 0 {
					other.Seq = 1
				} else {
					other.Seq = 0
				}
				enc := appendFrame(nil, &other)
				var again Frame
				if m, err := Parse(enc, &again); m != len(enc) || err != nil || show(&again) != show(&other) {
					t.Fatalf("%s in the other form %q → %d %v %s", show(&f), enc, m, err, show(&again))
				}
			}
			if err == nil {
				checkFrame(t, &f)
				// Encoded again, it parses to the same frame.
				enc := appendFrame(nil, &f)
				var again Frame
				if m, err := Parse(enc, &again); m != len(enc) || err != nil || show(&again) != show(&f) {
					t.Fatalf("%s → %q → %d %v %s", show(&f), enc, m, err, show(&again))
				}
			}
			data = data[n:]
		}
	})
}

// parseAll parses every frame of data, fed in pieces cut at cuts the way a
// reader sees them (each piece appended to what is still unparsed), and
// describes each result.
func parseAll(data, cuts []byte) []string {
	var out []string
	var buf []byte
	feed := func(b []byte) bool {
		buf = append(buf, b...)
		for {
			var f Frame
			n, err := Parse(buf, &f)
			if err == ErrLineTooLong && n == 0 {
				out = append(out, "too long")
				return false
			}
			if n == 0 {
				return true
			}
			if err != nil {
				out = append(out, "error "+err.Error())
			} else {
				out = append(out, show(&f))
			}
			buf = buf[n:]
		}
	}
	for _, c := range cuts {
		if len(data) == 0 {
			break
		}
		k := min(int(c)+1, len(data))
		if !feed(data[:k]) {
			return out
		}
		data = data[k:]
	}
	feed(data)
	return out
}

func show(f *Frame) string {
	g := *f
	return strings.NewReplacer("\n", `\n`).Replace(
		string(appendFrame(nil, &g)) + "|" + string(g.Key) + "|" + string(g.Owner) + "|" + string(g.From) + "|" + string(g.Active) + "|" + fmt.Sprint(g.Beat) + "|" + fmt.Sprint(g.Session, g.BySession))
}

func checkFrame(t *testing.T, f *Frame) {
	t.Helper()
	if f.Key != nil && (len(f.Key) == 0 || len(f.Key) > 250 || f.Token == 0) {
		t.Fatalf("a keyed frame with key %q token %d", f.Key, f.Token)
	}
	if bytes.ContainsAny(f.Key, " \n") || bytes.ContainsAny(f.From, " \n") || bytes.ContainsAny(f.Active, " \n") {
		t.Fatalf("a field holds a separator: %+v", f)
	}
	if f.Remaining < 0 {
		t.Fatalf("negative remaining %d", f.Remaining)
	}
	if f.Owner != nil && (f.Kind != Holder && f.Kind != Grant && f.Kind != Member && f.Kind != Join || len(f.Owner) == 0 || len(f.Owner) > 64 || bytes.ContainsAny(f.Owner, " \n")) {
		t.Fatalf("an owner %q on %c", f.Owner, f.Kind)
	}
	if f.Session != 0 && f.Kind != Holder && f.Kind != Grant && f.Kind != Member && f.Kind != Join {
		t.Fatalf("a session %d on %c", f.Session, f.Kind)
	}
}

// appendFrame encodes f with the package's encoders.
func appendFrame(dst []byte, f *Frame) []byte {
	if f.Peer {
		switch f.Kind {
		case Heartbeat:
			b := f.Beat
			b.Active = string(f.Active)
			return AppendHeartbeat(dst, string(f.From), &b)
		case Ack:
			return AppendAck(dst, f.Seq)
		}
		return AppendPeer(dst, f.Kind)
	}
	switch f.Kind {
	case Begin:
		return AppendBegin(dst, f.Seq)
	case Holder, Member:
		return AppendHolder(dst, f.Key, f.Token, f.Remaining, f.Owner, f.Mode, f.Session)
	case End:
		return AppendEnd(dst)
	case Handoff:
		return AppendHandoff(dst, f.Seq, f.Inc, f.HB, f.Range)
	}
	kind := f.Kind
	if f.BySession {
		kind = ReleaseBySession
	}
	if f.Seq == 0 {
		return AppendCompactRecord(dst, kind, f.Key, f.Token, f.Remaining, f.Owner, f.Session)
	}
	if kind == Join {
		kind = Grant // AppendRecord writes a grant with a mode as J
	}
	return AppendRecord(dst, kind, f.Seq, f.Key, f.Token, f.Remaining, f.Owner, f.Mode, f.Session)
}

// FuzzHandshake feeds arbitrary lines to both sides of the handshake: no
// line passes as a proof without the key.
func FuzzHandshake(f *testing.F) {
	kr, _ := NewKeyring(keyA)
	d, hello, _ := Dial(kr, nodeD, 5, nodeA, nil)
	_, challenge, _ := Accept(kr, nodeA, 9, line(hello), isPeer, nil)
	proof, _, _ := d.Challenge(line(challenge))
	for _, s := range [][]byte{hello, challenge, proof, []byte("N - - - -\n"), []byte("V -\n"), []byte("E N - no\n")} {
		f.Add(line(s), line(s))
	}
	f.Fuzz(func(t *testing.T, a, b []byte) {
		d, _, _ := Dial(kr, nodeD, 5, nodeA, nil)
		if _, _, err := d.Challenge(a); err == nil {
			t.Fatalf("challenge %q passed without the key", a)
		}
		acc, _, err := Accept(kr, nodeA, 9, a, isPeer, nil)
		if err != nil {
			return
		}
		if err := acc.Proof(b); err == nil {
			t.Fatalf("proof %q passed without the key", b)
		}
	})
}
