package replica

import (
	"bytes"
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"
)

var (
	testSendKey = SessionKey{key: bytes.Repeat([]byte{1}, 32), gmac: true}
	testRecvKey = SessionKey{key: bytes.Repeat([]byte{2}, 32), gmac: true}
)

// testMACs are the two seals a link may speak: the tests of both run with
// each, as send and receive keys.
var testMACs = []struct {
	name       string
	send, recv SessionKey
}{
	{"gmac", testSendKey, testRecvKey},
	{"hmac", SessionKey{key: testSendKey.key}, SessionKey{key: testRecvKey.key}},
}

// seal seals each batch in turn, as a link's writer would.
func seal(key SessionKey, batches ...string) []byte {
	s := NewSealer(key)
	var out []byte
	for _, b := range batches {
		out = append(out, b...)
		out = append(out, s.Seal([]byte(b))...)
	}
	return out
}

// open feeds stream to an Opener in pieces cut at random and returns the
// batches it let through, and its error.
func open(key SessionKey, stream []byte, rng *rand.Rand) ([]string, error) {
	o := NewOpener(key)
	var got []string
	var buf []byte
	for len(stream) > 0 {
		k := 1 + rng.IntN(min(len(stream), 64))
		buf = append(buf, stream[:k]...)
		stream = stream[k:]
		for {
			n, batch, err := o.Open(buf)
			if err != nil {
				return got, err
			}
			if n == 0 {
				break
			}
			got = append(got, string(batch))
			buf = buf[n:]
		}
	}
	return got, nil
}

var testBatches = []string{
	"P H 127.0.0.1:7001 a 127.0.0.1:7001 5 1 1048576 0 1 4 2\n",
	"G 1 orders/42 7 30000000 billing\nR 2 orders/42 7\n",
	"B 2\nH jobs/1 3 5000000\nZ\n",
}

func TestSealedBatchesOpen(t *testing.T) {
	for _, mac := range testMACs {
		stream := seal(mac.send, testBatches...)
		for seed := range uint64(50) {
			got, err := open(mac.send, stream, rand.New(rand.NewPCG(seed, 1)))
			if err != nil || fmt.Sprint(got) != fmt.Sprint(testBatches) {
				t.Fatalf("%s, seed %d: %q, %v; want %q", mac.name, seed, got, err, testBatches)
			}
		}
	}
}

// A batch sealed with one MAC does not open with the other under the same
// key bytes: ends that disagree on the version close the link at once.
func TestSealsDoNotOpenEachOther(t *testing.T) {
	for i, mac := range testMACs {
		other := testMACs[1-i]
		if got, err := open(other.send, seal(mac.send, testBatches...), rand.New(rand.NewPCG(1, 1))); err == nil || len(got) != 0 {
			t.Errorf("%s's batches opened as %s: %q, %v", mac.name, other.name, got, err)
		}
	}
}

// Whatever the path does to the stream, no frame it touched is let through.
func TestSealedBatchesRefuseTampering(t *testing.T) {
	for _, mac := range testMACs {
		t.Run(mac.name, func(t *testing.T) { refuseTampering(t, mac.send, mac.recv) })
	}
}

func refuseTampering(t *testing.T, testSendKey, testRecvKey SessionKey) {
	good := seal(testSendKey, testBatches...)
	forged := "G 3 forged 4242 600000000\n"
	cases := map[string][]byte{
		"a byte changed":    bytes.Replace(good, []byte("orders/42 7 3"), []byte("orders/42 8 3"), 1),
		"a frame prepended": append([]byte(forged), good...),
		"a batch dropped":   seal(testSendKey, testBatches[0], testBatches[2])[:0], // filled below
		"batches reordered": nil,
		"a batch replayed":  nil,
		"reflected":         seal(testRecvKey, testBatches...),
		"a forged MAC line": append(append([]byte(nil), forged...), "M 00000000000000000000000000000000\n"...),
		"an empty batch":    []byte("M 00000000000000000000000000000000\n"),
		"a short MAC line":  append([]byte(testBatches[0]), "M 00\n"...),
	}
	// Dropped, reordered and replayed batches are made of the real sealed
	// batches, each with its own MAC line.
	var pieces [][]byte
	rest := good
	for range testBatches {
		i := bytes.Index(rest, []byte("\nM ")) + 1
		n := i + macLineLen
		pieces = append(pieces, rest[:n])
		rest = rest[n:]
	}
	cases["a frame inserted"] = bytes.Join([][]byte{pieces[0], []byte(forged), pieces[1], pieces[2]}, nil)
	cases["a batch dropped"] = bytes.Join([][]byte{pieces[0], pieces[2]}, nil)
	cases["batches reordered"] = bytes.Join([][]byte{pieces[1], pieces[0], pieces[2]}, nil)
	cases["a batch replayed"] = bytes.Join([][]byte{pieces[0], pieces[1], pieces[1]}, nil)
	for name, stream := range cases {
		got, err := open(testSendKey, stream, rand.New(rand.NewPCG(1, 2)))
		for _, b := range got {
			if !bytes.Contains(good, []byte(b)) || bytes.Contains([]byte(b), []byte("forged")) {
				t.Errorf("%s: let %q through", name, b)
			}
		}
		if err == nil {
			t.Errorf("%s: no error (let through %q)", name, got)
		}
	}
	// A frame added at the end waits for a MAC line that never checks: it
	// is not let through (the next real batch fails the check).
	if got, _ := open(testSendKey, append(bytes.Clone(good), forged...), rand.New(rand.NewPCG(1, 4))); len(got) != len(testBatches) {
		t.Errorf("a frame appended: %q let through", got)
	}
	// Truncated: what is cut off is never let through, and the batches
	// before it are.
	cut := good[:len(good)-5]
	if got, err := open(testSendKey, cut, rand.New(rand.NewPCG(1, 3))); err != nil || len(got) != 2 {
		t.Errorf("truncated stream: %q, %v; want the first two batches", got, err)
	}
}

// A batch that passes MaxBatch without a MAC line closes the link, rather
// than make the receiver hold it without bound.
func TestSealedBatchBound(t *testing.T) {
	line := []byte("G 1 k 1 1000\n")
	o := NewOpener(testSendKey)
	var buf []byte
	for len(buf) <= MaxBatch+macLineLen {
		buf = append(buf, line...)
		if _, _, err := o.Open(buf); err != nil {
			if len(buf) <= MaxBatch {
				t.Fatalf("refused at %d bytes, within MaxBatch", len(buf))
			}
			return
		}
	}
	t.Fatalf("%d bytes without a MAC line taken", len(buf))
}

func TestSplitKeepsFramesWhole(t *testing.T) {
	var b []byte
	for i := 0; len(b) < 3*MaxBatch; i++ {
		b = fmt.Appendf(b, "G %d key%d 7 30000000\n", i, i)
	}
	s := NewSealer(testSendKey)
	var stream []byte
	for rest := b; len(rest) > 0; {
		batch := Split(rest)
		if len(batch) > MaxBatch || batch[len(batch)-1] != '\n' {
			t.Fatalf("a batch of %d bytes ending %q", len(batch), batch[len(batch)-1])
		}
		stream = append(append(stream, batch...), s.Seal(batch)...)
		rest = rest[len(batch):]
	}
	got, err := open(testSendKey, stream, rand.New(rand.NewPCG(4, 4)))
	if err != nil || len(bytes.Join(func() [][]byte {
		var out [][]byte
		for _, g := range got {
			out = append(out, []byte(g))
		}
		return out
	}(), nil)) != len(b) {
		t.Fatalf("split stream: %d batches, %v", len(got), err)
	}
}

func TestSealAndOpenAllocateNothing(t *testing.T) {
	for _, mac := range testMACs {
		s, o := NewSealer(mac.send), NewOpener(mac.send)
		batch := []byte(testBatches[1])
		buf := make([]byte, 0, 256)
		allocs := testing.AllocsPerRun(100, func() {
			buf = append(append(buf[:0], batch...), s.Seal(batch)...)
			if n, _, err := o.Open(buf); n == 0 || err != nil {
				panic(err)
			}
		})
		if allocs != 0 {
			t.Fatalf("%s: %v allocations per sealed and opened batch", mac.name, allocs)
		}
	}
}

// What sealing costs a link: a batch of 16 records (a loop turn under
// load) and one heartbeat.
func BenchmarkSeal(b *testing.B) {
	for _, frames := range []int{1, 16, 256} {
		var batch []byte
		for i := range frames {
			batch = fmt.Appendf(batch, "G %d orders/%d 1234567 30000000\n", i, i)
		}
		for _, mac := range testMACs {
			b.Run(fmt.Sprintf("mac=%s/frames=%d", mac.name, frames), func(b *testing.B) { benchSealOpen(b, mac.send, batch) })
		}
	}
}

// benchSealOpen seals batch under key and opens it, again and again.
func benchSealOpen(b *testing.B, key SessionKey, batch []byte) {
	s, o := NewSealer(key), NewOpener(key)
	buf := make([]byte, 0, len(batch)+macLineLen)
	b.SetBytes(int64(len(batch)))
	b.ReportAllocs()
	for b.Loop() {
		buf = append(append(buf[:0], batch...), s.Seal(batch)...)
		if n, _, err := o.Open(buf); n == 0 || err != nil {
			b.Fatal(err)
		}
	}
}

// Open never panics, never lets through a batch it was not sealed with, and
// lets through every batch of a sealed stream however it is cut.
func FuzzOpen(f *testing.F) {
	f.Add(seal(testSendKey, testBatches...), uint64(1))
	f.Add([]byte("G 1 k 1 1\nM 00000000000000000000000000000000\n"), uint64(2))
	f.Add([]byte("M \n\n\nM zz\n"), uint64(3))
	f.Fuzz(func(t *testing.T, stream []byte, seed uint64) {
		good := seal(testSendKey, testBatches...)
		got, err := open(testSendKey, stream, rand.New(rand.NewPCG(seed, 5)))
		sent := strings.Join(testBatches, "")
		for i, b := range got {
			if i >= len(testBatches) || b != testBatches[i] {
				t.Fatalf("let through %q, never sealed in that place (stream %q)", b, stream)
			}
		}
		if bytes.Equal(stream, good) && (err != nil || strings.Join(got, "") != sent) {
			t.Fatalf("the sealed stream opened as %q, %v", got, err)
		}
	})
}
