package main

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"testing"

	"github.com/spotagent/spotagent/pkg/checkpoint"
	"github.com/spotagent/spotagent/pkg/checkpoint/restore"
	"github.com/spotagent/spotagent/pkg/watch"
)

// TestGenStore: the generated manifests are valid manifests of the
// asked-for files, and a restore reads every one, newest first, and finds
// each damaged (its objects missing): what restore-rss measures.
func TestGenStore(t *testing.T) {
	st := &genStore{n: 3, files: 50}
	ctx := context.Background()
	for i := 1; i <= st.n; i++ {
		m, err := checkpoint.ReadManifest(ctx, st, st.key(i))
		if err != nil {
			t.Fatalf("manifest %d: %v", i, err)
		}
		if m.Step != int64(i*10) || len(m.Files) != 50 {
			t.Fatalf("manifest %d: step %d, %d files; want %d, 50", i, m.Step, len(m.Files), i*10)
		}
	}
	if _, err := restore.Checkpoint(ctx, st, t.TempDir(), restore.Options{}); !errors.Is(err, restore.ErrAllDamaged) {
		t.Fatalf("restore: %v, want every checkpoint damaged", err)
	}
}

// TestWriteCheckpoint: an HF layout checkpoint, its marker last.
func TestWriteCheckpoint(t *testing.T) {
	dir := t.TempDir()
	if err := writeCheckpoint(dir, 7, 3, 0); err != nil {
		t.Fatal(err)
	}
	ents, _ := os.ReadDir(filepath.Join(dir, "checkpoint-7"))
	if len(ents) != 4 {
		t.Fatalf("%d entries, want 3 shards and the marker", len(ents))
	}
	if _, err := os.Stat(filepath.Join(dir, "checkpoint-7", watch.HFMarker)); err != nil {
		t.Fatal(err)
	}
	if peakRSS() <= 0 {
		t.Fatal("peakRSS: want this process's VmHWM")
	}
}
