package server

import (
	"context"
	"io"
	"net"

	"github.com/panjf2000/gnet/v2"

	"github.com/kunci/kunci/replica"
)

// sealedConn is a peer link whose frames are sealed (replica's Sealer and
// Opener): every write goes out as batches of whole frames, each followed
// by its MAC line, and what arrives is let through to the peer code only a
// checked batch at a time. A link over TLS is not sealed (TLS has integrity
// of its own), nor one of an insecure cluster (no key to seal with).
//
// It is owned by the link's loop, like the gnet.Conn it wraps; AsyncWrite
// may be called from any goroutine and seals on the loop.
type sealedConn struct {
	socket
	seal    *replica.Sealer
	open    *replica.Opener
	inbound        // frames of checked batches not yet consumed
	raw     []byte // the start of the batch under way: read, its MAC line not yet
	vec     [2][]byte
	closed  bool // OnClose ran: nothing may be written any more
}

// maxKeptPlain is the largest checked-frames buffer a link keeps once it is
// all consumed. A loaded active's stream brings a standby a few hundred
// KiB a read; at 64 KiB such a buffer was let go and grown again on every
// read (8 MB/s of garbage on a standby under 50×16 cycles).
const maxKeptPlain = 1 << 20

// sealed wraps c, a peer link that proved the key, when send and recv (its
// session keys) say it is to be sealed; otherwise it returns c.
func sealed(c gnet.Conn, send, recv replica.SessionKey) gnet.Conn {
	if !send.Sealed() {
		return c
	}
	if _, ok := c.(*tlsConn); ok {
		return c
	}
	return &sealedConn{socket: socket{c}, seal: replica.NewSealer(send), open: replica.NewOpener(recv)}
}

// openBatches takes the batches whose MAC checks off what gnet read, into
// plain. An error means the link must be closed.
//
// It takes all gnet read, every time, and keeps the batch under way (read
// in part: its MAC line has not come) in raw itself. Left in gnet, that
// part would be copied into the connection's own buffer, and on the next
// read Peek would copy it and the new bytes into a fresh slice, a large
// allocation for each piece of a large batch: with 2 ms batches (two reads
// each), 6 % of a standby's CPU went to those allocations and the scavenger
// giving their memory back.
func (s *sealedConn) openBatches() error {
	if s.off == len(s.plain) && cap(s.plain) > maxKeptPlain {
		s.plain, s.off = nil, 0 // a burst's buffer is not kept
	}
	read, _ := s.Conn.Next(-1) // gnet's own buffer stays empty: no copy
	raw := read
	if len(s.raw) > 0 {
		s.raw = append(s.raw, read...)
		raw = s.raw
	}
	used := 0
	for {
		n, batch, err := s.open.Open(raw[used:])
		if err != nil {
			return err
		}
		if n == 0 {
			break
		}
		s.put(batch)
		used += n
	}
	// Open refuses a batch longer than replica.MaxBatch: raw stays within
	// that and one read.
	if len(s.raw) > 0 {
		s.raw = s.raw[:copy(s.raw, raw[used:])]
	} else {
		s.raw = append(s.raw, raw[used:]...)
	}
	if len(s.raw) == 0 && cap(s.raw) > maxKeptPlain {
		s.raw = nil
	}
	return nil
}

// The sealing side of gnet.Writer. b must hold whole frames.

func (s *sealedConn) Write(b []byte) (int, error) {
	for rest := b; len(rest) > 0; {
		batch := replica.Split(rest)
		s.vec = [2][]byte{batch, s.seal.Seal(batch)}
		_, err := s.Conn.Writev(s.vec[:])
		s.vec = [2][]byte{}
		if err != nil {
			return len(b) - len(rest), err
		}
		rest = rest[len(batch):]
	}
	return len(b), nil
}

func (s *sealedConn) Writev(bs [][]byte) (int, error) { return writev(s, bs) }

func (s *sealedConn) ReadFrom(r io.Reader) (int64, error) { return readFrom(s, r) }

// AsyncWrite seals and writes buf on the link's loop; callback, if any,
// runs there after. Safe for any goroutine; buf must not change until then.
func (s *sealedConn) AsyncWrite(buf []byte, callback gnet.AsyncCallback) error {
	return asyncWritev(s, &s.closed, [][]byte{buf}, callback)
}

func (s *sealedConn) AsyncWritev(bs [][]byte, callback gnet.AsyncCallback) error {
	return asyncWritev(s, &s.closed, bs, callback)
}

// writev, readFrom and asyncWritev are the write side of a wrapper
// (tlsConn, sealedConn) in terms of its Write: what it writes goes through
// it, to be encrypted or sealed.
func writev(c gnet.Conn, bs [][]byte) (int, error) {
	n := 0
	for _, b := range bs {
		m, err := c.Write(b)
		n += m
		if err != nil {
			return n, err
		}
	}
	return n, nil
}

func readFrom(c gnet.Conn, r io.Reader) (int64, error) {
	b, err := io.ReadAll(r)
	if err != nil {
		return 0, err
	}
	n, err := c.Write(b)
	return int64(n), err
}

// asyncWritev writes bs through c on its loop, unless *closed (OnClose ran)
// by then; callback, if any, runs there after.
func asyncWritev(c gnet.Conn, closed *bool, bs [][]byte, callback gnet.AsyncCallback) error {
	return c.EventLoop().Execute(context.Background(), gnet.RunnableFunc(func(context.Context) error {
		err := net.ErrClosed
		if !*closed {
			_, err = c.Writev(bs)
		}
		if callback != nil {
			return callback(c, err)
		}
		return nil
	}))
}

// socket is the gnet connection a wrapper (tlsConn, sealedConn) sends and
// receives its bytes through. Embedded in a struct of its own, its methods
// sit one level deeper than the wrapper's inbound: the wrapper's reads are
// inbound's, its other methods the connection's.
type socket struct{ gnet.Conn }

// inbound is the read side of a connection that hands the node bytes it
// made itself (decrypted, checked): plain[off:] are not consumed yet. It
// implements gnet.Reader's methods for the loop that owns the connection.
type inbound struct {
	plain []byte
	off   int
}

// put appends b to what is not consumed.
func (in *inbound) put(b []byte) {
	if in.off == len(in.plain) {
		in.plain, in.off = in.plain[:0], 0
	}
	in.plain = append(in.plain, b...)
}

func (in *inbound) InboundBuffered() int { return len(in.plain) - in.off }

func (in *inbound) Peek(n int) ([]byte, error) {
	avail := len(in.plain) - in.off
	if n > avail {
		return nil, io.ErrShortBuffer // as gnet's Peek
	}
	if n <= 0 {
		n = avail
	}
	return in.plain[in.off : in.off+n], nil
}

// Next's slice, like Peek's, is valid until more is put.
func (in *inbound) Next(n int) ([]byte, error) {
	b, err := in.Peek(n)
	in.off += len(b)
	return b, err
}

func (in *inbound) Discard(n int) (int, error) {
	avail := len(in.plain) - in.off
	if n < 0 || n > avail {
		n = avail
	}
	in.off += n
	return n, nil
}

func (in *inbound) Read(b []byte) (int, error) {
	if in.off == len(in.plain) {
		return 0, io.EOF
	}
	n := copy(b, in.plain[in.off:])
	in.off += n
	return n, nil
}

func (in *inbound) WriteTo(w io.Writer) (int64, error) {
	n, err := w.Write(in.plain[in.off:])
	in.off += n
	return int64(n), err
}
