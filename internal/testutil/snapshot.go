package testutil

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"
)

// StoreSnapshot is what a file store under dir holds: each file's path
// and SHA-256, except what every agent's start rewrites: its lease
// (leases/, taken before it restores), latest.json's epoch (latest.json
// is reduced to the manifest and id it names) and the store's lock file
// (.spotagent-lock, empty, made by the first conditional write). Two
// snapshots are equal (SameStoreSnapshot) when nothing else was written,
// changed or removed.
func StoreSnapshot(t *testing.T, dir string) map[string]string {
	t.Helper()
	out := map[string]string{}
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		rel, _ := filepath.Rel(dir, p)
		rel = filepath.ToSlash(rel)
		if strings.HasPrefix(rel, "leases/") || rel == ".spotagent-lock" {
			return nil
		}
		b, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		if rel == "latest.json" {
			var l struct{ Manifest, ID string }
			if err := json.Unmarshal(b, &l); err != nil {
				return fmt.Errorf("latest.json: %w", err)
			}
			out[rel] = l.Manifest + " " + l.ID
			return nil
		}
		sum := sha256.Sum256(b)
		out[rel] = hex.EncodeToString(sum[:])
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// SameStoreSnapshot fails the test unless after holds what before did.
func SameStoreSnapshot(t *testing.T, before, after map[string]string) {
	t.Helper()
	var diff []string
	for k, v := range before {
		if after[k] != v {
			diff = append(diff, "changed or removed: "+k)
		}
	}
	for k := range after {
		if _, ok := before[k]; !ok {
			diff = append(diff, "added: "+k)
		}
	}
	sort.Strings(diff)
	if len(diff) > 0 {
		t.Fatalf("store changed:\n%s", strings.Join(diff, "\n"))
	}
}
