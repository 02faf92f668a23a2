package commit

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/spotagent/spotagent/pkg/checkpoint"
	"github.com/spotagent/spotagent/pkg/checkpoint/internal/cptest"
	"github.com/spotagent/spotagent/pkg/checkpoint/restore"
	"github.com/spotagent/spotagent/pkg/cloud"
)

func commit(t *testing.T, st cloud.Store, step int64, id string, files map[string]string) *Result {
	t.Helper()
	c := &Committer{Store: st, RunID: "run"}
	res, err := c.Commit(context.Background(), Request{Dir: cptest.WriteDir(t, files), ID: id, Step: step, Reason: "periodic", Metadata: []byte(`{"epoch":1}`)})
	if err != nil {
		t.Fatalf("commit %s: %v", id, err)
	}
	return res
}

func TestCommit_RoundTrip(t *testing.T) {
	st := cptest.NewStore(t)
	files := map[string]string{"model.pt": strings.Repeat("m", 100000), "sub/opt.pt": "optimizer", "empty": ""}
	res := commit(t, st, 120, "abc", files)
	if got, want := res.ManifestKey, "checkpoints/000000000120-abc/manifest.json"; got != want {
		t.Fatalf("manifest key=%q, want %q", got, want)
	}
	l, err := checkpoint.ReadLatest(context.Background(), st)
	if err != nil {
		t.Fatal(err)
	}
	if l.Manifest != res.ManifestKey || l.Step != 120 || l.ID != "abc" {
		t.Fatalf("latest=%+v", l)
	}
	dest := t.TempDir()
	r, err := restore.Checkpoint(context.Background(), st, dest, restore.Options{})
	if err != nil {
		t.Fatal(err)
	}
	var meta bytes.Buffer
	json.Compact(&meta, r.Manifest.Metadata)
	if r.Manifest.Step != 120 || meta.String() != `{"epoch":1}` {
		t.Fatalf("restored step=%d metadata=%s", r.Manifest.Step, r.Manifest.Metadata)
	}
	for name, body := range files {
		got, err := os.ReadFile(filepath.Join(r.Dir, name))
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(got, []byte(body)) {
			t.Fatalf("%s differs after restore", name)
		}
	}
	// A second restore reuses the verified local copy.
	r2, err := restore.Checkpoint(context.Background(), st, dest, restore.Options{})
	if err != nil || r2.Dir != r.Dir {
		t.Fatalf("second restore: dir=%v err=%v", r2, err)
	}
}

func TestCommit_RefusesEscapes(t *testing.T) {
	for name, plant := range map[string]func(dir string) error{
		"symlink to /etc/passwd": func(dir string) error { return os.Symlink("/etc/passwd", filepath.Join(dir, "passwd")) },
		"symlink to ../":         func(dir string) error { return os.Symlink("..", filepath.Join(dir, "up")) },
		"symlink inside":         func(dir string) error { return os.Symlink("model.pt", filepath.Join(dir, "alias")) },
		"fifo":                   func(dir string) error { return mkfifo(filepath.Join(dir, "pipe")) },
	} {
		t.Run(name, func(t *testing.T) {
			st := cptest.NewStore(t)
			dir := cptest.WriteDir(t, map[string]string{"model.pt": "weights"})
			if err := plant(dir); err != nil {
				t.Fatal(err)
			}
			c := &Committer{Store: st, RunID: "run"}
			_, err := c.Commit(context.Background(), Request{Dir: dir, ID: "x", Step: 1})
			if !errors.Is(err, checkpoint.ErrRefused) {
				t.Fatalf("err=%v, want ErrRefused", err)
			}
			n := 0
			st.List(context.Background(), "", func(cloud.ObjectInfo) error { n++; return nil })
			if n != 0 {
				t.Fatalf("%d objects in the store after a refused commit, want 0", n)
			}
		})
	}
	t.Run("directory is a symlink", func(t *testing.T) {
		st := cptest.NewStore(t)
		real := cptest.WriteDir(t, map[string]string{"model.pt": "weights"})
		link := filepath.Join(t.TempDir(), "ckpt")
		if err := os.Symlink(real, link); err != nil {
			t.Fatal(err)
		}
		_, err := (&Committer{Store: st}).Commit(context.Background(), Request{Dir: link, ID: "x", Step: 1})
		if !errors.Is(err, checkpoint.ErrRefused) {
			t.Fatalf("err=%v, want ErrRefused", err)
		}
	})
	t.Run("empty directory", func(t *testing.T) {
		_, err := (&Committer{Store: cptest.NewStore(t)}).Commit(context.Background(), Request{Dir: t.TempDir(), ID: "x", Step: 1})
		if err == nil || !strings.Contains(err.Error(), "no files") {
			t.Fatalf("err=%v, want no files", err)
		}
	})
	t.Run("bad id", func(t *testing.T) {
		_, err := (&Committer{Store: cptest.NewStore(t)}).Commit(context.Background(), Request{Dir: t.TempDir(), ID: "../x", Step: 1})
		if err == nil {
			t.Fatal("commit accepted id ../x")
		}
	})
}

func TestUpdateLatest_NeverMovesBack(t *testing.T) {
	st := cptest.NewStore(t)
	commit(t, st, 200, "new", map[string]string{"a": "1"})
	commit(t, st, 100, "old", map[string]string{"a": "2"})
	l, err := checkpoint.ReadLatest(context.Background(), st)
	if err != nil {
		t.Fatal(err)
	}
	if got, want := l.Step, int64(200); got != want {
		t.Fatalf("latest step=%d, want %d", got, want)
	}
}
