package clientlib

import (
	"context"
	"errors"
	"fmt"

	"github.com/kunci/kunci/wire"
)

// Listed is a grant a listing shows: its key, and what Inspect says of a
// key's grant (a key with several grants is listed once for each).
type Listed struct {
	Key string
	Holder
}

// Locks lists the grants of held keys that start with prefix ("": every
// key), at most limit of them (0: no limit), as the active node sees them
// ("L limit prefix"); more reports that the limit left some unlisted. The
// listing is in no particular order and is not a snapshot of one instant:
// a key taken or freed meanwhile may or may not be listed (see
// docs/PROTOCOL.md, Listings). A credential limited to key prefixes lists
// only keys under them. When no connection can carry it, it tries again
// as Release does (route.go); a listing cut short by a failover is
// started again.
func (c *Client) Locks(ctx context.Context, prefix string, limit uint64) (grants []Listed, more bool, err error) {
	if prefix != "" {
		if err := checkKey(prefix); err != nil {
			return nil, false, fmt.Errorf("clientlib: bad prefix: %w", err)
		}
	}
	r, err := c.route(ctx, c.retrying(nil), func(cn *conn) (result, error) {
		return cn.do(ctx, 'L', "", func(b []byte) []byte { return wire.AppendList(b, limit, []byte(prefix)) })
	})
	if err != nil {
		return nil, false, err
	}
	if r.kind == 'E' {
		return nil, false, r.err
	}
	return r.list, r.more, nil
}

// Node is what a node says of itself and of its cluster ("I").
type Node struct {
	// Addr is the node's own client address; Role is "active" or
	// "standby"; Active is the active's address as the node knows it, ""
	// for none.
	Addr, Role, Active string
}

// ErrNoActive: the node asked knows no active node (the cluster is
// electing one).
var ErrNoActive = errors.New("clientlib: no active node known")

// Active asks a node which node of the cluster is the active ("I"), and
// returns that node's address. A single node is its own active. When the
// node knows none (an election is under way), the error is ErrNoActive.
func (c *Client) Active(ctx context.Context) (string, error) {
	n, err := c.Info(ctx)
	if err != nil {
		return "", err
	}
	if n.Active == "" {
		return "", fmt.Errorf("%w (asked %s)", ErrNoActive, n.Addr)
	}
	return n.Active, nil
}

// Info asks the node a connection goes to what it is ("I"): its address,
// role, and the active it knows. Every node answers, whatever its role.
func (c *Client) Info(ctx context.Context) (Node, error) {
	r, err := c.route(ctx, c.retrying(nil), func(cn *conn) (result, error) {
		return cn.do(ctx, 'I', "", func(b []byte) []byte { return wire.AppendInfoRequest(b) })
	})
	if err != nil {
		return Node{}, err
	}
	return r.node, nil
}
