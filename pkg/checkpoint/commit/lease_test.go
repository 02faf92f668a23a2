package commit

import (
	"context"
	"errors"
	"fmt"
	"io"
	"sort"
	"sync"
	"testing"

	"github.com/spotagent/spotagent/pkg/checkpoint"
	"github.com/spotagent/spotagent/pkg/checkpoint/internal/cptest"
	"github.com/spotagent/spotagent/pkg/checkpoint/journal"
	"github.com/spotagent/spotagent/pkg/checkpoint/restore"
	"github.com/spotagent/spotagent/pkg/cloud"
)

func commitUnder(l *checkpoint.Lease, st cloud.Store, t *testing.T, step int64, id string) (*Result, error) {
	c := &Committer{Store: st, RunID: "run", Lease: l}
	return c.Commit(context.Background(), Request{Dir: cptest.WriteDir(t, map[string]string{"w": id}), ID: id, Step: step, Reason: "periodic"})
}

func latestRaw(t *testing.T, st cloud.Store) checkpoint.Latest {
	t.Helper()
	l, _, err := checkpoint.ReadLatestRaw(context.Background(), st)
	if err != nil {
		t.Fatalf("read latest: %v", err)
	}
	return l
}

// Sessions starting at once each get their own epoch; the newest owns the
// run, every other one is fenced, and latest.json carries the newest epoch.
func TestLease_ConcurrentAcquire(t *testing.T) {
	cptest.LeaseStores(t, func(t *testing.T, st cloud.Store) {
		const n = 6
		leases := make([]*checkpoint.Lease, n)
		errs := make([]error, n)
		var wg sync.WaitGroup
		for i := range n {
			wg.Add(1)
			go func() {
				defer wg.Done()
				leases[i], errs[i] = checkpoint.AcquireLease(context.Background(), st, checkpoint.LeaseRecord{Session: fmt.Sprint("s", i)})
			}()
		}
		wg.Wait()
		var epochs []int64
		var top *checkpoint.Lease
		for i, l := range leases {
			if errs[i] != nil && !errors.Is(errs[i], checkpoint.ErrFenced) {
				t.Fatalf("acquire %d: %v", i, errs[i])
			}
			epochs = append(epochs, l.Epoch)
			if top == nil || l.Epoch > top.Epoch {
				top = l
			}
		}
		sort.Slice(epochs, func(i, j int) bool { return epochs[i] < epochs[j] })
		for i := 1; i < n; i++ {
			if epochs[i] == epochs[i-1] {
				t.Fatalf("two sessions got epoch %d: %v", epochs[i], epochs)
			}
		}
		for _, l := range leases {
			err := l.Check(context.Background())
			if l == top && err != nil {
				t.Fatalf("newest session (epoch %d) fenced: %v", l.Epoch, err)
			}
			if l != top && !errors.Is(err, checkpoint.ErrFenced) {
				t.Fatalf("epoch %d not fenced by %d: %v", l.Epoch, top.Epoch, err)
			}
		}
		if got := latestRaw(t, st).Epoch; got != top.Epoch {
			t.Fatalf("latest.json epoch=%d, want %d", got, top.Epoch)
		}
		if _, err := checkpoint.ReadLatest(context.Background(), st); !errors.Is(err, cloud.ErrNotExist) {
			t.Fatalf("sealed latest.json without a checkpoint: ReadLatest err=%v, want ErrNotExist", err)
		}
	})
}

// An older session's commit after a newer lease uploads its manifest
// (with its epoch) but never moves latest.json; the newer one publishes.
func TestLease_FencedCommitDoesNotPublish(t *testing.T) {
	cptest.LeaseStores(t, func(t *testing.T, st cloud.Store) {
		old := cptest.Acquire(t, st, "old")
		if _, err := commitUnder(old, st, t, 10, "a"); err != nil {
			t.Fatal(err)
		}
		newer := cptest.Acquire(t, st, "new")
		if l := latestRaw(t, st); l.Epoch != newer.Epoch || l.ID != "a" {
			t.Fatalf("after the new lease latest=%+v, want id a sealed with epoch %d", l, newer.Epoch)
		}
		_, err := commitUnder(old, st, t, 20, "b")
		if !errors.Is(err, checkpoint.ErrFenced) {
			t.Fatalf("fenced commit err=%v, want ErrFenced", err)
		}
		m, err := checkpoint.ReadManifest(context.Background(), st, checkpoint.ManifestKey(20, "b"))
		if err != nil || m.Epoch != old.Epoch {
			t.Fatalf("fenced checkpoint's manifest=%+v err=%v, want one with epoch %d", m, err, old.Epoch)
		}
		if l := latestRaw(t, st); l.ID != "a" {
			t.Fatalf("latest moved to %s after the fence", l.ID)
		}
		if _, err := commitUnder(newer, st, t, 15, "c"); err != nil {
			t.Fatalf("newer session's commit: %v", err)
		}
		if l := latestRaw(t, st); l.ID != "c" || l.Epoch != newer.Epoch {
			t.Fatalf("latest=%+v, want c at epoch %d", l, newer.Epoch)
		}
	})
}

// sealBeforePut lets a newer session take its lease (and seal latest.json)
// just before the older session's write of latest.json: after the older
// one checked leases/, before its write lands.
type sealBeforePut struct {
	cloud.Store
	mu   sync.Mutex
	seal func() // run once, before the next Put of latest.json
}

func (s *sealBeforePut) Put(ctx context.Context, key string, r io.Reader, size int64, o cloud.PutOptions) error {
	s.mu.Lock()
	seal := s.seal
	if key == checkpoint.LatestKey {
		s.seal = nil
	}
	s.mu.Unlock()
	if key == checkpoint.LatestKey && seal != nil {
		seal()
	}
	return s.Store.Put(ctx, key, r, size, o)
}

// The race the conditional write closes: a fence check that passed, then a
// newer session's seal, then the older write. It must fail, not land (the
// seal took the older session's manifest, committed before it, as latest).
func TestLease_SealBetweenCheckAndWrite(t *testing.T) {
	cptest.LeaseStores(t, func(t *testing.T, st cloud.Store) {
		racy := &sealBeforePut{Store: st}
		old := cptest.Acquire(t, racy, "old")
		if _, err := commitUnder(old, racy, t, 10, "a"); err != nil {
			t.Fatal(err)
		}
		var newer *checkpoint.Lease
		racy.seal = func() { newer = cptest.Acquire(t, st, "new") }
		_, err := commitUnder(old, racy, t, 20, "b")
		if newer == nil {
			t.Fatal("the newer session never took its lease")
		}
		if !errors.Is(err, checkpoint.ErrFenced) {
			t.Fatalf("write after the seal: err=%v, want ErrFenced", err)
		}
		// b's manifest landed before the newer session sealed: the seal
		// adopts it (a committed checkpoint), though its own write failed.
		if l := latestRaw(t, st); l.ID != "b" || l.Epoch != newer.Epoch {
			t.Fatalf("latest=%+v, want b sealed by epoch %d", l, newer.Epoch)
		}
		if !old.Fenced() {
			t.Fatal("old session does not know it is fenced")
		}
	})
}

// Restore passes over checkpoints of a newer epoch (the session that fenced
// the one restoring), also when latest.json names one.
func TestRestore_IgnoresHigherEpochs(t *testing.T) {
	cptest.LeaseStores(t, func(t *testing.T, st cloud.Store) {
		one := cptest.Acquire(t, st, "one")
		if _, err := commitUnder(one, st, t, 10, "a"); err != nil {
			t.Fatal(err)
		}
		two := cptest.Acquire(t, st, "two")
		if _, err := commitUnder(two, st, t, 20, "b"); err != nil {
			t.Fatal(err)
		}
		r, err := restore.Checkpoint(context.Background(), st, t.TempDir(), restore.Options{MaxEpoch: one.Epoch})
		if err != nil || r.Manifest.ID != "a" {
			t.Fatalf("restore under epoch %d: %+v, %v; want checkpoint a", one.Epoch, r, err)
		}
		r, err = restore.Checkpoint(context.Background(), st, t.TempDir(), restore.Options{MaxEpoch: two.Epoch})
		if err != nil || r.Manifest.ID != "b" {
			t.Fatalf("restore under epoch %d: %+v, %v; want checkpoint b", two.Epoch, r, err)
		}
		if _, err := restore.Checkpoint(context.Background(), st, t.TempDir(), restore.Options{MaxEpoch: one.Epoch, ID: "b"}); !errors.Is(err, restore.ErrNoCheckpoint) {
			t.Fatalf("restore of a newer epoch's checkpoint by id: err=%v, want ErrNoCheckpoint", err)
		}
	})
}

// Two journal writers: neither loses the other's update; a fenced one
// writes nothing.
func TestJournal_ConditionalAndFenced(t *testing.T) {
	cptest.LeaseStores(t, func(t *testing.T, st cloud.Store) {
		ctx := context.Background()
		old := cptest.Acquire(t, st, "old")
		j1, _ := journal.Read(ctx, st, "run")
		j2, _ := journal.Read(ctx, st, "run")
		w1, w2 := journal.NewWriter(st, j1), journal.NewWriter(st, j2)
		w1.FenceWith(old)
		if err := w1.Update(ctx, func(j *journal.Journal) { j.Stats.Checkpoints++ }); err != nil {
			t.Fatal(err)
		}
		// w2 read the journal before w1 wrote: its write must not drop w1's.
		if err := w2.Update(ctx, func(j *journal.Journal) { j.Stats.Failures++ }); err != nil {
			t.Fatal(err)
		}
		got, _ := journal.Read(ctx, st, "run")
		if got.Stats.Checkpoints != 1 || got.Stats.Failures != 1 {
			t.Fatalf("stats=%+v, want both updates", got.Stats)
		}
		newer := cptest.Acquire(t, st, "new")
		w2.FenceWith(newer)
		if err := w2.Update(ctx, func(j *journal.Journal) { j.Stats.Failures++ }); err != nil {
			t.Fatal(err)
		}
		// w1 has not looked at the leases yet: its write loses the race
		// against w2's, it checks, and finds itself fenced.
		if err := w1.Update(ctx, func(j *journal.Journal) { j.Stats.Checkpoints += 100 }); !errors.Is(err, checkpoint.ErrFenced) {
			t.Fatalf("fenced journal write: err=%v, want ErrFenced", err)
		}
		got, _ = journal.Read(ctx, st, "run")
		if got.Stats.Checkpoints != 1 || got.Stats.Failures != 2 {
			t.Fatalf("stats=%+v after the fenced write, want checkpoints 1, failures 2", got.Stats)
		}
	})
}

// Issue 28.2: leases/ keeps the newest LeasesKept objects, not one per
// session ever started, and pruning never unfences an older session.
func TestLease_Pruned(t *testing.T) {
	st := cptest.NewStore(t)
	ctx := t.Context()
	first, err := checkpoint.AcquireLease(ctx, st, checkpoint.LeaseRecord{Session: "s0"})
	if err != nil {
		t.Fatal(err)
	}
	var last *checkpoint.Lease
	for i := range 3 * checkpoint.LeasesKept {
		if last, err = checkpoint.AcquireLease(ctx, st, checkpoint.LeaseRecord{Session: fmt.Sprint("s", i+1)}); err != nil {
			t.Fatal(err)
		}
	}
	n := 0
	st.List(ctx, checkpoint.LeaseDir, func(cloud.ObjectInfo) error { n++; return nil })
	if n != checkpoint.LeasesKept {
		t.Fatalf("%d lease objects, want the newest %d", n, checkpoint.LeasesKept)
	}
	if err := first.Check(ctx); !errors.Is(err, checkpoint.ErrFenced) {
		t.Fatalf("the first session after pruning: %v, want ErrFenced", err)
	}
	next, err := checkpoint.AcquireLease(ctx, st, checkpoint.LeaseRecord{Session: "next"})
	if err != nil || next.Epoch != last.Epoch+1 {
		t.Fatalf("next lease %+v, %v: want epoch %d", next, err, last.Epoch+1)
	}
}
