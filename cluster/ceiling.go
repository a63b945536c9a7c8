package cluster

import (
	"github.com/kunci/kunci/failover"
	"github.com/kunci/kunci/internal/atomicx"
)

// NextCeiling is the node's ceiling writer's question: the highest ceiling
// the failover.Node asked to make durable since the last write (0: none).
// Called on the ceiling writer's goroutine.
func (d *Driver) NextCeiling() (uint64, error) { return d.persist.Swap(0), nil }

// WroteCeiling tells the failover.Node how a write of ceiling c went; after
// a failure it asks again at its next tick. Called on the ceiling writer's
// goroutine.
func (d *Driver) WroteCeiling(c uint64, err error) {
	if err != nil {
		d.log.Debug().Err(err).Uint64("ceiling", c).Msg("cannot persist the token ceiling")
		d.mail.post(-1, failover.CeilingFailed{Ceiling: c})
		return
	}
	atomicx.Raise(&d.durable, c)
	d.mail.post(-1, failover.CeilingDurable{Ceiling: c})
}

// Durable returns the token ceiling known to be in the data directory.
func (d *Driver) Durable() uint64 { return d.durable.Load() }
