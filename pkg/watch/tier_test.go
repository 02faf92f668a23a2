package watch

import (
	"context"
	"io"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/spotagent/spotagent/internal/testutil"
	"github.com/spotagent/spotagent/pkg/checkpoint"
	"github.com/spotagent/spotagent/pkg/cloud"
)

// readCounter counts the bytes read from each data object (not manifests,
// not latest.json).
type readCounter struct {
	cloud.Store
	mu   sync.Mutex
	read map[string]int64
}

func (c *readCounter) Get(ctx context.Context, key string, off, n int64) (io.ReadCloser, error) {
	rc, err := c.Store.Get(ctx, key, off, n)
	if err != nil || strings.HasSuffix(key, "manifest.json") || key == checkpoint.LatestKey {
		return rc, err
	}
	b, err := io.ReadAll(rc)
	rc.Close()
	c.mu.Lock()
	c.read[key] += int64(len(b))
	c.mu.Unlock()
	return io.NopCloser(strings.NewReader(string(b))), err
}

// TestRestore_FromDir: the trainer's own checkpoint in DIR is the local
// tier (#38): an intact one costs no data byte from the store; a damaged
// file is the only one fetched, and the copy is replaced.
func TestRestore_FromDir(t *testing.T) {
	for _, c := range []struct {
		name, b   string
		wantStore map[string]int64
	}{
		{"intact", "bbbb", map[string]int64{}},
		{"damaged", "bbbx", map[string]int64{"b.bin": 4}},
	} {
		t.Run(c.name, func(t *testing.T) {
			st := &readCounter{Store: committedDir(t), read: map[string]int64{}}
			dir := t.TempDir()
			testutil.WriteFile(t, filepath.Join(dir, "checkpoint-7", "a.bin"), "aaaa")
			testutil.WriteFile(t, filepath.Join(dir, "checkpoint-7", "b.bin"), c.b)
			w, _ := newWatcher(t, Config{Dir: dir, Marker: markerNone})
			r, err := restoreWithin(t, w, st)
			if err != nil {
				t.Fatal(err)
			}
			if len(st.read) != len(c.wantStore) {
				t.Fatalf("read from the store %v, want %v", st.read, c.wantStore)
			}
			for k, n := range st.read {
				if !strings.HasSuffix(k, "/b.bin") || n != c.wantStore["b.bin"] {
					t.Fatalf("read from the store %v, want %v", st.read, c.wantStore)
				}
			}
			if got, want := r.From[checkpoint.FromLocal], 8-c.wantStore["b.bin"]; got != want {
				t.Fatalf("From=%v, want local %d", r.From, want)
			}
			if b, err := os.ReadFile(filepath.Join(dir, "checkpoint-7", "b.bin")); err != nil || string(b) != "bbbb" {
				t.Fatalf("DIR/checkpoint-7/b.bin = %q, %v; want the committed bbbb", b, err)
			}
		})
	}
}
