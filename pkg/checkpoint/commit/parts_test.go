package commit

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/spotagent/spotagent/internal/storesim"
	"github.com/spotagent/spotagent/internal/testutil"
	"github.com/spotagent/spotagent/pkg/checkpoint"
	"github.com/spotagent/spotagent/pkg/checkpoint/internal/cptest"
	"github.com/spotagent/spotagent/pkg/checkpoint/journal"
	"github.com/spotagent/spotagent/pkg/checkpoint/restore"
	"github.com/spotagent/spotagent/pkg/cloud"
)

// twoNodes is the job of the tests: world size 4, two ranks per node.
var twoNodes = []checkpoint.PartSpec{{Node: "node-0", Ranks: []int{0, 1}, WorldSize: 4}, {Node: "node-1", Ranks: []int{2, 3}, WorldSize: 4}}

// untilPartLanded is ctx ended once node's part manifest of (step, id) is
// in st, or after a minute: a commit waiting for parts that never come
// ends with ErrIncomplete once its own part is durable, however slow the
// machine (a fixed 200 ms bound once ended one before its part was
// written, under -race at load 9).
func untilPartLanded(t *testing.T, ctx context.Context, st cloud.Store, step int64, id, node string) context.Context {
	t.Helper()
	pctx, cancel := context.WithCancel(ctx)
	t.Cleanup(cancel)
	key := checkpoint.PartKey(step, id, node)
	go func() {
		defer cancel()
		for end := time.Now().Add(time.Minute); time.Now().Before(end) && pctx.Err() == nil; time.Sleep(10 * time.Millisecond) {
			if _, err := st.Stat(pctx, key); err == nil {
				return
			}
		}
	}()
	return pctx
}

// partFiles is what the ranks of part p save at step.
func partFiles(p checkpoint.PartSpec, step int64) map[string]string {
	files := map[string]string{}
	for _, r := range p.Ranks {
		files[fmt.Sprintf("rank-%d.pt", r)] = fmt.Sprintf("rank %d step %d %s", r, step, strings.Repeat("x", r*100))
	}
	return files
}

func partRequest(t *testing.T, p checkpoint.PartSpec, step int64, id string) Request {
	p.Ranks = slices.Clone(p.Ranks)
	return Request{Dir: cptest.WriteDir(t, partFiles(p, step)), ID: id, Step: step, Reason: "periodic",
		Metadata: []byte(fmt.Sprintf(`{"node":%q}`, p.Node)), Part: &p}
}

// commitJob commits every part at once and fails the test unless each succeeds.
func commitJob(t *testing.T, st cloud.Store, step int64, id string, parts ...checkpoint.PartSpec) []*Result {
	t.Helper()
	res, errs := commitParts(t, context.Background(), st, step, id, parts...)
	for i, err := range errs {
		if err != nil {
			t.Fatalf("commit part %s: %v", parts[i].Node, err)
		}
	}
	return res
}

func commitParts(t *testing.T, ctx context.Context, st cloud.Store, step int64, id string, parts ...checkpoint.PartSpec) ([]*Result, []error) {
	t.Helper()
	if len(parts) == 0 {
		parts = twoNodes
	}
	res, errs := make([]*Result, len(parts)), make([]error, len(parts))
	var wg sync.WaitGroup
	for i, p := range parts {
		req := partRequest(t, p, step, id)
		wg.Go(func() {
			c := &Committer{Store: st, RunID: "run"}
			res[i], errs[i] = c.Commit(ctx, req)
		})
	}
	wg.Wait()
	return res, errs
}

// manifestWrites counts the manifest writes that succeeded.
type manifestWrites struct {
	cloud.Store
	n atomic.Int64
}

func (s *manifestWrites) Put(ctx context.Context, key string, r io.Reader, size int64, o cloud.PutOptions) error {
	err := s.Store.Put(ctx, key, r, size, o)
	if err == nil && strings.HasSuffix(key, "/"+checkpoint.ManifestName) {
		s.n.Add(1)
	}
	return err
}

// Two agents finish one job checkpoint at once: both succeed, one manifest
// write wins, and latest.json points at it.
func TestCommitParts_Concurrent(t *testing.T) {
	cptest.LeaseStores(t, func(t *testing.T, raw cloud.Store) {
		for i := range 4 {
			st := &manifestWrites{Store: raw}
			step, id := int64(100+i), fmt.Sprintf("%012x", i)
			res := commitJob(t, st, step, id)
			if got := st.n.Load(); got != 1 {
				t.Fatalf("%d manifest writes succeeded, want 1", got)
			}
			if res[0].ManifestKey != res[1].ManifestKey || !res[0].Manifest.Created.Equal(res[1].Manifest.Created) {
				t.Fatalf("the committers report different manifests: %s %v, %s %v", res[0].ManifestKey, res[0].Manifest.Created, res[1].ManifestKey, res[1].Manifest.Created)
			}
			m, err := checkpoint.ReadManifest(t.Context(), st, checkpoint.ManifestKey(step, id))
			if err != nil {
				t.Fatal(err)
			}
			if len(m.Parts) != 2 || m.Parts[0].Node != "node-0" || len(m.Files) != 4 || m.Parts[1].Files != 2 {
				t.Fatalf("manifest parts=%+v files=%d", m.Parts, len(m.Files))
			}
			var meta bytes.Buffer
			json.Compact(&meta, m.Metadata)
			if meta.String() != `{"node":"node-0"}` {
				t.Fatalf("metadata=%s, want rank 0's part's", m.Metadata)
			}
			for _, f := range m.Files {
				if want := checkpoint.PartPrefix(step, id, f.Part) + f.Path; f.Key != want {
					t.Fatalf("file %s key=%s, want %s", f.Path, f.Key, want)
				}
			}
			l, err := checkpoint.ReadLatest(t.Context(), st)
			if err != nil || l.Manifest != checkpoint.ManifestKey(step, id) {
				t.Fatalf("latest=%+v, %v", l, err)
			}
			if res[1].Bytes != m.PartBytes("node-1") {
				t.Fatalf("result bytes=%d, want the part's %d", res[1].Bytes, m.PartBytes("node-1"))
			}
		}
	})
}

// A part that never arrives: ErrIncomplete naming its ranks, no manifest,
// the part stays, and restore keeps returning the previous checkpoint.
func TestCommitParts_Missing(t *testing.T) {
	cptest.LeaseStores(t, func(t *testing.T, st cloud.Store) {
		commitJob(t, st, 10, "aaaaaaaaaaaa")
		ctx := untilPartLanded(t, t.Context(), st, 20, "bbbbbbbbbbbb", twoNodes[0].Node)
		_, errs := commitParts(t, ctx, st, 20, "bbbbbbbbbbbb", twoNodes[0])
		if !errors.Is(errs[0], ErrIncomplete) || !strings.Contains(errs[0].Error(), "[2 3]") {
			t.Fatalf("err=%v, want ErrIncomplete naming ranks [2 3]", errs[0])
		}
		if _, err := st.Stat(t.Context(), checkpoint.ManifestKey(20, "bbbbbbbbbbbb")); !errors.Is(err, cloud.ErrNotExist) {
			t.Fatalf("manifest of the incomplete checkpoint: %v", err)
		}
		if _, err := st.Stat(t.Context(), checkpoint.PartKey(20, "bbbbbbbbbbbb", "node-0")); err != nil {
			t.Fatalf("the part is gone: %v", err)
		}
		for _, p := range []string{"", "node-0", "node-1"} {
			r, err := restore.Checkpoint(t.Context(), st, t.TempDir(), restore.Options{Part: p})
			if err != nil || r.Manifest.Step != 10 {
				t.Fatalf("restore part %q: %v, want step 10", p, err)
			}
		}
		// The late part completes it after all (its agent was slow, not dead).
		res := commitJob(t, st, 20, "bbbbbbbbbbbb", twoNodes[1])
		if res[0].Manifest.Step != 20 || restoredStep(t, st) != 20 {
			t.Fatal("the late part did not complete the checkpoint")
		}
	})
}

// An object of the other part missing or cut short: restore skips the
// checkpoint for the previous complete one, whichever part it fetches.
func TestRestoreParts_OtherPartDamaged(t *testing.T) {
	for _, damage := range []string{"missing", "short", "own-corrupt"} {
		t.Run(damage, func(t *testing.T) {
			cptest.LeaseStores(t, func(t *testing.T, st cloud.Store) {
				commitJob(t, st, 10, "aaaaaaaaaaaa")
				commitJob(t, st, 20, "bbbbbbbbbbbb")
				victim := checkpoint.PartPrefix(20, "bbbbbbbbbbbb", "node-1") + "rank-3.pt"
				switch damage {
				case "missing":
					if err := st.Delete(t.Context(), victim); err != nil {
						t.Fatal(err)
					}
				case "short":
					cptest.Put(t, st, victim, "cut")
				case "own-corrupt": // same size, other bytes: only a download sees it
					body := partFiles(twoNodes[1], 20)["rank-3.pt"]
					cptest.Put(t, st, victim, strings.ToUpper(body))
				}
				r, err := restore.Checkpoint(t.Context(), st, t.TempDir(), restore.Options{Part: "node-1"})
				if err != nil || r.Manifest.Step != 10 || len(r.Skipped) != 1 {
					t.Fatalf("node-1 restore: %+v, %v; want step 10, one skipped", r, err)
				}
				if damage == "own-corrupt" {
					return // node-0 cannot tell without downloading node-1's files
				}
				r, err = restore.Checkpoint(t.Context(), st, t.TempDir(), restore.Options{Part: "node-0"})
				if err != nil || r.Manifest.Step != 10 || len(r.Skipped) != 1 {
					t.Fatalf("node-0 restore: %+v, %v; want step 10, one skipped", r, err)
				}
			})
		})
	}
}

// Parts that cannot make one checkpoint are never committed. No commit
// here ends on a timer (one that must outlast a part's write failed under
// load): a commit that finds the disagreement returns by itself (a minute
// bounds a failure), the other side of a pair ends when it did, and a
// part that only has to be in the store ends once it is.
func TestCommitParts_Disagree(t *testing.T) {
	const id = "cccccccccccc"
	bound := func(t *testing.T) context.Context {
		ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
		t.Cleanup(cancel)
		return ctx
	}
	// pair commits both parts; the first to return ends the other.
	pair := func(t *testing.T, st cloud.Store, step int64, parts ...checkpoint.PartSpec) []error {
		t.Helper()
		ctx, cancel := context.WithCancel(bound(t))
		defer cancel()
		errs := make([]error, len(parts))
		var wg sync.WaitGroup
		for i, p := range parts {
			req := partRequest(t, p, step, id)
			wg.Go(func() {
				_, errs[i] = (&Committer{Store: st, RunID: "run"}).Commit(ctx, req)
				cancel()
			})
		}
		wg.Wait()
		return errs
	}
	disagreed := func(t *testing.T, errs []error) {
		t.Helper()
		seen := false
		for _, err := range errs {
			if err == nil {
				t.Fatalf("errs=%v: a part that disagrees committed", errs)
			}
			seen = seen || errors.Is(err, checkpoint.ErrPartsDisagree)
		}
		if !seen {
			t.Fatalf("errs=%v, want ErrPartsDisagree", errs)
		}
	}
	noManifest := func(t *testing.T, st cloud.Store) {
		t.Helper()
		if es, err := checkpoint.ListManifests(t.Context(), st); err != nil || len(es) != 0 {
			t.Fatalf("manifests: %d, %v; want none", len(es), err)
		}
		if _, err := checkpoint.ReadLatest(t.Context(), st); !errors.Is(err, cloud.ErrNotExist) {
			t.Fatalf("latest.json: %v, want none", err)
		}
	}
	cptest.LeaseStores(t, func(t *testing.T, st cloud.Store) {
		t.Run("duplicate rank", func(t *testing.T) {
			disagreed(t, pair(t, st, 1, twoNodes[0], checkpoint.PartSpec{Node: "node-1", Ranks: []int{1, 2, 3}, WorldSize: 4}))
			noManifest(t, st)
		})
		t.Run("world size", func(t *testing.T) {
			disagreed(t, pair(t, st, 2, checkpoint.PartSpec{Node: "node-0", Ranks: []int{0, 1}, WorldSize: 3}, checkpoint.PartSpec{Node: "node-1", Ranks: []int{2}, WorldSize: 4}))
			noManifest(t, st)
		})
		t.Run("mixed steps", func(t *testing.T) {
			// One node one step ahead: neither ever completes; both end
			// once both parts are in the store.
			landed0 := untilPartLanded(t, bound(t), st, 3, id, "node-0")
			landed1 := untilPartLanded(t, bound(t), st, 4, id, "node-1")
			ctx, cancel := context.WithCancel(bound(t))
			defer cancel()
			go func() {
				defer cancel()
				<-landed0.Done()
				<-landed1.Done()
			}()
			var wg sync.WaitGroup
			errs := make([]error, 2)
			for i, p := range twoNodes {
				req := partRequest(t, p, int64(3+i), id)
				wg.Go(func() { _, errs[i] = (&Committer{Store: st, RunID: "run"}).Commit(ctx, req) })
			}
			wg.Wait()
			for _, err := range errs {
				// The end may meet a Put whose object is already in
				// the store but whose reply has not come back (S3):
				// cancelled, not incomplete; never committed.
				if !errors.Is(err, ErrIncomplete) && !errors.Is(err, context.Canceled) {
					t.Fatalf("err=%v, want ErrIncomplete", err)
				}
			}
			for i, p := range twoNodes {
				if _, err := st.Stat(t.Context(), checkpoint.PartKey(int64(3+i), id, p.Node)); err != nil {
					t.Fatalf("%s's part of step %d: %v: the commits ended before both parts were in the store", p.Node, 3+i, err)
				}
			}
			noManifest(t, st)
		})
		t.Run("part claiming another step", func(t *testing.T) {
			// A part manifest copied under another checkpoint's prefix.
			commitParts(t, untilPartLanded(t, bound(t), st, 5, id, "node-1"), st, 5, id, twoNodes[1])
			rc, err := st.Get(t.Context(), checkpoint.PartKey(5, id, "node-1"), 0, -1)
			if err != nil {
				t.Fatal(err)
			}
			body, _ := io.ReadAll(rc)
			rc.Close()
			cptest.Put(t, st, checkpoint.PartKey(6, id, "node-1"), string(body))
			_, errs := commitParts(t, bound(t), st, 6, id, twoNodes[0])
			if !errors.Is(errs[0], checkpoint.ErrPartsDisagree) {
				t.Fatalf("err=%v, want ErrPartsDisagree", errs[0])
			}
			noManifest(t, st)
		})
		t.Run("same node twice", func(t *testing.T) {
			commitParts(t, untilPartLanded(t, bound(t), st, 7, id, "node-0"), st, 7, id, twoNodes[0])
			_, errs := commitParts(t, bound(t), st, 7, id, checkpoint.PartSpec{Node: "node-0", Ranks: []int{2, 3}, WorldSize: 4})
			if !errors.Is(errs[0], checkpoint.ErrPartsDisagree) {
				t.Fatalf("err=%v, want ErrPartsDisagree", errs[0])
			}
			noManifest(t, st)
		})
	})
}

// A part restore gets its own files; "" gets every part's.
func TestRestoreParts_Select(t *testing.T) {
	st := cptest.NewStore(t)
	commitJob(t, st, 10, "aaaaaaaaaaaa")
	for _, c := range []struct {
		part  string
		files []string
		parts []string
	}{
		{"node-1", []string{"rank-2.pt", "rank-3.pt"}, []string{"node-1"}},
		{"node-0", []string{"rank-0.pt", "rank-1.pt"}, []string{"node-0"}},
		{"", []string{"rank-0.pt", "rank-1.pt", "rank-2.pt", "rank-3.pt"}, []string{"node-0", "node-1"}},
	} {
		r, err := restore.Checkpoint(t.Context(), st, t.TempDir(), restore.Options{Part: c.part})
		if err != nil {
			t.Fatal(err)
		}
		if got := dirFiles(t, r.Dir); !slices.Equal(got, c.files) || !slices.Equal(r.Parts, c.parts) {
			t.Fatalf("part %q: files %v parts %v, want %v %v", c.part, got, r.Parts, c.files, c.parts)
		}
		for _, name := range c.files {
			var r0 int
			fmt.Sscanf(name, "rank-%d.pt", &r0)
			node := twoNodes[r0/2]
			if got, want := testutil.ReadFile(t, filepath.Join(r.Dir, name)), partFiles(node, 10)[name]; got != want {
				t.Fatalf("%s=%q, want %q", name, got, want)
			}
		}
	}
	// A node the checkpoint has no part of gets an error, never another
	// node's files (issue 24.2: node 0 restored node 1's rank-1.pt).
	if r, err := restore.Checkpoint(t.Context(), st, t.TempDir(), restore.Options{Part: "node-7"}); !errors.Is(err, restore.ErrNoPart) ||
		!strings.Contains(err.Error(), "--restore all") {
		t.Fatalf("part node-7: %+v, %v; want ErrNoPart naming --restore all", r, err)
	}
	// A single-node checkpoint asked for a part: all of it.
	commit(t, st, 20, "single", map[string]string{"m": "x"})
	r, err := restore.Checkpoint(t.Context(), st, t.TempDir(), restore.Options{Part: "node-1"})
	if err != nil || r.Manifest.Step != 20 || r.Parts != nil || !slices.Equal(dirFiles(t, r.Dir), []string{"m"}) {
		t.Fatalf("single-node restore: %+v, %v", r, err)
	}
}

func dirFiles(t *testing.T, dir string) []string {
	t.Helper()
	var names []string
	err := filepath.WalkDir(dir, func(p string, d os.DirEntry, err error) error {
		if err == nil && !d.IsDir() {
			rel, _ := filepath.Rel(dir, p)
			names = append(names, filepath.ToSlash(rel))
		}
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	slices.Sort(names)
	return names
}

// A single-node commit writes the manifest it always did: no part fields.
func TestCommit_SingleNodeHasNoParts(t *testing.T) {
	st := cptest.NewStore(t)
	res := commit(t, st, 1, "abc", map[string]string{"m": "x"})
	rc, err := st.Get(t.Context(), res.ManifestKey, 0, -1)
	if err != nil {
		t.Fatal(err)
	}
	defer rc.Close()
	body, _ := io.ReadAll(rc)
	if strings.Contains(string(body), `"part`) {
		t.Fatalf("single-node manifest mentions parts:\n%s", body)
	}
}

// killAfter cancels its committer's context just before the store call
// number at (counting from 0): an agent killed at that point of its commit.
type killAfter struct {
	cloud.Store
	at     int64
	n      atomic.Int64
	cancel context.CancelFunc
}

func (k *killAfter) tick() {
	if k.n.Add(1)-1 == k.at {
		k.cancel()
	}
}

func (k *killAfter) Put(ctx context.Context, key string, r io.Reader, size int64, o cloud.PutOptions) error {
	k.tick()
	return k.Store.Put(ctx, key, r, size, o)
}

func (k *killAfter) Get(ctx context.Context, key string, off, n int64) (io.ReadCloser, error) {
	k.tick()
	return k.Store.Get(ctx, key, off, n)
}

func (k *killAfter) Stat(ctx context.Context, key string) (cloud.ObjectInfo, error) {
	k.tick()
	return k.Store.Stat(ctx, key)
}

func (k *killAfter) List(ctx context.Context, prefix string, fn func(cloud.ObjectInfo) error) error {
	k.tick()
	return k.Store.List(ctx, prefix, fn)
}

// Either agent killed at a random point of the job-wide commit: whatever
// restore returns has every part of one step, and otherwise the previous
// checkpoint stands.
func TestCommitParts_KilledAtRandom(t *testing.T) {
	seeds := 24
	if testing.Short() {
		seeds = 8
	}
	cptest.LeaseStores(t, func(t *testing.T, st cloud.Store) {
		commitJob(t, st, 10, "000000000010")
		counts := map[string]int{}
		for seed := range seeds {
			rng := rand.New(rand.NewPCG(uint64(seed), 15))
			step := int64(20 + seed)
			id := fmt.Sprintf("%012x", 0x1000+seed)
			victim := rng.IntN(2)
			ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
			var wg sync.WaitGroup
			errs := make([]error, 2)
			ctxs, cancels := make([]context.Context, 2), make([]context.CancelFunc, 2)
			for i := range ctxs {
				ctxs[i], cancels[i] = context.WithCancel(ctx)
			}
			// A commit of a part makes about ten store calls.
			kill := &killAfter{Store: st, at: int64(rng.IntN(12)), cancel: cancels[victim]}
			giveUp := time.Duration(rng.IntN(300)) * time.Millisecond
			for i, p := range twoNodes {
				req := partRequest(t, p, step, id)
				var s cloud.Store = st
				if i == victim {
					s = kill
				}
				wg.Go(func() {
					defer cancels[i]()
					_, errs[i] = (&Committer{Store: s, RunID: "run"}).Commit(ctxs[i], req)
					if i == victim && errs[i] != nil {
						// The survivor waits for the victim's part until
						// its own deadline: a random one, from now.
						time.AfterFunc(giveUp, cancels[1-i])
					}
				})
			}
			wg.Wait()
			cancel()
			committed := errs[0] == nil || errs[1] == nil
			_, merr := st.Stat(t.Context(), checkpoint.ManifestKey(step, id))
			for _, part := range []string{"", "node-0", "node-1"} {
				r, err := restore.Checkpoint(t.Context(), st, t.TempDir(), restore.Options{Part: part})
				if err != nil {
					t.Fatalf("seed %d: restore %q: %v", seed, part, err)
				}
				m := r.Manifest
				if len(m.Parts) != 2 || len(m.Files) != 4 {
					t.Fatalf("seed %d: restored a checkpoint of %d parts, %d files", seed, len(m.Parts), len(m.Files))
				}
				for _, f := range m.Files {
					if !strings.HasPrefix(f.Key, checkpoint.Prefix(m.Step, m.ID)) {
						t.Fatalf("seed %d: file %s of another checkpoint than %d-%s", seed, f.Key, m.Step, m.ID)
					}
				}
				if part == "" {
					for _, p := range twoNodes {
						for name, body := range partFiles(p, m.Step) {
							if got := testutil.ReadFile(t, filepath.Join(r.Dir, name)); got != body {
								t.Fatalf("seed %d: %s=%q, want %q", seed, name, got, body)
							}
						}
					}
				}
				if m.Step != step && (committed || merr == nil) {
					t.Fatalf("seed %d: committed (%v, manifest %v) but restore returned step %d", seed, errs, merr, m.Step)
				}
				if m.Step > step {
					t.Fatalf("seed %d: restored step %d", seed, m.Step)
				}
			}
			for _, err := range errs {
				switch {
				case err == nil:
					counts["ok"]++
				case errors.Is(err, ErrIncomplete):
					counts["incomplete"]++
				default:
					counts["other"]++
				}
			}
		}
		t.Logf("outcomes over %d seeds: %v", seeds, counts)
		if counts["ok"] == 0 || counts["incomplete"] == 0 {
			t.Fatalf("outcomes %v: the kill points did not cover both commit and no commit", counts)
		}
	})
}

// Retention deletes the parts of a job checkpoint that never completed
// once a newer one is committed, and never touches a prefix above the
// newest committed step: other nodes may still be assembling it.
func TestPrune_PartsOnly(t *testing.T) {
	st := cptest.NewStore(t)
	incomplete := func(step int64, id string) {
		ctx := untilPartLanded(t, t.Context(), st, step, id, twoNodes[0].Node)
		if _, errs := commitParts(t, ctx, st, step, id, twoNodes[0]); !errors.Is(errs[0], ErrIncomplete) {
			t.Fatalf("err=%v", errs[0])
		}
	}
	commitJob(t, st, 10, "aaaaaaaaaaaa")
	incomplete(15, "bbbbbbbbbbbb")
	cptest.Put(t, st, checkpoint.Prefix(16, "cccccccccccc")+"node-0/rank-0.pt", "data, no part yet") // in flight
	commitJob(t, st, 20, "dddddddddddd")
	incomplete(30, "eeeeeeeeeeee")
	if _, err := checkpoint.Prune(t.Context(), st, 2, nil); err != nil {
		t.Fatal(err)
	}
	left := map[string]int{}
	st.List(t.Context(), checkpoint.CheckpointsDir, func(o cloud.ObjectInfo) error { left[checkpoint.DirOf(o.Key)]++; return nil })
	// 15 is above the oldest checkpoint kept: it may be a job checkpoint
	// still being assembled (after a rollback past a newer damaged one).
	want := map[string]int{
		checkpoint.Prefix(10, "aaaaaaaaaaaa"): 7, checkpoint.Prefix(15, "bbbbbbbbbbbb"): 3, checkpoint.Prefix(16, "cccccccccccc"): 1,
		checkpoint.Prefix(20, "dddddddddddd"): 7, checkpoint.Prefix(30, "eeeeeeeeeeee"): 3,
	}
	if fmt.Sprint(left) != fmt.Sprint(want) {
		t.Fatalf("left %v, want %v", left, want)
	}
	// Once the oldest kept checkpoint is above them, they go: parts and
	// data of 15, the upload of 16, and 10, the third newest.
	commitJob(t, st, 40, "ffffffffffff")
	if _, err := checkpoint.Prune(t.Context(), st, 2, nil); err != nil {
		t.Fatal(err)
	}
	left = map[string]int{}
	st.List(t.Context(), checkpoint.CheckpointsDir, func(o cloud.ObjectInfo) error { left[checkpoint.DirOf(o.Key)]++; return nil })
	want = map[string]int{checkpoint.Prefix(20, "dddddddddddd"): 7, checkpoint.Prefix(30, "eeeeeeeeeeee"): 3, checkpoint.Prefix(40, "ffffffffffff"): 7}
	if fmt.Sprint(left) != fmt.Sprint(want) {
		t.Fatalf("after a newer commit: left %v, want %v", left, want)
	}
}

func TestJournal_SessionByID(t *testing.T) {
	j := &journal.Journal{Sessions: []journal.Session{{ID: "a"}, {}, {ID: "b"}}}
	if s := j.SessionByID("a"); s != &j.Sessions[0] {
		t.Fatalf("SessionByID(a)=%v", s)
	}
	if j.SessionByID("") != nil || j.SessionByID("c") != nil {
		t.Fatal("found a session that is not there")
	}
}

// Early uploads of a part go under the part's prefix, once each; a commit
// that ends incomplete keeps them (Abort after it deletes nothing the part
// manifest lists), so the late part can still complete the checkpoint.
func TestCommitParts_Pipeline(t *testing.T) {
	st := &countingStore{Store: cptest.NewStore(t)}
	const id = "fedcbafedcba"
	p0 := twoNodes[0]
	files := partFiles(p0, 5)
	root := openRoot(t, cptest.WriteDir(t, files))
	c := &Committer{Store: st, RunID: "run"}

	wrong := c.NewPipeline(t.Context(), root, 5, id)
	if _, err := c.Commit(t.Context(), Request{Root: root, ID: id, Step: 5, Pipeline: wrong, Part: &p0}); err == nil || !strings.Contains(err.Error(), "NewPartPipeline") {
		t.Fatalf("commit with a single-node pipeline: %v", err)
	}
	wrong.Abort()
	wrong.Wait()

	p := c.NewPartPipeline(t.Context(), root, 5, id, p0.Node)
	for rel := range files {
		if err := p.Add(rel); err != nil {
			t.Fatal(err)
		}
	}
	ctx := untilPartLanded(t, t.Context(), st, 5, id, p0.Node)
	_, err := c.Commit(ctx, Request{Root: root, ID: id, Step: 5, Reason: "periodic", Pipeline: p, Part: &p0})
	if !errors.Is(err, ErrIncomplete) {
		t.Fatalf("err=%v, want ErrIncomplete", err)
	}
	p.Abort() // what the agent does with a checkpoint that did not commit
	p.Wait()
	for rel := range files {
		if got := st.count(checkpoint.PartPrefix(5, id, p0.Node) + rel); got != 1 {
			t.Errorf("puts of %s=%d, want 1", rel, got)
		}
	}
	commitJob(t, st, 5, id, twoNodes[1])
	r, err := restore.Checkpoint(t.Context(), st, t.TempDir(), restore.Options{Part: p0.Node})
	if err != nil || r.Manifest.Step != 5 {
		t.Fatalf("restore: %v", err)
	}
	for rel, body := range files {
		if got := testutil.ReadFile(t, filepath.Join(r.Dir, rel)); got != body {
			t.Fatalf("%s=%q, want %q", rel, got, body)
		}
	}
}

// landsThenFails puts part manifests and then reports a deadline error, as
// a store does when the caller's deadline ends after it took the write.
type landsThenFails struct{ cloud.Store }

func (s *landsThenFails) Put(ctx context.Context, key string, r io.Reader, size int64, o cloud.PutOptions) error {
	err := s.Store.Put(ctx, key, r, size, o)
	if err == nil && strings.Contains(key, "/"+checkpoint.PartsDir) {
		return context.DeadlineExceeded
	}
	return err
}

// Issue 24.10: a part write that landed but returned an error fails the
// commit, and the Abort after it must not delete the early uploads that
// the durable part names: the other node can still complete the job
// checkpoint, and restore must find every object.
func TestCommitParts_LandedPartKeepsEarlyUploads(t *testing.T) {
	base := cptest.NewStore(t)
	const id = "abcabcabcabc"
	p0 := twoNodes[0]
	files := partFiles(p0, 5)
	root := openRoot(t, cptest.WriteDir(t, files))
	c := &Committer{Store: &landsThenFails{base}, RunID: "run", Session: "s0"}
	p := c.NewPartPipeline(t.Context(), root, 5, id, p0.Node)
	for rel := range files {
		if err := p.Add(rel); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := c.Commit(t.Context(), Request{Root: root, ID: id, Step: 5, Reason: "periodic", Pipeline: p, Part: &p0}); err == nil {
		t.Fatal("commit succeeded; want the part write's error")
	}
	p.Abort()
	p.Wait()
	commitJob(t, base, 5, id, twoNodes[1])
	r, err := restore.Checkpoint(t.Context(), base, t.TempDir(), restore.Options{Part: p0.Node})
	if err != nil || r.Manifest.Step != 5 {
		t.Fatalf("restore of the part whose write landed: %+v, %v", r, err)
	}
}

// Issue 24.3: two live copies of one node. Each session's part data goes
// to a folder of its own, so the older copy never overwrites the newer's
// objects, and once the newer copy took the node's lease the older one
// writes no part: the committed checkpoint stays whole.
func TestCommitParts_SecondCopyOfANode(t *testing.T) {
	st := cptest.NewStore(t)
	ctx := t.Context()
	old, err := checkpoint.AcquirePartLease(ctx, st, "node-1", checkpoint.LeaseRecord{Session: "old"})
	if err != nil {
		t.Fatal(err)
	}
	commitJob(t, st, 100, "111111111111")
	fresh, err := checkpoint.AcquirePartLease(ctx, st, "node-1", checkpoint.LeaseRecord{Session: "new"})
	if err != nil || fresh.Epoch != old.Epoch+1 {
		t.Fatalf("second copy's lease: %+v, %v; want epoch %d", fresh, err, old.Epoch+1)
	}
	if other, err := checkpoint.AcquirePartLease(ctx, st, "node-0", checkpoint.LeaseRecord{Session: "n0"}); err != nil || other.Epoch != 1 {
		t.Fatalf("node 0's lease: %+v, %v: another node's leases are its own", other, err)
	}
	// Both copies save step 200 of the same job checkpoint.
	p1 := twoNodes[1]
	var keys []map[string]bool
	for _, cp := range []struct {
		lease   *checkpoint.Lease
		session string
		want    error
	}{{fresh, "new", nil}, {old, "old", checkpoint.ErrFenced}} {
		req := partRequest(t, p1, 200, "222222222222")
		c := &Committer{Store: st, RunID: "run", PartLease: cp.lease, Session: cp.session}
		// The fresh copy's commit ends once its part landed; the old
		// copy's is refused before it waits (a minute bounds a failure).
		pctx, cancel := context.WithTimeout(ctx, time.Minute)
		if cp.want == nil {
			pctx = untilPartLanded(t, ctx, st, 200, "222222222222", p1.Node)
		}
		_, err := c.Commit(pctx, req)
		cancel()
		if cp.want != nil && !errors.Is(err, cp.want) {
			t.Fatalf("copy %s: %v, want %v", cp.session, err, cp.want)
		}
		if cp.want == nil && !errors.Is(err, ErrIncomplete) { // node 0 has not saved yet
			t.Fatalf("copy %s: %v, want ErrIncomplete", cp.session, err)
		}
		got := map[string]bool{}
		st.List(ctx, checkpoint.PartPrefix(200, "222222222222", p1.Node), func(o cloud.ObjectInfo) error {
			got[o.Key] = true
			return nil
		})
		keys = append(keys, got)
	}
	for k := range keys[1] {
		if !keys[0][k] && !strings.Contains(k, "/old/") {
			t.Fatalf("the fenced copy wrote %s outside its own folder", k)
		}
	}
	if !old.Fenced() {
		t.Fatal("the older copy does not know it is fenced")
	}
	commitJob(t, st, 200, "222222222222", twoNodes[0])
	r, err := restore.Checkpoint(ctx, st, t.TempDir(), restore.Options{Part: p1.Node})
	if err != nil || r.Manifest.Step != 200 {
		t.Fatalf("restore: %+v, %v", r, err)
	}
	for _, f := range r.Manifest.Files {
		if f.Part == p1.Node && !strings.Contains(f.Key, "/new/") {
			t.Fatalf("the job checkpoint lists %s, not the newer copy's object", f.Key)
		}
	}
}

// The job manifest names the machine that wrote each part (where
// --replicas places its copies, pkg/checkpoint/peertier), and none for a
// part whose machine is unknown.
func TestCommitParts_SourcePerPart(t *testing.T) {
	st := storesim.New()
	machines := []checkpoint.Machine{{Cloud: "aws", Zone: "us-east-1a", InstanceType: "p5.48xlarge"}, {}}
	var wg sync.WaitGroup
	errs := make([]error, 2)
	for i, p := range twoNodes {
		req := partRequest(t, p, 7, "c7")
		wg.Go(func() {
			c := &Committer{Store: st, RunID: "run", Source: machines[i]}
			_, errs[i] = c.Commit(t.Context(), req)
		})
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		t.Fatal(err)
	}
	m, err := checkpoint.ReadManifest(t.Context(), st, checkpoint.ManifestKey(7, "c7"))
	if err != nil {
		t.Fatal(err)
	}
	if got := m.Parts[0].Source; got == nil || *got != machines[0] {
		t.Fatalf("part node-0 source=%v, want %+v", got, machines[0])
	}
	if got := m.Parts[1].Source; got != nil {
		t.Fatalf("part node-1 source=%+v, want none (unknown machine)", *got)
	}
}
