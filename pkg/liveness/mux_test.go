package liveness

import (
	"context"
	"fmt"
	"testing"
	"time"

	"go.uber.org/zap/zaptest"

	"github.com/spotagent/spotagent/pkg/cloud"
)

// startOn starts node k of a 2-node job run on the shared socket x.
func startOn(t *testing.T, x *Mux, st cloud.Store, run string, k int) *node {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	m, err := Start(ctx, Config{Store: st, RunID: run, Node: k, Nodes: 2, Session: fmt.Sprintf("%s-%d-%d", run, k, time.Now().UnixNano()),
		Mux: x, Advertise: []string{"127.0.0.1"}, Interval: testInterval, Timeout: testTimeout,
		Log: zaptest.NewLogger(t).Named(fmt.Sprintf("%s-node%d", run, k))})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cancel(); m.wg.Wait() })
	return &node{m: m, cancel: cancel}
}

func listen(t *testing.T) *Mux {
	t.Helper()
	x, err := Listen("127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { x.Close() })
	return x
}

// TestMux_RunsOfOneSocketApart: two node agents (one shared socket each)
// host node 0 and node 1 of two jobs; a third job has both its nodes on
// the first agent (two pods of one job on one machine). Every monitor
// hears its own neighbour through the shared port; job a's node 1
// vanishing is reported to job a's node 0 only.
func TestMux_RunsOfOneSocketApart(t *testing.T) {
	x0, x1 := listen(t), listen(t)
	sta, stb, stc := newStore(t), newStore(t), newStore(t)
	a0, a1 := startOn(t, x0, sta, "a", 0), startOn(t, x1, sta, "a", 1)
	b0, b1 := startOn(t, x0, stb, "b", 0), startOn(t, x1, stb, "b", 1)
	c0, c1 := startOn(t, x0, stc, "c", 0), startOn(t, x0, stc, "c", 1)
	for _, pair := range [][2]*node{{a0, a1}, {b0, b1}, {c0, c1}} {
		heard(t, pair[:])
	}
	if a0.m.Addr().Port != x0.Addr().Port || b0.m.Addr().Port != x0.Addr().Port {
		t.Fatalf("monitors on the shared socket listen on %v and %v, want its port %d", a0.m.Addr(), b0.m.Addr(), x0.Addr().Port)
	}
	a1.cancel()
	select {
	case s := <-a0.m.Silent():
		if s.Node != 1 {
			t.Fatalf("job a's node 0 reported node %d silent, want 1", s.Node)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("job a's node 0 never reported its vanished neighbour")
	}
	// Job b and c's nodes keep hearing each other well past the timeout.
	seen := b0.peerState(1).seq
	waitFor(t, "job b's node 0 to hear more of node 1", func() bool { return b0.peerState(1).seq > seen+2*uint64(testTimeout/testInterval) })
	for name, nd := range map[string]*node{"b0": b0, "b1": b1, "c0": c0, "c1": c1} {
		select {
		case s := <-nd.m.Silent():
			t.Errorf("%s reported node %d silent, but only job a's node 1 vanished", name, s.Node)
		default:
		}
	}
}

// TestMux_OneMonitorPerRunAndNode: a second monitor of the same run and
// node on one socket is refused; once the first stops, it may join.
func TestMux_OneMonitorPerRunAndNode(t *testing.T) {
	x, st := listen(t), newStore(t)
	first := startOn(t, x, st, "a", 0)
	_, err := Start(context.Background(), Config{Store: st, RunID: "a", Node: 0, Nodes: 2, Session: "other", Mux: x, Interval: testInterval, Timeout: testTimeout})
	if err == nil {
		t.Fatal("a second monitor of run a node 0 on one socket was accepted")
	}
	first.cancel()
	first.m.wg.Wait()
	startOn(t, x, st, "a", 0)
}

// TestRoute reads a packet's run and addressee; anything else is dropped.
func TestRoute(t *testing.T) {
	pkt := seal([]byte("0123456789abcdef0123456789abcdef"), body{Run: "r", From: 1, To: 0, Session: "s", Seq: 1})
	if k, ok := route(pkt); !ok || k != (muxKey{"r", 0}) {
		t.Errorf("route = %v, %v; want {r 0}, true", k, ok)
	}
	for name, bad := range map[string][]byte{"short": pkt[:10], "magic": append([]byte("XXXX"), pkt[4:]...),
		"json": append(append([]byte(nil), pkt[:len(magic)+macSize]...), '{'), "long": make([]byte, maxPacket+1)} {
		if _, ok := route(bad); ok {
			t.Errorf("%s packet routed", name)
		}
	}
}
