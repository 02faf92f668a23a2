package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/spotagent/spotagent/pkg/checkpoint"
	"github.com/spotagent/spotagent/pkg/checkpoint/commit"
	"github.com/spotagent/spotagent/pkg/cloud"
	"github.com/spotagent/spotagent/pkg/cloud/file"

	"github.com/spotagent/spotagent/internal/render"
)

// commitPart commits node's part (ranks) of a world of 4 ranks.
func commitPart(ctx context.Context, t *testing.T, st cloud.Store, step int64, id, node string, ranks ...int) error {
	dir := t.TempDir()
	for _, r := range ranks {
		if err := os.WriteFile(filepath.Join(dir, fmt.Sprintf("rank-%d.pt", r)), bytes.Repeat([]byte{'x'}, 1000*(r+1)), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	c := &commit.Committer{Store: st, RunID: "run"}
	_, err := c.Commit(ctx, commit.Request{Dir: dir, ID: id, Step: step, Reason: "periodic",
		Part: &checkpoint.PartSpec{Node: node, Ranks: ranks, WorldSize: 4}})
	return err
}

func TestPrintCheckpoints_Parts(t *testing.T) {
	st, err := file.New(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	ctx := t.Context()
	var wg sync.WaitGroup
	errs := make([]error, 2)
	wg.Go(func() { errs[0] = commitPart(ctx, t, st, 10, "aaaaaaaaaaaa", "node-0", 0, 1) })
	wg.Go(func() { errs[1] = commitPart(ctx, t, st, 10, "aaaaaaaaaaaa", "node-1", 2, 3) })
	wg.Wait()
	if errs[0] != nil || errs[1] != nil {
		t.Fatal(errs)
	}
	// Step 20: node-1's part lands, node-0's never comes. The commit is
	// ended once its part is in the store (not by a timer: on a loaded
	// machine a 200 ms bound once ended it before the part was written).
	waiting, cancel := context.WithCancel(ctx)
	defer cancel()
	go func() {
		defer cancel()
		for end := time.Now().Add(time.Minute); time.Now().Before(end); time.Sleep(10 * time.Millisecond) {
			if _, err := st.Stat(ctx, checkpoint.PartKey(20, "bbbbbbbbbbbb", "node-1")); err == nil {
				return
			}
		}
	}()
	if err := commitPart(waiting, t, st, 20, "bbbbbbbbbbbb", "node-1", 2, 3); !errors.Is(err, commit.ErrIncomplete) {
		t.Fatalf("err=%v", err)
	}
	entries, err := checkpoint.ListManifests(ctx, st)
	if err != nil {
		t.Fatal(err)
	}
	incomplete, err := checkpoint.ListIncomplete(ctx, st)
	if err != nil {
		t.Fatal(err)
	}
	latest, _ := checkpoint.ReadLatest(ctx, st)
	var out bytes.Buffer
	render.Checkpoints(&out, entries, incomplete, latest)
	t.Logf("\n%s", out.String())
	var lines []string // each row with its columns one space apart
	for l := range strings.Lines(out.String()) {
		lines = append(lines, strings.Join(strings.Fields(l), " "))
	}
	got := strings.Join(lines, "\n")
	for _, want := range []string{
		"10 aaaaaaaaaaaa (latest) periodic 4 9.8 KiB", "part node-0 ranks 0-1 2 2.9 KiB", "part node-1 ranks 2-3 2 6.8 KiB",
		"20 bbbbbbbbbbbb incomplete: no manifest, ranks 0-1 missing\npart node-1 ranks 2-3 of 4 2 6.8 KiB",
	} {
		if !strings.Contains(got, want) {
			t.Errorf("output lacks %q", want)
		}
	}
}

func TestRanges(t *testing.T) {
	if got, want := render.Ranges([]int{0, 1, 2, 3, 6, 8, 9}), "0-3,6,8-9"; got != want {
		t.Fatalf("ranges=%q, want %q", got, want)
	}
}
