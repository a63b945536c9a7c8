package replica

import (
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
	b = AppendHolder(b, []byte("k/1"), 3, 1500, nil, engine.Mode{}) // 1.5 µs rounds up to 2
	b = AppendEnd(b)
	b = AppendRecord(b, Grant, 6, []byte("k/2"), 4, 30e9, nil, engine.Mode{})
	b = AppendRecord(b, Release, 7, []byte("k/2"), 4, 0, []byte("ignored"), engine.Mode{Slots: 3})
	b = AppendHandoff(b, 8, 7, 9, failover.Range{Lo: 1 << 20, Hi: 2 << 20})
	b = AppendHolder(b, []byte("k/3"), 10, 1e9, []byte("web-3:4121"), engine.Mode{})
	b = AppendRecord(b, Grant, 9, []byte("k/4"), 11, 1e9, []byte("batch-7"), engine.Mode{})
	b = AppendHolder(b, []byte("k/5"), 12, 1e9, nil, engine.Mode{Slots: 3})
	b = AppendRecord(b, Grant, 10, []byte("k/6"), 13, 2e9, []byte("r"), engine.Mode{Shared: true})
	b = AppendHolder(b, []byte("k/7"), 14, 1e9, []byte("w"), engine.Mode{Shared: true})
	b = AppendRecord(b, Grant, 11, []byte("k/8"), 15, 1e9, nil, engine.Mode{Slots: 1 << 16})
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

func TestParseRefusesBadFrames(t *testing.T) {
	for _, line := range []string{
		"Q 1\n", "G 1 k\n", "G x k 1 1\n", "P H a b\n", "P H a x - 1 1 1 1\n", "R 1 k 0\n",
		"P A\n", "Z extra\n", "G 1 k  1 1\n", "P Q\n", "K 1 2\n", "O 1 2 3 5 4\n",
		"P H a x - 1 1 1 1 1 0 0\n", "P H a a - 1 1 1 1 2 0 0\n",
		"G 1 k 1 1 o x\n", "G 1 k 1 1 " + string(make([]byte, 65)) + "\n", "X 1 k 1 1 o\n", "R 1 k 1 o\n",
		"H k 1 1 o x\n", "H k 1 1 o\x01\n", "G 1 k 1 1 é\n",
		"K k 1 1\n", "K k 1 1 x\n", "K k 1 1 -1\n", "K k 1 1 4294967296\n", "K k 1 1 2 o x\n",
		"J 1 k 1 1\n", "J 1 k 1 1 2 o x\n", "J 1 k 1 1 y\n", "J 1 k 0 1 2\n", "K k 0 1 0\n",
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

func TestHubSequencesAndSnapshots(t *testing.T) {
	var h Hub
	var out engine.Output
	out.WantRecords = true
	var tokens engine.Tokens
	sh := engine.NewShard(engine.Config{}, &tokens, 0)
	sh.Acquire(0, 1, []byte("before"), 10e9, 0, &out)
	if seq := h.Records(0, &out); seq != 1 {
		t.Fatalf("seq %d", seq)
	}
	out.Reset()
	woken, killed := 0, 0
	s := NewSub(1, func() { woken++ }, func() { killed++ })
	begin := h.Subscribe(s)
	if string(begin) != "B 1\n" {
		t.Fatalf("begin %q", begin)
	}
	// A record made while the snapshot is being sent waits for it.
	sh.AcquireBy(0, 1, []byte("after"), []byte("web-3:4121"), 10e9, 0, &out)
	h.Records(0, &out)
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
	s = NewSub(1, func() {}, func() { killed++ })
	h.Subscribe(s)
	h.SnapshotDone(s)
	out.Reset()
	for range MaxBacklog/32 + 1 {
		sh.Acquire(0, 1, []byte("k"), 10e9, 0, &out)
		sh.Release(0, 1, []byte("k"), out.Answers[0].Token, &out)
		h.Records(0, &out)
		out.Reset()
		if killed > 0 {
			break
		}
	}
	if killed != 1 || !s.dead {
		t.Fatalf("a standby %d bytes behind: killed %d", MaxBacklog, killed)
	}
}
