package server

import (
	"context"
	"errors"
	"net/http"
	"strconv"
	"time"
	"unicode/utf8"

	"github.com/panjf2000/gnet/v2"

	"github.com/kunci/kunci/engine"
	"github.com/kunci/kunci/wire"
)

// Holding is a held key's grant as a node sees it: for a key held by
// several grants (a semaphore's, or shared ones), its oldest, with the
// tokens of all of them.
type Holding struct {
	Token     uint64
	Remaining time.Duration // lease left
	Owner     string        // "" when the grant has none
	Mode      engine.Mode   // the zero Mode for a key held by one exclusive grant
	Tokens    []uint64      // every grant's token, oldest first, for a key with a Mode
}

// Holders returns every held key with its grant: on a standby, its copy of
// the active's state. It copies the whole table: for tests and small
// states; a listing (L, /locks) walks the table a chunk at a time instead.
func (n *Node) Holders() map[string]Holding {
	out := make(map[string]Holding)
	for i := range n.shards {
		b := &n.shards[i]
		b.mu.Lock()
		now := n.now()
		b.sh.Each(func(h engine.Held) {
			k := string(h.Key)
			if h.Mode == (engine.Mode{}) {
				out[k] = Holding{Token: h.Token, Remaining: time.Duration(h.Deadline - now), Owner: string(h.Owner)}
				return
			}
			hd, ok := out[k]
			if !ok { // the key's oldest grant: Each visits a key's grants oldest first
				hd = Holding{Token: h.Token, Remaining: time.Duration(h.Deadline - now), Owner: string(h.Owner), Mode: h.Mode}
			}
			hd.Tokens = append(hd.Tokens, h.Token)
			out[k] = hd
		})
		b.mu.Unlock()
	}
	return out
}

// Listings. "L limit [prefix]" lists the held keys a connection may see:
// one "H key token left waiters [owner=…]" line each, then "L count", or
// "L count more" when the limit left some unlisted. The admin endpoint's
// /locks gives the same as JSON (admin.go).
//
// A listing never copies the lock table. It walks each shard in turn with
// an engine.Cursor, listChunk keys at a time under the shard's mutex, as a
// standby's snapshot does (snapshot.go), so the shards are held for a chunk
// at a time and the node's memory for a listing is a cursor and a chunk's
// lines. On a client connection the listing waits while more than
// listWindow of the connection's output is unsent: a client that stops
// reading holds up only its own listing, and is closed once it has read
// nothing for Config.StallTimeout. The connection reads no request sent after the L
// until the listing ends, so that its lines come before their answers;
// answers to its earlier acquires (A, T) may come between them.
const (
	listChunk  = 256       // keys visited per shard-mutex hold
	listStep   = 64 << 10  // bytes a listing writes per turn of its loop
	listWindow = 256 << 10 // unsent output before a listing waits for its client
	// sessionChunk is listChunk for a session's listing (S): it passes
	// over other sessions' grants at the cost of a comparison each
	// (engine.Shard.ScanSession), a few nanoseconds, so a hold of the
	// mutex visits more keys for the same time.
	sessionChunk = 16 << 10
)

// shardWalk walks the node's shards in order with an engine cursor, a
// chunk of keys per hold of a shard's mutex (a listing's, a snapshot's).
// It belongs to one goroutine at a time.
type shardWalk struct {
	shard int           // the shard being walked
	cur   engine.Cursor // under that shard's mutex, while open
	open  bool
}

// lock takes the mutex of the shard being walked, opens the cursor on it if
// it is not open yet, and returns the shard.
func (w *shardWalk) lock(n *Node) *shardBox {
	b := &n.shards[w.shard]
	b.mu.Lock()
	if !w.open {
		b.sh.Open(&w.cur)
		w.open = true
	}
	return b
}

// next moves on to the next shard, the cursor having walked this one to
// its end (or been closed).
func (w *shardWalk) next() {
	w.open = false
	w.shard++
}

// closeCursor closes the cursor, if it is open, under its shard's mutex.
func (w *shardWalk) closeCursor(n *Node) {
	if w.open {
		b := &n.shards[w.shard]
		b.mu.Lock()
		b.sh.Close(&w.cur)
		b.mu.Unlock()
		w.open = false
	}
}

// listWalk walks every shard's held keys for a listing. It belongs to one
// goroutine at a time: a connection's loop, or an admin request's.
type listWalk struct {
	prefix string
	limit  uint64 // 0: no limit
	// session, when set, lists that session's grants only (S), and passes
	// over the shards where it holds none without walking them.
	session engine.Session
	// allow, when set, says whether the listing shows key (a client's
	// credential); it runs under the shard's mutex.
	allow func(key []byte) bool
	shardWalk
	count uint64 // keys listed
	more  bool   // the limit was reached with a key left to list
}

// done reports whether the walk is over: every shard walked, or the limit
// reached with more to list.
func (w *listWalk) done(n *Node) bool { return w.more || w.shard == len(n.shards) }

// step visits up to listChunk keys of the shard being walked, under its
// mutex, and appends each one the listing shows to dst with emit, given
// the key's grant and its lease left in ms.
func (w *listWalk) step(n *Node, dst []byte, emit func(dst []byte, h *engine.Held, leftMs int64) []byte) []byte {
	b := w.lock(n)
	now := n.now()
	visit := func(h engine.Held) {
		if w.more || !hasPrefix(h.Key, w.prefix) || w.allow != nil && !w.allow(h.Key) {
			return
		}
		if w.limit != 0 && w.count == w.limit {
			w.more = true
			return
		}
		w.count++
		dst = emit(dst, &h, ceilMs(h.Deadline-now))
	}
	var finished bool
	if w.session != 0 {
		finished = b.sh.ScanSession(&w.cur, sessionChunk, w.session, visit)
	} else {
		finished = b.sh.Scan(&w.cur, listChunk, visit)
	}
	if w.more && !finished {
		b.sh.Close(&w.cur)
		finished = true
	}
	b.mu.Unlock()
	if finished {
		w.next()
	}
	return dst
}

// close ends the walk, closing its cursor.
func (w *listWalk) close(n *Node) {
	w.closeCursor(n)
	w.shard = len(n.shards)
}

// listing is a client connection's listing in progress, owned by the
// connection's loop.
type listing struct {
	listWalk
	// ofSession: the listing answers S, and ends with "S count".
	ofSession bool
	started   bool
	waiting   int64 // since when it waits for its client to read (node clock), 0: not
	task      gnet.Runnable
}

// startList begins the listing req asked for on cs; serve stops reading
// cs's lines, and steps it once the lines before it are answered.
func (lp *loop) startList(cs *conn, req *wire.Request) {
	lp.beginList(cs, &listing{listWalk: listWalk{prefix: string(req.Prefix), limit: req.Limit}})
}

// Refusals of S, and of an acquire's seen=, counted by reason.
var (
	errNoSession    = errors.New("server: no session")
	errSessionNamed = errors.New("server: session already named")
)

// startSession names cs's session, as S asked (a connection names one
// session: naming it again lists it again, naming another is refused), and
// begins the listing of its grants, as startList begins L's.
func (lp *loop) startSession(cs *conn, req *wire.Request) {
	sess := engine.Session(req.Session)
	if cs.session != 0 && cs.session != sess {
		lp.refused.count(errSessionNamed)
		cs.out = wire.AppendError(cs.out, req.EchoOp, req.EchoKey, wire.Reason(errSessionNamed))
		lp.markDirty(cs)
		return
	}
	// cs.session is set as the listing starts (stepList): after the
	// requests sent before the S are executed.
	lp.beginList(cs, &listing{listWalk: listWalk{session: sess}, ofSession: true})
}

// beginList makes ls cs's listing.
func (lp *loop) beginList(cs *conn, ls *listing) {
	if cs.cred != nil {
		ls.allow = func(key []byte) bool { return cs.cred == nil || cs.cred.Allows(key) }
	}
	ls.task = gnet.RunnableFunc(func(context.Context) error {
		lp.stepList(cs)
		return nil
	})
	cs.list = ls
}

// stepList writes the next lines of cs's listing: until it ends, the
// connection's unsent output passes listWindow (the ticker comes back once
// it drains: resumeLists), or listStep bytes went out this turn (a task
// comes back after the loop's other connections). It runs on cs's loop.
func (lp *loop) stepList(cs *conn) {
	n := lp.n
	ls := cs.list
	if ls == nil || cs.closed || ls.waiting != 0 {
		return
	}
	if !ls.started && ls.ofSession {
		cs.session = ls.session
	}
	ls.started = true
	for sent := 0; ; {
		if !n.roles.deciding() {
			// Between roles: a node that stays active lists on after the
			// thaw; one that does not redirects and closes cs.
			lp.waitList(cs, 0)
			return
		}
		if cs.c.OutboundBuffered()+cs.held > listWindow {
			lp.waitList(cs, n.now())
			return
		}
		if sent >= listStep {
			_ = lp.el.Execute(context.Background(), ls.task)
			return
		}
		if ls.done(n) {
			if ls.ofSession {
				cs.out = wire.AppendSessionEnd(cs.out, ls.count)
			} else {
				cs.out = wire.AppendListEnd(cs.out, ls.count, ls.more)
			}
			ls.close(n)
			cs.list = nil
			lp.markDirty(cs)
			lp.flush()
			if !cs.closed {
				_ = cs.c.Wake(nil) // read what it sent after the L
			}
			return
		}
		before := len(cs.out)
		cs.out = ls.step(n, cs.out, appendListed)
		sent += len(cs.out) - before
		lp.markDirty(cs)
		lp.flush()
		if cs.closed {
			return // the write failed; OnClose ended the walk
		}
	}
}

func appendListed(dst []byte, h *engine.Held, leftMs int64) []byte {
	return wire.AppendListed(dst, h.Key, h.Token, leftMs, uint64(h.Waiters), h.Owner, wireGroup(h.Mode, h.Holders))
}

// waitList keeps cs for the ticker, which resumes its listing once its
// client has read some of it (since: when it began to wait for that), or
// once the node is active and thawed again (since 0).
func (lp *loop) waitList(cs *conn, since int64) {
	cs.list.waiting = max(since, 1)
	if since == 0 {
		cs.list.waiting = -1
	}
	lp.lists.add(lp.n, cs)
}

// resumeLists continues the listings whose connections drained to half the
// window, and closes those whose clients read nothing for Config.StallTimeout. It
// runs on lp from the ticker.
func (lp *loop) resumeLists() {
	n := lp.n
	between := !n.roles.deciding()
	var resume []*conn
	lp.lists.sweep(n, func(now int64, cs *conn) bool {
		ls := cs.list
		switch {
		case cs.closed || ls == nil:
		case ls.waiting < 0: // waited for the node
			if between {
				return true
			}
			ls.waiting = 0
			resume = append(resume, cs)
		case cs.c.OutboundBuffered()+cs.held <= listWindow/2:
			ls.waiting = 0
			resume = append(resume, cs)
		case now-ls.waiting > int64(n.cfg.StallTimeout):
			// It has not read its listing for long: let its memory go.
			n.slowClosed.Add(1)
			_ = cs.c.Close()
		default:
			return true
		}
		return false
	})
	for _, cs := range resume {
		lp.stepList(cs)
	}
}

// endList ends cs's listing, if one runs, as cs closes. It runs on cs's
// loop.
func (n *Node) endList(cs *conn) {
	if cs.list != nil {
		cs.list.close(n)
		cs.list = nil
	}
}

// hasPrefix reports whether key starts with prefix, without a copy.
func hasPrefix(key []byte, prefix string) bool {
	return len(key) >= len(prefix) && string(key[:len(prefix)]) == prefix
}

// Admin listings (/locks) list adminListDefault keys unless told another
// limit; each write must go out within adminListWrite, or the listing is
// given up.
const (
	adminListDefault = 1000
	adminListWrite   = 30 * time.Second
)

// serveLocks answers /locks?prefix=P&limit=N with the held keys as JSON:
//
//	{"role":"active","locks":[
//	{"key":"orders/42","token":7,"lease_left_ms":28140,"waiters":2,"owner":"web-3:4121"},
//	{"key":"pool/db","token":9,"lease_left_ms":1200,"waiters":0,"holders":2,"limit":3},
//	…
//	],"count":2,"more":false}
//
// limit defaults to adminListDefault; 0 lists every held key. It walks the
// shards as a client's listing does, a chunk under each shard's mutex, and
// writes each chunk before it takes the next: its memory is a chunk, and a
// reader that stops reading for adminListWrite ends it. On a standby it
// lists the standby's copy of the active's grants (with no waiters).
func (n *Node) serveLocks(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	prefix := q.Get("prefix")
	if prefix != "" && !wire.ValidKey([]byte(prefix)) {
		http.Error(w, "bad prefix: a prefix is 1 to 250 bytes with no space or control byte", http.StatusBadRequest)
		return
	}
	limit := uint64(adminListDefault)
	if s := q.Get("limit"); s != "" {
		v, err := strconv.ParseUint(s, 10, 64)
		if err != nil {
			http.Error(w, "bad limit: a limit is a whole number, 0 for no limit", http.StatusBadRequest)
			return
		}
		limit = v
	}
	w.Header().Set("Content-Type", "application/json")
	if r.Method == http.MethodHead {
		return
	}
	rc := http.NewResponseController(w)
	walk := listWalk{prefix: prefix, limit: limit}
	defer walk.close(n)
	buf := append(make([]byte, 0, 64<<10), `{"role":`...)
	buf = appendJSONString(buf, []byte(n.Role()))
	buf = append(buf, `,"locks":[`...)
	first := true
	emit := func(dst []byte, h *engine.Held, leftMs int64) []byte {
		if !first {
			dst = append(dst, ',')
		}
		first = false
		dst = append(dst, "\n{\"key\":"...)
		dst = appendJSONString(dst, h.Key)
		dst = append(dst, `,"token":`...)
		dst = strconv.AppendUint(dst, h.Token, 10)
		dst = append(dst, `,"lease_left_ms":`...)
		dst = strconv.AppendInt(dst, leftMs, 10)
		dst = append(dst, `,"waiters":`...)
		dst = strconv.AppendInt(dst, int64(h.Waiters), 10)
		if len(h.Owner) > 0 {
			dst = append(dst, `,"owner":`...)
			dst = appendJSONString(dst, h.Owner)
		}
		if h.Mode != (engine.Mode{}) {
			dst = append(dst, `,"holders":`...)
			dst = strconv.AppendInt(dst, int64(h.Holders), 10)
			if h.Mode.Shared {
				dst = append(dst, `,"mode":"shared"`...)
			} else {
				dst = append(dst, `,"limit":`...)
				dst = strconv.AppendUint(dst, uint64(h.Mode.Slots), 10)
			}
		}
		return append(dst, '}')
	}
	for !walk.done(n) {
		buf = walk.step(n, buf, emit)
		if len(buf) < 32<<10 && !walk.done(n) {
			continue // a chunk visited mostly keys outside the prefix
		}
		_ = rc.SetWriteDeadline(time.Now().Add(adminListWrite))
		if _, err := w.Write(buf); err != nil {
			return
		}
		buf = buf[:0]
	}
	buf = append(buf, "\n],\"count\":"...)
	buf = strconv.AppendUint(buf, walk.count, 10)
	buf = append(buf, `,"more":`...)
	buf = strconv.AppendBool(buf, walk.more)
	buf = append(buf, "}\n"...)
	_ = rc.SetWriteDeadline(time.Now().Add(adminListWrite))
	_, _ = w.Write(buf)
}

// appendJSONString appends s as a JSON string. Keys are bytes, not always
// UTF-8: a byte that is not part of valid UTF-8 is written as U+FFFD.
func appendJSONString(dst []byte, s []byte) []byte {
	const hex = "0123456789abcdef"
	dst = append(dst, '"')
	for i := 0; i < len(s); {
		c := s[i]
		if c < utf8.RuneSelf {
			switch {
			case c == '"' || c == '\\':
				dst = append(dst, '\\', c)
			case c < 0x20 || c == 0x7f:
				dst = append(dst, '\\', 'u', '0', '0', hex[c>>4], hex[c&15])
			default:
				dst = append(dst, c)
			}
			i++
			continue
		}
		r, size := utf8.DecodeRune(s[i:])
		if r == utf8.RuneError && size == 1 {
			dst = append(dst, `\ufffd`...)
		} else {
			dst = append(dst, s[i:i+size]...)
		}
		i += size
	}
	return append(dst, '"')
}
