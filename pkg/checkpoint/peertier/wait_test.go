package peertier

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"io/fs"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"

	"github.com/spotagent/spotagent/pkg/checkpoint"
	"github.com/spotagent/spotagent/pkg/checkpoint/restore"
	"github.com/spotagent/spotagent/pkg/cloud"
)

const (
	msgWaiting = "peer tier: a peer holding the checkpoint does not answer: waiting for its agent to start"
	msgWaited  = "peer tier: wait for a peer ended"
)

// deadAddr is an address where nothing listens: connection refused.
func deadAddr(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	return addr
}

// staleRecord writes node's record as its previous agent left it: session
// "before", at an address where nothing listens now, holding the rig's
// checkpoint when holds.
func (r *rig) staleRecord(node string, holds bool) {
	r.t.Helper()
	rec := Record{Node: node, Session: "before", Addrs: []string{deadAddr(r.t)}}
	if holds {
		rec.Holds = []string{folder(r.m)}
	}
	if err := putRecord(context.Background(), r.st.Store, rec); err != nil {
		r.t.Fatal(err)
	}
}

// startAs starts node k's peer tier as session sess, serving local (nil:
// nothing), with the rig's wait and log.
func (r *rig) startAs(k int, sess string, local Local) *Node {
	r.t.Helper()
	p, err := Start(context.Background(), r.onNet(k, r.config(k, sess, local)))
	if err != nil {
		r.t.Fatal(err)
	}
	r.t.Cleanup(p.Close)
	return p
}

// observe has the rig's nodes log into the returned observer.
func (r *rig) observe() *observer.ObservedLogs {
	core, logs := observer.New(zap.InfoLevel)
	r.log = zap.New(core)
	return logs
}

// waitLog waits until logs hold n entries with message msg.
func waitLog(t *testing.T, logs *observer.ObservedLogs, msg string, n int) []observer.LoggedEntry {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		if e := logs.FilterMessage(msg).All(); len(e) >= n {
			return e
		}
		if time.Now().After(deadline) {
			t.Fatalf("no %d %q in the log: %v", n, msg, logs.All())
		}
		time.Sleep(5 * time.Millisecond) // polling a condition
	}
}

type restored struct {
	res *restore.Result
	err error
}

// restoreAsync restores node k's part through p's tier in the background.
func (r *rig) restoreAsync(ctx context.Context, k int, p *Node) <-chan restored {
	done := make(chan restored, 1)
	dir := filepath.Join(r.t.TempDir(), "restore")
	go func() {
		res, err := restore.Checkpoint(ctx, r.st, dir, restore.Options{Part: r.parts[k].Node, Tiers: []checkpoint.Tier{p.Tier()}})
		done <- restored{res, err}
	}()
	return done
}

// check waits for the restore of node k's part and checks its files.
func (r *rig) check(k int, done <-chan restored) *restore.Result {
	r.t.Helper()
	var d restored
	select {
	case d = <-done:
	case <-time.After(time.Minute):
		r.t.Fatal("the restore did not end")
	}
	if d.err != nil {
		r.t.Fatal(d.err)
	}
	if d.res.Manifest.ID != r.m.ID {
		r.t.Fatalf("restored checkpoint %s, want %s", d.res.Manifest.ID, r.m.ID)
	}
	for _, rank := range r.parts[k].Ranks {
		for f, b := range rankFiles(rank, 10) {
			if got, err := os.ReadFile(filepath.Join(d.res.Dir, f)); err != nil || !bytes.Equal(got, b) {
				r.t.Fatalf("%s: %v, content equal %v", f, err, bytes.Equal(got, b))
			}
		}
	}
	return d.res
}

// A whole-job restart: node 1 (an empty machine) restores before node 0's
// new agent has started, its record naming the previous session's
// address. Node 1 waits; node 0 starts with a new session; node 1's
// replica files come from it, not the store, after one shared wait.
func TestWaitForPeerStarting(t *testing.T) {
	r := newRig(t)
	logs := r.observe()
	r.wait = time.Minute // never reached: the test ends when node 0 starts
	r.commit(0)
	r.staleRecord("node-0", true)
	done := r.restoreAsync(context.Background(), 1, r.startAs(1, "s1", nil))
	w := waitLog(t, logs, msgWaiting, 1)
	if got := w[0].ContextMap()["node"]; got != "node-0" {
		t.Fatalf("waiting for %v, want node-0", got)
	}
	if b, _ := w[0].ContextMap()["bound_s"].(float64); b <= 0 || b > 60 {
		t.Fatalf("bound_s %v, want in (0, 60]", b)
	}
	r.startAs(0, "s0", r.nodes[0].tier)
	res := r.check(1, done)
	if got, want := res.From[checkpoint.FromPeer], int64(2*replicaBytes); got != want {
		t.Fatalf("From[peer]=%d, want %d (node 1's two replica files, from node 0's new agent)", got, want)
	}
	if got, want := r.st.dataRead(), int64(2*shardBytes); got != want {
		t.Fatalf("data bytes read from the store: %d, want %d (node 1's own shards)", got, want)
	}
	ended := waitLog(t, logs, msgWaited, 1)
	if n := len(logs.FilterMessage(msgWaiting).All()); n != 1 || len(ended) != 1 {
		t.Fatalf("%d waits started, %d ended, want 1 each: the files share one", n, len(ended))
	}
	if got := ended[0].ContextMap()["outcome"]; got != "new session" {
		t.Fatalf("outcome %v, want new session", got)
	}
}

// A peer that never comes back (both machines lost, its replacement not
// started): the store, after the wait's bound.
func TestWaitBoundThenStore(t *testing.T) {
	r := newRig(t)
	logs := r.observe()
	r.wait = 300 * time.Millisecond
	r.commit(0)
	r.staleRecord("node-0", true)
	res := r.check(1, r.restoreAsync(context.Background(), 1, r.startAs(1, "s1", nil)))
	if got := res.From[checkpoint.FromPeer]; got != 0 {
		t.Fatalf("From[peer]=%d, want 0", got)
	}
	if got, want := r.st.dataRead(), int64(2*replicaBytes+2*shardBytes); got != want {
		t.Fatalf("data bytes read from the store: %d, want %d", got, want)
	}
	ended := waitLog(t, logs, msgWaited, 1)
	m := ended[0].ContextMap()
	if got := m["outcome"]; got != "bound passed" {
		t.Fatalf("outcome %v, want bound passed", got)
	}
	if w, _ := m["waited_s"].(float64); w < 0.3 {
		t.Fatalf("waited_s %v, want at least the bound, 0.3", w)
	}
	if n := len(logs.FilterMessage(msgWaiting).All()); n != 1 {
		t.Fatalf("%d waits, want 1", n)
	}
}

// Node 0's new agent starts on an empty machine too (a correlated loss):
// its record no longer holds the checkpoint, the wait ends at once, and
// the files come from the store; the checkpoint restored is the same.
func TestWaitEndsWhenNewSessionHoldsNothing(t *testing.T) {
	r := newRig(t)
	logs := r.observe()
	r.wait = time.Minute
	r.commit(0)
	r.staleRecord("node-0", true)
	done := r.restoreAsync(context.Background(), 1, r.startAs(1, "s1", nil))
	waitLog(t, logs, msgWaiting, 1)
	r.startAs(0, "s0", nil)
	res := r.check(1, done)
	if got := res.From[checkpoint.FromPeer]; got != 0 {
		t.Fatalf("From[peer]=%d, want 0", got)
	}
	if got := waitLog(t, logs, msgWaited, 1)[0].ContextMap()["outcome"]; got != "new session" {
		t.Fatalf("outcome %v, want new session", got)
	}
}

// No wait for a record that does not hold the checkpoint, nor for one of
// the restoring agent's own session; nor with PeerWait negative.
func TestNoWait(t *testing.T) {
	for name, c := range map[string]struct {
		holds bool
		sess  string
		wait  time.Duration
	}{
		"record holds nothing": {false, "s1", time.Minute},
		"own session":          {true, "before", time.Minute},
		"wait off":             {true, "s1", -1},
	} {
		t.Run(name, func(t *testing.T) {
			r := newRig(t)
			logs := r.observe()
			r.wait = c.wait
			r.commit(0)
			r.staleRecord("node-0", c.holds)
			res := r.check(1, r.restoreAsync(context.Background(), 1, r.startAs(1, c.sess, nil)))
			if got := res.From[checkpoint.FromPeer]; got != 0 {
				t.Fatalf("From[peer]=%d, want 0", got)
			}
			if n := logs.FilterMessage(msgWaiting).Len(); n != 0 {
				t.Fatalf("%d waits, want none", n)
			}
		})
	}
}

// Many files asking the same node that is down share one wait: together
// they take about one bound, not one each.
func TestConcurrentFilesShareOneWait(t *testing.T) {
	r := newRig(t)
	logs := r.observe()
	const bound, files = time.Second, 8
	r.wait = bound
	r.commit(0)
	r.staleRecord("node-0", true)
	cl := r.startAs(1, "s1", nil).Tier()
	var f checkpoint.File
	for _, g := range r.m.Files {
		if g.Part == "node-1" && g.Path == "replica-2.bin" {
			f = g
		}
	}
	start := time.Now()
	var wg sync.WaitGroup
	errs := make([]error, files)
	for i := range files {
		wg.Go(func() {
			rc, err := cl.Open(context.Background(), r.m, f)
			if rc != nil {
				rc.Close()
			}
			errs[i] = err
		})
	}
	wg.Wait()
	took := time.Since(start)
	for i, err := range errs {
		if err == nil {
			t.Fatalf("file %d: a copy from a peer that is down", i)
		}
	}
	if n := logs.FilterMessage(msgWaiting).Len(); n != 1 {
		t.Fatalf("%d waits for %d files, want 1", n, files)
	}
	if took >= files/2*bound {
		t.Fatalf("%d files took %s: the waits of %s each were not shared", files, took, bound)
	}
}

// Two nodes down share the restore's one bound: the second wait has
// nothing left of it.
func TestWaitBoundSharedAcrossNodes(t *testing.T) {
	ps := []checkpoint.PartSpec{{Node: "node-0", Ranks: []int{0}, WorldSize: 3}, {Node: "node-1", Ranks: []int{1}, WorldSize: 3}, {Node: "node-2", Ranks: []int{2}, WorldSize: 3}}
	r := newRigOf(t, ps, nil)
	logs := r.observe()
	r.wait = 500 * time.Millisecond
	r.commit(0, 2)
	r.staleRecord("node-0", true)
	r.staleRecord("node-2", true)
	res := r.check(1, r.restoreAsync(context.Background(), 1, r.startAs(1, "s1", nil)))
	if got := res.From[checkpoint.FromPeer]; got != 0 {
		t.Fatalf("From[peer]=%d, want 0", got)
	}
	if n := logs.FilterMessage(msgWaiting).Len(); n != 1 {
		t.Fatalf("%d waits, want 1: the bound is the restore's", n)
	}
}

// A restore cancelled while it waits ends at once.
func TestWaitCanceled(t *testing.T) {
	r := newRig(t)
	logs := r.observe()
	r.wait = time.Hour
	r.commit(0)
	r.staleRecord("node-0", true)
	ctx, cancel := context.WithCancel(context.Background())
	done := r.restoreAsync(ctx, 1, r.startAs(1, "s1", nil))
	waitLog(t, logs, msgWaiting, 1)
	cancel()
	select {
	case d := <-done:
		if !errors.Is(d.err, context.Canceled) {
			t.Fatalf("restore: %v, want context.Canceled", d.err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("the restore did not end when cancelled")
	}
	if got := waitLog(t, logs, msgWaited, 1)[0].ContextMap()["outcome"]; got != "canceled" {
		t.Fatalf("outcome %v, want canceled", got)
	}
}

// staleFirst answers reads of key with stale, as the store did just before
// the record was rewritten, until refused reports that node 0 refused a
// request signed for the stale session; every later read is the store's.
// (Stale for the first read alone raced: restore's files read the record
// concurrently, and a fresh read could win before any request was sent.)
type staleFirst struct {
	cloud.Store
	key     string
	stale   []byte
	refused func() bool
	done    atomic.Bool
}

func (s *staleFirst) Get(ctx context.Context, key string, off, n int64) (io.ReadCloser, error) {
	if key == s.key && !s.refused() {
		s.done.Store(true)
		return io.NopCloser(bytes.NewReader(s.stale)), nil
	}
	return s.Store.Get(ctx, key, off, n)
}

// Node 1 reads node 0's record just before node 0's new agent, on the
// same address (a fixed --peer-listen port), rewrites it: its requests,
// signed for the previous session, are refused (403). It reads the record
// once more, and takes the files from the new agent, not the store.
func TestRefusedRereadsRecord(t *testing.T) {
	r := newRig(t)
	logs := r.observe()
	r.wait = -1 // no wait: the address answers
	r.commit(0)
	p0 := r.startAs(0, "s0", r.nodes[0].tier)
	stale, err := json.Marshal(Record{Node: "node-0", Session: "before", Addrs: []string{p0.Addr().String()}, Holds: []string{folder(r.m)}})
	if err != nil {
		t.Fatal(err)
	}
	refused := func() bool { return logs.FilterMessage("peer tier: requests refused").Len() > 0 }
	st := &staleFirst{Store: r.st, key: recordKey("node-0"), stale: stale, refused: refused}
	p1, err := Start(context.Background(), Config{Store: st, RunID: "run", Node: "node-1", Session: "s1", Listen: "127.0.0.1:0", PeerWait: -1, Log: r.log})
	if err != nil {
		t.Fatal(err)
	}
	defer p1.Close()
	res := r.check(1, r.restoreAsync(context.Background(), 1, p1))
	if !st.done.Load() {
		t.Fatal("the stale record was never read")
	}
	if got, want := res.From[checkpoint.FromPeer], int64(2*replicaBytes); got != want {
		t.Fatalf("From[peer]=%d, want %d: the record was not read again after the refusal", got, want)
	}
	if got, want := r.st.dataRead(), int64(2*shardBytes); got != want {
		t.Fatalf("data bytes read from the store: %d, want %d", got, want)
	}
	if !refused() {
		t.Fatal("node 0 refused no request: the test did not test the refusal")
	}
}

// hangAfterFirst answers the first read of key, then hangs every later
// one until its context ends (a store that stops answering).
type hangAfterFirst struct {
	cloud.Store
	key  string
	once atomic.Bool
}

func (s *hangAfterFirst) Get(ctx context.Context, key string, off, n int64) (io.ReadCloser, error) {
	if key == s.key && !s.once.CompareAndSwap(false, true) {
		<-ctx.Done()
		return nil, ctx.Err()
	}
	return s.Store.Get(ctx, key, off, n)
}

// A store that stops answering the record's reads while the restore
// waits: the read in flight ends with the bound, and the files come from
// the store's data (which still answers).
func TestWaitBoundEndsHungRead(t *testing.T) {
	r := newRig(t)
	logs := r.observe()
	r.commit(0)
	r.staleRecord("node-0", true)
	st := &hangAfterFirst{Store: r.st, key: recordKey("node-0")}
	p1, err := Start(context.Background(), Config{Store: st, RunID: "run", Node: "node-1", Session: "s1", Listen: "127.0.0.1:0", PeerWait: 500 * time.Millisecond, Log: r.log})
	if err != nil {
		t.Fatal(err)
	}
	defer p1.Close()
	res := r.check(1, r.restoreAsync(context.Background(), 1, p1))
	if got := res.From[checkpoint.FromPeer]; got != 0 {
		t.Fatalf("From[peer]=%d, want 0", got)
	}
	if got := waitLog(t, logs, msgWaited, 1)[0].ContextMap()["outcome"]; got != "bound passed" {
		t.Fatalf("outcome %v, want bound passed", got)
	}
	if !st.once.Load() {
		t.Fatal("the record was never read")
	}
}

// manyParts is a job of 2 nodes × 4 ranks: 8 files a part, twice the 4
// files restore fetches at once, so that some of node 1's files are
// first asked for only after its wait for node 0 has ended.
var manyParts = []checkpoint.PartSpec{{Node: "node-0", Ranks: []int{0, 1, 2, 3}, WorldSize: 8}, {Node: "node-1", Ranks: []int{4, 5, 6, 7}, WorldSize: 8}}

// dial is one connection a client attempted: where, and when it began.
type dial struct {
	addr string
	at   time.Time
}

// dials has cl record every connection it attempts.
func dials(cl *Client) func() []dial {
	var mu sync.Mutex
	var out []dial
	tr := cl.hc.Transport.(*http.Transport)
	inner := tr.DialContext
	tr.DialContext = func(ctx context.Context, network, addr string) (net.Conn, error) {
		mu.Lock()
		out = append(out, dial{addr, time.Now()})
		mu.Unlock()
		return inner(ctx, network, addr)
	}
	return func() []dial {
		mu.Lock()
		defer mu.Unlock()
		return slices.Clone(out)
	}
}

// The bench's whole-job restart (spotbench recovery, --replicas 1): node
// 0's previous agent kept a copy of node 1's part, then both machines'
// agents stopped; node 1 restores on an empty machine before node 0's
// new agent has started, node 0's record naming the previous session's
// address, which now refuses. Node 0's agent starts with a new session
// on a new port while node 1 waits: every file of node 1's part, those
// asked while the wait ran and those asked after it, comes from the new
// address; no connection goes to the old one once the wait has ended,
// and nothing is read from the store.
func TestWaitThenEveryFileFromNewAddress(t *testing.T) {
	r := newRigOf(t, manyParts, nil)
	logs := r.observe()
	r.wait = time.Minute // never reached: the test ends when node 0 starts
	r.commit(0, 1)
	p1old := r.serve(1, nil, 0)
	p0old := r.serveReplicas(0, nil, 0, 1)
	if err := p0old.replicate(context.Background(), r.m); err != nil {
		t.Fatal(err)
	}
	oldAddr := p0old.Addr().String()
	p0old.Close() // its record stays, naming oldAddr: connection refused
	p1old.Close() // node 1's machine is lost
	if rec, err := getRecord(context.Background(), r.st.Store, "node-0"); err != nil || rec == nil || !slices.Equal(rec.Addrs, []string{oldAddr}) || rec.Replicas != 1 {
		t.Fatalf("node 0's record before the restart: %+v, %v; want %s and replicas 1", rec, err, oldAddr)
	}

	cl := r.startAs(1, "s1", nil).Tier() // an empty machine: its peer tier only
	dialed := dials(cl)
	done := make(chan restored, 1)
	go func() {
		res, err := restore.Checkpoint(context.Background(), r.st, filepath.Join(t.TempDir(), "restore"),
			restore.Options{Part: "node-1", Tiers: []checkpoint.Tier{cl}, Log: r.log})
		done <- restored{res, err}
	}()
	waitLog(t, logs, msgWaiting, 1)
	p0, err := Start(context.Background(), Config{Store: r.st.Store, RunID: "run", Node: "node-0", Session: "s0",
		Listen: "127.0.0.1:0", Local: r.nodes[0].tier, Replicas: 1, PeerWait: r.wait, Log: r.log})
	if err != nil {
		t.Fatal(err)
	}
	defer p0.Close()
	newAddr := p0.Addr().String()
	if newAddr == oldAddr {
		t.Fatalf("node 0's new agent bound its previous port %s: the test needs another", oldAddr)
	}
	res := r.check(1, done)
	ended := waitLog(t, logs, msgWaited, 1)
	if got := ended[0].ContextMap()["outcome"]; got != "new session" {
		t.Fatalf("outcome %v, want new session", got)
	}
	var all int64
	for _, f := range r.m.Files {
		if f.Part == "node-1" {
			all += f.Size
		}
	}
	if got := res.From[checkpoint.FromPeer]; got != all {
		t.Fatalf("From[peer]=%d, want %d (all of node 1's part, from node 0's new agent)", got, all)
	}
	if got := r.st.dataRead(); got != 0 {
		t.Fatalf("data bytes read from the store: %d, want 0", got)
	}
	var toOld, toNew int
	for _, d := range dialed() {
		switch {
		case d.addr == oldAddr && d.at.After(ended[0].Time):
			t.Errorf("a connection to node 0's previous address %s began %s after the wait ended", oldAddr, d.at.Sub(ended[0].Time))
		case d.addr == oldAddr:
			toOld++
		case d.addr == newAddr:
			toNew++
		}
	}
	if toOld == 0 || toNew == 0 {
		t.Fatalf("%d connections to node 0's previous address, %d to its new one: want both (%v)", toOld, toNew, dialed())
	}
	if w := logs.FilterMessage("nearby copy unreadable: fetching the file from the store").All(); len(w) != 0 {
		t.Fatalf("%d files fell back to the store: %v", len(w), w[0].ContextMap())
	}
}

// heldNothing is a local tier whose record says it holds held but that
// has no file of it: a peer's new agent without the file asked for.
type heldNothing struct{ held string }

func (h heldNothing) Name() string   { return checkpoint.FromLocal }
func (h heldNothing) Held() []string { return []string{h.held} }
func (h heldNothing) Open(context.Context, *checkpoint.Manifest, checkpoint.File) (io.ReadCloser, error) {
	return nil, fs.ErrNotExist
}

// The bench's log: node 1's files that found node 0's previous address
// refusing wait for its new agent, which answers that it has no such
// copy (404). The files come from the store, as they must, and restore
// says nothing of it (a peer without the copy is no fault), never naming
// the previous session's address, which was not what sent them there.
func TestWaitNewSessionWithoutCopyBlamesNoOldAddress(t *testing.T) {
	r := newRig(t)
	logs := r.observe()
	r.wait = time.Minute
	r.commit(0)
	r.staleRecord("node-0", true)
	old, err := getRecord(context.Background(), r.st.Store, "node-0")
	if err != nil {
		t.Fatal(err)
	}
	cl := r.startAs(1, "s1", nil).Tier()
	dialed := dials(cl)
	done := make(chan restored, 1)
	go func() {
		res, err := restore.Checkpoint(context.Background(), r.st, filepath.Join(t.TempDir(), "restore"),
			restore.Options{Part: "node-1", Tiers: []checkpoint.Tier{cl}, Log: r.log})
		done <- restored{res, err}
	}()
	waitLog(t, logs, msgWaiting, 1)
	r.startAs(0, "s0", heldNothing{folder(r.m)})
	res := r.check(1, done)
	if got := waitLog(t, logs, msgWaited, 1)[0].ContextMap()["outcome"]; got != "new session" {
		t.Fatalf("outcome %v, want new session", got)
	}
	if got := res.From[checkpoint.FromPeer]; got != 0 {
		t.Fatalf("From[peer]=%d, want 0", got)
	}
	if !slices.ContainsFunc(dialed(), func(d dial) bool { return d.addr == old.Addrs[0] }) {
		t.Fatalf("no connection to node 0's previous address: the test did not test it: %v", dialed())
	}
	for _, e := range logs.FilterMessage("nearby copy unreadable: fetching the file from the store").All() {
		t.Errorf("restore blames the peer tier: %v", e.ContextMap())
	}
}

// A peer serving its maxServing transfers answers one more with 503
// busy: that file comes from the next peer or the store at once, with no
// wait for a new session (the peer is up: none comes), and the peer's
// address is asked again for the next file, not marked down.
func TestBusyPeerNotWaitedFor(t *testing.T) {
	r := newRig(t)
	logs := r.observe()
	r.wait = time.Minute
	r.commit(0)
	p0 := r.startAs(0, "s0", r.nodes[0].tier)
	for range maxServing { // every transfer slot taken
		p0.serving.slots <- struct{}{}
	}
	cl := r.startAs(1, "s1", nil).Tier()
	var f checkpoint.File
	for _, g := range r.m.Files {
		if g.Part == "node-1" && g.Path == "replica-2.bin" {
			f = g
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	rc, err := cl.Open(ctx, r.m, f)
	if err == nil {
		rc.Close()
		t.Fatal("a copy from a peer with no transfer slot free")
	}
	if ctx.Err() != nil {
		t.Fatalf("Open of a file on a busy peer ended only with its context: %v", err)
	}
	if n := logs.FilterMessage(msgWaiting).Len(); n != 0 {
		t.Fatalf("%d waits for a peer that is up and busy, want none", n)
	}
	for range maxServing {
		<-p0.serving.slots
	}
	rc, err = cl.Open(context.Background(), r.m, f)
	if err != nil {
		t.Fatalf("the peer, no longer busy, not asked for the next file: %v", err)
	}
	rc.Close()
}
