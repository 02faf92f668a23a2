package integration

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/spotagent/spotagent/internal/testutil"
	"github.com/spotagent/spotagent/pkg/checkpoint"
	"github.com/spotagent/spotagent/pkg/cloud"
	"github.com/spotagent/spotagent/pkg/cloud/all"
)

// TestFence_TwoAgentsOneRun: ASG Capacity Rebalancing starts the
// replacement while the old instance still trains. Two agents, one store:
// the second takes a newer lease while the first trains. From then on
// latest.json never names a checkpoint of the first; the first takes a last
// checkpoint (uploaded, with its epoch, not published), stops its trainer
// and exits 76; the second resumes from what latest.json held at its lease
// and finishes with exactly the parameters of an uninterrupted run. The
// trainer is the pure-Python example (the fence is the agent's; the
// PyTorch example's exact resume is TestNotice_Matrix's).
func TestFence_TwoAgentsOneRun(t *testing.T) {
	parallel(t)
	requirePython(t, false)
	dir := testutil.ShortDir(t)
	uri := "file://" + filepath.Join(dir, "store")
	const steps = "600"

	ref := filepath.Join(dir, "ref.json")
	cmd := exec.Command(python, "python/examples/train.py", "--steps", steps, "--step-time", "0", "--out", ref)
	cmd.Dir = repo
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("reference run: %v\n%s", err, out)
	}

	args := func(name string) []string {
		return []string{"run", "--store", uri, "--run-id", "it",
			"--checkpoint-dir", filepath.Join(dir, name), "--socket", filepath.Join(dir, name+".sock"),
			"--cloud", "none", "--interval", "1s", "--fence-interval", "200ms", "--keep", "1000", "--log-level", "info",
			"--", python, "python/examples/train.py", "--steps", steps, "--step-time", "0.02",
			"--out", filepath.Join(dir, name+".json")}
	}
	st := openTestStore(t, uri, all.Options{})
	watch := watchLatest(t, st)

	first := start(t, nil, args("first")...)
	first.waitLine(`starting fresh`, 2*time.Minute)
	first.waitLine(`checkpoint committed`, time.Minute)

	second := start(t, nil, args("second")...)
	second.waitLine(`lease taken.*"epoch": 2`, time.Minute)
	r := second.waitLine(`resuming from step (\d+) `, 2*time.Minute)
	resumed := int64(atoi(t, r[1]))

	// The first agent: a last checkpoint, not published, then stop. The
	// agent's line, not the trainer's: a periodic request pending at the
	// fence becomes the last checkpoint, and the trainer saves it under
	// the reason it was asked with (periodic).
	m := first.waitLine(`checkpoint uploaded but not published.*"id": "([^"]+)", "step": (\d+), "reason": "fenced"`, time.Minute)
	lastID, lastStep := m[1], int64(atoi(t, m[2]))
	first.waitLine(`stopping at step \d+: fenced`, time.Minute)
	if code := first.wait(time.Minute); code != 76 {
		t.Fatalf("fenced agent exit code %d, want 76", code)
	}
	if _, err := os.Stat(filepath.Join(dir, "first.json")); err == nil {
		t.Fatal("the fenced trainer finished training: the fence came too late to test anything")
	}
	if code := second.wait(3 * time.Minute); code != 0 {
		t.Fatalf("second agent exit code %d", code)
	}
	sameFile(t, filepath.Join(dir, "second.json"), ref)

	ctx := context.Background()
	lm, err := checkpoint.ReadManifest(ctx, st, checkpoint.ManifestKey(lastStep, lastID))
	if err != nil || lm.Epoch != 1 || lm.Reason != "fenced" {
		t.Fatalf("fenced agent's last checkpoint: %+v, %v; want a manifest of epoch 1, reason fenced", lm, err)
	}

	// latest.json as seen every few milliseconds: once epoch 2 sealed it,
	// only the checkpoint it sealed (the one the second agent resumed
	// from) or checkpoints of epoch 2.
	seen := watch()
	sealed := -1
	for i, l := range seen {
		if l.Epoch >= 2 {
			sealed = i
			break
		}
	}
	if sealed < 0 {
		t.Fatalf("latest.json never carried epoch 2: %+v", seen)
	}
	if got := seen[sealed].Step; got != resumed {
		t.Fatalf("latest.json sealed at step %d, the second agent resumed from %d", got, resumed)
	}
	for _, l := range seen[sealed:] {
		if l.Epoch < 2 {
			t.Fatalf("latest.json went back to epoch %d after the fence: %+v", l.Epoch, seen)
		}
		if l.ID == seen[sealed].ID {
			continue
		}
		mf, err := checkpoint.ReadManifest(ctx, st, l.Manifest)
		if err == nil && mf.Epoch != 2 {
			t.Fatalf("latest.json named %s (epoch %d) after the fence: %+v", l.ID, mf.Epoch, seen)
		}
		if l.ID == lastID {
			t.Fatalf("latest.json named the fenced agent's last checkpoint %s", lastID)
		}
	}
	if l := seen[len(seen)-1]; l.Epoch != 2 || l.Step <= resumed {
		t.Fatalf("final latest.json %+v, want a checkpoint of epoch 2 past step %d", l, resumed)
	}
	j := noticeJournal(t, st)
	if len(j.Sessions) != 2 || j.Sessions[1].End == nil || j.Sessions[0].End != nil {
		t.Fatalf("journal sessions %+v: want two, the second ended, the fenced one's end not written", j.Sessions)
	}
}

// watchLatest polls latest.json until the returned func is called, which
// returns every distinct value seen, in order.
func watchLatest(t *testing.T, st cloud.Store) func() []checkpoint.Latest {
	ctx, cancel := context.WithCancel(context.Background())
	var (
		mu   sync.Mutex
		seen []checkpoint.Latest
		wg   sync.WaitGroup
	)
	key := func(l checkpoint.Latest) string { return fmt.Sprint(l.ID, l.Epoch, l.Step) }
	wg.Add(1)
	go func() {
		defer wg.Done()
		for ctx.Err() == nil {
			if l, err := checkpoint.ReadLatest(ctx, st); err == nil {
				mu.Lock()
				if n := len(seen); n == 0 || key(seen[n-1]) != key(l) {
					seen = append(seen, l)
				}
				mu.Unlock()
			}
			select {
			case <-ctx.Done():
			case <-time.After(5 * time.Millisecond):
			}
		}
	}()
	stop := func() []checkpoint.Latest {
		cancel()
		wg.Wait()
		mu.Lock()
		defer mu.Unlock()
		return seen
	}
	t.Cleanup(func() { stop() })
	return stop
}
