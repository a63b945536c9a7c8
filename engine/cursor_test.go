package engine

import (
	"fmt"
	"math/rand/v2"
	"os"
	"strconv"
	"testing"
)

// TestCursorWalksWhileTheShardChanges opens a cursor, then interleaves
// small Scans with grants, releases, FIFO handoffs and lease expiries, and
// checks Cursor's promise: every key held from Open until the cursor
// reaches it is visited, once unless the table grew meanwhile; a visited
// key is held when it is visited. KUNCI_CURSOR_SEED replays a run.
func TestCursorWalksWhileTheShardChanges(t *testing.T) {
	seed := rand.Uint64()
	if s := os.Getenv("KUNCI_CURSOR_SEED"); s != "" {
		seed, _ = strconv.ParseUint(s, 10, 64)
	}
	t.Logf("seed %d", seed)
	rng := rand.New(rand.NewPCG(seed, 7))
	for run := 0; run < 3000; run++ {
		cursorRun(t, rng)
	}
}

func cursorRun(t *testing.T, rng *rand.Rand) {
	sh := NewShard(Config{}, new(Tokens), 0)
	var out Output
	now := int64(0)
	held := map[string]uint64{} // key → token
	settle := func() {          // what the records say happened
		for _, r := range out.Records {
			switch r.Kind {
			case RecordGrant:
				held[string(out.RecordKey(&r))] = r.Token
			case RecordRelease, RecordExpire:
				if held[string(out.RecordKey(&r))] == r.Token {
					delete(held, string(out.RecordKey(&r)))
				}
			}
		}
		out.Reset()
	}
	take := func(k string, conn ConnID) {
		sh.Acquire(now, conn, []byte(k), int64(1+rng.IntN(50))*ms, 0, &out)
		settle()
	}
	out.WantRecords = true
	// Up to ¾ of the smallest table (64 slots) or of the next (96, not a
	// power of two): long probe runs, wrapping at the end.
	full := 46
	if rng.IntN(2) == 0 {
		full = 70
	}
	for i := range 1 + rng.IntN(full) {
		take("k"+strconv.Itoa(i), 1)
	}
	var c Cursor
	sh.Open(&c)
	// A key's instance counts the times it was taken since Open: visits
	// are told apart by instance, since a key freed and taken again is a
	// new grant the cursor may visit too.
	inst := map[string]int{}
	visited := map[string]int{} // "key#instance" → visits
	next := 1000
	size := len(sh.locks.slots)
	grew := false
	for done := false; !done; {
		done = sh.Scan(&c, 1+rng.IntN(4), func(h Held) {
			key, token := string(h.Key), h.Token // Key aliases the lock's memory
			visited[fmt.Sprint(key, "#", inst[key])]++
			if held[key] != token {
				t.Fatalf("visited %s with token %d, its grant is %d", key, token, held[key])
			}
		})
		for range rng.IntN(4) {
			before := map[string]bool{}
			for k := range held {
				before[k] = true
			}
			op := rng.IntN(4)
			if op == 0 && len(held) >= full {
				op = 2 // keep the table from growing, mostly
			}
			switch op {
			case 0: // a new key
				take(fmt.Sprint("k", next), 1)
				next++
			case 1: // a key taken again, or queued for
				take(fmt.Sprint("k", rng.IntN(next)), ConnID(2+rng.IntN(3)))
			case 2: // a release
				for k, tok := range held {
					sh.Release(now, 1, []byte(k), tok, &out)
					break
				}
			case 3: // time passes: leases run out
				now += int64(rng.IntN(20)) * ms
				sh.Advance(now, &out)
			}
			settle()
			for k := range held {
				if !before[k] {
					inst[k]++
				}
			}
			for k := range before {
				if _, ok := held[k]; !ok {
					inst[k]++ // freed: the instance that was is gone
				}
			}
			grew = grew || len(sh.locks.slots) != size
		}
	}
	for k := range held {
		if inst[k] == 0 { // held from Open to the end
			if v := visited[k+"#0"]; v == 0 || v > 1 && !grew {
				t.Fatalf("%s held throughout, visited %d times (table grew: %v)", k, v, grew)
			}
		}
	}
	for k, v := range visited {
		if v > 1 && !grew {
			t.Fatalf("%s visited %d times, the table never grew", k, v)
		}
	}
	// A Reset ends an open cursor.
	sh.Open(&c)
	sh.Reset(now)
	if !sh.Scan(&c, 10, func(Held) { t.Fatal("visited after Reset") }) {
		t.Fatal("a cursor outlived Reset")
	}
}

func TestCursorOnAnEmptyShardIsDone(t *testing.T) {
	sh := NewShard(Config{}, new(Tokens), 0)
	var c Cursor
	sh.Open(&c)
	if !sh.Scan(&c, 10, func(Held) { t.Fatal("visited") }) {
		t.Fatal("not done")
	}
	sh.Open(&c) // closed by the Scan that was done
	sh.Close(&c)
	sh.Close(&c)
}
