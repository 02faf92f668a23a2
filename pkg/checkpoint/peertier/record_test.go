package peertier

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"

	"github.com/spotagent/spotagent/pkg/checkpoint"
	"github.com/spotagent/spotagent/pkg/checkpoint/restore"
	"github.com/spotagent/spotagent/pkg/cloud"
)

// flipRecords answers the reads of key with its records in turn (the
// record rewritten between reads by two agents of one node name: an
// old agent still publishing while it drains, and its replacement).
type flipRecords struct {
	cloud.Store
	key   string
	recs  [][]byte
	reads atomic.Int64
}

func (s *flipRecords) Get(ctx context.Context, key string, off, n int64) (io.ReadCloser, error) {
	if key == s.key {
		i := s.reads.Add(1) - 1
		return io.NopCloser(bytes.NewReader(s.recs[int(i)%len(s.recs)])), nil
	}
	return s.Store.Get(ctx, key, off, n)
}

// Node 0's record flips between two sessions, A and B (found by review 12), neither
// of them the session of the agent that answers at its address (it
// refuses both: 403). The restore reads the record once (A), re-reads it
// after the refusal (B), re-reads it after B's refusal (A again); from
// then on Open alternates between the two cached re-reads, with every
// address marked bad, asking nobody and never looking at ctx: it spins
// forever, one CPU at 100 %, and the restore's context does not end it.
// It must instead fall back to the store (or at least end with ctx): each
// session of a node is asked once per file (Open's tried).
func TestFlippingRecordEnds(t *testing.T) {
	r := newRig(t)
	r.commit(0)
	p0 := r.startAs(0, "s0", r.nodes[0].tier)
	var recs [][]byte
	for _, s := range []string{"A", "B"} {
		b, err := json.Marshal(Record{Node: "node-0", Session: s, Addrs: []string{p0.Addr().String()}, Holds: []string{folder(r.m)}})
		if err != nil {
			t.Fatal(err)
		}
		recs = append(recs, b)
	}
	st := &flipRecords{Store: r.st, key: recordKey("node-0"), recs: recs}
	p1, err := Start(context.Background(), Config{Store: st, RunID: "run", Node: "node-1", Session: "s1", Listen: "127.0.0.1:0", PeerWait: -1, Log: r.log})
	if err != nil {
		t.Fatal(err)
	}
	defer p1.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	done := r.restoreAsync(ctx, 1, p1)
	select {
	case d := <-done:
		if d.err != nil {
			t.Logf("restore ended with %v (acceptable: it ended)", d.err)
		}
	case <-time.After(20 * time.Second):
		t.Fatalf("the restore did not end 15 s after its context did (record read %d times): Open loops over the cached re-reads", st.reads.Load())
	}
}

// The same flip on a peer that is down (both sessions' address
// refuses the connection). await(A) polls until the record names another
// session (B), await(B) until it names A; then both waits are cached
// (done) and Open alternates between them, dialling nobody: the restore
// never ended, far past the --peer-wait bound, and never reached the store.
func TestFlippingRecordOfDownPeerWithinBound(t *testing.T) {
	r := newRig(t)
	r.commit(0)
	dead := deadAddr(t)
	var recs [][]byte
	for _, s := range []string{"A", "B"} {
		b, err := json.Marshal(Record{Node: "node-0", Session: s, Addrs: []string{dead}, Holds: []string{folder(r.m)}})
		if err != nil {
			t.Fatal(err)
		}
		recs = append(recs, b)
	}
	st := &flipRecords{Store: r.st, key: recordKey("node-0"), recs: recs}
	p1, err := Start(context.Background(), Config{Store: st, RunID: "run", Node: "node-1", Session: "s1", Listen: "127.0.0.1:0", PeerWait: time.Second, Log: r.log})
	if err != nil {
		t.Fatal(err)
	}
	defer p1.Close()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := r.restoreAsync(ctx, 1, p1)
	select {
	case d := <-done:
		if d.err != nil {
			t.Fatalf("restore: %v", d.err)
		}
	case <-time.After(15 * time.Second):
		t.Fatalf("the restore did not end 14 s after its 1 s wait bound (record read %d times)", st.reads.Load())
	}
}

// staleThenHang answers the first read of key with stale, then hangs
// every later one until its context ends (a store GET that stalls).
type staleThenHang struct {
	cloud.Store
	key   string
	stale []byte
	reads atomic.Int64
}

func (s *staleThenHang) Get(ctx context.Context, key string, off, n int64) (io.ReadCloser, error) {
	if key == s.key {
		if s.reads.Add(1) == 1 {
			return io.NopCloser(bytes.NewReader(s.stale)), nil
		}
		<-ctx.Done()
		return nil, ctx.Err()
	}
	return s.Store.Get(ctx, key, off, n)
}

// Review 12 found: the re-read after a 403 (reread) was a store GET with no
// bound but the restore's context (the restore's own store reads stall
// out after restore.Options.Stall; the peer wait's polls after
// --peer-wait; this one after neither), and it held c.mu: every other
// file's Open (keeperOf, record, isBad) blocked behind it, the files that
// would come from the store included. Now a record read holds no lock and
// ends after recordTimeout: that peer's copies come from the store.
func TestStalledRecordReadCostsOnlyThatPeer(t *testing.T) {
	r := newRig(t)
	r.commit(0)
	p0 := r.startAs(0, "s0", r.nodes[0].tier)
	stale, err := json.Marshal(Record{Node: "node-0", Session: "before", Addrs: []string{p0.Addr().String()}, Holds: []string{folder(r.m)}})
	if err != nil {
		t.Fatal(err)
	}
	st := &staleThenHang{Store: r.st, key: recordKey("node-0"), stale: stale}
	p1, err := Start(context.Background(), Config{Store: st, RunID: "run", Node: "node-1", Session: "s1", Listen: "127.0.0.1:0", PeerWait: time.Second, Log: r.log})
	if err != nil {
		t.Fatal(err)
	}
	defer p1.Close()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error, 1)
	go func() {
		_, err := restore.Checkpoint(ctx, r.st, filepath.Join(t.TempDir(), "restore"),
			restore.Options{Part: r.parts[1].Node, Tiers: []checkpoint.Tier{p1.Tier()}, Stall: time.Second})
		done <- err
	}()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("restore: %v", err)
		}
	case <-time.After(15 * time.Second):
		t.Fatalf("the restore did not end in 15 s (stall 1 s, --peer-wait 1 s): the record's re-read after the 403 hangs (record read %d times)", st.reads.Load())
	}
}
