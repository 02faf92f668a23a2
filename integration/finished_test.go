package integration

import (
	"os"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/spotagent/spotagent/internal/testutil"
	"github.com/spotagent/spotagent/pkg/checkpoint/journal"
	"github.com/spotagent/spotagent/pkg/cloud/all"
)

// TestFinishedRun_RecordedSaidAndCacheCleared: a real trainer finishes its
// steps under `spotagent run` with the default checkpoint directory. The
// journal records the session as finished, with the trainer's last step;
// the local copies under the default cache are deleted at the end (the
// store keeps them). A rerun with the same store says the run finished
// before and resumes from the newest committed checkpoint.
func TestFinishedRun_RecordedSaidAndCacheCleared(t *testing.T) {
	requirePython(t, false)
	t.Parallel()
	dir := testutil.ShortDir(t)
	storeDir := filepath.Join(dir, "store")
	store := "file://" + storeDir
	cache := filepath.Join(dir, "cache")
	env := []string{"XDG_CACHE_HOME=" + cache}
	args := func(steps int) []string {
		return []string{"run", "--store", store, "--run-id", "fin", "--socket", filepath.Join(dir, "a.sock"),
			"--cloud", "none", "--interval", "1s", "--log-level", "info",
			"--", python, "python/examples/train.py", "--steps", strconv.Itoa(steps), "--step-time", "0.05"}
	}
	a := start(t, env, args(60)...)
	a.waitLine(`checkpoint committed`, 2*time.Minute) // something kept in the local tier
	if code := a.wait(2 * time.Minute); code != 0 {
		t.Fatalf("finished run exit code %d, want 0\n%s", code, a.output())
	}
	a.waitLine(`run finished: deleted its local copies`, time.Second)
	area := filepath.Join(cache, "spotagent", "fin")
	for _, sub := range []string{"committed", "restore"} {
		matches, _ := filepath.Glob(filepath.Join(area, "*", sub, "*"))
		if len(matches) > 0 {
			t.Fatalf("the finished run left %v under the default cache", matches)
		}
	}
	if _, err := os.Stat(area); err != nil {
		t.Fatalf("the checkpoint dir itself is gone: %v", err)
	}

	st, err := all.Open(t.Context(), store, all.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	j, err := journal.Read(t.Context(), st, "fin")
	if err != nil {
		t.Fatal(err)
	}
	s := j.FinishedBefore()
	if s == nil || s.LastStep == nil || *s.LastStep != 60 {
		t.Fatalf("journal sessions %+v: want the last one finished at step 60", j.Sessions)
	}

	// The rerun trains again from the newest commit, and says why.
	b := start(t, env, args(60)...)
	b.waitLine(`this run finished before.*"finished_step": ?60`, time.Minute)
	b.waitLine(`resuming from step \d+`, time.Minute)
	if code := b.wait(2 * time.Minute); code != 0 {
		t.Fatalf("rerun exit code %d, want 0\n%s", code, b.output())
	}
}
