package restore

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"hash/crc32"
	"strings"
	"testing"

	"github.com/spotagent/spotagent/pkg/checkpoint"
	"github.com/spotagent/spotagent/pkg/checkpoint/internal/cptest"
)

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// A commit records each file's CRC32C (and no sha256), and restore checks
// it on both download paths: a flipped byte of the same size is caught
// whether the file streams through the hash or is fetched in ranges.
func TestChecksum_CRC32CRecordedAndChecked(t *testing.T) {
	for _, ranged := range []bool{false, true} {
		name := map[bool]string{false: "streamed", true: "ranged"}[ranged]
		t.Run(name, func(t *testing.T) {
			if ranged {
				old := rangedAbove
				rangedAbove = 1
				t.Cleanup(func() { rangedAbove = old })
			}
			st := cptest.NewStore(t)
			body := strings.Repeat("weights", 1000)
			commitFiles(t, st, 10, "a", map[string]string{"m": "ten"})
			res := commitFiles(t, st, 20, "b", map[string]string{"m": body})
			f := res.Manifest.Files[0]
			if want := checkpoint.CRC32CHex(crc32.Checksum([]byte(body), castagnoli)); f.CRC32C != want || f.SHA256 != "" {
				t.Fatalf("manifest entry crc32c %q sha256 %q, want crc32c %s and no sha256", f.CRC32C, f.SHA256, want)
			}
			if got := restoredStep(t, st); got != 20 {
				t.Fatalf("restored %d, want 20", got)
			}
			damaged := []byte(body)
			damaged[len(damaged)/2] ^= 1
			cptest.Put(t, st, f.Key, string(damaged))
			r, err := Checkpoint(context.Background(), st, t.TempDir(), Options{})
			if err != nil {
				t.Fatal(err)
			}
			if r.Manifest.Step != 10 || len(r.Skipped) != 1 || !strings.Contains(r.Skipped[0], "crc32c") {
				t.Fatalf("restored %d skipping %q, want 10 skipping 20 for its crc32c", r.Manifest.Step, r.Skipped)
			}
		})
	}
}

// Manifests written before CRC32C carry sha256 only: they still restore,
// and their sha256 is still checked.
func TestChecksum_OldSHA256Manifest(t *testing.T) {
	st := cptest.NewStore(t)
	commitFiles(t, st, 10, "a", map[string]string{"m": "ten"})
	body := "twenty"
	sum := sha256.Sum256([]byte(body))
	m := checkpoint.Manifest{Format: checkpoint.Format, RunID: "run", ID: "b", Step: 20, Reason: "periodic",
		Files: []checkpoint.File{{Path: "m", Key: "checkpoints/000000000020-b/m", Size: int64(len(body)), SHA256: hex.EncodeToString(sum[:])}}}
	raw, err := json.Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(string(raw), "crc32c") {
		t.Fatalf("an entry without crc32c encodes it: %s", raw)
	}
	cptest.Put(t, st, "checkpoints/000000000020-b/m", body)
	cptest.Put(t, st, checkpoint.ManifestKey(20, "b"), string(raw))
	if got := restoredStep(t, st); got != 20 {
		t.Fatalf("restored %d, want the sha256 manifest's 20", got)
	}
	cptest.Put(t, st, "checkpoints/000000000020-b/m", "twentx")
	r, err := Checkpoint(context.Background(), st, t.TempDir(), Options{})
	if err != nil {
		t.Fatal(err)
	}
	if r.Manifest.Step != 10 || len(r.Skipped) != 1 || !strings.Contains(r.Skipped[0], "sha256") {
		t.Fatalf("restored %d skipping %q, want 10 skipping 20 for its sha256", r.Manifest.Step, r.Skipped)
	}
}
