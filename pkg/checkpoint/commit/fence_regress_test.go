package commit

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/spotagent/spotagent/pkg/checkpoint"
	"github.com/spotagent/spotagent/pkg/checkpoint/internal/cptest"
	"github.com/spotagent/spotagent/pkg/checkpoint/restore"
	"github.com/spotagent/spotagent/pkg/cloud"
)

// Issue 35, bug 1: a commit whose manifest landed but whose latest.json
// write did not is a committed checkpoint. The next session's seal adopts
// it, and its restore (and `spotagent restore`) resume it, not the older
// one latest.json named.
func TestLease_SealAdoptsUnpublishedCommit(t *testing.T) {
	cptest.LeaseStores(t, func(t *testing.T, st cloud.Store) {
		old := cptest.Acquire(t, st, "old")
		if _, err := commitUnder(old, st, t, 10, "a"); err != nil {
			t.Fatal(err)
		}
		before, err := checkpoint.ReadSmall(t.Context(), st, checkpoint.LatestKey, 1<<20)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := commitUnder(old, st, t, 20, "b"); err != nil {
			t.Fatal(err)
		}
		// The machine died before latest.json moved: it still names a.
		cptest.Put(t, st, checkpoint.LatestKey, string(before))
		next := cptest.Acquire(t, st, "next")
		if l := latestRaw(t, st); l.ID != "b" || l.Epoch != next.Epoch {
			t.Fatalf("latest=%+v, want b sealed by epoch %d", l, next.Epoch)
		}
		for _, maxEpoch := range []int64{next.Epoch, 0} { // run, restore
			r, err := restore.Checkpoint(t.Context(), st, t.TempDir(), restore.Options{MaxEpoch: maxEpoch})
			if err != nil || r.Manifest.ID != "b" {
				t.Fatalf("max epoch %d: restored %v, %v; want b (step 20)", maxEpoch, r, err)
			}
		}
	})
}

// Issue 35 (found by the simulation): a seal with no checkpoint to point
// at fences all the same. The older session's commit after it is a fenced
// session's: neither the newer session nor `spotagent restore` resumes it.
func TestLease_PointerlessSealFences(t *testing.T) {
	cptest.LeaseStores(t, func(t *testing.T, st cloud.Store) {
		old := cptest.Acquire(t, st, "old")
		next := cptest.Acquire(t, st, "next")
		if _, err := commitUnder(old, st, t, 5, "late"); !errors.Is(err, checkpoint.ErrFenced) {
			t.Fatalf("commit of the fenced session: err=%v, want ErrFenced", err)
		}
		for _, maxEpoch := range []int64{next.Epoch, 0} {
			r, err := restore.Checkpoint(t.Context(), st, t.TempDir(), restore.Options{MaxEpoch: maxEpoch})
			if !errors.Is(err, restore.ErrNoCheckpoint) {
				t.Fatalf("max epoch %d: restored %v, %v; want ErrNoCheckpoint (late is fenced)", maxEpoch, r, err)
			}
		}
		if _, err := commitUnder(next, st, t, 1, "own"); err != nil {
			t.Fatal(err)
		}
		r, err := restore.Checkpoint(t.Context(), st, t.TempDir(), restore.Options{})
		if err != nil || r.Manifest.ID != "own" {
			t.Fatalf("restored %v, %v; want own (step 1), not the fenced late (step 5)", r, err)
		}
	})
}

// Issue 35, bug 2: retention keeps the parts of a job checkpoint being
// assembled below a newer damaged one (the job rolled back past it), and
// the damaged one does not count as kept: the checkpoint the job resumed
// from stays.
func TestPrune_RollbackKeepsAssembly(t *testing.T) {
	st := cptest.NewStore(t)
	commitJob(t, st, 10, "aaaaaaaaaaaa")
	res := commitJob(t, st, 20, "bbbbbbbbbbbb")
	if err := st.Delete(t.Context(), res[0].Manifest.Files[0].Key); err != nil { // damaged
		t.Fatal(err)
	}
	// The job resumed from 10; node-0's part of 12 is durable, node-1's
	// not yet (node-0's wait ends first here: its part stays).
	ctx := untilPartLanded(t, t.Context(), st, 12, "cccccccccccc", twoNodes[0].Node)
	if _, errs := commitParts(t, ctx, st, 12, "cccccccccccc", twoNodes[0]); !errors.Is(errs[0], ErrIncomplete) {
		t.Fatalf("err=%v", errs[0])
	}
	if _, err := checkpoint.Prune(t.Context(), st, 1, nil); err != nil {
		t.Fatal(err)
	}
	left := map[string]int{}
	st.List(t.Context(), checkpoint.CheckpointsDir, func(o cloud.ObjectInfo) error { left[checkpoint.DirOf(o.Key)]++; return nil })
	if left[checkpoint.Prefix(10, "aaaaaaaaaaaa")] == 0 {
		t.Errorf("retention deleted 10, the checkpoint restore picks (20 is damaged): left %v", left)
	}
	if left[checkpoint.Prefix(12, "cccccccccccc")] == 0 {
		t.Errorf("retention deleted the parts of 12, being assembled: left %v", left)
	}
}

// hideFromList hides keys from List: a listing that lags behind writes.
type hideFromList struct {
	cloud.Store
	hide string
}

func (h hideFromList) List(ctx context.Context, prefix string, fn func(cloud.ObjectInfo) error) error {
	return h.Store.List(ctx, prefix, func(o cloud.ObjectInfo) error {
		if strings.HasPrefix(o.Key, h.hide) {
			return nil
		}
		return fn(o)
	})
}

// Found by the simulation: a listing that lags behind the commit just made
// must not make retention delete that checkpoint's objects (it is pinned:
// read directly, not from the listing).
func TestPrune_PinnedNotYetListed(t *testing.T) {
	st := cptest.NewStore(t)
	c := &Committer{Store: st, RunID: "run"}
	for _, s := range []struct {
		step int64
		id   string
	}{{10, "a"}, {20, "b"}, {15, "c"}} {
		if _, err := c.Commit(t.Context(), Request{Dir: cptest.WriteDir(t, map[string]string{"w": s.id}), ID: s.id, Step: s.step}); err != nil {
			t.Fatal(err)
		}
	}
	key := checkpoint.ManifestKey(15, "c")
	lag := hideFromList{Store: st, hide: checkpoint.Prefix(15, "c") + checkpoint.ManifestName}
	if _, err := checkpoint.Prune(t.Context(), lag, 1, nil, key); err != nil {
		t.Fatal(err)
	}
	if _, err := restore.Checkpoint(t.Context(), st, t.TempDir(), restore.Options{ID: "c"}); err != nil {
		t.Fatalf("the pinned checkpoint after retention: %v", err)
	}
}
