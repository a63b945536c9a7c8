package server

import (
	"os"
	"strings"
	"testing"

	"github.com/kunci/kunci/engine"
	"github.com/kunci/kunci/replica"
	"github.com/kunci/kunci/wire"
)

// TestProtocolDocNamesEveryReason: docs/PROTOCOL.md names every reason an
// E line can carry, so that the document and the node cannot drift apart.
func TestProtocolDocNamesEveryReason(t *testing.T) {
	t.Parallel()
	doc, err := os.ReadFile("../docs/PROTOCOL.md")
	if err != nil {
		t.Fatal(err)
	}
	reasons := []error{
		engine.ErrTooManyKeys, engine.ErrTooManyWaiters, engine.ErrAlreadyQueued, engine.ErrStorageUnavailable,
		engine.ErrHeldAsLock, engine.ErrHeldAsSemaphore, engine.ErrLimitDiffers,
		replica.ErrBadHandshake, replica.ErrUnknownPeer, replica.ErrNoCommonKey, replica.ErrNeedsKey,
		replica.ErrNoKey, replica.ErrBadProof, errNotCluster,
	}
	reasons = append(reasons, refusalReasons[:]...)
	for _, err := range reasons {
		if r := wire.Reason(err); !strings.Contains(string(doc), "`"+r+"`") {
			t.Errorf("docs/PROTOCOL.md does not name the reason %q", r)
		}
	}
	for _, op := range []wire.Op{wire.OpAcquire, wire.OpRelease, wire.OpExtend, wire.OpCancel, wire.OpInspect, wire.OpList, wire.OpInfo, wire.OpAuth} {
		if !strings.Contains(string(doc), "| `"+op.String()+" ") && !strings.Contains(string(doc), "| `"+op.String()+"`") {
			t.Errorf("docs/PROTOCOL.md has no table row for %s", op)
		}
	}
}
