package checkpoint_test

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"testing"

	"github.com/spotagent/spotagent/pkg/checkpoint"
	"github.com/spotagent/spotagent/pkg/checkpoint/journal"
)

// TestFormats_ByteCompatible: manifests, journals and leases written before
// the formats owned their schema (testdata/format, written when they still
// embedded metadata.Identity, metadata.Cloud and metadata.Kind) decode and
// re-encode to the same bytes, as commit, journal and lease.go
// encode them.
func TestFormats_ByteCompatible(t *testing.T) {
	for _, c := range []struct {
		file string
		v    any
	}{
		{"manifest.json", &checkpoint.Manifest{}},
		{"manifest_minimal.json", &checkpoint.Manifest{}},
		{"journal.json", &journal.Journal{}},
		{"lease.json", &checkpoint.LeaseRecord{}},
	} {
		t.Run(c.file, func(t *testing.T) {
			old, err := os.ReadFile(filepath.Join("testdata", "format", c.file))
			if err != nil {
				t.Fatal(err)
			}
			if err := json.Unmarshal(old, c.v); err != nil {
				t.Fatal(err)
			}
			got, err := json.MarshalIndent(c.v, "", "  ")
			if err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(got, old) {
				t.Fatalf("re-encoded differs from the old bytes:\n%s\n--- want\n%s", got, old)
			}
		})
	}
}
