package peertier

import (
	"context"
	"errors"
	"io/fs"
	"strings"
	"testing"

	"github.com/spotagent/spotagent/pkg/checkpoint"
	"github.com/spotagent/spotagent/pkg/checkpoint/storesim"
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

	// run's secret, routed to run "other": refused by other's server.
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
	if _, err := cl.Open(context.Background(), r.m, replica); err == nil || !strings.Contains(err.Error(), "403") {
		t.Fatalf("a request of run's secret routed to run other: %v, want 403", err)
	}

	if _, err := Start(context.Background(), Config{Store: other, RunID: "other", Node: "node-0", Shared: l}); err == nil {
		t.Fatal("a second node-0 of run other on the shared listener: no error")
	}

	po.Close()
	cl = NewClient(other, "other", "node-1", po.token, 0, nil)
	if _, err := cl.get(context.Background(), l.Addr().String(), target{"node-0", ""}, folder(r.m), r.m.Files[0]); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("a closed run's node: %v, want not found", err)
	}
	if got := r.restore(1, 0).From[checkpoint.FromPeer]; got != int64(2*replicaBytes) {
		t.Fatalf("run still served after another closed: From[peer]=%d", got)
	}
}
