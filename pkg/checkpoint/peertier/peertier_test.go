package peertier

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"

	"github.com/spotagent/spotagent/internal/storesim"
	"github.com/spotagent/spotagent/internal/testutil/memnet"
	"github.com/spotagent/spotagent/pkg/checkpoint"
	"github.com/spotagent/spotagent/pkg/checkpoint/commit"
	"github.com/spotagent/spotagent/pkg/checkpoint/journal"
	"github.com/spotagent/spotagent/pkg/checkpoint/localtier"
	"github.com/spotagent/spotagent/pkg/checkpoint/restore"
	"github.com/spotagent/spotagent/pkg/cloud"
)

// countingStore counts the bytes read from each object.
type countingStore struct {
	cloud.Store
	mu   sync.Mutex
	read map[string]int64
}

func (c *countingStore) Get(ctx context.Context, key string, off, n int64) (io.ReadCloser, error) {
	rc, err := c.Store.Get(ctx, key, off, n)
	if err != nil {
		return nil, err
	}
	return &countedBody{ReadCloser: rc, c: c, key: key}, nil
}

type countedBody struct {
	io.ReadCloser
	c   *countingStore
	key string
}

func (b *countedBody) Read(p []byte) (int, error) {
	n, err := b.ReadCloser.Read(p)
	b.c.mu.Lock()
	b.c.read[b.key] += int64(n)
	b.c.mu.Unlock()
	return n, err
}

// dataRead is the bytes read from checkpoint data objects.
func (c *countingStore) dataRead() int64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	var n int64
	for k, b := range c.read {
		if strings.HasPrefix(k, "checkpoints/") && !strings.HasSuffix(k, ".json") {
			n += b
		}
	}
	return n
}

// The job of the tests: 2 nodes × 2 ranks. Every rank writes replica-<r>.bin,
// the same bytes on every rank (data-parallel weights), and shard-<r>.bin,
// its own.
var parts = []checkpoint.PartSpec{{Node: "node-0", Ranks: []int{0, 1}, WorldSize: 4}, {Node: "node-1", Ranks: []int{2, 3}, WorldSize: 4}}

const (
	replicaBytes = 300_000
	shardBytes   = 100_000
)

func rankFiles(r int, step int64) map[string][]byte {
	return map[string][]byte{
		fmt.Sprintf("replica-%d.bin", r): bytes.Repeat([]byte(fmt.Sprintf("weights step %d;", step)), replicaBytes/15)[:replicaBytes],
		fmt.Sprintf("shard-%d.bin", r):   bytes.Repeat([]byte(fmt.Sprintf("rank %d step %d;", r, step)), shardBytes/10)[:shardBytes],
	}
}

// node is one simulated machine: its checkpoint directory, local tier
// and peer tier.
type node struct {
	name   string
	dir    string
	parent *os.Root
	tier   *localtier.Tier
	peer   *Node
}

type rig struct {
	log      *zap.Logger // nil: none
	t        *testing.T
	st       *countingStore
	nodes    []*node
	m        *checkpoint.Manifest
	parts    []checkpoint.PartSpec
	machines []checkpoint.Machine // each node's, as its committer records it; nil: none
	wait     time.Duration        // each node's PeerWait (0: the default)
	// net: the nodes' network, node k at 10.0.0.<k+1> (nil: the
	// machine's TCP on 127.0.0.1); set by inBubble.
	net *memnet.Network
}

func newRig(t *testing.T) *rig { return newRigOf(t, parts, nil) }

// newRigOf is a rig of the job ps, node k on machines[k] (nil: unknown).
func newRigOf(t *testing.T, ps []checkpoint.PartSpec, machines []checkpoint.Machine) *rig {
	t.Helper()
	r := &rig{t: t, st: &countingStore{Store: storesim.New(), read: map[string]int64{}}, parts: ps, machines: machines}
	for _, p := range ps {
		n := &node{name: p.Node, dir: t.TempDir()}
		var err error
		if n.parent, err = os.OpenRoot(n.dir); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { n.parent.Close() })
		if n.tier, err = localtier.Open(n.parent, "area/committed", localtier.Options{}); err != nil {
			t.Fatal(err)
		}
		r.nodes = append(r.nodes, n)
	}
	return r
}

// commit has every node save step 10 and commits the job's checkpoint;
// the local tier of each node in keep keeps its part.
func (r *rig) commit(keep ...int) {
	r.t.Helper()
	var wg sync.WaitGroup
	errs := make([]error, len(r.parts))
	for i, p := range r.parts {
		src := filepath.Join(r.nodes[i].dir, "req")
		for _, rank := range p.Ranks {
			for f, b := range rankFiles(rank, 10) {
				if err := os.MkdirAll(src, 0o700); err != nil {
					r.t.Fatal(err)
				}
				if err := os.WriteFile(filepath.Join(src, f), b, 0o600); err != nil {
					r.t.Fatal(err)
				}
			}
		}
		wg.Go(func() {
			c := &commit.Committer{Store: r.st.Store, RunID: "run"}
			if r.machines != nil {
				c.Source = r.machines[i]
			}
			_, errs[i] = c.Commit(context.Background(), commit.Request{Dir: src, ID: "c10", Step: 10, Reason: "periodic", Part: &p})
		})
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			r.t.Fatal(err)
		}
	}
	l, err := checkpoint.ReadLatest(context.Background(), r.st.Store)
	if err != nil {
		r.t.Fatal(err)
	}
	if r.m, err = checkpoint.ReadManifest(context.Background(), r.st.Store, l.Manifest); err != nil {
		r.t.Fatal(err)
	}
	for _, k := range keep {
		if err := r.nodes[k].tier.Keep(context.Background(), "req", r.m, r.parts[k].Node, true); err != nil {
			r.t.Fatal(err)
		}
	}
}

// serve starts node k's peer tier, serving local (default: its tier).
func (r *rig) serve(k int, local Local, stall time.Duration) *Node {
	r.t.Helper()
	return r.serveReplicas(k, local, stall, 0)
}

func (r *rig) serveReplicas(k int, local Local, stall time.Duration, replicas int) *Node {
	r.t.Helper()
	n := r.nodes[k]
	if local == nil {
		local = n.tier
	}
	cfg := r.config(k, "s", local)
	cfg.Advertise, cfg.Stall, cfg.Replicas = []string{"127.0.0.1"}, stall, replicas
	p, err := Start(context.Background(), r.onNet(k, cfg))
	if err != nil {
		r.t.Fatal(err)
	}
	r.t.Cleanup(p.Close)
	n.peer = p
	return p
}

// config is node k's peer tier as session sess, serving local, with the
// rig's wait and log.
func (r *rig) config(k int, sess string, local Local) Config {
	return Config{Store: r.st.Store, RunID: "run", Node: r.nodes[k].name, Session: sess,
		Listen: "127.0.0.1:0", Local: local, PeerWait: r.wait, Log: r.log}
}

// onNet puts node k's cfg on the rig's network when it has one.
func (r *rig) onNet(k int, cfg Config) Config {
	if r.net != nil {
		ip := fmt.Sprintf("10.0.0.%d", k+1)
		cfg.Listen, cfg.Advertise, cfg.Network = ip+":0", []string{ip}, r.net.Host(ip)
	}
	return cfg
}

// restore restores node k's part into a new directory through its peer
// tier (started if it was not).
func (r *rig) restore(k int, stall time.Duration) *restore.Result {
	r.t.Helper()
	p := r.nodes[k].peer
	if p == nil {
		p = r.serve(k, nil, stall)
	}
	res, err := restore.Checkpoint(context.Background(), r.st, filepath.Join(r.t.TempDir(), "restore"),
		restore.Options{Part: r.parts[k].Node, Tiers: []checkpoint.Tier{p.Tier()}})
	if err != nil {
		r.t.Fatal(err)
	}
	for _, rank := range r.parts[k].Ranks {
		for f, b := range rankFiles(rank, 10) {
			got, err := os.ReadFile(filepath.Join(res.Dir, f))
			if err != nil {
				r.t.Fatal(err)
			}
			if !bytes.Equal(got, b) {
				r.t.Fatalf("%s: restored content differs", f)
			}
		}
	}
	return res
}

// keptPartPath is node k's kept copy of file f of another node's part
// (--replicas 1: localtier keeps it apart from the node's own).
func (r *rig) keptPartPath(k int, part, f string) string {
	return filepath.Join(r.nodes[k].dir, "area", "committed", folder(r.m)+"+"+part, f)
}

// keptPath is node k's kept copy of file f.
func (r *rig) keptPath(k int, f string) string {
	return filepath.Join(r.nodes[k].dir, "area", "committed", folder(r.m), f)
}

func TestRestoreFromPeer(t *testing.T) {
	r := newRig(t)
	r.commit(0) // node 1 is a new, empty machine
	r.serve(0, nil, 0)
	res := r.restore(1, 0)
	if got, want := res.From[checkpoint.FromPeer], int64(2*replicaBytes); got != want {
		t.Fatalf("From[peer]=%d, want %d (node 1's two replica files)", got, want)
	}
	if got, want := res.From[checkpoint.FromStore], int64(2*shardBytes); got != want {
		t.Fatalf("From[store]=%d, want %d (node 1's own shards)", got, want)
	}
	if got, want := r.st.dataRead(), int64(2*shardBytes); got != want {
		t.Fatalf("data bytes read from the store: %d, want %d", got, want)
	}
	if got, want := journal.Sources(res.From), "peer+store"; got != want {
		t.Fatalf("Sources=%q, want %q", got, want)
	}
}

func TestRestoreAllFromPeer(t *testing.T) {
	r := newRig(t)
	r.commit(0)
	r.serve(0, nil, 0)
	p := r.serve(1, nil, 0)
	res, err := restore.Checkpoint(context.Background(), r.st, t.TempDir(), restore.Options{Tiers: []checkpoint.Tier{p.Tier()}})
	if err != nil {
		t.Fatal(err)
	}
	// Node 0's part from its owner; node 1's replicas from node 0 too.
	if got, want := res.From[checkpoint.FromPeer], int64(4*replicaBytes+2*shardBytes); got != want {
		t.Fatalf("From[peer]=%d, want %d", got, want)
	}
}

// A peer down, a stale record: the store, at the cost of one refused
// connection and the wait for a new agent of that node (wait_test.go).
func TestPeerGoneFallsBackToStore(t *testing.T) {
	r := newRig(t)
	r.wait = 100 * time.Millisecond
	r.commit(0)
	r.serve(0, nil, 0).Close()
	res := r.restore(1, 0)
	if got := res.From[checkpoint.FromPeer]; got != 0 {
		t.Fatalf("From[peer]=%d, want 0", got)
	}
	if got, want := r.st.dataRead(), int64(2*replicaBytes+2*shardBytes); got != want {
		t.Fatalf("data bytes read from the store: %d, want %d", got, want)
	}
}

// A kept copy damaged in place (the same size): the peer serves it, restore's
// CRC32C check refuses it, the file comes from the store.
func TestBadCRCFallsBackToStore(t *testing.T) {
	r := newRig(t)
	r.commit(0)
	for _, f := range []string{"replica-0.bin", "replica-1.bin"} {
		p := r.keptPath(0, f)
		b, err := os.ReadFile(p)
		if err != nil {
			t.Fatal(err)
		}
		b[len(b)/2] ^= 0xff
		if err := os.WriteFile(p, b, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	r.serve(0, nil, 0)
	res := r.restore(1, 0)
	if got := res.From[checkpoint.FromPeer]; got != 0 {
		t.Fatalf("From[peer]=%d, want 0: every copy was damaged", got)
	}
}

// A symlink in the kept copy (to a file of the same size outside it) is
// never served.
func TestSymlinkNotServed(t *testing.T) {
	r := newRig(t)
	r.commit(0)
	outside := filepath.Join(t.TempDir(), "secret")
	if err := os.WriteFile(outside, make([]byte, replicaBytes), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, f := range []string{"replica-0.bin", "replica-1.bin"} {
		p := r.keptPath(0, f)
		if err := os.Remove(p); err != nil {
			t.Fatal(err)
		}
		if err := os.Symlink(outside, p); err != nil {
			t.Fatal(err)
		}
	}
	p := r.serve(0, nil, 0)
	res := r.restore(1, 0)
	if got := res.From[checkpoint.FromPeer]; got != 0 {
		t.Fatalf("From[peer]=%d, want 0", got)
	}
	f := checkpoint.File{Path: "replica-0.bin", Size: replicaBytes}
	if got := r.ask(p, signed(p.token, "run", target{"node-0", "s"}, folder(r.m), f, time.Now())); got != http.StatusNotFound {
		t.Fatalf("symlinked file: status %d, want 404", got)
	}
}

// stuckLocal serves a tier whose reads stop half-way (a dying disk, a
// peer that stops sending) until the request ends.
type stuckLocal struct{ *localtier.Tier }

func (s stuckLocal) Open(ctx context.Context, m *checkpoint.Manifest, f checkpoint.File) (io.ReadCloser, error) {
	rc, err := s.Tier.Open(ctx, m, f)
	if err != nil {
		return nil, err
	}
	return &stuckReader{ReadCloser: rc, ctx: ctx, left: f.Size / 2}, nil
}

type stuckReader struct {
	io.ReadCloser
	ctx  context.Context
	left int64
}

func (s *stuckReader) Read(p []byte) (int, error) {
	if s.left <= 0 {
		<-s.ctx.Done()
		return 0, s.ctx.Err()
	}
	n, err := s.ReadCloser.Read(p[:min(int64(len(p)), s.left)])
	s.left -= int64(n)
	return n, err
}

func TestStallFallsBackToStore(t *testing.T) {
	r := newRig(t)
	r.commit(0)
	r.serve(0, stuckLocal{r.nodes[0].tier}, 0)
	start := time.Now()
	res := r.restore(1, 200*time.Millisecond)
	if got := res.From[checkpoint.FromPeer]; got != 0 {
		t.Fatalf("From[peer]=%d, want 0", got)
	}
	if got, want := res.From[checkpoint.FromStore], int64(2*replicaBytes+2*shardBytes); got != want {
		t.Fatalf("From[store]=%d, want %d", got, want)
	}
	t.Logf("restore with a stalled peer took %s", time.Since(start))
}

// ask sends a request to node p's server and returns the status.
func (r *rig) ask(p *Node, req request) int {
	r.t.Helper()
	resp, err := http.Get("http://" + p.Addr().String() + filePath + "?" + req.query())
	if err != nil {
		r.t.Fatal(err)
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return resp.StatusCode
}

func TestServerRefuses(t *testing.T) {
	r := newRig(t)
	r.commit(0)
	p := r.serve(0, nil, 0)
	tok := p.token
	ck := folder(r.m)
	f := checkpoint.File{Path: "replica-0.bin", Size: replicaBytes}
	to := target{"node-0", "s"}
	now := time.Now()
	if got := r.ask(p, signed(tok, "run", to, ck, f, now)); got != http.StatusOK {
		t.Fatalf("a valid request: status %d, want 200", got)
	}
	cases := map[string]struct {
		req  request
		want int
	}{
		"another node":    {signed(tok, "run", target{"node-1", "s"}, ck, f, now), http.StatusForbidden},
		"another session": {signed(tok, "run", target{"node-0", "s-before"}, ck, f, now), http.StatusForbidden},
		"no mac":          {request{node: "node-0", session: "s", ckpt: ck, file: f.Path, size: f.Size, expiry: now.Add(time.Minute).Unix()}, http.StatusForbidden},
		"another key":     {signed([]byte("not the job's secret, 32 bytes.."), "run", to, ck, f, now), http.StatusForbidden},
		"another run":     {signed(tok, "other", to, ck, f, now), http.StatusForbidden},
		"expired":         {signed(tok, "run", to, ck, f, now.Add(-maxSkew-time.Minute)), http.StatusForbidden},
		"too far ahead":   {signed(tok, "run", to, ck, f, now.Add(maxSkew+time.Minute)), http.StatusForbidden},
		"other file":      {signed(tok, "run", to, ck, checkpoint.File{Path: "shard-2.bin", Size: shardBytes}, now), http.StatusNotFound},
		"other size":      {signed(tok, "run", to, ck, checkpoint.File{Path: f.Path, Size: f.Size - 1}, now), http.StatusNotFound},
		"escape":          {signed(tok, "run", to, ck, checkpoint.File{Path: "../../../etc/passwd", Size: 1}, now), http.StatusBadRequest},
		"bad name":        {signed(tok, "run", to, "../committed", f, now), http.StatusBadRequest},
		"not held":        {signed(tok, "run", to, "000000000011-c11", f, now), http.StatusNotFound},
	}
	for name, c := range cases {
		t.Run(name, func(t *testing.T) {
			if got := r.ask(p, c.req); got != c.want {
				t.Fatalf("status %d, want %d", got, c.want)
			}
		})
	}
	// A signature of one file does not open another.
	forged := signed(tok, "run", to, ck, f, now)
	forged.file = "shard-0.bin"
	forged.size = shardBytes
	if got := r.ask(p, forged); got != http.StatusForbidden {
		t.Fatalf("a signature of another file: status %d, want 403", got)
	}
	resp, err := http.Get("http://" + p.Addr().String() + "/")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusNotFound {
		t.Fatalf("GET /: status %d, want 404", resp.StatusCode)
	}
}

func TestRecordSaysWhatIsHeld(t *testing.T) {
	r := newRig(t)
	r.commit()
	p := r.serve(0, nil, 0)
	rec, err := getRecord(context.Background(), r.st, "node-0")
	if err != nil || rec == nil {
		t.Fatalf("record: %v %v", rec, err)
	}
	if len(rec.Holds) != 0 {
		t.Fatalf("holds %v before any copy was kept, want none", rec.Holds)
	}
	if err := r.nodes[0].tier.Keep(context.Background(), "req", r.m, "node-0", true); err != nil {
		t.Fatal(err)
	}
	if err := p.Publish(context.Background()); err != nil {
		t.Fatal(err)
	}
	if rec, err = getRecord(context.Background(), r.st, "node-0"); err != nil {
		t.Fatal(err)
	}
	if got, want := strings.Join(rec.Holds, ","), folder(r.m); got != want {
		t.Fatalf("holds %q, want %q", got, want)
	}
	if got, want := rec.Addrs[0], p.Addr().String(); got != want {
		t.Fatalf("addrs %v, want %s first", rec.Addrs, want)
	}
}

// With --replicas 1, node 0 keeps a copy of node 1's part: node 1 replaced
// by an empty machine reads nothing from the store, its shards included.
func TestReplicaServesShardedPart(t *testing.T) {
	r := newRig(t)
	r.commit(0, 1)
	p1 := r.serve(1, nil, 0)
	p0 := r.serveReplicas(0, nil, 0, 1)
	if err := p0.replicate(context.Background(), r.m); err != nil {
		t.Fatal(err)
	}
	p1.Close() // node 1's machine is gone
	cl := NewClient(r.st, "run", "node-1", p0.token, 0, nil)
	res, err := restore.Checkpoint(context.Background(), r.st, t.TempDir(), restore.Options{Part: "node-1", Tiers: []checkpoint.Tier{cl}})
	if err != nil {
		t.Fatal(err)
	}
	if got, want := res.From[checkpoint.FromPeer], int64(2*replicaBytes+2*shardBytes); got != want {
		t.Fatalf("From[peer]=%d, want %d (all of node 1's part)", got, want)
	}
	if got := r.st.dataRead(); got != 0 {
		t.Fatalf("data bytes read from the store: %d, want 0", got)
	}
	for _, rank := range parts[1].Ranks {
		for f, b := range rankFiles(rank, 10) {
			if got, err := os.ReadFile(filepath.Join(res.Dir, f)); err != nil || !bytes.Equal(got, b) {
				t.Fatalf("%s: %v, or its content differs", f, err)
			}
		}
	}
}

// Replicate runs in the background and is tried again until the kept
// part's node has kept its part.
func TestReplicateWaitsForThePart(t *testing.T) {
	r := newRig(t)
	core, logs := observer.New(zap.InfoLevel)
	r.log = zap.New(core)
	r.commit(0) // node 1 has not kept its part yet
	p1 := r.serve(1, nil, 0)
	p0 := r.serveReplicas(0, nil, 0, 1)
	p0.Replicate(r.m)
	deadline := time.Now().Add(30 * time.Second)
	for logs.FilterMessage("peer tier: the kept part is not copied yet (retrying)").Len() == 0 {
		if time.Now().After(deadline) {
			t.Fatal("no failed first attempt within 30 s")
		}
		time.Sleep(10 * time.Millisecond) // polling for the background attempt, bounded by the deadline
	}
	if err := r.nodes[1].tier.Keep(context.Background(), "req", r.m, "node-1", true); err != nil {
		t.Fatal(err)
	}
	if err := p1.Publish(context.Background()); err != nil {
		t.Fatal(err)
	}
	deadline = time.Now().Add(30 * time.Second)
	for {
		if _, err := os.Stat(r.keptPartPath(0, "node-1", "shard-3.bin")); err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("node 1's part not copied to node 0 within 30 s")
		}
		time.Sleep(20 * time.Millisecond) // polling for the background copy, bounded by the deadline
	}
}

// A replica that does not fit the local tier's budget is not kept.
func TestReplicaWithinBudget(t *testing.T) {
	r := newRig(t)
	var err error
	if r.nodes[0].tier, err = localtier.Open(r.nodes[0].parent, "area/committed", localtier.Options{MaxBytes: 2*replicaBytes + 2*shardBytes}); err != nil {
		t.Fatal(err)
	}
	r.commit(0, 1)
	r.serve(1, nil, 0)
	p0 := r.serveReplicas(0, nil, 0, 1)
	if err := p0.replicate(context.Background(), r.m); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(r.keptPartPath(0, "node-1", "shard-2.bin")); err == nil {
		t.Fatal("node 1's part kept beyond the budget")
	}
	if _, err := os.Stat(r.keptPath(0, "shard-0.bin")); err != nil {
		t.Fatalf("node 0's own part: %v", err)
	}
}

// A copy that fails verification (node 1's kept shard damaged in place)
// leaves no replica, partial or whole: a replacement of node 1 reads its
// part from the store.
func TestReplicaBadCopyNotKept(t *testing.T) {
	r := newRig(t)
	r.commit(0, 1)
	p := r.keptPath(1, "shard-3.bin")
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	b[0] ^= 0xff
	if err := os.WriteFile(p, b, 0o600); err != nil {
		t.Fatal(err)
	}
	r.serve(1, nil, 0)
	p0 := r.serveReplicas(0, nil, 0, 1)
	if err := p0.replicate(context.Background(), r.m); err == nil {
		t.Fatal("replicate: no error for a damaged copy")
	}
	for _, f := range []string{"shard-2.bin", "shard-3.bin", "replica-2.bin"} {
		if _, err := os.Stat(r.keptPartPath(0, "node-1", f)); err == nil {
			t.Fatalf("%s of node 1 kept on node 0 after a failed copy", f)
		}
	}
}

// dripPeer is node-0's peer server gone sick (or hostile): it answers
// every request with the right header, then one byte every 20 ms, each
// flushed, never silent for a stall bound.
func dripPeer(t *testing.T, r *rig, opens *atomic.Int64) {
	t.Helper()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		opens.Add(1)
		w.Header().Set("Content-Length", req.URL.Query().Get("s"))
		w.WriteHeader(http.StatusOK)
		rc := http.NewResponseController(w)
		for {
			select {
			case <-req.Context().Done():
				return
			case <-time.After(20 * time.Millisecond):
			}
			if _, err := w.Write([]byte{0}); err != nil {
				return
			}
			rc.Flush()
		}
	}))
	t.Cleanup(srv.Close)
	rec := Record{Node: "node-0", Session: "s", Addrs: []string{strings.TrimPrefix(srv.URL, "http://")}, Holds: []string{folder(r.m)}}
	if err := putRecord(context.Background(), r.st.Store, rec); err != nil {
		t.Fatal(err)
	}
}

// A peer that sends a byte now and then (never silent for the stall
// bound) is cut off once its average rate is under the minimum after the
// grace period: its file, and every later file it would have served, come
// from the store, and the restore ends (review S1).
func TestSlowPeerFallsBackToStore(t *testing.T) {
	r := newRig(t)
	r.commit(0)
	var opens atomic.Int64
	dripPeer(t, r, &opens)
	p := r.serve(1, nil, 0) // the default stall bound: each byte resets it
	cl := p.Tier()
	cl.minRate, cl.grace = 1<<20, 300*time.Millisecond
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	res, err := restore.Checkpoint(ctx, r.st, filepath.Join(t.TempDir(), "restore"),
		restore.Options{Part: "node-1", Tiers: []checkpoint.Tier{cl}})
	if err != nil {
		t.Fatalf("restore with a dripping peer: %v", err)
	}
	if got := res.From[checkpoint.FromPeer]; got != 0 {
		t.Fatalf("From[peer]=%d, want 0", got)
	}
	if got, want := res.From[checkpoint.FromStore], int64(2*replicaBytes+2*shardBytes); got != want {
		t.Fatalf("From[store]=%d, want %d", got, want)
	}
	t.Logf("restore with a dripping peer took %s", res.Took)
	// Files asked for at once may each have gone to it; none after the cut.
	asked := opens.Load()
	var f checkpoint.File
	for _, g := range r.m.Files {
		if g.Part == "node-1" && strings.HasPrefix(g.Path, "replica-") {
			f = g
		}
	}
	if _, err := cl.Open(ctx, r.m, f); err == nil {
		t.Fatal("a peer cut off for its rate was asked again by the same restore")
	}
	if got := opens.Load(); got != asked {
		t.Fatalf("the dripping peer was asked for %d files after it was cut off, want 0", got-asked)
	}
}

// A restore's warning about a peer it could not read names the peer and
// the file, never the signed URL (review M1c).
func TestPeerErrorHidesSignature(t *testing.T) {
	r := newRig(t)
	r.commit(0)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	dead := ln.Addr().String()
	ln.Close() // nothing listens there now: connection refused
	rec := Record{Node: "node-0", Session: "s", Addrs: []string{dead}, Holds: []string{folder(r.m)}}
	if err := putRecord(context.Background(), r.st.Store, rec); err != nil {
		t.Fatal(err)
	}
	core, logs := observer.New(zap.InfoLevel)
	p := r.serve(1, nil, 0)
	if _, err := restore.Checkpoint(context.Background(), r.st, filepath.Join(t.TempDir(), "restore"),
		restore.Options{Part: "node-1", Tiers: []checkpoint.Tier{p.Tier()}, Log: zap.New(core)}); err != nil {
		t.Fatal(err)
	}
	warned := 0
	for _, e := range logs.All() {
		for k, v := range e.ContextMap() {
			if s := fmt.Sprint(v); strings.Contains(s, "mac=") || strings.Contains(s, filePath) {
				t.Fatalf("%q logs the signed URL in %s: %s", e.Message, k, s)
			}
			if k == "error" && strings.Contains(fmt.Sprint(v), dead) {
				warned++
			}
		}
	}
	if warned == 0 {
		t.Fatalf("no warning names the peer %s: %v", dead, logs.All())
	}
}

// A flood of refused requests (unsigned, 4 KB names) logs one warning
// per interval, counting them, its file name truncated (review m1).
func TestRefusalsRateLimited(t *testing.T) {
	r := newRig(t)
	r.commit(0)
	core, logs := observer.New(zap.InfoLevel)
	r.log = zap.New(core)
	p := r.serve(0, nil, 0)
	long := strings.Repeat("x", 4096)
	for range 200 {
		req := request{node: "node-0", session: "s", ckpt: folder(r.m), file: long, size: 1, expiry: time.Now().Add(time.Minute).Unix()}
		if got := r.ask(p, req); got != http.StatusForbidden {
			t.Fatalf("status %d, want 403", got)
		}
	}
	var bytes int
	refused := logs.FilterMessage("peer tier: requests refused").All()
	for _, e := range refused {
		bytes += len(fmt.Sprint(e.ContextMap()))
	}
	if len(refused) != 1 || bytes > 1024 {
		t.Fatalf("%d refusal warnings, %d bytes, want 1 of at most 1 KiB", len(refused), bytes)
	}
	if n := refused[0].ContextMap()["refused"]; n != int64(1) {
		t.Fatalf("the first warning counts %v refusals, want 1", n)
	}
}

// A node whose port cannot be bound withdraws its record (no address):
// the previous session's, naming that port, sends nobody there (review M1b).
func TestListenFailureWithdrawsRecord(t *testing.T) {
	r := newRig(t)
	r.commit(0)
	taken, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer taken.Close()
	old := Record{Node: "node-0", Session: "before", Addrs: []string{taken.Addr().String()}, Holds: []string{folder(r.m)}}
	if err := putRecord(context.Background(), r.st.Store, old); err != nil {
		t.Fatal(err)
	}
	_, err = Start(context.Background(), Config{Store: r.st.Store, RunID: "run", Node: "node-0", Session: "now",
		Listen: taken.Addr().String(), Local: r.nodes[0].tier})
	if err == nil {
		t.Fatal("start on a port in use: no error")
	}
	rec, err := getRecord(context.Background(), r.st.Store, "node-0")
	if err != nil || rec == nil {
		t.Fatalf("record: %v %v", rec, err)
	}
	if rec.Session != "now" || len(rec.Addrs) != 0 || len(rec.Holds) != 0 {
		t.Fatalf("record after a failed start: %+v, want this session's, no address", rec)
	}
}

// A server listening on one address, without Advertise, publishes that
// address, not the machine's others where nothing listens (review m2).
func TestRecordNamesSpecificListenHost(t *testing.T) {
	r := newRig(t)
	p, err := Start(context.Background(), Config{Store: r.st.Store, RunID: "run", Node: "node-0", Session: "s", Listen: "127.0.0.1:0"})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	rec, err := getRecord(context.Background(), r.st.Store, "node-0")
	if err != nil || rec == nil {
		t.Fatalf("record: %v %v", rec, err)
	}
	if got, want := strings.Join(rec.Addrs, ","), p.Addr().String(); got != want {
		t.Fatalf("addrs %q, want %q only", got, want)
	}
}

// A node without a local tier never says it serves copies (review m3).
func TestNoLocalSaysServesNothing(t *testing.T) {
	r := newRig(t)
	core, logs := observer.New(zap.InfoLevel)
	p, err := Start(context.Background(), Config{Store: r.st.Store, RunID: "run", Node: "node-0", Session: "s", Listen: "127.0.0.1:0", Log: zap.New(core)})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	if n := logs.FilterMessage("peer tier: serving this node's local copies").Len(); n != 0 {
		t.Fatalf("%d 'serving' messages without a local tier", n)
	}
}

// restoreAs restores node k's part as a new agent of it, session sess,
// that serves nothing: what it checks is restore's.
func (r *rig) restoreAs(k int, sess string) *restore.Result {
	r.t.Helper()
	p, err := Start(context.Background(), r.onNet(k, r.config(k, sess, nil)))
	if err != nil {
		r.t.Fatal(err)
	}
	r.t.Cleanup(p.Close)
	r.nodes[k].peer = p
	return r.restore(k, 0)
}

// The peer tier inside a synctest bubble, its nodes on an in-memory
// network (Config.Network, as the agent's simulation runs it): a restore
// from a peer, from the store past a peer that is gone (its record's
// address refused, its agent waited for the default PeerWait) or one
// whose reads stall (the default stall), each in fake time; the bubble
// ends with every goroutine of the tier gone once its nodes are closed.
func TestInBubble(t *testing.T) {
	inBubble := func(name string, f func(t *testing.T, r *rig)) {
		t.Run(name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				r := newRig(t)
				r.net = memnet.New()
				f(t, r)
			})
		})
	}
	inBubble("peer", func(t *testing.T, r *rig) {
		r.commit(0)
		r.serve(0, nil, 0)
		res := r.restore(1, 0)
		if got, want := res.From[checkpoint.FromPeer], int64(2*replicaBytes); got != want {
			t.Errorf("From[peer]=%d, want %d (node 1's two replica files)", got, want)
		}
		if got, want := r.st.dataRead(), int64(2*shardBytes); got != want {
			t.Errorf("data bytes read from the store: %d, want %d", got, want)
		}
	})
	inBubble("gone", func(t *testing.T, r *rig) {
		r.commit(0)
		r.serve(0, nil, 0).Close()
		start := time.Now()
		res := r.restoreAs(1, "next")
		if got := res.From[checkpoint.FromPeer]; got != 0 {
			t.Errorf("From[peer]=%d, want 0", got)
		}
		if got, want := r.st.dataRead(), int64(2*replicaBytes+2*shardBytes); got != want {
			t.Errorf("data bytes read from the store: %d, want %d", got, want)
		}
		if d := time.Since(start); d < DefaultPeerWait || d > DefaultPeerWait+time.Second {
			t.Errorf("the restore took %s of fake time, want the peer wait (%s) and one poll more at most", d, DefaultPeerWait)
		}
	})
	inBubble("back", func(t *testing.T, r *rig) {
		r.commit(0)
		r.serve(0, nil, 0).Close()
		start := time.Now()
		go func() {
			time.Sleep(5 * time.Second) // node 0's agent back, a new session
			p, err := Start(context.Background(), r.onNet(0, r.config(0, "back", r.nodes[0].tier)))
			if err != nil {
				t.Error(err)
				return
			}
			t.Cleanup(p.Close)
		}()
		res := r.restoreAs(1, "next")
		if got, want := res.From[checkpoint.FromPeer], int64(2*replicaBytes); got != want {
			t.Errorf("From[peer]=%d, want %d (node 1's two replica files)", got, want)
		}
		if d := time.Since(start); d < 5*time.Second || d > 5*time.Second+2*pollEvery {
			t.Errorf("the restore took %s of fake time, want node 0's return (5s) and a poll more at most", d)
		}
	})
	inBubble("stalled", func(t *testing.T, r *rig) {
		r.commit(0)
		r.serve(0, stuckLocal{r.nodes[0].tier}, 0)
		start := time.Now()
		res := r.restore(1, 0)
		if got, want := res.From[checkpoint.FromStore], int64(2*replicaBytes+2*shardBytes); got != want {
			t.Errorf("From[store]=%d, want %d", got, want)
		}
		if d := time.Since(start); d < DefaultStall || d > 3*DefaultStall {
			t.Errorf("the restore took %s of fake time, want about the stall bound (%s)", d, DefaultStall)
		}
	})
}

// holdRecordPuts holds every write of a record until hold is closed.
type holdRecordPuts struct{ hold chan struct{} }

func (h holdRecordPuts) Before(ctx context.Context, op storesim.Op) error {
	if op.Kind == storesim.OpPut && strings.HasPrefix(op.Key, recordDir) {
		select {
		case <-h.hold:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	return nil
}

func (holdRecordPuts) After(_ context.Context, _ storesim.Op, err error) error { return err }

// A Publish behind a slow one waits its turn within its own context: it
// gives up when that ends (a mutex could not; inside a synctest bubble,
// the agent's simulation, a goroutine waiting on one stopped the clock).
func TestPublishWaitsItsTurnWithinItsContext(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		r := newRig(t)
		r.net = memnet.New()
		p := r.serve(0, nil, 0)
		h := holdRecordPuts{hold: make(chan struct{})}
		r.st.Store.(*storesim.Store).Faults = h
		first := make(chan error, 1)
		go func() { first <- p.Publish(context.Background()) }()
		synctest.Wait() // the first write is held in the store
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		start := time.Now()
		if err := p.Publish(ctx); !errors.Is(err, context.DeadlineExceeded) {
			t.Errorf("a Publish behind a held one: %v, want its context's deadline", err)
		}
		if d := time.Since(start); d != time.Second {
			t.Errorf("it gave up after %s, want its context's 1s", d)
		}
		close(h.hold)
		if err := <-first; err != nil {
			t.Errorf("the held Publish: %v", err)
		}
	})
}
