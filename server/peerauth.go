package server

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"time"

	"github.com/panjf2000/gnet/v2"
	"github.com/rs/zerolog"

	"github.com/kunci/kunci/cluster"
	"github.com/kunci/kunci/replica"
	"github.com/kunci/kunci/wire"
)

// Peer links are authenticated (replica's handshake) before anything a peer
// says is acted on. An accepted connection is a client until its first line
// is a peer's hello and its second a proof that passes; until then it
// counts against Config.MaxConns like any client, and a peer frame ("P …")
// on it is refused and closes it (see loop.parse).

var (
	errNotCluster       = errors.New("server: this node is not in a cluster")
	errPeerUnauthorized = errors.New("server: peer link not authenticated")
)

// peerHandshake drives the handshake of an accepted connection cs whose
// first line may be a peer's hello. It returns the peer link cs became once
// the dialling node proved the key, or nil: cs is then a client
// (cs.client), still in its handshake (cs.hs), or refused (the action says
// Close). It runs on cs's loop.
func (n *Node) peerHandshake(cs *conn, c gnet.Conn) (gnet.Action, *peerConn) {
	for {
		buf, _ := c.Peek(-1)
		i := bytes.IndexByte(buf, '\n')
		if cs.hs == nil && len(buf) > 0 && (buf[0] != 'N' || len(buf) > 1 && buf[1] != ' ' && buf[1] != '\n' && buf[1] != '\r') {
			if cs.probation {
				// A client in a slot kept for peers.
				n.refused.count(errTooManyConns)
				_, _ = c.Write([]byte("E - - too many connections\n"))
				return gnet.Close, nil
			}
			cs.client = true
			return gnet.None, nil
		}
		if i < 0 {
			if len(buf) >= replica.MaxLine {
				return n.lineTooLong(cs), nil
			}
			return gnet.None, nil
		}
		if i+1 > replica.MaxLine {
			return n.lineTooLong(cs), nil
		}
		line := bytes.TrimSuffix(buf[:i], []byte("\r"))
		if cs.hs == nil {
			hs, challenge, err := n.acceptHello(line)
			_, _ = c.Discard(i + 1)
			if err != nil {
				return n.refusePeer(cs, c, 'N', err), nil
			}
			cs.hs = hs
			_, _ = c.Write(challenge)
			continue
		}
		err := cs.hs.Proof(line)
		_, _ = c.Discard(i + 1)
		if err != nil {
			return n.refusePeer(cs, c, 'V', err), nil
		}
		return gnet.None, n.adoptPeer(cs, c)
	}
}

func (n *Node) acceptHello(line []byte) (*replica.Accepting, []byte, error) {
	cl := n.cl
	if cl == nil {
		return nil, nil, errNotCluster
	}
	isPeer := func(addr string) bool {
		i := cl.Index(addr)
		return i >= 0 && i != cl.Self()
	}
	return replica.Accept(n.peers.keys, n.run.self, cl.Inc(), line, isPeer, nil)
}

// refusePeer answers a failed handshake step with an E line, logs it (at
// most once a few seconds per reason), and closes the connection.
func (n *Node) refusePeer(cs *conn, c gnet.Conn, op byte, err error) gnet.Action {
	n.peers.refused.Add(1)
	cs.out = wire.AppendError(cs.out, []byte{op}, nil, wire.Reason(err))
	cs.lp.markDirty(cs)
	cs.lp.flush()
	n.peers.log.Warn(n.log, "refused "+wire.Reason(err), func(e *zerolog.Event) {
		e.Str("remote", c.RemoteAddr().String()).Err(err)
	}, "refused a peer handshake")
	return gnet.Close
}

// probationTimeout is how long a connection taken into the peers' reserve
// of slots (connTable) may take to prove itself a peer.
const probationTimeout = 2 * time.Second

// watchProbation keeps cs, on probation, for the ticker to close if it has
// not proved itself a peer in time.
func (lp *loop) watchProbation(cs *conn) {
	lp.probation.add(lp.n, cs)
}

// expireProbation closes the connections on probation that did not prove
// themselves peers within probationTimeout. It runs on lp from the ticker.
func (lp *loop) expireProbation() {
	lp.probation.sweep(lp.n, func(now int64, cs *conn) bool {
		switch {
		case cs.closed:
		case now-cs.openedAt > int64(probationTimeout):
			_ = lp.el.Close(cs.c)
		default:
			return true
		}
		return false
	})
}

// dialLink connects to peer i, proves the cluster key, and adopts the link
// into a loop (cluster.Host.Dial). It returns once OnOpen took it, or with
// why not. It runs on the cluster driver's goroutine.
func (n *Node) dialLink(i int, timeout time.Duration) error {
	nc, keys, err := n.dialPeer(i, timeout)
	nc, err = n.peerLink(nc, err) // a TLS link: its TCP socket, for gnet
	if err != nil {
		return err
	}
	pc := &peerConn{n: n, idx: i, peerInc: keys.inc, version: keys.version, out: true, keys: keys}
	ctx := gnet.NewContext(gnet.NewNetConnContext(context.Background(), nc), pc)
	ch, err := n.run.eng.Register(ctx)
	if err != nil {
		nc.Close()
		return fmt.Errorf("%w: %w", cluster.ErrNotTaken, err)
	}
	select {
	case <-ch:
	case <-time.After(timeout):
	}
	if !pc.registered.Load() {
		return cluster.ErrNotTaken // the loop did not take it (stopping, say)
	}
	return nil
}

// dialPeer connects to peer i and runs the handshake as the dialling side,
// within timeout. It returns the connection, ready to be adopted into a
// loop, with the proof written and nothing of the peer's unread, and the
// peer's incarnation and the link's session keys.
func (n *Node) dialPeer(i int, timeout time.Duration) (net.Conn, peerKeys, error) {
	addr := n.cfg.Peers[i]
	nc, err := n.dialPeerTransport(addr, timeout)
	if err != nil {
		return nil, peerKeys{}, err
	}
	_ = nc.SetDeadline(time.Now().Add(timeout))
	d, hello, err := replica.Dial(n.peers.keys, n.run.self, n.cl.Inc(), addr, nil)
	if err == nil {
		_, err = nc.Write(hello)
	}
	var proof []byte
	var incA uint64
	if err == nil {
		r := bufio.NewReaderSize(nc, replica.MaxLine)
		var line []byte
		line, err = r.ReadSlice('\n')
		switch {
		case err == bufio.ErrBufferFull:
			err = fmt.Errorf("%w: a %d-byte first line is not a kunci peer's answer", replica.ErrBadHandshake, len(line))
		case err != nil && len(line) > 0:
			err = fmt.Errorf("%w: %q is not a kunci peer's answer", replica.ErrBadHandshake, bytes.TrimSpace(line))
		case err == nil && r.Buffered() > 0:
			err = fmt.Errorf("%w: the peer said more than its challenge", replica.ErrBadHandshake)
		case err == nil:
			proof, incA, err = d.Challenge(bytes.TrimSuffix(bytes.TrimSuffix(line, []byte("\n")), []byte("\r")))
		}
	}
	if err == nil {
		_, err = nc.Write(proof)
	}
	if err != nil {
		nc.Close()
		return nil, peerKeys{}, err
	}
	_ = nc.SetDeadline(time.Time{})
	k := peerKeys{inc: incA, version: d.Version()}
	k.send, k.recv = d.Keys()
	return nc, k, nil
}

// peerKeys is what a dialled link's handshake gave: the peer's incarnation,
// the peer protocol's version and the link's session keys (zero for an
// insecure cluster).
type peerKeys struct {
	inc        uint64
	version    int
	send, recv replica.SessionKey
}
