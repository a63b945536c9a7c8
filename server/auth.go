package server

import (
	"errors"
	"fmt"
	"sync"
	"sync/atomic"

	"github.com/kunci/kunci/internal/authfile"
	"github.com/kunci/kunci/wire"
)

// clientGate is who may connect and as whom: the credentials, and the
// connections and failures counted per source.
type clientGate struct {
	// auth is nil without Config.AuthFile. Loops read it; ReloadAuth, one
	// at a time under reloadMu, replaces it.
	auth     atomic.Pointer[authfile.File]
	reloadMu sync.Mutex
	failures atomic.Uint64 // refused authentications
	sources  sources       // connections and auth failures per source address; safe for concurrent use
}

// Client credentials (Config.AuthFile). A node with an auth file serves a
// client connection only after its first line, "U name secret", named a
// credential of the file; a credential with key prefixes may touch only the
// keys under them. The file is re-read by ReloadAuth (kuncid: on SIGHUP).

// Refusals of the authentication rules, counted by reason like the others.
var (
	errAuthRequired   = errors.New("server: auth required")
	errBadCredentials = errors.New("server: bad credentials")
	errAuthThrottled  = errors.New("server: too many authentication failures")
	errKeyForbidden   = errors.New("server: key forbidden")
	errRevoked        = errors.New("server: credentials revoked")
	errAuthenticated  = errors.New("server: already authenticated")
)

// MinSecret is the shortest secret an auth file may hold, in bytes: secrets
// are machine-made (openssl rand -base64 24), never passwords.
const MinSecret = authfile.MinSecret

// loadCredentials reads Config.AuthFile (authfile.Load).
func loadCredentials(path string) (*authfile.File, error) {
	f, err := authfile.Load(path)
	if err != nil {
		return nil, fmt.Errorf("server: %w", err)
	}
	return f, nil
}

// beforeAuth handles a line that arrives on a connection that has not
// authenticated yet (Config.AuthFile is set). It is the one place that
// decides what may come first: "U name secret", checked here; every other
// line, well formed or not, I included, is answered "E op key auth
// required" and the connection is closed. Peers never get here: a peer's
// hello ("N …") and proof are taken by peerHandshake before any line is
// served, and a peer frame ("P …") on a connection that has not proved the
// cluster key is refused by parse as errPeerUnauthorized. req and err are
// ParseRequest's outcome for the line; lp.closing is set when the
// connection is to close after this line's answer.
func (lp *loop) beforeAuth(cs *conn, req *wire.Request, err error) {
	switch {
	case req.Op == wire.OpAuth && err == nil:
		lp.authenticate(cs, req)
		return
	case req.Op == wire.OpAuth:
		// A malformed U guesses nothing: its own reason, then close.
		lp.refused.count(err)
		cs.out = wire.AppendError(cs.out, req.EchoOp, nil, wire.Reason(err))
	default:
		lp.refused.count(errAuthRequired)
		cs.out = wire.AppendError(cs.out, req.EchoOp, req.EchoKey, wire.Reason(errAuthRequired))
	}
	lp.markDirty(cs)
	lp.closing = true
}

// authenticate checks a U request on cs. Success answers "U OK"; a failure
// is answered "E U - bad credentials" after Config.AuthFailureDelay, and the
// connection is then closed (see reject). A U line from a source past its
// failure allowance for the name it gives (sources.go) is not checked at
// all: it is answered "too many authentication failures" the same way.
// Other names from that source are checked as usual.
func (lp *loop) authenticate(cs *conn, req *wire.Request) {
	n := lp.n
	now := n.now()
	set := n.gate.auth.Load()
	name := set.AllowanceName(req.Name)
	if !n.gate.sources.mayTry(cs.src, name, now) {
		n.gate.failures.Add(1)
		lp.reject(cs, errAuthThrottled, now)
		return
	}
	c := set.Check(req.Name, req.Secret)
	if c == nil {
		n.gate.failures.Add(1)
		n.gate.sources.failed(cs.src, name, now)
		n.log.Debug().Str("remote", cs.c.RemoteAddr().String()).Msg("client authentication failed")
		lp.reject(cs, errBadCredentials, now)
		return
	}
	n.admit(cs, c)
	cs.out = wire.AppendAuthOK(cs.out)
	lp.markDirty(cs)
}

// admit lets cs send requests under credential c. It runs on cs's loop.
func (n *Node) admit(cs *conn, c *authfile.Credential) {
	cs.cred, cs.authed = c, true
}

// authenticateAs admits cs under the credential named name without a
// secret, for a connection whose peer proved who it is otherwise (a
// verified TLS client certificate naming it). It reports whether the
// current auth file has that name. It runs on cs's loop; the credential is
// then revoked and re-read on reload like one given by U.
func (n *Node) authenticateAs(cs *conn, name string) bool {
	set := n.gate.auth.Load()
	if set == nil {
		return false
	}
	c := set.Lookup(name)
	if c == nil {
		return false
	}
	n.admit(cs, c)
	return true
}

// reject ends cs after a failed authentication: it is no longer read, and
// the ticker writes its answer and closes it once the delay has passed, so
// that a guesser waits and the loop does not. It runs on cs's loop.
func (lp *loop) reject(cs *conn, why error, now int64) {
	lp.refused.count(why)
	cs.rejected, cs.rejectAt = why, now+int64(lp.n.cfg.AuthFailureDelay)
	lp.rejected.add(lp.n, cs)
}

// endRejected answers and closes the rejected connections whose delay has
// passed. It runs on the loop, from runTick.
func (lp *loop) endRejected(now int64) {
	var due []*conn
	lp.rejected.sweep(lp.n, func(_ int64, cs *conn) bool {
		switch {
		case cs.closed:
		case now >= cs.rejectAt:
			due = append(due, cs)
		default:
			return true
		}
		return false
	})
	for _, cs := range due {
		lp.closeWith(cs, opAuth, cs.rejected)
	}
}

var opAuth = []byte{'U'}

// closeWith writes "E op - reason" on cs and closes it. It runs on cs's
// loop, outside any iteration over lp.conns (closing removes cs from it).
func (lp *loop) closeWith(cs *conn, op []byte, why error) {
	if cs.closed {
		return
	}
	_, _ = cs.c.Write(wire.AppendError(nil, op, nil, wire.Reason(why)))
	_ = lp.el.Close(cs.c)
}

// ReloadAuth re-reads Config.AuthFile. Open connections stay: each goes on
// under its credential's new key prefixes, except those whose credential
// was removed or whose secret changed, which are answered "E - - credentials
// revoked" and closed. A file that cannot be read or parsed leaves the
// credentials in force as they were; the error is logged and returned.
func (n *Node) ReloadAuth() error {
	if n.cfg.AuthFile == "" {
		return errors.New("server: no auth file to re-read (the node was started without one)")
	}
	n.gate.reloadMu.Lock()
	defer n.gate.reloadMu.Unlock()
	set, err := loadCredentials(n.cfg.AuthFile)
	if err != nil {
		n.log.Error().Err(err).Msg("auth file not reloaded: the credentials in force stay")
		return err
	}
	n.gate.auth.Store(set)
	var revoked, kept atomic.Int64
	n.onEachLoop(func(lp *loop) {
		var gone []*conn
		for _, cs := range lp.conns {
			if cs.cred == nil {
				continue
			}
			c := set.Lookup(cs.cred.Name())
			if c == nil || !c.SameSecret(cs.cred) {
				gone = append(gone, cs)
				continue
			}
			cs.cred = c
			kept.Add(1)
		}
		for _, cs := range gone {
			lp.refused.count(errRevoked)
			lp.closeWith(cs, nil, errRevoked)
		}
		revoked.Add(int64(len(gone)))
	})
	n.log.Info().Str("file", n.cfg.AuthFile).Int("credentials", set.Len()).
		Int64("connections_kept", kept.Load()).Int64("connections_revoked", revoked.Load()).
		Msg("auth file reloaded")
	return nil
}
