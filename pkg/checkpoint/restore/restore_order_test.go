package restore

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/spotagent/spotagent/pkg/checkpoint"
	"github.com/spotagent/spotagent/pkg/checkpoint/internal/cptest"
	"github.com/spotagent/spotagent/pkg/cloud"
)

// TestRestore_LatestStepDisagrees: latest.json points at step 100's
// manifest but says step 1000. Restore trusts the manifest: it returns
// 500, the newest valid one, not 100; and the next commit moves
// latest.json, which a step of 1000 must not block.
func TestRestore_LatestStepDisagrees(t *testing.T) {
	st := cptest.NewStore(t)
	a := commitFiles(t, st, 100, "a", map[string]string{"m": "100"})
	commitFiles(t, st, 110, "b", map[string]string{"m": "110"})
	commitFiles(t, st, 500, "c", map[string]string{"m": "500"})
	body, _ := json.Marshal(checkpoint.Latest{Manifest: a.ManifestKey, Step: 1000, ID: "a"})
	cptest.Put(t, st, checkpoint.LatestKey, string(body))
	if got := restoredStep(t, st); got != 500 {
		t.Fatalf("restored step %d, want 500 (latest.json's step field is not the truth)", got)
	}
	commitFiles(t, st, 600, "d", map[string]string{"m": "600"})
	l, err := checkpoint.ReadLatest(context.Background(), st)
	if err != nil || l.Step != 600 || l.ID != "d" {
		t.Fatalf("latest=%+v, %v after a commit of 600: the pointer was not repaired", l, err)
	}
}

// TestRestore_SkipsFencedSessionsNewer: session one commits 10, session
// two seals and commits 15, one's commit of 20 is fenced at publish but
// its manifest stays. A third session resumes two's 15, not one's 20.
func TestRestore_SkipsFencedSessionsNewer(t *testing.T) {
	cptest.LeaseStores(t, func(t *testing.T, st cloud.Store) {
		one := cptest.Acquire(t, st, "one")
		if _, err := commitUnder(one, st, t, 10, "a"); err != nil {
			t.Fatal(err)
		}
		two := cptest.Acquire(t, st, "two")
		if _, err := commitUnder(two, st, t, 15, "b"); err != nil {
			t.Fatal(err)
		}
		if _, err := commitUnder(one, st, t, 20, "c"); err == nil {
			t.Fatal("the fenced session's commit succeeded")
		}
		r, err := Checkpoint(context.Background(), st, t.TempDir(), Options{})
		if err != nil || r.Manifest.ID != "b" {
			t.Fatalf("restore: %+v, %v; want checkpoint b (step 15), not the fenced session's c", r, err)
		}
		// Older than latest.json, a lower epoch is an ordinary fallback.
		st.Delete(context.Background(), "checkpoints/000000000015-b/w")
		r, err = Checkpoint(context.Background(), st, t.TempDir(), Options{})
		if err != nil || r.Manifest.ID != "a" {
			t.Fatalf("restore with b damaged: %+v, %v; want a", r, err)
		}
	})
}

// getCounter counts Gets of manifests and of data objects, and the
// bytes of manifests read.
type getCounter struct {
	cloud.Store
	manifests, data atomic.Int64
}

func (s *getCounter) Get(ctx context.Context, key string, off, n int64) (io.ReadCloser, error) {
	if strings.HasSuffix(key, "/"+checkpoint.ManifestName) {
		s.manifests.Add(1)
	} else if strings.HasPrefix(key, checkpoint.CheckpointsDir) {
		s.data.Add(1)
	}
	return s.Store.Get(ctx, key, off, n)
}

// TestRestore_OneManifestAtATime: with no latest.json and 30 manifests,
// restore reads the newest and stops there, instead of reading every
// manifest into memory first.
func TestRestore_OneManifestAtATime(t *testing.T) {
	inner := cptest.NewStore(t)
	for i := 1; i <= 30; i++ {
		commitFiles(t, inner, int64(i*10), fmt.Sprintf("c%d", i), map[string]string{"m": fmt.Sprint(i)})
	}
	inner.Delete(context.Background(), checkpoint.LatestKey)
	st := &getCounter{Store: inner}
	if got := restoredStep(t, st); got != 300 {
		t.Fatalf("restored %d, want 300", got)
	}
	if n := st.manifests.Load(); n != 1 {
		t.Fatalf("read %d manifests to restore the newest, want 1", n)
	}
	// A damaged newest: the next one is read then, not before.
	inner.Delete(context.Background(), "checkpoints/000000000300-c30/m")
	st.manifests.Store(0)
	if got := restoredStep(t, st); got != 290 {
		t.Fatalf("restored %d, want 290", got)
	}
	if n := st.manifests.Load(); n != 2 {
		t.Fatalf("read %d manifests, want 2", n)
	}
}

// TestRestore_StopsAtFirstFailure: a checkpoint of 300 files whose first
// object is missing: restore stops fetching (and creating files) at that
// failure instead of going through the other 299.
func TestRestore_StopsAtFirstFailure(t *testing.T) {
	inner := cptest.NewStore(t)
	files := map[string]string{}
	for i := range 300 {
		files[fmt.Sprintf("f%03d", i)] = strings.Repeat("x", i)
	}
	commitFiles(t, inner, 10, "a", files)
	inner.Delete(context.Background(), "checkpoints/000000000010-a/f000")
	st := &getCounter{Store: inner}
	_, err := Checkpoint(context.Background(), st, t.TempDir(), Options{})
	if err == nil {
		t.Fatal("a checkpoint with a missing object restored")
	}
	if n := st.data.Load(); n > 20 {
		t.Fatalf("%d objects fetched after the first one failed, want at most 20", n)
	}
}

// silentStore never answers a Get of key (until the request's context
// ends), nor a Get of any object when key is "".
type silentStore struct {
	cloud.Store
	key string
}

func (s silentStore) Get(ctx context.Context, key string, off, n int64) (io.ReadCloser, error) {
	if s.key == "" || key == s.key {
		<-ctx.Done()
		return nil, ctx.Err()
	}
	return s.Store.Get(ctx, key, off, n)
}

// stallAfterStore answers one byte of each object "m", then nothing.
type stallAfterStore struct{ cloud.Store }

type oneByteThenSilence struct {
	ctx  context.Context
	sent bool
}

func (r *oneByteThenSilence) Read(p []byte) (int, error) {
	if !r.sent {
		r.sent = true
		p[0] = 'x'
		return 1, nil
	}
	<-r.ctx.Done()
	return 0, r.ctx.Err()
}
func (r *oneByteThenSilence) Close() error { return nil }

func (s stallAfterStore) Get(ctx context.Context, key string, off, n int64) (io.ReadCloser, error) {
	if strings.HasSuffix(key, "/m") {
		return &oneByteThenSilence{ctx: ctx}, nil
	}
	return s.Store.Get(ctx, key, off, n)
}

// TestRestore_StallTimesOut: a store whose GETs never answer, and an
// object whose body stops after one byte, fail the restore with
// ErrStalled after the stall timeout instead of hanging; a latest.json
// alone that never answers is passed over (the listing is used); and
// cancelling ctx ends a restore at once.
func TestRestore_StallTimesOut(t *testing.T) {
	inner := cptest.NewStore(t)
	commitFiles(t, inner, 10, "a", map[string]string{"m": "ten"})
	for _, tc := range []struct {
		name string
		st   cloud.Store
	}{
		{"no Get answers", silentStore{Store: inner}},
		{"body stops", stallAfterStore{inner}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Checkpoint(context.Background(), tc.st, t.TempDir(), Options{Stall: 200 * time.Millisecond})
			if !errors.Is(err, ErrStalled) {
				t.Fatalf("err=%v, want ErrStalled", err)
			}
		})
	}
	r, err := Checkpoint(context.Background(), silentStore{Store: inner, key: checkpoint.LatestKey}, t.TempDir(), Options{Stall: 200 * time.Millisecond})
	if err != nil || r.Manifest.Step != 10 {
		t.Fatalf("restore with latest.json silent: %+v, %v; want step 10 from the listing", r, err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	errc := make(chan error, 1)
	go func() {
		_, err := Checkpoint(ctx, silentStore{Store: inner}, t.TempDir(), Options{})
		errc <- err
	}()
	cancel()
	select {
	case err := <-errc:
		if !errors.Is(err, context.Canceled) {
			t.Fatalf("err=%v, want context.Canceled", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("a cancelled restore did not return")
	}
}
