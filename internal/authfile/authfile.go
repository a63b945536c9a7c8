// Package authfile reads a node's client credentials file (--auth-file)
// and checks what a client presents against it: a name and a secret in
// constant time, and the key prefixes a credential may touch.
package authfile

import (
	"bufio"
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"fmt"
	"os"
	"strings"

	"github.com/kunci/kunci/wire"
)

// MinSecret is the shortest secret an auth file may hold, in bytes: secrets
// are machine-made (openssl rand -base64 24), never passwords.
const MinSecret = 16

// Credential is one line of the auth file. It is never changed once made; a
// reload makes new ones.
type Credential struct {
	name     string
	digest   [sha256.Size]byte // of the secret: the secret itself is not kept
	prefixes []string          // the keys it may touch; nil: every key
}

// Name returns the credential's name.
func (c *Credential) Name() string { return c.name }

// SameSecret reports whether o holds the same secret as c (a reload that
// kept a name but changed its secret revokes the connections that used it).
func (c *Credential) SameSecret(o *Credential) bool { return c.digest == o.digest }

// Allows reports whether the credential may touch key.
func (c *Credential) Allows(key []byte) bool {
	if c.prefixes == nil {
		return true
	}
	for _, p := range c.prefixes {
		if len(key) >= len(p) && string(key[:len(p)]) == p {
			return true
		}
	}
	return false
}

// File is an auth file's content. It is never changed once loaded: a
// reload makes a new one.
type File struct {
	byName map[string]*Credential
	// decoy is compared with a presented secret whose name has no
	// credential, so that a bad name costs what a bad secret costs.
	decoy [sha256.Size]byte
}

// allowanceName returns the name a U line's failures count under (see
// the node's failure allowances per source): the credential's, or "" for a name no credential has. It does
// not allocate.
func (s *File) AllowanceName(name []byte) string {
	if c := s.byName[string(name)]; c != nil {
		return c.name
	}
	return ""
}

// Check returns the credential that name and secret match, or nil. The
// secret's digest is compared in constant time, with a random decoy when
// the name is unknown, so a failure takes the same work whether or not the
// name exists; and the node delays a failure's answer, which drowns what
// little the map lookup could tell.
func (s *File) Check(name, secret []byte) *Credential {
	d := sha256.Sum256(secret)
	c := s.byName[string(name)]
	want := &s.decoy
	if c != nil {
		want = &c.digest
	}
	if subtle.ConstantTimeCompare(d[:], want[:]) != 1 || c == nil {
		return nil
	}
	return c
}

// Lookup returns the credential named name, or nil: for a client whose
// name was proved otherwise (a verified TLS certificate naming it).
func (s *File) Lookup(name string) *Credential { return s.byName[name] }

// Len returns how many credentials the file holds.
func (s *File) Len() int { return len(s.byName) }

// Load reads an auth file: one credential a line,
//
//	name secret [prefix,prefix,…]
//
// fields separated by spaces or tabs; a line whose first non-blank byte is
// '#' is a comment, and blank lines are skipped ('#' elsewhere is part of
// its field, so a secret may hold one). Names and secrets are 1 to 250 bytes
// without space or control byte, as they travel in a U line; a secret is at
// least MinSecret bytes; a name appears once. Without prefixes the
// credential may touch every key; with them, only keys that start with one
// of them (a plain byte prefix: end it with a separator, "orders/"). The
// file must be a regular file that neither group nor others may read or
// write (chmod 600), as ssh asks of a private key. Errors name the file and
// the line, never the line's content, which may hold a secret.
func Load(path string) (*File, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("auth file: %w", err)
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return nil, fmt.Errorf("auth file: %w", err)
	}
	if !st.Mode().IsRegular() {
		return nil, fmt.Errorf("auth file %s is not a regular file", path)
	}
	if perm := st.Mode().Perm(); perm&0o077 != 0 {
		return nil, fmt.Errorf("auth file %s may be read or written by group or others (mode %04o): it holds secrets; chmod 600 it", path, perm)
	}
	s := &File{byName: make(map[string]*Credential)}
	if _, err := rand.Read(s.decoy[:]); err != nil {
		return nil, fmt.Errorf("auth file: %w", err)
	}
	lineOf := make(map[string]int)
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 0, 4096), 64<<10)
	for no := 1; sc.Scan(); no++ {
		fields := strings.Fields(sc.Text())
		if len(fields) == 0 || strings.HasPrefix(fields[0], "#") {
			continue
		}
		bad := func(why string) error {
			return fmt.Errorf("auth file %s, line %d: %s", path, no, why)
		}
		if len(fields) < 2 || len(fields) > 3 {
			return nil, bad(fmt.Sprintf("%d fields, want \"name secret\" or \"name secret prefix,prefix,...\"", len(fields)))
		}
		name, secret := fields[0], fields[1]
		switch {
		case !wire.ValidKey([]byte(name)):
			return nil, bad("the name is over 250 bytes or holds a control byte")
		case !wire.ValidKey([]byte(secret)):
			return nil, bad("the secret is over 250 bytes or holds a control byte")
		case len(secret) < MinSecret:
			return nil, bad(fmt.Sprintf("the secret is shorter than %d bytes (make one with: openssl rand -base64 24)", MinSecret))
		case lineOf[name] != 0:
			return nil, bad(fmt.Sprintf("name %q already given on line %d", name, lineOf[name]))
		}
		c := &Credential{name: name, digest: sha256.Sum256([]byte(secret))}
		if len(fields) == 3 {
			for _, p := range strings.Split(fields[2], ",") {
				if !wire.ValidKey([]byte(p)) {
					return nil, bad(fmt.Sprintf("key prefix %q is empty or not a valid key", p))
				}
				c.prefixes = append(c.prefixes, p)
			}
		}
		s.byName[name] = c
		lineOf[name] = no
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("auth file %s: %w", path, err)
	}
	if len(s.byName) == 0 {
		return nil, fmt.Errorf("auth file %s holds no credential: no client could connect", path)
	}
	return s, nil
}
