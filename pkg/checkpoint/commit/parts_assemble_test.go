package commit

import (
	"context"
	"fmt"
	"io"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/spotagent/spotagent/internal/storesim"
	"github.com/spotagent/spotagent/pkg/checkpoint"
	"github.com/spotagent/spotagent/pkg/cloud"
)

// partReadsStore counts the reads of part manifests (parts/<node>.json)
// one agent makes.
type partReadsStore struct {
	cloud.Store
	n atomic.Int64
}

func (s *partReadsStore) Get(ctx context.Context, key string, off, n int64) (io.ReadCloser, error) {
	if _, rest, ok := strings.Cut(key, "/"+checkpoint.PartsDir); ok && strings.HasSuffix(rest, ".json") && !strings.Contains(rest, "/") {
		s.n.Add(1)
	}
	return s.Store.Get(ctx, key, off, n)
}

// nodes is a job of n nodes, two ranks each.
func nodes(n int) []checkpoint.PartSpec {
	parts := make([]checkpoint.PartSpec, n)
	for i := range parts {
		parts[i] = checkpoint.PartSpec{Node: fmt.Sprintf("node-%d", i), Ranks: []int{2 * i, 2*i + 1}, WorldSize: 2 * n}
	}
	return parts
}

// TestCommitParts_OnlyRankZeroReadsParts: of a job's agents, only the one
// whose part holds rank 0 reads the other parts; the others wait for the
// job manifest. Every agent used to read every part: n(n-1) reads, 10⁶ at
// 1,000 nodes; now n-1. All of them commit the same manifest.
func TestCommitParts_OnlyRankZeroReadsParts(t *testing.T) {
	const n = 12
	raw := storesim.New()
	parts := nodes(n)
	stores, res, errs := make([]*partReadsStore, n), make([]*Result, n), make([]error, n)
	var wg sync.WaitGroup
	for i, p := range parts {
		req := partRequest(t, p, 7, "aaaaaaaaaaaa")
		stores[i] = &partReadsStore{Store: raw}
		wg.Go(func() { res[i], errs[i] = (&Committer{Store: stores[i], RunID: "run"}).Commit(t.Context(), req) })
	}
	wg.Wait()
	var total int64
	for i := range parts {
		if errs[i] != nil {
			t.Fatalf("%s: %v", parts[i].Node, errs[i])
		}
		if res[i].ManifestKey != res[0].ManifestKey || !res[i].Manifest.Created.Equal(res[0].Manifest.Created) {
			t.Fatalf("%s committed %s %v, node-0 %s %v", parts[i].Node, res[i].ManifestKey, res[i].Manifest.Created, res[0].ManifestKey, res[0].Manifest.Created)
		}
		got := stores[i].n.Load()
		total += got
		if i > 0 && got != 0 {
			t.Errorf("%s read %d part manifests, want 0 (rank 0's agent assembles)", parts[i].Node, got)
		}
	}
	if got := stores[0].n.Load(); got < n-1 || got > n-1 {
		t.Errorf("node-0 read %d part manifests, want %d (each other part once)", got, n-1)
	}
	t.Logf("%d nodes: %d part-manifest reads in all (every agent reading every part: %d)", n, total, n*(n-1))
}

// TestCommitParts_AssembledWithoutRankZerosAgent: rank 0's agent wrote its
// part and stopped (killed before it assembled the manifest): the others
// see the listing stop changing, assemble the manifest themselves after
// assembleAfter, and commit; one manifest write wins.
func TestCommitParts_AssembledWithoutRankZerosAgent(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		raw := &manifestWrites{Store: storesim.New()}
		parts := nodes(3)
		// Rank 0's part, as its agent left it.
		zero := partRequest(t, parts[0], 9, "bbbbbbbbbbbb")
		ctx, cancel := context.WithCancel(t.Context())
		early := &Committer{Store: raw, RunID: "run"}
		go func() { early.Commit(ctx, zero) }()
		synctest.Wait()
		if _, err := raw.Stat(t.Context(), checkpoint.PartKey(9, "bbbbbbbbbbbb", "node-0")); err != nil {
			t.Fatalf("rank 0's part not written: %v", err)
		}
		cancel() // gone before the other parts came
		synctest.Wait()
		start := time.Now()
		within, cancel := context.WithTimeout(t.Context(), time.Minute) // the commit's deadline in an agent
		defer cancel()
		res, errs := make([]*Result, 2), make([]error, 2)
		var wg sync.WaitGroup
		for i, p := range parts[1:] {
			req := partRequest(t, p, 9, "bbbbbbbbbbbb")
			wg.Go(func() { res[i], errs[i] = (&Committer{Store: raw, RunID: "run"}).Commit(within, req) })
		}
		wg.Wait()
		for i, err := range errs {
			if err != nil {
				t.Fatalf("%s: %v", parts[i+1].Node, err)
			}
		}
		if took := time.Since(start); took < assembleAfter || took > assembleAfter+5*time.Second {
			t.Errorf("committed after %v, want assembleAfter (%v) and a few polls", took, assembleAfter)
		}
		if got := raw.n.Load(); got != 1 {
			t.Errorf("%d manifest writes succeeded, want 1", got)
		}
		m, err := checkpoint.ReadManifest(t.Context(), raw, checkpoint.ManifestKey(9, "bbbbbbbbbbbb"))
		if err != nil || len(m.Parts) != 3 {
			t.Fatalf("manifest %+v, %v: want 3 parts", m, err)
		}
	})
}
