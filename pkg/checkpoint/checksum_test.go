package checkpoint

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"hash/crc32"
	"strings"
	"testing"
)

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
			st := newStore(t)
			body := strings.Repeat("weights", 1000)
			commit(t, st, 10, "a", map[string]string{"m": "ten"})
			res := commit(t, st, 20, "b", map[string]string{"m": body})
			f := res.Manifest.Files[0]
			if want := CRC32CHex(crc32.Checksum([]byte(body), castagnoli)); f.CRC32C != want || f.SHA256 != "" {
				t.Fatalf("manifest entry crc32c %q sha256 %q, want crc32c %s and no sha256", f.CRC32C, f.SHA256, want)
			}
			if got := restoredStep(t, st); got != 20 {
				t.Fatalf("restored %d, want 20", got)
			}
			damaged := []byte(body)
			damaged[len(damaged)/2] ^= 1
			put(t, st, f.Key, string(damaged))
			r, err := Restore(context.Background(), st, t.TempDir(), RestoreOptions{})
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
	st := newStore(t)
	commit(t, st, 10, "a", map[string]string{"m": "ten"})
	body := "twenty"
	sum := sha256.Sum256([]byte(body))
	m := Manifest{Format: Format, RunID: "run", ID: "b", Step: 20, Reason: "periodic",
		Files: []File{{Path: "m", Key: "checkpoints/000000000020-b/m", Size: int64(len(body)), SHA256: hex.EncodeToString(sum[:])}}}
	raw, err := json.Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(string(raw), "crc32c") {
		t.Fatalf("an entry without crc32c encodes it: %s", raw)
	}
	put(t, st, "checkpoints/000000000020-b/m", body)
	put(t, st, ManifestKey(20, "b"), string(raw))
	if got := restoredStep(t, st); got != 20 {
		t.Fatalf("restored %d, want the sha256 manifest's 20", got)
	}
	put(t, st, "checkpoints/000000000020-b/m", "twentx")
	r, err := Restore(context.Background(), st, t.TempDir(), RestoreOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if r.Manifest.Step != 10 || len(r.Skipped) != 1 || !strings.Contains(r.Skipped[0], "sha256") {
		t.Fatalf("restored %d skipping %q, want 10 skipping 20 for its sha256", r.Manifest.Step, r.Skipped)
	}
}

func TestChecksum_Validate(t *testing.T) {
	ok := File{Path: "m", Key: "k/m", Size: 1, CRC32C: "0badf00d"}
	for _, c := range []struct {
		name string
		edit func(*File)
		bad  bool
	}{
		{"crc32c", func(*File) {}, false},
		{"both", func(f *File) { f.SHA256 = strings.Repeat("ab", 32) }, false},
		{"sha256 only", func(f *File) { f.CRC32C, f.SHA256 = "", strings.Repeat("ab", 32) }, false},
		{"none", func(f *File) { f.CRC32C = "" }, true},
		{"short crc32c", func(f *File) { f.CRC32C = "0badf00" }, true},
		{"upper case crc32c", func(f *File) { f.CRC32C = "0BADF00D" }, true},
		{"bad sha256 beside crc32c", func(f *File) { f.SHA256 = "x" }, true},
	} {
		f := ok
		c.edit(&f)
		m := Manifest{Format: Format, ID: "a", Step: 1, Files: []File{f}}
		if err := m.Validate(); (err != nil) != c.bad {
			t.Errorf("%s: Validate = %v, want error %v", c.name, err, c.bad)
		}
	}
	if err := (File{Size: 3, CRC32C: CRC32CHex(crc32.Checksum([]byte("abc"), castagnoli))}).Verify(strings.NewReader("abcd")); !errors.Is(err, ErrCorrupt) {
		t.Fatalf("Verify of a longer object = %v, want ErrCorrupt", err)
	}
}

func TestCRC32CCombine(t *testing.T) {
	data := []byte(strings.Repeat("spot checkpoint bytes ", 5000))
	for _, cut := range []int{0, 1, 7, 4096, len(data) - 1, len(data)} {
		a, b := data[:cut], data[cut:]
		got := crc32cCombine(crc32.Checksum(a, castagnoli), crc32.Checksum(b, castagnoli), int64(len(b)))
		if want := crc32.Checksum(data, castagnoli); got != want {
			t.Fatalf("cut %d: combined %08x, want %08x", cut, got, want)
		}
	}
	// Out-of-order ranged writes, each range in several writes.
	var sink writerAtDiscard
	cw := NewCRCWriterAt(sink)
	for _, r := range [][2]int{{60000, len(data)}, {0, 30000}, {30000, 60000}} {
		for off := r[0]; off < r[1]; off += 777 {
			end := min(off+777, r[1])
			cw.WriteAt(data[off:end], int64(off))
		}
	}
	if crc, ok := cw.Sum(int64(len(data))); !ok || crc != crc32.Checksum(data, castagnoli) {
		t.Fatalf("sum = %08x, %v; want %08x, true", crc, ok, crc32.Checksum(data, castagnoli))
	}
	cw.WriteAt(data[:10], 0) // a range written twice: not trusted
	if _, ok := cw.Sum(int64(len(data))); ok {
		t.Fatal("overlapping writes summed as ok")
	}
}

type writerAtDiscard struct{}

func (writerAtDiscard) WriteAt(p []byte, _ int64) (int, error) { return len(p), nil }
