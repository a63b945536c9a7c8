package replica

import (
	"bytes"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"strconv"
	"strings"
)

// The peer handshake. A peer link starts as an ordinary client connection
// to the node's client port; before any peer frame is acted on, both ends
// prove that they know the cluster key. The node that dialled (D) and the
// node that accepted (A) exchange three lines:
//
//	D → A   N from incD nonceD keyids    hello: D's address (its entry in the
//	                                     peer list), incarnation, a fresh
//	                                     nonce, the IDs of the keys it holds
//	A → D   N self incA nonceA keyid mac challenge: A's address, incarnation,
//	                                     nonce, the key it chose, its proof
//	D → A   V mac                        D's proof
//
// A proof is HMAC-SHA256 under the chosen key over a label naming the
// version of the peer protocol ("kunci peer link v3" or "… v2") and the
// side that makes it, both addresses, both incarnations and both nonces.
// Each side's proof covers the other side's fresh nonce, so a recorded
// handshake cannot be replayed, and it names both addresses and
// incarnations, so it cannot be moved to another link. Proofs are compared
// in constant time. Nonces are 16 random bytes in hex; key IDs and MACs are
// hex too.
//
// Versions. v2 seals a link's frames with HMAC-SHA256, v3 with GMAC (seal.go);
// v1 sealed nothing and fails the proof of both, instead of linking up and
// then hearing nothing. A dialler of v3 ends its key IDs with v3Mark, an ID
// no key has; an acceptor of v3 that sees it proves under v3's label, and
// one of v2 picks its key before it reaches the mark (or, holding none of
// the dialler's keys, finds none in the mark either) and proves under v2's.
// The dialler checks the proof under v3's label and then v2's, and the link
// speaks the version that checked; a dialler of v2 sends no mark and gets
// v2. So nodes of v2 and v3 link up during a rolling upgrade. Whoever is on
// the path can strip the mark, which only makes the link v2 (still sealed,
// only dearer); the label binds the version into both proofs. A dialler
// holding MaxKeys keys sends no mark (a node of v2 reads no more IDs than
// that), and a node that cannot seal with GMAC (gmacUsable) neither sends
// one nor answers one: both speak v2.
//
// Key rotation: a node holds its current key and, during a rollout, older
// ones. D lists the IDs of all it holds, current first; A picks the first of
// them it also holds. So a rollout adds the new key as current with the old
// one beside it on every node, then drops the old key from every node,
// without a moment when two nodes share no key.
//
// A cluster run without a key (explicitly insecure) uses the same lines with
// "-" for the key IDs, key ID and MACs; a node with a key refuses such a
// hello, and a node without one refuses a hello with keys.

// Handshake errors. Their text after "replica: " is the reason of the E line
// the accepting node answers before it closes the connection.
var (
	ErrBadHandshake = errors.New("replica: bad peer handshake")
	ErrUnknownPeer  = errors.New("replica: not a peer of this cluster")
	ErrNoCommonKey  = errors.New("replica: no cluster key in common")
	ErrNeedsKey     = errors.New("replica: this cluster needs the cluster key")
	ErrNoKey        = errors.New("replica: this node has no cluster key")
	// ErrKeyMismatch: the peer refused the handshake for want of a
	// cluster key in common (it has another key, or none, or this node
	// has none). Challenge's other key errors say the same from this
	// node's side: see KeyMismatch.
	ErrKeyMismatch = errors.New("replica: the peer holds another cluster key")
	ErrBadProof    = errors.New("replica: bad peer proof")
)

// MinKeyLen is the shortest cluster key accepted, in bytes.
const MinKeyLen = 16

const (
	nonceLen = 16
	keyIDLen = 4
	macLen   = sha256.Size
	// MaxKeys is how many keys a node may hold at once (current and old).
	MaxKeys = 4
)

// v3Mark is the key ID a dialler of peer protocol v3 puts last in its hello:
// no key may have it (NewKeyring refuses one that would).
var v3Mark = [keyIDLen]byte{0, 0, 0, 3}

// Keyring is a node's cluster keys: the current one first, then older ones
// still accepted during a rotation. A nil *Keyring is an insecure cluster
// without a key. Immutable once made; safe for concurrent use.
type Keyring struct {
	keys []ringKey
}

type ringKey struct {
	id     [keyIDLen]byte
	secret []byte
}

// NewKeyring returns the keyring of current and, accepted beside it, old.
func NewKeyring(current []byte, old ...[]byte) (*Keyring, error) {
	kr := &Keyring{}
	for i, k := range append([][]byte{current}, old...) {
		if len(k) < MinKeyLen {
			return nil, fmt.Errorf("replica: cluster key %d is %d bytes: at least %d are needed", i+1, len(k), MinKeyLen)
		}
		rk := ringKey{id: keyID(k), secret: bytes.Clone(k)}
		if rk.id == v3Mark {
			return nil, fmt.Errorf("replica: cluster key %d has the ID that marks protocol v3 (one key in 4 billion): choose another", i+1)
		}
		for _, o := range kr.keys {
			if o.id == rk.id {
				return nil, fmt.Errorf("replica: cluster key %d is given twice", i+1)
			}
		}
		kr.keys = append(kr.keys, rk)
	}
	if len(kr.keys) > MaxKeys {
		return nil, fmt.Errorf("replica: at most %d cluster keys", MaxKeys)
	}
	return kr, nil
}

// KeyID returns the ID of the current key, as handshakes show it: it names
// the key without revealing anything of it.
func (kr *Keyring) KeyID() string {
	if kr == nil {
		return "-"
	}
	return hex.EncodeToString(kr.keys[0].id[:])
}

func keyID(secret []byte) [keyIDLen]byte {
	h := sha256.Sum256(append([]byte("kunci cluster key id\x00"), secret...))
	var id [keyIDLen]byte
	copy(id[:], h[:])
	return id
}

func (kr *Keyring) find(id [keyIDLen]byte) []byte {
	for _, k := range kr.keys {
		if k.id == id {
			return k.secret
		}
	}
	return nil
}

// handshake is what both sides' proofs cover.
type handshake struct {
	version          int // of the peer protocol: 2 or 3
	dialer, acceptor string
	incD, incA       uint64
	nonceD, nonceA   [nonceLen]byte
}

func (h *handshake) mac(secret []byte, side string) [macLen]byte {
	m := hmac.New(sha256.New, secret)
	var b []byte
	b = append(b, "kunci peer link v"...)
	b = strconv.AppendInt(b, int64(h.version), 10)
	b = append(b, 0)
	b = append(b, side...)
	b = append(b, 0)
	b = append(b, h.dialer...)
	b = append(b, 0)
	b = append(b, h.acceptor...)
	b = append(b, 0)
	b = strconv.AppendUint(b, h.incD, 10)
	b = append(b, 0)
	b = strconv.AppendUint(b, h.incA, 10)
	b = append(b, 0)
	b = append(b, h.nonceD[:]...)
	b = append(b, h.nonceA[:]...)
	m.Write(b)
	var out [macLen]byte
	m.Sum(out[:0])
	return out
}

// Version returns the peer protocol the link speaks: 3, or 2 (an end from
// before v3, one that cannot seal with GMAC, or an insecure cluster). Call
// it once Challenge succeeded.
func (d *Dialing) Version() int { return d.hs.version }

// Version returns the peer protocol the link speaks (see Dialing.Version).
func (a *Accepting) Version() int { return a.hs.version }

// Dialing is the dialling side of a handshake in progress.
type Dialing struct {
	kr     *Keyring
	hs     handshake
	want   string // the address dialled
	secret []byte // the key both ends chose, once Challenge succeeded
}

// Dial starts a handshake with the peer at addr: it returns the state and
// the hello line to send. from and inc are this node's address and
// incarnation; rnd is the source of the nonce (crypto/rand when nil).
func Dial(kr *Keyring, from string, inc uint64, addr string, rnd io.Reader) (*Dialing, []byte, error) {
	d := &Dialing{kr: kr, want: addr, hs: handshake{version: 2, dialer: from, acceptor: addr, incD: inc}}
	if err := readNonce(rnd, &d.hs.nonceD); err != nil {
		return nil, nil, err
	}
	b := appendHello(nil, from, inc, &d.hs.nonceD)
	b = append(b, ' ')
	if kr == nil {
		b = append(b, '-')
	} else {
		for i, k := range kr.keys {
			if i > 0 {
				b = append(b, ',')
			}
			b = hex.AppendEncode(b, k.id[:])
		}
		// No room for the mark after MaxKeys keys: a node of v2 reads
		// no more IDs, and one holding none of the keys would answer
		// that the hello is bad, not that it holds no key in common.
		if gmacUsable && len(kr.keys) < MaxKeys {
			d.hs.version = 3
			b = append(b, ',')
			b = hex.AppendEncode(b, v3Mark[:])
		}
	}
	return d, append(b, '\n'), nil
}

// appendHello appends the fields that the hello and the challenge both
// start with: "N addr inc nonce".
func appendHello(b []byte, addr string, inc uint64, nonce *[nonceLen]byte) []byte {
	b = append(b, "N "...)
	b = append(b, addr...)
	b = append(b, ' ')
	b = strconv.AppendUint(b, inc, 10)
	b = append(b, ' ')
	return hex.AppendEncode(b, nonce[:])
}

// Challenge checks the accepting node's answer to the hello (one line,
// without its line ending) and returns the proof line to send and the
// acceptor's incarnation. An "E" line from the acceptor, which refused the
// hello, comes back as an error carrying its reason; any other failure means
// the other end did not prove the key (or is not kunci at all), and the
// connection must be closed.
func (d *Dialing) Challenge(line []byte) (proof []byte, incA uint64, err error) {
	if rest, ok := bytes.CutPrefix(line, []byte("E ")); ok {
		for _, e := range []error{ErrNoCommonKey, ErrNeedsKey, ErrNoKey} {
			if bytes.HasSuffix(rest, []byte(strings.TrimPrefix(e.Error(), "replica: "))) {
				return nil, 0, fmt.Errorf("%w: it refused the handshake: %s", ErrKeyMismatch, printable(rest))
			}
		}
		return nil, 0, fmt.Errorf("replica: the peer refused the handshake: %s", printable(rest))
	}
	f, ok := fields(line, 6)
	if !ok || string(f[0]) != "N" {
		return nil, 0, fmt.Errorf("%w: %q is not a kunci peer's answer", ErrBadHandshake, printable(line))
	}
	if string(f[1]) != d.want {
		return nil, 0, fmt.Errorf("%w: the node at %s says it is %s", ErrBadHandshake, d.want, printable(f[1]))
	}
	incA, ok = parseUint(f[2])
	if !ok || !decodeHex(f[3], d.hs.nonceA[:]) {
		return nil, 0, fmt.Errorf("%w: %q", ErrBadHandshake, printable(line))
	}
	d.hs.incA = incA
	if d.kr == nil {
		if string(f[4]) != "-" || string(f[5]) != "-" {
			return nil, 0, ErrNoKey
		}
		return []byte("V -\n"), incA, nil
	}
	var id [keyIDLen]byte
	var mac [macLen]byte
	if !decodeHex(f[4], id[:]) || !decodeHex(f[5], mac[:]) {
		if string(f[4]) == "-" {
			return nil, 0, fmt.Errorf("%w: the peer has none", ErrNeedsKey)
		}
		return nil, 0, fmt.Errorf("%w: %q", ErrBadHandshake, printable(line))
	}
	secret := d.kr.find(id)
	if secret == nil {
		return nil, 0, ErrNoCommonKey
	}
	want := d.hs.mac(secret, "accept")
	if !hmac.Equal(mac[:], want[:]) && d.hs.version == 3 {
		d.hs.version = 2 // an acceptor from before v3?
		want = d.hs.mac(secret, "accept")
	}
	if !hmac.Equal(mac[:], want[:]) {
		return nil, 0, ErrBadProof
	}
	d.secret = secret
	p := d.hs.mac(secret, "dial")
	b := append([]byte("V "), hex.EncodeToString(p[:])...)
	return append(b, '\n'), incA, nil
}

// KeyMismatch reports whether err, from Dial or Challenge, says that the
// peer and this node hold no cluster key in common (either side).
func KeyMismatch(err error) bool {
	return errors.Is(err, ErrKeyMismatch) || errors.Is(err, ErrNoCommonKey) || errors.Is(err, ErrNeedsKey) || errors.Is(err, ErrNoKey)
}

// Accepting is the accepting side of a handshake in progress.
type Accepting struct {
	hs     handshake
	secret []byte // nil: insecure
	keyID  [keyIDLen]byte
	// Peer is the dialling node's address, as its hello named it; Inc its
	// incarnation. Both are proven only once Proof succeeds.
	Peer string
	Inc  uint64
}

// Accept answers a hello (one line, without its line ending) received by
// the node self with incarnation inc. isPeer says whether an address is one
// of this node's peers (not itself). It returns the state and the challenge
// line to send, or an error whose reason the node answers in an E line.
func Accept(kr *Keyring, self string, inc uint64, hello []byte, isPeer func(string) bool, rnd io.Reader) (*Accepting, []byte, error) {
	f, ok := fields(hello, 5)
	if !ok || string(f[0]) != "N" {
		return nil, nil, ErrBadHandshake
	}
	a := &Accepting{hs: handshake{version: 2, acceptor: self, incA: inc}}
	a.Peer = string(f[1])
	a.hs.dialer = a.Peer
	a.Inc, ok = parseUint(f[2])
	if !ok || !decodeHex(f[3], a.hs.nonceD[:]) {
		return nil, nil, ErrBadHandshake
	}
	a.hs.incD = a.Inc
	if !isPeer(a.Peer) {
		return nil, nil, ErrUnknownPeer
	}
	ids := f[4]
	switch {
	case kr == nil && string(ids) != "-":
		return nil, nil, ErrNoKey
	case kr != nil && string(ids) == "-":
		return nil, nil, ErrNeedsKey
	case kr != nil:
		marked := false
		err := eachKeyID(ids, MaxKeys+1, func(id [keyIDLen]byte) bool {
			if id == v3Mark {
				marked = true
			} else if s := kr.find(id); s != nil && a.secret == nil {
				a.secret = s
				a.keyID = id
			}
			return true
		})
		if err != nil {
			return nil, nil, err
		}
		if a.secret == nil {
			return nil, nil, ErrNoCommonKey
		}
		if marked && gmacUsable {
			a.hs.version = 3
		}
	}
	if err := readNonce(rnd, &a.hs.nonceA); err != nil {
		return nil, nil, err
	}
	b := appendHello(nil, self, inc, &a.hs.nonceA)
	if a.secret == nil {
		b = append(b, " - -"...)
	} else {
		mac := a.hs.mac(a.secret, "accept")
		b = append(b, ' ')
		b = hex.AppendEncode(b, a.keyID[:])
		b = append(b, ' ')
		b = hex.AppendEncode(b, mac[:])
	}
	return a, append(b, '\n'), nil
}

// Proof checks the dialling node's proof line (without its line ending).
// Only when it returns nil is the connection a peer link.
func (a *Accepting) Proof(line []byte) error {
	f, ok := fields(line, 2)
	if !ok || string(f[0]) != "V" {
		return ErrBadHandshake
	}
	if a.secret == nil {
		if string(f[1]) != "-" {
			return ErrBadHandshake
		}
		return nil
	}
	var mac [macLen]byte
	if !decodeHex(f[1], mac[:]) {
		return ErrBadProof
	}
	want := a.hs.mac(a.secret, "dial")
	if !hmac.Equal(mac[:], want[:]) {
		return ErrBadProof
	}
	return nil
}

// fields splits line at single spaces into exactly n non-empty fields.
func fields(line []byte, n int) ([][]byte, bool) {
	line = bytes.TrimSuffix(line, []byte("\r"))
	out := make([][]byte, 0, n)
	for len(line) > 0 {
		if len(out) == n {
			return nil, false
		}
		f, rest, _ := bytes.Cut(line, []byte(" "))
		if len(f) == 0 {
			return nil, false
		}
		out = append(out, f)
		line = rest
	}
	return out, len(out) == n
}

// eachKeyID calls each with the key IDs of a hello's comma-separated list,
// in order, until it returns false. More than most IDs, or one that is not
// keyIDLen bytes in hex, is ErrBadHandshake.
func eachKeyID(ids []byte, most int, each func(id [keyIDLen]byte) bool) error {
	for n := 1; len(ids) > 0; n++ {
		if n > most {
			return ErrBadHandshake
		}
		one, rest, _ := bytes.Cut(ids, []byte(","))
		ids = rest
		var id [keyIDLen]byte
		if !decodeHex(one, id[:]) {
			return ErrBadHandshake
		}
		if !each(id) {
			return nil
		}
	}
	return nil
}

func decodeHex(src, dst []byte) bool {
	if len(src) != 2*len(dst) {
		return false
	}
	_, err := hex.Decode(dst, src)
	return err == nil
}

func readNonce(rnd io.Reader, dst *[nonceLen]byte) error {
	if rnd == nil {
		rnd = rand.Reader
	}
	if _, err := io.ReadFull(rnd, dst[:]); err != nil {
		return fmt.Errorf("replica: nonce: %w", err)
	}
	return nil
}

// printable shortens b and replaces bytes that are not printable ASCII, so
// that what a stranger sent can be logged.
func printable(b []byte) string {
	if len(b) > 80 {
		b = b[:80]
	}
	out := make([]byte, len(b))
	for i, c := range b {
		if c < 0x20 || c > 0x7e {
			c = '?'
		}
		out[i] = c
	}
	return string(out)
}
