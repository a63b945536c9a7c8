package server

import (
	"bufio"
	"bytes"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
)

// The buffer budget. gnet buffers without limit, and each connection's own
// limits (Config.OutputLimit, Config.InputLimit) bound one connection, not
// their sum: thousands of connections that send requests and never read
// their answers would each be let fill its limits. So the node counts, in
// Node.budget, what every client connection holds in its memory — unsent
// output (gnet's outbound buffer and answers held for a standby) and unread
// input (gnet's inbound buffer, or a TLS connection's decrypted bytes) —
// and holds the sum to Config.MaxBuffered:
//
//   - Under pressure (the sum at half the budget or more) every connection
//     is held to pressedLimit: it is not read once its unsent output passes
//     it, and is closed when its unread input does, instead of the
//     megabytes its own limits allow. A client that reads its answers never
//     gets there: its output leaves at once.
//   - Over budget, each loop's ticker turn closes the connections of that
//     loop holding the most, worst first, until the sum is back within it.
//   - When the pressure has passed (the sum below an eighth of the budget),
//     the freed memory is handed back to the operating system
//     (release.go): Go's own scavenger would take minutes to.
//
// A connection's charge is what it held when its loop last looked: after
// each write, read and ticker turn. Output the kernel takes after that
// (EPOLLOUT) is seen at the next ticker turn: connections with a charge are
// on their loop's owing list, which the ticker goes through while it is not
// empty. The sum may so run a little high, never low for long.

// budget is the node's count of buffered bytes. Safe for concurrent use.
type budget struct {
	buffered atomic.Int64  // what client connections hold, summed
	squeezed atomic.Bool   // there was pressure since memory was last released
	closed   atomic.Uint64 // connections closed over budget
}

// pressedLimit is the most unsent output, and unread input, a connection
// may hold while the node is under buffer pressure: the input a serve
// takes at once, so that a paused client is still resumed by one turn.
const pressedLimit = serveBudget

// sendBuffer is the kernel send buffer of a client connection (Linux
// doubles it for its own bookkeeping). Without it, the kernel's autotuning
// would let each connection that does not read hold megabytes of the
// node's answers in kernel memory, outside the budget, and take the CPU to
// copy them there. A lock service's answers are short: 128 KiB carries
// thousands of them, more than a client far away has in flight.
const sendBuffer = 128 << 10

// minMaxBuffered is the smallest budget Config accepts.
const minMaxBuffered = 4 << 20

// DefaultMaxBuffered is Config.MaxBuffered's default: a sixteenth of the
// memory the process may use (its cgroup's limit, else the machine's),
// between 32 MiB and 512 MiB.
func DefaultMaxBuffered() int64 {
	return min(max(memoryAvailable()/16, 32<<20), 512<<20)
}

// memoryAvailable returns the memory this process may use: the cgroup's
// limit where one is set, else the machine's memory; 4 GiB when neither
// can be read.
func memoryAvailable() int64 {
	total := int64(4 << 30)
	if f, err := os.Open("/proc/meminfo"); err == nil {
		s := bufio.NewScanner(f)
		for s.Scan() {
			if rest, ok := strings.CutPrefix(s.Text(), "MemTotal:"); ok {
				kb, err := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(rest), " kB"), 10, 64)
				if err == nil && kb > 0 {
					total = kb << 10
				}
				break
			}
		}
		_ = f.Close()
	}
	for _, p := range []string{"/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"} {
		b, err := os.ReadFile(p)
		if err != nil {
			continue
		}
		if v, err := strconv.ParseInt(string(bytes.TrimSpace(b)), 10, 64); err == nil && v > 0 && v < total {
			total = v // "max", or v1's huge "no limit", leave the machine's
		}
	}
	return total
}

// footprint is the memory a buffer of b bytes takes in gnet: its pieces
// are rounded up to powers of two, and a connection's outbound bytes start
// in a ring of 64 KiB (gnet's default WriteBufferCap) that stays with it.
func footprint(b int) int {
	if b == 0 {
		return 0
	}
	return 2*b + 64<<10
}

// pressed reports whether the node is under buffer pressure.
func (n *Node) pressed() bool { return 2*n.budget.buffered.Load() >= n.cfg.MaxBuffered }

// outputLimit is the unsent output past which a connection is not read.
func (n *Node) outputLimit() int {
	if n.pressed() {
		return min(pressedLimit, n.cfg.OutputLimit)
	}
	return n.cfg.OutputLimit
}

// inputLimit is the unread input past which a connection that is not read
// is closed.
func (n *Node) inputLimit() int {
	if n.pressed() {
		return min(pressedLimit, n.cfg.InputLimit)
	}
	return n.cfg.InputLimit
}

// charge counts what cs holds now in Node.budget, and keeps cs on the
// owing list while that is not nothing. It runs on cs's loop.
func (lp *loop) charge(cs *conn) {
	v := 0
	if !cs.closed {
		v = footprint(cs.c.OutboundBuffered()+cs.held) + footprint(cs.c.InboundBuffered())
	}
	if v == cs.charged {
		return
	}
	n := lp.n
	if total := n.budget.buffered.Add(int64(v - cs.charged)); 2*total >= n.cfg.MaxBuffered {
		n.budget.squeezed.Store(true)
	}
	cs.charged = v
	if v > 0 && !cs.owing {
		cs.owing = true
		lp.owing.add(n, cs)
	}
}

// uncharge takes a closing connection's charge off the sum.
func (lp *loop) uncharge(cs *conn) {
	if cs.charged != 0 {
		lp.n.budget.buffered.Add(int64(-cs.charged))
		cs.charged = 0
	}
}

// recharge looks again at what the owing connections hold, drops those
// that hold nothing now, and, over budget, closes those that hold the most
// until the sum is back within it. It runs on the loop, from runTick.
func (lp *loop) recharge() {
	if len(lp.owing.items) == 0 {
		return
	}
	lp.owing.sweep(lp.n, func(_ int64, cs *conn) bool {
		lp.charge(cs)
		cs.owing = cs.charged > 0
		return cs.owing
	})

	n := lp.n
	over := n.budget.buffered.Load() - n.cfg.MaxBuffered
	if over <= 0 {
		return
	}
	worst := slices.Clone(lp.owing.items)
	slices.SortFunc(worst, func(a, b *conn) int { return b.charged - a.charged })
	for _, cs := range worst {
		if over <= 0 {
			break
		}
		over -= int64(cs.charged)
		n.slowClosed.Add(1)
		n.budget.closed.Add(1)
		n.log.Debug().Str("remote", cs.c.RemoteAddr().String()).Int("holds", cs.charged).
			Msg("closing a connection that holds the most of the node's buffer budget")
		_ = lp.el.Close(cs.c)
	}
}
