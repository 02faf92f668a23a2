package journal

import (
	"context"
	"errors"
	"fmt"
	"io"
	"sync/atomic"
	"testing"
	"time"

	"github.com/spotagent/spotagent/internal/retry"
	"github.com/spotagent/spotagent/internal/testutil"
	"github.com/spotagent/spotagent/pkg/cloud"
	"github.com/spotagent/spotagent/pkg/cloud/file"
)

// lossyStore lands the journal's first Put and then answers it with lost:
// the store took the write, the answer never came back.
type lossyStore struct {
	cloud.Store
	lost error
	puts atomic.Int32
}

func (l *lossyStore) Put(ctx context.Context, key string, r io.Reader, size int64, o cloud.PutOptions) error {
	if err := l.Store.Put(ctx, key, r, size, o); err != nil {
		return err
	}
	if l.puts.Add(1) == 1 {
		return l.lost
	}
	return nil
}

// A write that landed though its answer was lost is not applied a second
// time when it is made again: a reset after the store took it, and a
// conditional Put that the SDK sent again, refused (412) for the copy that
// had landed. Both counted a failure twice (and added the session twice).
func TestUpdateRetrying_LandedWriteNotAppliedTwice(t *testing.T) {
	for _, lost := range []error{
		errors.New("put journal.json: connection reset by peer"),
		fmt.Errorf("put journal.json: %w", cloud.ErrPrecondition),
	} {
		t.Run(lost.Error(), func(t *testing.T) {
			fs, err := file.New(t.TempDir())
			if err != nil {
				t.Fatal(err)
			}
			st := &lossyStore{Store: fs, lost: lost}
			w := NewWriter(st, &Journal{Format: Format, RunID: "r"})
			// The first write creates the journal; the second's answer is lost.
			st.puts.Store(-1)
			if err := w.Update(t.Context(), func(j *Journal) { j.Stats.RunSeconds = 1 }); err != nil {
				t.Fatal(err)
			}
			p := retry.Policy{Attempts: 3, Backoff: retry.Backoff{Min: 1, Max: 1}}
			if err := w.UpdateRetrying(t.Context(), p, func(j *Journal) { j.Stats.Failures++ }); err != nil {
				t.Fatalf("write: %v", err)
			}
			j, err := Read(t.Context(), fs, "r")
			if err != nil {
				t.Fatal(err)
			}
			if j.Stats.Failures != 1 || w.Snapshot().Stats.Failures != 1 {
				t.Fatalf("failures %d in the store, %d in the writer: want 1, the write applied once",
					j.Stats.Failures, w.Snapshot().Stats.Failures)
			}
		})
	}
}

// flakyStat fails every Stat while down, and counts them.
type flakyStat struct {
	cloud.Store
	down  atomic.Bool
	stats atomic.Int32
}

func (f *flakyStat) Stat(ctx context.Context, key string) (cloud.ObjectInfo, error) {
	if f.down.Load() {
		f.stats.Add(1)
		return cloud.ObjectInfo{}, errors.New("stat journal.json: connection reset by peer")
	}
	return f.Store.Stat(ctx, key)
}

// A write made again keeps the journal's turn between its attempts: a
// write asked for after it lands after it, never under it. The older
// write landed last and put back its stale measurements (RunSeconds
// 100 over 200), which the next start's scheduler reads.
func TestUpdateRetrying_KeepsItsTurn(t *testing.T) {
	fs, err := file.New(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	st := &flakyStat{Store: fs}
	st.down.Store(true)
	w := NewWriter(st, &Journal{Format: Format, RunID: "r"})
	p := retry.Policy{Attempts: 1 << 20, Backoff: retry.Backoff{Min: time.Millisecond, Max: time.Millisecond}}
	older := make(chan error, 1)
	go func() {
		older <- w.UpdateRetrying(context.Background(), p, func(j *Journal) { j.Stats.RunSeconds = 100 })
	}()
	testutil.WaitFor(t, "the older write's attempts failing", func() bool { return st.stats.Load() >= 3 })
	newer := make(chan error, 1)
	go func() {
		newer <- w.UpdateRetrying(context.Background(), p, func(j *Journal) { j.Stats.RunSeconds = 200 })
	}()
	n := st.stats.Load()
	testutil.WaitFor(t, "more of the older write's attempts", func() bool { return st.stats.Load() >= n+3 })
	st.down.Store(false)
	for _, c := range []chan error{older, newer} {
		if err := <-c; err != nil {
			t.Fatal(err)
		}
	}
	j, err := Read(t.Context(), fs, "r")
	if err != nil {
		t.Fatal(err)
	}
	if j.Stats.RunSeconds != 200 {
		t.Fatalf("run seconds %v, want 200: the older write landed over the newer one", j.Stats.RunSeconds)
	}
}
