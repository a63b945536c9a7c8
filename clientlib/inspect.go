package clientlib

import (
	"context"
	"os"
	"strconv"
	"time"

	"github.com/kunci/kunci/wire"
)

// Holder is what Inspect finds about a key.
type Holder struct {
	// Token is the grant's fencing token; 0 when nobody holds the key
	// (and so nobody waits for it).
	Token uint64
	// Left is what was left of the grant's lease when the node answered.
	Left time.Duration
	// Waiters counts the acquires queued behind the grant.
	Waiters int
	// Owner is the owner the grant's acquire named (Config.Owner), "" for
	// none.
	Owner string
	// Holders counts the key's grants: 1 for a lock held exclusive, up to
	// the limit for a semaphore, as many as hold it for a shared lock; 0
	// when the key is free. When several hold the key, Token, Left and
	// Owner are the oldest grant's (the lowest token).
	Holders int
	// Limit is a semaphore's limit; 0 when the key is not held as a
	// semaphore.
	Limit int
	// Shared: the key is held by shared (read) grants of a read-write
	// lock.
	Shared bool
}

// Held reports whether the key has a holder.
func (h Holder) Held() bool { return h.Token != 0 }

// Mode returns the mode of the key's grants: Semaphore(Limit), Shared, or
// Exclusive (also for a free key).
func (h Holder) Mode() Mode {
	switch {
	case h.Limit > 0:
		return Semaphore(h.Limit)
	case h.Shared:
		return Shared
	}
	return Exclusive
}

// Inspect asks the active node who holds key ("Q key"): the grant's token,
// lease left, queued acquires and owner, and how many grants hold it in
// which mode, or a zero Holder when the key is free. It changes nothing. A
// credential whose key prefixes do not cover key is refused (a
// *RefusedError, "key forbidden"). When no connection can carry it, it
// tries again as Release does (route.go).
func (c *Client) Inspect(ctx context.Context, key string) (Holder, error) {
	if err := checkKey(key); err != nil {
		return Holder{}, err
	}
	r, err := c.route(ctx, c.retrying(nil), func(cn *conn) (result, error) {
		return cn.do(ctx, 'Q', key, func(b []byte) []byte { return wire.AppendInspect(b, key) })
	})
	if err != nil {
		return Holder{}, err
	}
	if r.kind == 'E' {
		return Holder{}, r.err
	}
	return r.hold, nil
}

// holder is the Holder a Q answer describes.
func holder(a *wire.Answer) Holder {
	h := Holder{Token: a.Token, Left: time.Duration(a.Left) * time.Millisecond, Waiters: int(a.Waiters), Owner: string(a.Owner)}
	switch g := a.Group; {
	case a.Token == 0: // FREE
	case g.Multi():
		h.Holders, h.Limit, h.Shared = int(g.Holders), int(g.Slots), g.Shared
	default:
		h.Holders = 1 // one exclusive grant, which says nothing of holders
	}
	return h
}

// ProcessOwner returns an owner naming this process, "host:pid" (the host
// name cut so that the whole fits wire.MaxOwner, bytes a owner may not hold
// replaced by '_'), for Config.Owner.
func ProcessOwner() string {
	host, err := os.Hostname()
	if err != nil || host == "" {
		host = "unknown"
	}
	pid := ":" + strconv.Itoa(os.Getpid())
	b := []byte(host)
	if len(b) > wire.MaxOwner-len(pid) {
		b = b[:wire.MaxOwner-len(pid)]
	}
	for i, c := range b {
		if c < 0x21 || c > 0x7e {
			b[i] = '_'
		}
	}
	return string(b) + pid
}
