package localtier

import (
	"context"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"

	"github.com/spotagent/spotagent/internal/testutil/forge"
	"github.com/spotagent/spotagent/pkg/checkpoint"
	"github.com/spotagent/spotagent/pkg/checkpoint/restore"
)

// forgeFile rewrites the file at p in place with other bytes of the same
// size and CRC32C (#46): a CRC cannot tell them from the genuine ones.
func forgeFile(t *testing.T, p string) {
	t.Helper()
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	fake, err := forge.Like(b, []byte("EVIL-WEIGHTS"))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(p, fake, 0o600); err != nil {
		t.Fatal(err)
	}
}

// A kept copy rewritten in place with the same size and CRC32C fails the
// manifest's digest: restore gets the committed bytes of that file from
// the store, the other files still from the tier, and the forged copy is
// dropped from the tier (no later restore, no peer is handed it). The
// log says so once, naming the tier and the file.
func TestForgedLocalCopyRefused(t *testing.T) {
	r := newRig(t, Options{})
	m, want := r.saveCommitKeep("c1", 10)
	bad := m.Files[slices.IndexFunc(m.Files, func(f checkpoint.File) bool { return f.Path == "optim/rank0.bin" })]
	if bad.BLAKE3 == "" {
		t.Fatalf("manifest entry %+v records no digest", bad)
	}
	forgeFile(t, r.keptPath(m, bad.Path))
	core, logs := observer.New(zap.InfoLevel)
	res, err := restore.Checkpoint(context.Background(), r.st, filepath.Join(r.dir, "area", "restore"), restore.Options{Tiers: []checkpoint.Tier{r.tier}, Log: zap.New(core)})
	if err != nil {
		t.Fatal(err)
	}
	warned := logs.FilterMessageSnippet("nearby copy failed verification").All()
	if len(warned) != 1 || warned[0].Level != zap.WarnLevel || warned[0].ContextMap()["tier"] != checkpoint.FromLocal || warned[0].ContextMap()["file"] != bad.Path {
		t.Fatalf("log %v, want one warning that the local copy of %s failed verification", warned, bad.Path)
	}
	if got := r.st.dataRead(); len(got) != 1 || got[bad.Key] != bad.Size {
		t.Fatalf("data read from the store: %v, want only %s (%d bytes)", got, bad.Key, bad.Size)
	}
	if res.From[checkpoint.FromStore] != bad.Size || res.From[checkpoint.FromLocal] != m.Bytes()-bad.Size {
		t.Fatalf("From=%v, want store %d, local %d", res.From, bad.Size, m.Bytes()-bad.Size)
	}
	checkFiles(t, res.Dir, want)
	if _, err := os.Stat(r.keptPath(m, bad.Path)); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("forged copy still in the tier: %v", err)
	}
}
