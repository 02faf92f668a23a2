package supervisor

import (
	"context"
	"os"
	"path/filepath"
	"syscall"
	"testing"

	"github.com/spotagent/spotagent/internal/testutil/trainertest"
	"github.com/spotagent/spotagent/pkg/checkpoint"
	"github.com/spotagent/spotagent/pkg/checkpoint/journal"
	"github.com/spotagent/spotagent/pkg/protocol"
	"github.com/spotagent/spotagent/pkg/supervisor/internal/localdirs"
)

// TestAgent_LocalTier (#38): a committed checkpoint is kept in the area's
// local tier; the next start on the same checkpoint directory restores it
// from there (the journal says local, no byte from the store), and with
// --local-keep 0 the copies are deleted.
func TestAgent_LocalTier(t *testing.T) {
	first := startAgent(t, func(c *Config) { c.LocalKeep = 1 })
	tr := trainertest.Dial(t, first.cfg.Server.Path)
	tr.Hello()
	tr.Send(map[string]any{"type": "done", "step": 5, "dir": mkCheckpoint(t, first.cfg.CheckpointDir, "first")})
	c := tr.Expect(protocol.TypeCommitted)
	tier := filepath.Join(first.cfg.CheckpointDir, "spotagent-test", localdirs.TierSub)
	if b, err := os.ReadFile(filepath.Join(tier, "000000000005-"+c.ID, "w")); err != nil || string(b) != "first" {
		t.Fatalf("kept copy: %q, %v", b, err)
	}
	first.sigs <- syscall.SIGTERM
	tr.Expect(protocol.TypeCheckpoint) // not answered: the shutdown checkpoint fails
	first.sigs <- syscall.SIGTERM
	first.wait(t)

	restart := func(keep int) journal.RestoreEntry {
		t.Helper()
		ar := startAgent(t, func(cfg *Config) {
			cfg.Store, cfg.CheckpointDir, cfg.LocalKeep = first.store, first.cfg.CheckpointDir, keep
			cfg.Command = []string{"/bin/sh", "-c", `test "$(cat "$SPOTAGENT_RESUME_DIR/w")" = first`}
		})
		if code := ar.wait(t); code != 0 {
			t.Fatalf("exit code %d: the trainer did not resume from the checkpoint", code)
		}
		j, err := journal.Read(context.Background(), first.store, "test")
		if err != nil || len(j.Restores) == 0 {
			t.Fatalf("journal: %v, %v", j, err)
		}
		return j.Restores[len(j.Restores)-1]
	}
	if r := restart(1); r.Sources() != checkpoint.FromLocal || r.From[checkpoint.FromLocal] != 5 {
		t.Fatalf("restore from %v, want 5 bytes from local", r.From)
	}
	// Off: the copies go. (The restore directory of the last restore,
	// verified, still spares the download: that is older behaviour.)
	restart(0)
	if _, err := os.Stat(tier); !os.IsNotExist(err) {
		t.Fatalf("the local tier's copies outlive --local-keep 0: %v", err)
	}
}
