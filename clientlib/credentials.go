package clientlib

import (
	"bufio"
	"errors"
	"fmt"
	"net"
	"os"
	"strings"
	"time"

	"github.com/kunci/kunci/wire"
)

// Credentials are what a client authenticates with on a node started with
// an auth file (kuncid --auth-file): its name and secret, sent as the first
// line of every connection ("U name secret"). Both are 1 to 250 bytes
// without space or control byte. A node without an auth file accepts any.
type Credentials struct {
	Name, Secret string
}

// String shows the name only, so that printing a Config never shows the
// secret.
func (c Credentials) String() string { return c.Name + ":<secret>" }

// GoString is String for %#v.
func (c Credentials) GoString() string {
	return fmt.Sprintf("clientlib.Credentials{Name: %q, Secret: <hidden>}", c.Name)
}

func (c *Credentials) check() error {
	if !wire.ValidKey([]byte(c.Name)) {
		return fmt.Errorf("clientlib: credentials: the name %q is empty, over %d bytes, or holds a space or control byte", c.Name, wire.MaxKey)
	}
	if !wire.ValidKey([]byte(c.Secret)) {
		return fmt.Errorf("clientlib: credentials of %s: the secret is empty, over %d bytes, or holds a space or control byte", c.Name, wire.MaxKey)
	}
	return nil
}

// LoadCredentials reads a credentials file: "name secret" on one line;
// blank lines and lines starting with # are skipped. Like an ssh key, the
// file must not be readable or writable by group or others (chmod 600).
// Errors never show the secret.
func LoadCredentials(path string) (*Credentials, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("clientlib: credentials file: %w", err)
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return nil, fmt.Errorf("clientlib: credentials file: %w", err)
	}
	if perm := st.Mode().Perm(); perm&0o077 != 0 {
		return nil, fmt.Errorf("clientlib: credentials file %s may be read or written by group or others (mode %04o): it holds a secret; chmod 600 it", path, perm)
	}
	var c *Credentials
	sc := bufio.NewScanner(f)
	for no := 1; sc.Scan(); no++ {
		fields := strings.Fields(sc.Text())
		if len(fields) == 0 || strings.HasPrefix(fields[0], "#") {
			continue
		}
		switch {
		case c != nil:
			return nil, fmt.Errorf("clientlib: credentials file %s, line %d: a second credential (the file holds one \"name secret\" line)", path, no)
		case len(fields) != 2:
			return nil, fmt.Errorf("clientlib: credentials file %s, line %d: %d fields, want \"name secret\"", path, no, len(fields))
		}
		c = &Credentials{Name: fields[0], Secret: fields[1]}
		if err := c.check(); err != nil {
			return nil, fmt.Errorf("clientlib: credentials file %s, line %d: %w", path, no, err)
		}
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("clientlib: credentials file %s: %w", path, err)
	}
	if c == nil {
		return nil, fmt.Errorf("clientlib: credentials file %s holds no \"name secret\" line", path)
	}
	return c, nil
}

// AuthError is a node's refusal of the client's credentials: bad
// credentials, too many authentication failures from this address, or
// credentials asked for and not given. errors.Is(err, ErrAuth) is true.
type AuthError struct {
	Addr   string // the node
	Reason string // the node's reason
}

func (e *AuthError) Error() string {
	return fmt.Sprintf("clientlib: authentication at %s failed: %s", e.Addr, e.Reason)
}

// Is makes errors.Is(err, ErrAuth) true.
func (e *AuthError) Is(target error) bool { return target == ErrAuth }

// authTimeout is how long, beyond the dial timeout, a node may take to
// answer the credentials: it answers bad ones only after a delay (a second
// by default).
const authTimeout = 3 * time.Second

// alreadyAuthenticated is a node's answer to a U on a connection its
// client certificate authenticated.
const alreadyAuthenticated = "already authenticated"

// authenticate sends the client's credentials as the first line of nc, a
// new connection to addr, and reads the node's answer. It returns an
// *AuthError when the node refuses them. Without credentials it does
// nothing.
func (c *Client) authenticate(nc net.Conn, addr string) error {
	cr := c.cfg.Credentials
	if cr == nil {
		return nil
	}
	_ = nc.SetDeadline(time.Now().Add(c.cfg.DialTimeout + authTimeout))
	if _, err := nc.Write(wire.AppendAuth(nil, []byte(cr.Name), []byte(cr.Secret))); err != nil {
		return err
	}
	// The node sends nothing but this answer before the next request.
	var buf [wire.MaxLine]byte
	var a wire.Answer
	var nk *notKunciError
	switch err := readAnswer(nc, addr, buf[:], &a); {
	case errors.As(err, &nk):
		return err // it names the address and the line
	case err != nil:
		return fmt.Errorf("clientlib: %s: no answer to the credentials: %w", addr, err)
	case a.Kind == 'U', a.Kind == 'E' && string(a.Text) == alreadyAuthenticated:
		// Already: a verified TLS client certificate naming a
		// credential stands for it, and the node took it.
		_ = nc.SetDeadline(time.Time{})
		return nil
	case a.Kind == 'E' && len(a.Op) == 1 && a.Op[0] == 'U':
		return &AuthError{Addr: addr, Reason: string(a.Text)}
	case a.Kind == 'E':
		// Refused before the credentials were read (too many
		// connections, say).
		return fmt.Errorf("clientlib: %s refused the connection: %s", addr, a.Text)
	}
	return fmt.Errorf("clientlib: %s: unexpected answer to the credentials: %q", addr, a.Kind)
}

// authFailed records err, an authentication failure, for the errors of
// requests that find no usable connection; authOK forgets it.
func (c *Client) authFailed(err *AuthError) { c.authErr.Store(err) }
func (c *Client) authOK() {
	if c.authErr.Load() != nil {
		c.authErr.Store(nil)
	}
}

// noConnection is the error of a request that found no connection to
// carry it: ErrNoConnection, wrapping its cause, or when it has none the
// last authentication failure.
func (c *Client) noConnection(cause error) error {
	if cause == nil || errors.Is(cause, errNotUp) {
		if ae := c.authErr.Load(); ae != nil {
			return fmt.Errorf("%w: %w", ErrNoConnection, ae)
		}
		if cause == nil || cause == errNotUp {
			return ErrNoConnection // nothing known of why
		}
	}
	if ae := c.authErr.Load(); ae != nil && errors.Is(cause, errNoAnswer) {
		return fmt.Errorf("%w: %w: %w", ErrNoConnection, cause, ae)
	}
	return fmt.Errorf("%w: %s", ErrNoConnection, unprefixed(cause))
}

// allAuthFailed returns the authentication failure of the connections'
// first attempts when every one of them failed so, else nil.
func (c *Client) allAuthFailed() error {
	var first error
	for _, cn := range c.conns {
		var ae *AuthError
		if !errors.As(cn.firstErr, &ae) {
			return nil
		}
		if first == nil {
			first = ae
		}
	}
	return first
}
