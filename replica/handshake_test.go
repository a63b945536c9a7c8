package replica

import (
	"bytes"
	"encoding/hex"
	"errors"
	"math/rand/v2"
	"strings"
	"testing"
)

var (
	keyA = []byte("0123456789abcdef0123456789abcdef")
	keyB = []byte("fedcba9876543210fedcba9876543210")
)

func ring(t *testing.T, keys ...[]byte) *Keyring {
	t.Helper()
	if len(keys) == 0 {
		return nil
	}
	kr, err := NewKeyring(keys[0], keys[1:]...)
	if err != nil {
		t.Fatal(err)
	}
	return kr
}

const (
	nodeD = "10.0.0.2:7070"
	nodeA = "10.0.0.1:7070"
)

func isPeer(addr string) bool { return addr == nodeD }

// shake runs a whole handshake between a dialler holding dk and an acceptor
// holding ak, and returns the first error either side saw.
func shake(t *testing.T, dk, ak *Keyring) error {
	t.Helper()
	_, _, err := shakeVia(t, dk, ak, nil)
	return err
}

// shakeVia runs a whole handshake between a dialler holding dk and an
// acceptor holding ak, with the hello passed through path on its way (nil:
// as sent), and returns both sides and the first error either side saw.
func shakeVia(t *testing.T, dk, ak *Keyring, path func(hello []byte) []byte) (*Dialing, *Accepting, error) {
	t.Helper()
	d, hello, err := Dial(dk, nodeD, 5, nodeA, nil)
	if err != nil {
		t.Fatal(err)
	}
	if path != nil {
		hello = path(hello)
	}
	a, challenge, err := Accept(ak, nodeA, 9, line(hello), isPeer, nil)
	if err != nil {
		return d, nil, err
	}
	if a.Peer != nodeD || a.Inc != 5 {
		t.Fatalf("acceptor sees peer %q inc %d", a.Peer, a.Inc)
	}
	proof, incA, err := d.Challenge(line(challenge))
	if err != nil {
		return d, a, err
	}
	if incA != 9 {
		t.Fatalf("dialler sees incarnation %d", incA)
	}
	return d, a, a.Proof(line(proof))
}

func line(b []byte) []byte { return bytes.TrimSuffix(b, []byte("\n")) }

func TestHandshakeWithTheSameKey(t *testing.T) {
	if err := shake(t, ring(t, keyA), ring(t, keyA)); err != nil {
		t.Fatal(err)
	}
}

// Nodes of peer protocol v3 seal with GMAC; a node of v2 at either end makes
// the link v2 (HMAC-SHA256), so a cluster can be upgraded a node at a time.
// A node of v2 is played by v3's code without the mark: a v2 dialler sends
// none, and a v2 acceptor takes the first of the dialler's keys it holds and
// never reads on to the mark (a stripped mark is also what someone on the
// path could do: it only makes the link v2).
func TestHandshakeChoosesTheSeal(t *testing.T) {
	stripMark := func(hello []byte) []byte {
		mark := "," + hex.EncodeToString(v3Mark[:]) + "\n"
		if !bytes.HasSuffix(hello, []byte(mark)) {
			t.Fatalf("hello %q does not end with the v3 mark", hello)
		}
		return append(bytes.TrimSuffix(hello, []byte(mark)), '\n')
	}
	for _, tc := range []struct {
		name     string
		path     func([]byte) []byte
		wantGMAC bool
	}{
		{"v3 to v3", nil, true},
		{"v2 end", stripMark, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d, a, err := shakeVia(t, ring(t, keyA), ring(t, keyB, keyA), tc.path)
			if err != nil {
				t.Fatal(err)
			}
			dSend, dRecv := d.Keys()
			aSend, aRecv := a.Keys()
			for _, k := range []SessionKey{dSend, dRecv, aSend, aRecv} {
				if !k.Sealed() || k.gmac != tc.wantGMAC {
					t.Fatalf("a session key with GMAC %v, want %v", k.gmac, tc.wantGMAC)
				}
			}
			// Each side opens what the other seals, and not what it
			// seals itself.
			for _, dir := range []struct{ send, recv SessionKey }{{dSend, aRecv}, {aSend, dRecv}} {
				if got, err := open(dir.recv, seal(dir.send, testBatches...), rand.New(rand.NewPCG(1, 1))); err != nil || len(got) != len(testBatches) {
					t.Fatalf("opened %q, %v", got, err)
				}
			}
			if _, err := open(dSend, seal(aSend, testBatches...), rand.New(rand.NewPCG(1, 1))); err == nil {
				t.Fatal("a batch reflected back opened")
			}
		})
	}
	// The version is in both proofs: a dialler of v3 whose mark was
	// stripped sees v2's proof, never v3's, so its fallback cannot be
	// turned into a mismatch; and an acceptor's v3 proof does not check as
	// v2's or the other way round.
	hs := handshake{version: 3, dialer: nodeD, acceptor: nodeA}
	v3 := hs.mac(keyA, "accept")
	hs.version = 2
	if v2 := hs.mac(keyA, "accept"); v2 == v3 {
		t.Fatal("the proofs of v2 and v3 are the same")
	}
}

// A dialler's hello lists its keys and the mark, unless it holds MaxKeys
// (then it speaks v2: see TestDiallerWithMaxKeysMeetsANodeOfV2); a hello
// with the mark but no key in common is refused as that.
func TestHelloWithTheMark(t *testing.T) {
	keys := [][]byte{keyA, keyB, []byte("0123456789abcdef-3"), []byte("0123456789abcdef-4")}
	for n, want := range map[int]string{MaxKeys - 1: "gmac", MaxKeys: "hmac-sha256"} {
		d, _, err := shakeVia(t, ring(t, keys[:n]...), ring(t, keys[n-1]), nil)
		if send, _ := d.Keys(); err != nil || send.MAC() != want {
			t.Fatalf("a dialler with %d keys: %v, seal %s, want %s", n, err, send.MAC(), want)
		}
	}
	if err := shake(t, ring(t, keyA), ring(t, keyB)); !errors.Is(err, ErrNoCommonKey) {
		t.Fatalf("no key in common: %v", err)
	}
}

// acceptV2 answers hello as a node of kunci 0.10 (peer protocol v2) does:
// it walks the key IDs, at most MaxKeys of them, up to the first it holds,
// and proves under v2's label (v3's Accept without the mark).
func acceptV2(t *testing.T, kr *Keyring, hello []byte) (*Accepting, []byte, error) {
	t.Helper()
	f, ok := fields(line(hello), 5)
	if !ok {
		t.Fatalf("hello %q", hello)
	}
	held := false
	if err := eachKeyID(f[4], MaxKeys, func(id [keyIDLen]byte) bool { held = kr.find(id) != nil; return !held }); err != nil {
		return nil, nil, err
	}
	if !held {
		return nil, nil, ErrNoCommonKey
	}
	mark := []byte("," + hex.EncodeToString(v3Mark[:]))
	return Accept(kr, nodeA, 9, bytes.ReplaceAll(line(hello), mark, nil), isPeer, nil)
}

// A dialler holding MaxKeys keys meets a node of 0.10 during an upgrade.
// Holding none of them, that node must still answer that it holds no key
// in common (the dialler then sees a key mismatch, which keeps it from
// promoting itself, and says so), not that the hello is bad: before, the
// mark was a fifth key ID, past what 0.10 reads. Holding the last of them,
// it links up, sealed with HMAC-SHA256.
func TestDiallerWithMaxKeysMeetsANodeOfV2(t *testing.T) {
	keys := [][]byte{keyA, keyB, []byte("0123456789abcdef-3"), []byte("0123456789abcdef-4")}
	d, hello, err := Dial(ring(t, keys...), nodeD, 5, nodeA, nil)
	if err != nil {
		t.Fatal(err)
	}
	_, _, err = acceptV2(t, ring(t, []byte("another cluster's key, 32 bytes.")), hello)
	if !errors.Is(err, ErrNoCommonKey) {
		t.Fatalf("a node of 0.10 holding none of the keys answers %v", err)
	}
	_, _, err = d.Challenge([]byte("E N - " + strings.TrimPrefix(err.Error(), "replica: ")))
	if !KeyMismatch(err) {
		t.Fatalf("the dialler sees %v, not a key mismatch", err)
	}
	d, hello, _ = Dial(ring(t, keys...), nodeD, 5, nodeA, nil)
	a, challenge, err := acceptV2(t, ring(t, keys[3]), hello)
	if err != nil {
		t.Fatal(err)
	}
	proof, _, err := d.Challenge(line(challenge))
	if err == nil {
		err = a.Proof(line(proof))
	}
	if send, _ := d.Keys(); err != nil || send.MAC() != "hmac-sha256" {
		t.Fatalf("with the last key in common: %v, seal %s", err, send.MAC())
	}
}

func TestHandshakeWithoutAKeyOnBothSides(t *testing.T) {
	if err := shake(t, nil, nil); err != nil {
		t.Fatal(err)
	}
}

func TestHandshakeRefusals(t *testing.T) {
	for _, tc := range []struct {
		name   string
		dk, ak [][]byte
		want   error
	}{
		{"different keys", [][]byte{keyA}, [][]byte{keyB}, ErrNoCommonKey},
		{"dialler without a key", nil, [][]byte{keyA}, ErrNeedsKey},
		{"acceptor without a key", [][]byte{keyA}, nil, ErrNoKey},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if err := shake(t, ring(t, tc.dk...), ring(t, tc.ak...)); !errors.Is(err, tc.want) {
				t.Fatalf("got %v, want %v", err, tc.want)
			}
		})
	}
}

// A rollout: every node gets the new key as current with the old one
// beside it, then drops the old one. At every step any two nodes agree.
func TestHandshakeDuringAKeyRotation(t *testing.T) {
	steps := [][][]byte{
		{keyA},       // before
		{keyB, keyA}, // new key current, old accepted
		{keyB},       // after
	}
	for i := range steps {
		for j := range steps {
			if d := i - j; d > 1 || d < -1 {
				continue // nodes are never two steps apart
			}
			if err := shake(t, ring(t, steps[i]...), ring(t, steps[j]...)); err != nil {
				t.Errorf("dialler at step %d, acceptor at step %d: %v", i, j, err)
			}
		}
	}
}

// An attacker who recorded a whole handshake cannot replay either side's
// part: the other side's nonce is new each time.
func TestRecordedHandshakeCannotBeReplayed(t *testing.T) {
	kr := ring(t, keyA)
	d, hello, _ := Dial(kr, nodeD, 5, nodeA, nil)
	_, challenge, err := Accept(kr, nodeA, 9, line(hello), isPeer, nil)
	if err != nil {
		t.Fatal(err)
	}
	proof, _, err := d.Challenge(line(challenge))
	if err != nil {
		t.Fatal(err)
	}

	// The recorded hello and proof against the acceptor again.
	a2, _, err := Accept(kr, nodeA, 9, line(hello), isPeer, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := a2.Proof(line(proof)); !errors.Is(err, ErrBadProof) {
		t.Fatalf("replayed proof: %v", err)
	}
	// The recorded challenge against a dialler.
	d2, _, _ := Dial(kr, nodeD, 5, nodeA, nil)
	if _, _, err := d2.Challenge(line(challenge)); !errors.Is(err, ErrBadProof) {
		t.Fatalf("replayed challenge: %v", err)
	}
}

// A proof made for one pair of addresses or incarnations does not hold for
// another, and a flipped bit fails.
func TestProofBindsAddressesAndIncarnations(t *testing.T) {
	kr := ring(t, keyA)
	d, hello, _ := Dial(kr, nodeD, 5, nodeA, nil)
	a, challenge, _ := Accept(kr, nodeA, 9, line(hello), isPeer, nil)
	proof, _, err := d.Challenge(line(challenge))
	if err != nil {
		t.Fatal(err)
	}
	a.hs.incD++ // the proof was made for incarnation 5
	if err := a.Proof(line(proof)); !errors.Is(err, ErrBadProof) {
		t.Fatalf("proof for another incarnation: %v", err)
	}
	a.hs.incD--
	bad := bytes.Clone(proof)
	bad[5] ^= 1
	if err := a.Proof(line(bad)); err == nil {
		t.Fatal("a tampered proof passed")
	}
	if err := a.Proof(line(proof)); err != nil {
		t.Fatal(err)
	}

	// The challenge names the address dialled.
	d2, _, _ := Dial(kr, nodeD, 5, "10.0.0.3:7070", nil)
	if _, _, err := d2.Challenge(line(challenge)); !errors.Is(err, ErrBadHandshake) {
		t.Fatalf("challenge from another address: %v", err)
	}
}

func TestAcceptRefusesStrangersAndJunk(t *testing.T) {
	kr := ring(t, keyA)
	_, hello, _ := Dial(kr, "10.9.9.9:7070", 5, nodeA, nil)
	if _, _, err := Accept(kr, nodeA, 9, line(hello), isPeer, nil); !errors.Is(err, ErrUnknownPeer) {
		t.Fatalf("hello from a stranger: %v", err)
	}
	for _, junk := range []string{
		"", "N", "N a", "N " + nodeD + " 5 zz 1234abcd",
		"N " + nodeD + " x " + strings.Repeat("0", 32) + " 1234abcd",
		"N " + nodeD + " 5 " + strings.Repeat("0", 32) + " 1234abcd,",
		"N " + nodeD + " 5 " + strings.Repeat("0", 32) + " 1,2,3,4,5",
		"N " + nodeD + " 5 " + strings.Repeat("0", 32) + " 1234abcd extra",
		"GET / HTTP/1.1",
	} {
		if _, _, err := Accept(kr, nodeA, 9, []byte(junk), isPeer, nil); err == nil {
			t.Errorf("Accept(%q) passed", junk)
		}
	}
	d, _, _ := Dial(kr, nodeD, 5, nodeA, nil)
	for _, junk := range []string{"", "HTTP/1.1 400 Bad Request", "N " + nodeA + " 9 00 - -", "+OK"} {
		if _, _, err := d.Challenge([]byte(junk)); err == nil {
			t.Errorf("Challenge(%q) passed", junk)
		}
	}
	if _, _, err := d.Challenge([]byte("E N - replica: no cluster key in common")); err == nil || !strings.Contains(err.Error(), "refused") {
		t.Errorf("an E answer: %v", err)
	}
}

func TestKeyringRefusesShortAndRepeatedKeys(t *testing.T) {
	if _, err := NewKeyring([]byte("short")); err == nil {
		t.Error("a 5-byte key was taken")
	}
	if _, err := NewKeyring(keyA, keyA); err == nil {
		t.Error("the same key twice was taken")
	}
	if id := ring(t, keyA).KeyID(); len(id) != 8 || strings.Contains(string(keyA), id) {
		t.Errorf("key ID %q", id)
	}
}
