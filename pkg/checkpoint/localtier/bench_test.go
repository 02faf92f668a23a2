package localtier

import (
	"context"
	"crypto/rand"
	"os"
	"path/filepath"
	"testing"

	"github.com/spotagent/spotagent/internal/storesim"
	"github.com/spotagent/spotagent/pkg/checkpoint"
	"github.com/spotagent/spotagent/pkg/checkpoint/commit"
	"github.com/spotagent/spotagent/pkg/checkpoint/restore"
)

// BenchmarkRestoreLocal is a restore from the local tier: 4 files of 64
// MiB read from the kept copy, verified by CRC32C and written into the
// restore directory, no byte from the store (bench/RESULTS.md, "Local
// tier"). The page cache holds the kept copy, as it does on a restart
// soon after the commit; a cold cache adds the disk's read time.
func BenchmarkRestoreLocal(b *testing.B) {
	dir := b.TempDir()
	parent, err := os.OpenRoot(dir)
	if err != nil {
		b.Fatal(err)
	}
	defer parent.Close()
	r := &rig{dir: dir, parent: parent}
	r.tier, err = Open(parent, "area/committed", Options{})
	if err != nil {
		b.Fatal(err)
	}
	st := &countingStore{read: map[string]int64{}}
	st.Store = storesim.New()
	buf := make([]byte, 64<<20)
	for i := range 4 {
		rand.Read(buf)
		p := filepath.Join(dir, "req", "rank"+string(rune('0'+i))+".bin")
		os.MkdirAll(filepath.Dir(p), 0o700)
		if err := os.WriteFile(p, buf, 0o600); err != nil {
			b.Fatal(err)
		}
	}
	c := &commit.Committer{Store: st.Store, RunID: "run"}
	res, err := c.Commit(context.Background(), commit.Request{Dir: filepath.Join(dir, "req"), ID: "c1", Step: 1})
	if err != nil {
		b.Fatal(err)
	}
	if err := r.tier.Keep(context.Background(), "req", res.Manifest, "", true); err != nil {
		b.Fatal(err)
	}
	b.SetBytes(res.Manifest.Bytes())
	b.ResetTimer()
	for i := range b.N {
		dest := filepath.Join(dir, "restore", string(rune('a'+i%26)))
		got, err := restore.Checkpoint(context.Background(), st, dest, restore.Options{Tiers: []checkpoint.Tier{r.tier}})
		if err != nil {
			b.Fatal(err)
		}
		if got.From[checkpoint.FromStore] != 0 {
			b.Fatalf("read %d bytes from the store", got.From[checkpoint.FromStore])
		}
		b.StopTimer()
		os.RemoveAll(dest)
		b.StartTimer()
	}
}
