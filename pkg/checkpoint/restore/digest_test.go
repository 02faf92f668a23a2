package restore

import (
	"context"
	"encoding/hex"
	"encoding/json"
	"errors"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/zeebo/blake3"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"

	"github.com/spotagent/spotagent/internal/testutil/forge"
	"github.com/spotagent/spotagent/pkg/checkpoint"
	"github.com/spotagent/spotagent/pkg/checkpoint/internal/cptest"
)

// memTier is a nearby copy held in memory: the bytes it hands back for
// each path, counting the opens. Its copies are not Refusable.
type memTier struct {
	files map[string][]byte
	opens atomic.Int64
}

func (m *memTier) Name() string { return "mem" }

func (m *memTier) Open(_ context.Context, _ *checkpoint.Manifest, f checkpoint.File) (io.ReadCloser, error) {
	m.opens.Add(1)
	b, ok := m.files[f.Path]
	if !ok {
		return nil, fs.ErrNotExist
	}
	return io.NopCloser(strings.NewReader(string(b))), nil
}

func forged(t *testing.T, genuine string) []byte {
	t.Helper()
	b, err := forge.Like([]byte(genuine), []byte("EVIL-WEIGHTS"))
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// A commit records each file's BLAKE3 beside its CRC32C.
func TestDigest_Recorded(t *testing.T) {
	st := cptest.NewStore(t)
	body := strings.Repeat("weights", 1000)
	res := commitFiles(t, st, 10, "a", map[string]string{"m": body})
	sum := blake3.Sum256([]byte(body))
	if f := res.Manifest.Files[0]; f.BLAKE3 != hex.EncodeToString(sum[:]) || f.CRC32C == "" {
		t.Fatalf("entry %+v, want blake3 %x and a crc32c", f, sum)
	}
}

// A tier handing back bytes of the same size and CRC32C as the committed
// ones is refused by the digest: the file comes from the store, and a tier
// whose copies cannot be refused one by one is not asked again in that
// restore.
func TestDigest_ForgedTierRefused(t *testing.T) {
	st := cptest.NewStore(t)
	files := map[string]string{"a": strings.Repeat("A", 5000), "b": strings.Repeat("B", 5000), "c": strings.Repeat("C", 5000)}
	commitFiles(t, st, 10, "x", files)
	tier := &memTier{files: map[string][]byte{}}
	for p, b := range files {
		tier.files[p] = forged(t, b)
	}
	res, err := Checkpoint(context.Background(), st, t.TempDir(), Options{Tiers: []checkpoint.Tier{tier}})
	if err != nil {
		t.Fatal(err)
	}
	for p, b := range files {
		if got, err := os.ReadFile(filepath.Join(res.Dir, p)); err != nil || string(got) != b {
			t.Fatalf("%s: %v, or not the committed bytes", p, err)
		}
	}
	if res.From["mem"] != 0 || res.From[checkpoint.FromStore] != 15000 {
		t.Fatalf("From=%v, want all from the store", res.From)
	}
	// Up to 4 files are fetched at once: each may have asked before the
	// first refusal, none after.
	if n := tier.opens.Load(); n > 3 {
		t.Fatalf("tier asked %d times", n)
	}
}

// A restore directory already holding the checkpoint is reused only when
// every file matches its digest: one rewritten with the same size and
// CRC32C is restored again from the store.
func TestDigest_ForgedRestoreDirNotReused(t *testing.T) {
	st := cptest.NewStore(t)
	body := strings.Repeat("weights", 1000)
	commitFiles(t, st, 10, "a", map[string]string{"m": body})
	dest := t.TempDir()
	res, err := Checkpoint(context.Background(), st, dest, Options{})
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(res.Dir, "m"), forged(t, body), 0o600); err != nil {
		t.Fatal(err)
	}
	res, err = Checkpoint(context.Background(), st, dest, Options{})
	if err != nil {
		t.Fatal(err)
	}
	if res.From[checkpoint.FromLocal] != 0 {
		t.Fatalf("From=%v: the forged directory was reused", res.From)
	}
	if got, err := os.ReadFile(filepath.Join(res.Dir, "m")); err != nil || string(got) != body {
		t.Fatalf("%v, or not the committed bytes", err)
	}
}

// A manifest without digests (CRC32C only, before #46): every file comes
// from the store, no tier is asked, a reused directory is not trusted, and
// the log says so once.
func TestDigest_CRCOnlyManifestFromStore(t *testing.T) {
	st := cptest.NewStore(t)
	files := map[string]string{"a": "alpha", "b": "beta"}
	res := commitFiles(t, st, 10, "x", files)
	m := *res.Manifest
	m.Files = append([]checkpoint.File(nil), m.Files...)
	for i := range m.Files {
		m.Files[i].BLAKE3 = ""
	}
	raw, err := json.Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	cptest.Put(t, st, checkpoint.ManifestKey(10, "x"), string(raw))
	tier := &memTier{files: map[string][]byte{"a": []byte("alpha"), "b": []byte("beta")}}
	core, logs := observer.New(zap.InfoLevel)
	dest := t.TempDir()
	for range 2 { // the second finds the first's directory: not reused
		r, err := Checkpoint(context.Background(), st, dest, Options{Tiers: []checkpoint.Tier{tier}, Log: zap.New(core)})
		if err != nil {
			t.Fatal(err)
		}
		if r.From[checkpoint.FromStore] != 9 {
			t.Fatalf("From=%v, want all 9 bytes from the store", r.From)
		}
	}
	if n := tier.opens.Load(); n != 0 {
		t.Fatalf("tier asked %d times for files without a digest", n)
	}
	if n := logs.FilterMessageSnippet("no digest").Len(); n != 2 {
		t.Fatalf("%d log lines about missing digests, want 1 per restore (2)", n)
	}
	if !errors.Is(verifyNoDigest(m.Files[0]), checkpoint.ErrNoDigest) {
		t.Fatal("VerifyDigest of an entry without a digest is not ErrNoDigest")
	}
}

func verifyNoDigest(f checkpoint.File) error {
	return f.VerifyDigest(strings.NewReader("alpha"))
}
