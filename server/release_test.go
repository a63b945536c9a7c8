package server_test

import (
	"bytes"
	"fmt"
	"io"
	"runtime/metrics"
	"testing"
	"time"

	"github.com/kunci/kunci/internal/testnode"
)

// heapSamples are the figures heapHeld reads, made once: the test's polling
// must not allocate, for the node to see the process calm.
var heapSamples = []metrics.Sample{
	{Name: "/memory/classes/heap/objects:bytes"},
	{Name: "/memory/classes/heap/unused:bytes"},
	{Name: "/memory/classes/heap/free:bytes"},
	{Name: "/gc/heap/live:bytes"},
}

// heapHeld returns the process's heap pages not handed back to the system,
// and its live heap as of the last collection. One goroutine at a time.
func heapHeld() (held, live uint64) {
	s := heapSamples
	metrics.Read(s)
	return s[0].Value.Uint64() + s[1].Value.Uint64() + s[2].Value.Uint64(), s[3].Value.Uint64()
}

// A burst of keys, taken pipelined and let expire, leaves the node's heap
// full of what it freed (outgrown tables, chunks of locks): once it has
// passed, the node hands that memory back to the system by itself, with no
// buffer pressure and no request. (Go would keep it: it returns memory only
// above its heap goal, twice the live heap of the last collection.)
func TestMemoryOfABurstIsHandedBack(t *testing.T) {
	const keys = 300_000
	n := startNode(t, nil)
	before, _ := heapHeld()

	c := testnode.Dial(t, n.Addr(), time.Minute)
	var req bytes.Buffer
	for i := range keys {
		fmt.Fprintf(&req, "A burst%07d 1 0\n", i)
	}
	done := make(chan error, 1)
	go func() {
		_, err := c.Write(req.Bytes())
		done <- err
	}()
	buf := make([]byte, 64<<10)
	for got := 0; got < keys; {
		m, err := c.Read(buf)
		if err != nil && err != io.EOF {
			t.Fatalf("after %d answers: %v", got, err)
		}
		if bytes.Contains(buf[:m], []byte("\nE ")) || got == 0 && bytes.HasPrefix(buf[:m], []byte("E ")) {
			t.Fatalf("refused: %q", buf[:m])
		}
		got += bytes.Count(buf[:m], []byte("\n"))
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	loaded, _ := heapHeld()
	t.Logf("heap held: %d MiB before, %d MiB with %d keys", before>>20, loaded>>20, keys)

	// The leases end a second later, and the node frees the keys; it
	// then hands back what the burst took.
	ok := testnode.Until(60*time.Second, func() bool {
		held, live := heapHeld()
		return held < before+16<<20 && held < live+16<<20
	})
	held, live := heapHeld()
	if !ok {
		t.Fatalf("the heap still holds %d MiB (live %d MiB, %d MiB before the burst)", held>>20, live>>20, before>>20)
	}
	t.Logf("heap held once the burst has passed: %d MiB (live %d MiB)", held>>20, live>>20)
}
