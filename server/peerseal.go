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
	gnet.Conn
	seal *replica.Sealer
	open *replica.Opener
	// plain[off:] are frames of checked batches not yet consumed.
	plain  []byte
	off    int
	vec    [2][]byte
	closed bool // OnClose ran: nothing may be written any more
}

// maxKeptPlain is the largest checked-frames buffer a link keeps once it is
// all consumed.
const maxKeptPlain = 64 << 10

// sealed wraps c, a peer link that proved the key, when send and recv (its
// session keys) say it is to be sealed; otherwise it returns c.
func sealed(c gnet.Conn, send, recv []byte) gnet.Conn {
	if send == nil {
		return c
	}
	if _, ok := c.(*tlsConn); ok {
		return c
	}
	return &sealedConn{Conn: c, seal: replica.NewSealer(send), open: replica.NewOpener(recv)}
}

// openBatches takes the batches whose MAC checks off what gnet read, into
// plain. An error means the link must be closed.
func (s *sealedConn) openBatches() error {
	raw, _ := s.Conn.Peek(-1)
	used := 0
	for {
		n, batch, err := s.open.Open(raw[used:])
		if err != nil {
			return err
		}
		if n == 0 {
			break
		}
		if s.off == len(s.plain) {
			s.plain, s.off = s.plain[:0], 0
		}
		s.plain = append(s.plain, batch...)
		used += n
	}
	if used > 0 { // gnet's Discard(0) discards everything
		_, _ = s.Conn.Discard(used)
	}
	return nil
}

// The checked side of gnet.Reader.

func (s *sealedConn) InboundBuffered() int { return len(s.plain) - s.off }

func (s *sealedConn) Peek(n int) ([]byte, error) {
	avail := len(s.plain) - s.off
	if n > avail {
		return nil, io.ErrShortBuffer
	}
	if n <= 0 {
		n = avail
	}
	return s.plain[s.off : s.off+n], nil
}

func (s *sealedConn) Discard(n int) (int, error) {
	avail := len(s.plain) - s.off
	if n < 0 || n > avail {
		n = avail
	}
	s.off += n
	if s.off == len(s.plain) && cap(s.plain) > maxKeptPlain {
		s.plain, s.off = nil, 0
	}
	return n, nil
}

func (s *sealedConn) Next(n int) ([]byte, error) {
	b, err := s.Peek(n)
	s.off += len(b)
	return b, err
}

func (s *sealedConn) Read(b []byte) (int, error) {
	if s.off == len(s.plain) {
		return 0, io.EOF
	}
	n := copy(b, s.plain[s.off:])
	s.off += n
	return n, nil
}

func (s *sealedConn) WriteTo(w io.Writer) (int64, error) {
	n, err := w.Write(s.plain[s.off:])
	s.off += n
	return int64(n), err
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

func (s *sealedConn) Writev(bs [][]byte) (int, error) {
	n := 0
	for _, b := range bs {
		m, err := s.Write(b)
		n += m
		if err != nil {
			return n, err
		}
	}
	return n, nil
}

// AsyncWrite seals and writes buf on the link's loop; callback, if any,
// runs there after. Safe for any goroutine; buf must not change until then.
func (s *sealedConn) AsyncWrite(buf []byte, callback gnet.AsyncCallback) error {
	return s.AsyncWritev([][]byte{buf}, callback)
}

func (s *sealedConn) AsyncWritev(bs [][]byte, callback gnet.AsyncCallback) error {
	return s.Conn.EventLoop().Execute(context.Background(), gnet.RunnableFunc(func(context.Context) error {
		err := net.ErrClosed
		if !s.closed {
			_, err = s.Writev(bs)
		}
		if callback != nil {
			return callback(s, err)
		}
		return nil
	}))
}

// ReadFrom and SendTo are not used on peer links.

func (s *sealedConn) ReadFrom(r io.Reader) (int64, error) {
	b, err := io.ReadAll(r)
	if err != nil {
		return 0, err
	}
	n, err := s.Write(b)
	return int64(n), err
}
