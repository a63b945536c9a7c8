package replica

import (
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/kunci/kunci/engine"
	"github.com/kunci/kunci/failover"
)

func TestFramesRoundTrip(t *testing.T) {
	hb := failover.Heartbeat{Role: failover.Active, Inc: 7, HB: 8, Ceiling: 9 << 20, Issuing: 9 << 20, Synced: true, EchoInc: 5, EchoHB: 6}
	var b []byte
	b = AppendHeartbeat(b, "10.0.0.1:7070", &hb)
	b = AppendPeer(b, Sync)
	b = AppendAck(b, 42)
	b = AppendBegin(b, 5)
	b = AppendHolder(b, []byte("k/1"), 3, 1500, nil, engine.Mode{}, 0) // 1.5 µs rounds up to 2
	b = AppendEnd(b)
	b = AppendRecord(b, Grant, 6, []byte("k/2"), 4, 30e9, nil, engine.Mode{}, 0)
	b = AppendRecord(b, Release, 7, []byte("k/2"), 4, 0, []byte("ignored"), engine.Mode{Slots: 3}, 0)
	b = AppendHandoff(b, 8, 7, 9, failover.Range{Lo: 1 << 20, Hi: 2 << 20})
	b = AppendHolder(b, []byte("k/3"), 10, 1e9, []byte("web-3:4121"), engine.Mode{}, 0)
	b = AppendRecord(b, Grant, 9, []byte("k/4"), 11, 1e9, []byte("batch-7"), engine.Mode{}, 0)
	b = AppendHolder(b, []byte("k/5"), 12, 1e9, nil, engine.Mode{Slots: 3}, 0)
	b = AppendRecord(b, Grant, 10, []byte("k/6"), 13, 2e9, []byte("r"), engine.Mode{Shared: true}, 0)
	b = AppendHolder(b, []byte("k/7"), 14, 1e9, []byte("w"), engine.Mode{Shared: true}, 0)
	b = AppendRecord(b, Grant, 11, []byte("k/8"), 15, 1e9, nil, engine.Mode{Slots: 1 << 16}, 0)
	var got []Frame
	for len(b) > 0 {
		var f Frame
		n, err := Parse(b, &f)
		if err != nil || n == 0 {
			t.Fatalf("Parse(%q): %d %v", b, n, err)
		}
		f.Key, f.From, f.Active = append([]byte(nil), f.Key...), append([]byte(nil), f.From...), append([]byte(nil), f.Active...)
		f.Owner = append([]byte(nil), f.Owner...)
		got = append(got, f)
		b = b[n:]
	}
	if h := got[0]; !h.Peer || h.Kind != Heartbeat || string(h.From) != "10.0.0.1:7070" || len(h.Active) != 0 || h.Beat != hb {
		t.Fatalf("heartbeat %+v", h)
	}
	if got[1].Kind != Sync || got[2].Seq != 42 || got[3].Seq != 5 {
		t.Fatalf("%+v %+v %+v", got[1], got[2], got[3])
	}
	if h := got[4]; string(h.Key) != "k/1" || h.Token != 3 || h.Remaining != 2000 {
		t.Fatalf("holder %+v", h)
	}
	if g := got[6]; g.Kind != Grant || g.Seq != 6 || string(g.Key) != "k/2" || g.Token != 4 || g.Remaining != 30e9 {
		t.Fatalf("grant %+v", g)
	}
	if r, o := got[7], got[8]; r.Kind != Release || r.Token != 4 || len(r.Owner) != 0 || o.Inc != 7 || o.HB != 9 || o.Range != (failover.Range{Lo: 1 << 20, Hi: 2 << 20}) {
		t.Fatalf("%+v %+v", r, o)
	}
	if h := got[9]; h.Kind != Holder || string(h.Key) != "k/3" || string(h.Owner) != "web-3:4121" || h.Remaining != 1e9 {
		t.Fatalf("holder with an owner %+v", h)
	}
	if g := got[10]; g.Kind != Grant || string(g.Key) != "k/4" || g.Token != 11 || string(g.Owner) != "batch-7" {
		t.Fatalf("grant with an owner %+v", g)
	}
	if k := got[11]; k.Kind != Member || string(k.Key) != "k/5" || k.Token != 12 || k.Mode != (engine.Mode{Slots: 3}) || k.Owner != nil {
		t.Fatalf("semaphore holder %+v", k)
	}
	if j := got[12]; j.Kind != Join || j.Seq != 10 || string(j.Key) != "k/6" || j.Token != 13 || j.Remaining != 2e9 || !j.Mode.Shared || string(j.Owner) != "r" {
		t.Fatalf("shared grant %+v", j)
	}
	if k := got[13]; k.Kind != Member || !k.Mode.Shared || string(k.Owner) != "w" {
		t.Fatalf("shared holder %+v", k)
	}
	if j := got[14]; j.Kind != Join || j.Mode != (engine.Mode{Slots: 1 << 16}) {
		t.Fatalf("semaphore grant %+v", j)
	}
	if got[6].Mode != (engine.Mode{}) || got[4].Mode != (engine.Mode{}) {
		t.Fatalf("a mode on G or H: %+v %+v", got[6], got[4])
	}
	if len(got[4].Owner) != 0 || len(got[6].Owner) != 0 {
		t.Fatalf("owners where none was given: %q %q", got[4].Owner, got[6].Owner)
	}
}

// The compact form says what the full form does, but the sequence number.
func TestCompactRecordsRoundTrip(t *testing.T) {
	records := []struct {
		kind      Kind
		key       string
		token     uint64
		remaining int64
		owner     string
		sess      uint64
	}{
		{Grant, "orders/42", 3_000_000, 30e9, "", 0},
		{Grant, "k", 1, 1500, "web-3:4121", 0}, // 1.5 µs rounds up to 2
		{Release, "orders/42", 3_000_000, 0, "", 0},
		{Expire, "k", 1, 0, "", 0},
		{Extend, "k", 1, 0, "", 0},
		{Grant, "big", 1<<64 - 1, 1 << 62, "", 0}, // past maxRemaining µs
		{Release, "big", 1<<64 - 1, 0, "", 0},
		{Extend, "k/2", 63, 64e3, "", 0},
		{Grant, "orders/42", 3_000_000, 30e9, "", 8841},
		{Grant, "k", 1, 1500, "web-3:4121", 1<<64 - 1},
		{Release, "k", 1, 0, "", 8841}, // a session goes with grants only
	}
	for i, r := range records {
		compact := AppendCompactRecord(nil, r.kind, []byte(r.key), r.token, r.remaining, []byte(r.owner), r.sess)
		full := AppendRecord(nil, r.kind, uint64(i+1), []byte(r.key), r.token, r.remaining, []byte(r.owner), engine.Mode{}, r.sess)
		if len(compact) >= len(full) {
			t.Errorf("%q is no shorter than %q", compact, full)
		}
		var c, f Frame
		if n, err := Parse(compact, &c); n != len(compact) || err != nil {
			t.Fatalf("Parse(%q): %d %v", compact, n, err)
		}
		if n, err := Parse(full, &f); n != len(full) || err != nil {
			t.Fatalf("Parse(%q): %d %v", full, n, err)
		}
		if c.Seq != 0 || f.Seq != uint64(i+1) {
			t.Fatalf("%q has seq %d, %q %d", compact, c.Seq, full, f.Seq)
		}
		c.Seq = f.Seq
		if show(&c) != show(&f) {
			t.Fatalf("%q parses to %s, %q to %s", compact, show(&c), full, show(&f))
		}
		if want := sessionOf(r.kind, r.sess); c.Session != want || c.Kind != r.kind {
			t.Fatalf("%q: kind %c session %d, want %c %d", compact, c.Kind, c.Session, r.kind, want)
		}
	}
	// The digits: 64 is "10", 63 "o".
	if got := string(AppendCompactRecord(nil, Extend, []byte("k"), 64, 63e3, nil, 0)); got != "x k 10 o\n" {
		t.Fatalf("extend: %q", got)
	}
}

// A grant of a session travels as its own kind of frame, so that a cluster
// whose clients name no session keeps the frames of earlier versions; it
// parses to its twin with the session.
func TestGrantsOfASessionRoundTrip(t *testing.T) {
	const sess = 8841
	for _, tc := range []struct {
		enc  []byte
		want string // the frame as written
		kind Kind
		mode engine.Mode
	}{
		{AppendHolder(nil, []byte("k"), 3, 1e9, nil, engine.Mode{}, sess), "Y k 3 1000000 8841\n", Holder, engine.Mode{}},
		{AppendHolder(nil, []byte("k"), 3, 1e9, []byte("o"), engine.Mode{Slots: 2}, sess), "V k 3 1000000 2 8841 o\n", Member, engine.Mode{Slots: 2}},
		{AppendRecord(nil, Grant, 9, []byte("k"), 4, 1e9, []byte("o"), engine.Mode{}, sess), "F 9 k 4 1000000 8841 o\n", Grant, engine.Mode{}},
		{AppendRecord(nil, Grant, 9, []byte("k"), 4, 1e9, nil, engine.Mode{Shared: true}, sess), "W 9 k 4 1000000 0 8841\n", Join, engine.Mode{Shared: true}},
		{AppendCompactRecord(nil, Grant, []byte("k"), 4, 1e9, nil, sess), "f k 4 3d90 2:9\n", Grant, engine.Mode{}},
	} {
		if string(tc.enc) != tc.want {
			t.Errorf("encoded %q, want %q", tc.enc, tc.want)
		}
		var f Frame
		if n, err := Parse(tc.enc, &f); n != len(tc.enc) || err != nil {
			t.Fatalf("Parse(%q): %d %v", tc.enc, n, err)
		}
		if f.Kind != tc.kind || f.Session != sess || f.Mode != tc.mode || string(f.Key) != "k" {
			t.Errorf("%q parses to %s: kind %c session %d mode %+v", tc.enc, show(&f), f.Kind, f.Session, f.Mode)
		}
	}
	// A release by the grant's own session.
	for _, enc := range [][]byte{AppendRecord(nil, ReleaseBySession, 9, []byte("k"), 4, 0, nil, engine.Mode{}, 0),
		AppendCompactRecord(nil, ReleaseBySession, []byte("k"), 4, 0, nil, 0)} {
		var f Frame
		if n, err := Parse(enc, &f); n != len(enc) || err != nil || f.Kind != Release || !f.BySession || f.Token != 4 {
			t.Errorf("%q parses to %s (%d %v)", enc, show(&f), n, err)
		}
	}
	// Refused: no session, a session of 0, one field too many.
	for _, line := range []string{"Y k 3 1\n", "Y k 3 1 0\n", "F 9 k 4 1 8841 o x\n", "f k 4 1 0\n", "W 9 k 4 1 0\n"} {
		var f Frame
		if n, err := Parse([]byte(line), &f); err == nil {
			t.Errorf("%q accepted (%d) as %s", line, n, show(&f))
		}
	}
}

func TestParseRefusesBadFrames(t *testing.T) {
	for _, line := range []string{
		"Q 1\n", "G 1 k\n", "G x k 1 1\n", "P H a b\n", "P H a x - 1 1 1 1\n", "R 1 k 0\n",
		"P A\n", "Z extra\n", "G 1 k  1 1\n", "P Q\n", "K 1 2\n", "O 1 2 3 5 4\n",
		"P H a x - 1 1 1 1 1 0 0\n", "P H a a - 1 1 1 1 2 0 0\n",
		"G 1 k 1 1 o x\n", "G 1 k 1 1 " + string(make([]byte, 65)) + "\n", "X 1 k 1 1 o\n", "R 1 k 1 o\n",
		"H k 1 1 o x\n", "H k 1 1 o\x01\n", "G 1 k 1 1 é\n",
		"K k 1 1\n", "K k 1 1 x\n", "K k 1 1 -1\n", "K k 1 1 4294967296\n", "K k 1 1 2 o x\n",
		"J 1 k 1 1\n", "J 1 k 1 1 2 o x\n", "J 1 k 1 1 y\n", "J 1 k 0 1 2\n", "K k 0 1 0\n",
		"G 0 k 1 1\n", "R 0 k 1\n", "X 0 k 1 1\n", "J 0 k 1 1 2\n", // 0 is the compact form's
		"g k 0 1\n", "g k 01 1\n", "g k 1\n", "g k 1 1 o x\n", "g  1 1\n", "r k 1 1\n", "x k 1 1 o\n",
		"g k p 1\n", "g k 1 1\r\n", "G k 1 1\n", "j k 1 1 2\n", "h k 1 1\n", "g k 1 g0000000000\n",
		"g k 1 1 " + string(make([]byte, 65)) + "\n", "g k 100000000000 1\n", "r k 1" + strings.Repeat("0", 600) + "\n",
	} {
		var f Frame
		if _, err := Parse([]byte(line), &f); err == nil {
			t.Errorf("Parse(%q) accepted: %+v", line, f)
		}
	}
	var f Frame
	long := make([]byte, MaxLine+1)
	if _, err := Parse(long, &f); err != ErrLineTooLong {
		t.Fatalf("long line: %v", err)
	}
}

// During an upgrade from v2 an active streams to standbys of both versions:
// each gets the same records, a v2 one in full and a v3 one in the compact
// form (plain locks' records; a semaphore's grant is in full there too).
func TestHubWritesEachStreamInItsForm(t *testing.T) {
	var h Hub
	v2, v3, v3b := NewSub(1, 2, func() {}, func() {}), NewSub(2, 3, func() {}, func() {}), NewSub(3, 3, func() {}, func() {})
	sh := engine.NewShard(engine.Config{}, new(engine.Tokens), 0)
	var out engine.Output
	out.WantRecords = true
	sh.Acquire(0, 1, []byte("old"), 10e9, 0, &out)
	h.Records(0, &out) // record 1, before the subscriptions
	out.Reset()
	for _, s := range []*Sub{v2, v3, v3b} {
		h.Subscribe(s)
		h.SnapshotDone(s)
	}
	sh.AcquireBy(0, 1, []byte("a"), []byte("web-3:4121"), 10e9, 0, &out)
	sh.AcquireMode(0, 1, []byte("pool"), nil, engine.Mode{Slots: 3}, 10e9, 0, &out)
	h.Records(0, &out)
	tokA, tokPool := out.Answers[0].Token, out.Answers[1].Token
	out.Reset()
	sh.Extend(1e9, 1, []byte("a"), tokA, 20e9, &out)
	sh.Release(1e9, 1, []byte("a"), tokA, &out)
	sh.Release(1e9, 1, []byte("pool"), tokPool, &out)
	if seq := h.Records(1e9, &out); seq != 6 {
		t.Fatalf("last record %d, want 6", seq)
	}
	full, compact := string(h.Take(v2)), string(h.Take(v3))
	want := fmt.Sprintf("G 2 a %d 10000000 web-3:4121\nJ 3 pool %d 10000000 3\nX 4 a %d 20000000\nR 5 a %d\nR 6 pool %d\n", tokA, tokPool, tokA, tokA, tokPool)
	if full != want {
		t.Fatalf("v2 stream %q, want %q", full, want)
	}
	if other := string(h.Take(v3b)); other != compact {
		t.Fatalf("the v3 streams differ: %q and %q", compact, other)
	}
	// Numbered from the snapshot's record on (B 1), the compact stream
	// says what the full one does.
	frames := func(b string, seq uint64) (out []string) {
		for len(b) > 0 {
			var f Frame
			n, err := Parse([]byte(b), &f)
			if n == 0 || err != nil {
				t.Fatalf("Parse(%q): %d %v", b, n, err)
			}
			if f.Seq == 0 {
				f.Seq = seq + 1
			}
			seq = f.Seq
			out = append(out, show(&f))
			b = b[n:]
		}
		return out
	}
	if a, b := frames(full, 1), frames(compact, 1); !slices.Equal(a, b) {
		t.Fatalf("full %q\n%v\ncompact %q\n%v", full, a, compact, b)
	}
	if !strings.HasPrefix(compact, "g a ") || strings.Count(compact, "\n") != 5 || len(compact) >= len(full) {
		t.Fatalf("v3 stream %q", compact)
	}
}

// A compact stream still numbers every 64th record, in full, so that a
// standby checks its count at least that often.
func TestCompactStreamNumbersEvery64thRecord(t *testing.T) {
	var h Hub
	s := NewSub(1, 3, func() {}, func() {})
	h.Subscribe(s)
	h.SnapshotDone(s)
	sh := engine.NewShard(engine.Config{}, new(engine.Tokens), 0)
	var out engine.Output
	out.WantRecords = true
	for range 65 { // 130 records
		sh.Acquire(0, 1, []byte("k"), 10e9, 0, &out)
		sh.Release(0, 1, []byte("k"), out.Answers[0].Token, &out)
		h.Records(0, &out)
		out.Reset()
	}
	b, seq := h.Take(s), uint64(0)
	var numbered []uint64
	for len(b) > 0 {
		var f Frame
		n, err := Parse(b, &f)
		if n == 0 || err != nil {
			t.Fatalf("Parse(%q): %d %v", b, n, err)
		}
		if f.Seq != 0 {
			if f.Seq != seq+1 {
				t.Fatalf("record %d numbered %d", seq+1, f.Seq)
			}
			numbered = append(numbered, f.Seq)
		}
		seq++
		b = b[n:]
	}
	if seq != 130 || !slices.Equal(numbered, []uint64{64, 128}) {
		t.Fatalf("%d records, numbered in full: %v, want 130 and [64 128]", seq, numbered)
	}
}

// recordingShard returns a shard of its own tokens, and an Output that
// gathers its records.
func recordingShard() (*engine.Shard, *engine.Output) {
	out := &engine.Output{WantRecords: true}
	return engine.NewShard(engine.Config{}, new(engine.Tokens), 0), out
}

func TestHubSequencesAndSnapshots(t *testing.T) {
	var h Hub
	sh, out := recordingShard()
	sh.Acquire(0, 1, []byte("before"), 10e9, 0, out)
	if seq := h.Records(0, out); seq != 1 {
		t.Fatalf("seq %d", seq)
	}
	out.Reset()
	woken, killed := 0, 0
	s := NewSub(1, 2, func() { woken++ }, func() { killed++ }) // records in full
	begin := h.Subscribe(s)
	if string(begin) != "B 1\n" {
		t.Fatalf("begin %q", begin)
	}
	// A record made while the snapshot is being sent waits for it.
	sh.AcquireBy(0, 1, []byte("after"), []byte("web-3:4121"), 10e9, 0, out)
	h.Records(0, out)
	if woken != 0 {
		t.Fatal("woken during the snapshot")
	}
	h.SnapshotDone(s)
	got := string(h.Take(s))
	want := "G 2 after 2 10000000 web-3:4121\n"
	if got != want || woken != 1 {
		t.Fatalf("stream %q (woken %d), want %q", got, woken, want)
	}
	if m, ok := h.MinAcked(); ok || s.Synced() {
		t.Fatalf("acknowledged before the ack: %d %v", m, ok)
	}
	s.Ack(2)
	if m, ok := h.MinAcked(); !ok || m != 2 || !s.Synced() {
		t.Fatalf("after the ack: %d %v", m, ok)
	}
	h.Remove(s)
	if killed != 0 || len(h.Subs()) != 0 {
		t.Fatalf("remove: killed %d, subs %d", killed, len(h.Subs()))
	}
	// A standby more than MaxBacklog behind is killed.
	s = NewSub(1, 3, func() {}, func() { killed++ })
	h.Subscribe(s)
	h.SnapshotDone(s)
	out.Reset()
	for range MaxBacklog/16 + 1 { // at least 16 bytes a cycle, compact
		sh.Acquire(0, 1, []byte("k"), 10e9, 0, out)
		sh.Release(0, 1, []byte("k"), out.Answers[0].Token, out)
		h.Records(0, out)
		out.Reset()
		if killed > 0 {
			break
		}
	}
	if killed != 1 || !s.dead {
		t.Fatalf("a standby %d bytes behind: killed %d", MaxBacklog, killed)
	}
}

// A synced standby's stream that lapses (its link broke) is streamed to no
// more, but its acknowledgements count in MinAcked until it is removed:
// once, by Remove or by RemoveLapsed when the standby synced again.
func TestHubCountsALapsedStreamUntilRemoved(t *testing.T) {
	var h Hub
	sh, out := recordingShard()
	behind, ahead := NewSub(1, 3, func() {}, func() {}), NewSub(2, 3, func() {}, func() {})
	for _, s := range []*Sub{behind, ahead} {
		h.Subscribe(s)
		h.SnapshotDone(s)
	}
	unsynced := NewSub(3, 3, func() {}, func() {})
	h.Subscribe(unsynced)
	if h.Lapse(unsynced, 0) {
		t.Fatal("a stream that never synced lapsed")
	}
	h.Remove(unsynced)
	sh.Acquire(0, 1, []byte("k"), 10e9, 0, out)
	seq := h.Records(0, out)
	behind.Ack(seq - 1)
	ahead.Ack(seq)
	if !h.Lapse(behind, 100) {
		t.Fatal("a synced stream did not lapse")
	}
	out.Reset()
	sh.Acquire(0, 2, []byte("k2"), 10e9, 0, out)
	h.Records(0, out)
	if b := h.Take(behind); len(b) != 0 {
		t.Fatalf("a lapsed stream was given %q", b)
	}
	if m, ok := h.MinAcked(); !ok || m != seq-1 {
		t.Fatalf("MinAcked %d %v, want the lapsed stream's %d", m, ok, seq-1)
	}
	if len(h.Lags()) != 1 {
		t.Fatalf("lags %+v: a lapsed stream lags no more", h.Lags())
	}
	if h.RemoveLapsed(2) {
		t.Fatal("removed a live stream as lapsed")
	}
	if got := h.ExpireLapsed(100); len(got) != 0 {
		t.Fatalf("ExpireLapsed(100) removed %v, which lapsed at 100", got)
	}
	if !h.RemoveLapsed(1) || h.Remove(behind) || h.RemoveLapsed(1) || len(h.ExpireLapsed(1000)) != 0 {
		t.Fatal("the lapsed stream was not removed exactly once")
	}
	// Lapsed again (a test's liberty), it expires once its time is past.
	h.subs = append(h.subs, behind)
	behind.dead = false
	if !h.Lapse(behind, 200) || len(h.ExpireLapsed(200)) != 0 {
		t.Fatal("lapse at 200")
	}
	if got := h.ExpireLapsed(201); len(got) != 1 || got[0] != 1 || len(h.ExpireLapsed(300)) != 0 {
		t.Fatalf("ExpireLapsed(201) removed %v, want [1] once", got)
	}
	// A stream of a peer that has another synced stream does not lapse.
	again := NewSub(2, 3, func() {}, func() {})
	h.Subscribe(again)
	h.SnapshotDone(again)
	again.Ack(seq)
	if h.Lapse(again, 300) {
		t.Fatal("a stream lapsed beside another synced stream of its peer")
	}
	if m, ok := h.MinAcked(); !ok || m != seq {
		t.Fatalf("MinAcked %d %v after the lapsed stream left, want %d", m, ok, seq)
	}
}
