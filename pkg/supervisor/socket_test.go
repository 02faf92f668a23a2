package supervisor

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/spotagent/spotagent/internal/testutil/trainertest"
	"github.com/spotagent/spotagent/pkg/cloud"
	"github.com/spotagent/spotagent/pkg/protocol"
)

// TestAgent_SecondAgentRefusesALiveSocket (issue 36 item 8): two agents
// whose run ids default alike would share one socket; the second used to
// bind over the first's. It now refuses to start, naming --socket and
// --run-id, and the first still serves its trainers.
func TestAgent_SecondAgentRefusesALiveSocket(t *testing.T) {
	first := startAgent(t, nil)
	tr := trainertest.Dial(t, first.cfg.Server.Path)
	tr.Hello()
	cfg := first.cfg
	cfg.Store = first.store
	code, err := Run(context.Background(), cfg, nil)
	if err == nil || code != 1 {
		t.Fatalf("second agent: code %d, err %v; want 1 and an error", code, err)
	}
	if !errors.Is(err, protocol.ErrSocketInUse) || !strings.Contains(err.Error(), "--socket") || !strings.Contains(err.Error(), "--run-id") {
		t.Fatalf("error %q, want the socket in use, naming --socket and --run-id", err)
	}
	// Refused before it touched the store: its lease would have fenced
	// the first agent's run.
	var leases int
	if err := first.store.List(context.Background(), "leases/", func(cloud.ObjectInfo) error { leases++; return nil }); err != nil {
		t.Fatal(err)
	}
	if leases != 1 {
		t.Fatalf("%d leases in the store, want the first agent's only", leases)
	}
	again := trainertest.Dial(t, first.cfg.Server.Path)
	again.Hello()
}

// TestAgent_SecondAgentRefusedSocketDirTakesNoLease (review, item 1): a
// second agent whose default socket directory it must refuse (not 0700)
// used to take the next lease first, then refuse the directory: the live
// agent saw the newer epoch and exited fenced. The directory is now
// checked before the store is touched: no lease, and the first agent
// still serves its trainers.
func TestAgent_SecondAgentRefusedSocketDirTakesNoLease(t *testing.T) {
	first := startAgent(t, nil)
	tr := trainertest.Dial(t, first.cfg.Server.Path)
	tr.Hello()
	dir := filepath.Join(t.TempDir(), "spotagent-x")
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(dir, 0o755); err != nil { // whatever the umask
		t.Fatal(err)
	}
	cfg := first.cfg
	cfg.Store = first.store
	cfg.Server.Path = filepath.Join(dir, "b.sock")
	cfg.Server.PrivateDir = true
	code, err := Run(context.Background(), cfg, nil)
	if err == nil || code != 1 || !strings.Contains(err.Error(), "want no group or other permissions") {
		t.Fatalf("second agent: code %d, err %v; want 1 and the socket dir refused", code, err)
	}
	var leases int
	if err := first.store.List(context.Background(), "leases/", func(cloud.ObjectInfo) error { leases++; return nil }); err != nil {
		t.Fatal(err)
	}
	if leases != 1 {
		t.Fatalf("%d leases in the store, want the first agent's only", leases)
	}
	again := trainertest.Dial(t, first.cfg.Server.Path)
	again.Hello()
}
