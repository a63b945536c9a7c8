package server_test

import (
	"fmt"
	"maps"
	"strings"
	"testing"
)

// What Holders returns is the caller's to keep: once the keys it names are
// released and their memory in the engine is reused for other keys and
// owners of the same length, the map still names the keys and owners it
// named. (Its strings aliased the engine's reused memory, so the kept map's
// keys changed under the caller.)
func TestHoldersAreSafeToKeep(t *testing.T) {
	t.Parallel()
	n := startNode(t, nil)
	c := dial(t, n.Addr())
	toks := map[string]uint64{}
	for i := range 8 {
		key := fmt.Sprintf("kept/%d", i)
		c.send(fmt.Sprintf("A %s 60000 0 owner=own-%d", key, i))
		toks[key] = c.expectGrant(key)
	}
	kept := n.Holders()
	want := map[string]string{}
	for k, h := range kept {
		want[strings.Clone(k)] = strings.Clone(h.Owner)
	}
	// Release them, and hold other keys and owners of the same lengths.
	for key, tok := range toks {
		c.release(key, tok)
	}
	for i := range 8 {
		key := fmt.Sprintf("zzzz/%d", i)
		c.send(fmt.Sprintf("A %s 60000 0 owner=xxx-%d", key, i))
		c.expectGrant(key)
	}
	got := map[string]string{}
	for k, h := range kept {
		got[k] = h.Owner
	}
	if !maps.Equal(got, want) {
		t.Fatalf("the kept map changed under its holder: %v, was %v", got, want)
	}
}
