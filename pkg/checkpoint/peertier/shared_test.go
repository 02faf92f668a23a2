package peertier

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/spotagent/spotagent/internal/storesim"
	"github.com/spotagent/spotagent/pkg/checkpoint"
	"github.com/spotagent/spotagent/pkg/cloud"
	"github.com/spotagent/spotagent/pkg/liveness"
)

// Node mode's one listener serves every hosted run (#38 item 4): a run's
// node on it serves its peers as a listener of its own would; a request
// routed to another run is checked against that run's secret and
// refused; a node served twice is refused; a closed node is no longer
// served while the others are.
func TestSharedListener(t *testing.T) {
	l, err := Listen("127.0.0.1:0", nil)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	r := newRig(t)
	r.commit(0)
	start := func(st cloud.Store, run string, local Local) *Node {
		t.Helper()
		p, err := Start(context.Background(), Config{Store: st, RunID: run, Node: "node-0", Session: "s",
			Advertise: []string{"127.0.0.1"}, Local: local, Shared: l})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(p.Close)
		return p
	}
	p0 := start(r.st, "run", r.nodes[0].tier)
	if got, want := p0.Addr().Port, l.Addr().Port; got != want {
		t.Fatalf("node's port %d, want the shared listener's %d", got, want)
	}
	r.nodes[0].peer = p0
	// Another run on the same listener, its own store and secret, the
	// same node name.
	other := storesim.New()
	po := start(other, "other", r.nodes[0].tier)

	res := r.restore(1, 0)
	if got, want := res.From[checkpoint.FromPeer], int64(2*replicaBytes); got != want {
		t.Fatalf("From[peer]=%d, want %d (node 1's replica files, through the shared listener)", got, want)
	}

	// run's secret, routed to run "other": refused by other's server, as
	// a run not hosted there would be (503: nothing tells them apart).
	token, err := liveness.Token(context.Background(), r.st)
	if err != nil {
		t.Fatal(err)
	}
	var replica checkpoint.File // one of node 1's files that node 0 has too
	for _, f := range r.m.Files {
		if f.Part == "node-1" && strings.HasPrefix(f.Path, "replica-") {
			replica = f
		}
	}
	cl := NewClient(r.st, "other", "node-1", token, 0, nil)
	if _, err := cl.Open(context.Background(), r.m, replica); err == nil || !strings.Contains(err.Error(), "503") {
		t.Fatalf("a request of run's secret routed to run other: %v, want 503", err)
	}

	if _, err := Start(context.Background(), Config{Store: other, RunID: "other", Node: "node-0", Shared: l}); err == nil {
		t.Fatal("a second node-0 of run other on the shared listener: no error")
	}

	po.Close()
	cl = NewClient(other, "other", "node-1", po.token, 0, nil)
	if _, err := cl.get(context.Background(), l.Addr().String(), target{"node-0", ""}, folder(r.m), r.m.Files[0]); !errors.Is(err, errNotHosted) {
		t.Fatalf("a closed run's node: %v, want not hosted (503)", err)
	}
	if got := r.restore(1, 0).From[checkpoint.FromPeer]; got != int64(2*replicaBytes) {
		t.Fatalf("run still served after another closed: From[peer]=%d", got)
	}
}

// Node mode, a whole-job restart: node 0's node agent keeps its shared
// listener, but the run's pod on it is starting again, so the listener
// hosts no such run for a while (503) and the run's record still names
// the previous session. Node 1's restore waits for the new session's
// record, then takes node 0's copies from it, not from the store.
func TestWaitForRunHostedAgain(t *testing.T) {
	l, err := Listen("127.0.0.1:0", nil)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	r := newRig(t)
	logs := r.observe()
	r.wait = time.Minute // never reached: node 0's run is hosted again first
	r.commit(0)
	host := func(sess string) *Node {
		t.Helper()
		p, err := Start(context.Background(), Config{Store: r.st.Store, RunID: "run", Node: "node-0", Session: sess,
			Advertise: []string{"127.0.0.1"}, Local: r.nodes[0].tier, Shared: l, Log: r.log})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(p.Close)
		return p
	}
	host("s0").Close() // the pod ended: its record (session s0) stays
	done := r.restoreAsync(context.Background(), 1, r.startAs(1, "s1", nil))
	w := waitLog(t, logs, msgWaiting, 1)
	if got := w[0].ContextMap()["node"]; got != "node-0" {
		t.Fatalf("waiting for %v, want node-0", got)
	}
	host("s0b") // the new pod said hello on node 0
	res := r.check(1, done)
	if got, want := res.From[checkpoint.FromPeer], int64(2*replicaBytes); got != want {
		t.Fatalf("From[peer]=%d, want %d (node 1's two replica files, from node 0's run hosted again)", got, want)
	}
	if got, want := r.st.dataRead(), int64(2*shardBytes); got != want {
		t.Fatalf("data bytes read from the store: %d, want %d (node 1's own shards)", got, want)
	}
	if got := waitLog(t, logs, msgWaited, 1)[0].ContextMap()["outcome"]; got != "new session" {
		t.Fatalf("outcome %v, want new session", got)
	}
}
