package liveness

import (
	"context"
	"fmt"
	"net"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zaptest"
	"go.uber.org/zap/zaptest/observer"

	"github.com/spotagent/spotagent/pkg/cloud"
	"github.com/spotagent/spotagent/pkg/cloud/file"
)

// Short periods keep the tests quick; the logic does not depend on them.
const (
	testInterval = 50 * time.Millisecond
	testTimeout  = 500 * time.Millisecond
)

func newStore(t *testing.T) cloud.Store {
	t.Helper()
	st, err := file.New(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	return st
}

// node starts node k of n on the loopback; cancel makes it vanish
// without a word.
type node struct {
	m      *Monitor
	cancel context.CancelFunc
}

func startNode(t *testing.T, st cloud.Store, k, n int) *node {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	m, err := Start(ctx, Config{Store: st, RunID: "job", Node: k, Nodes: n, Session: fmt.Sprintf("s%d-%d", k, time.Now().UnixNano()),
		Listen: "127.0.0.1:0", Advertise: []string{"127.0.0.1"}, Interval: testInterval, Timeout: testTimeout,
		Log: zaptest.NewLogger(t).Named(fmt.Sprint("node", k))})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cancel(); m.wg.Wait() })
	return &node{m: m, cancel: cancel}
}

func (nd *node) peerState(k int) peer {
	nd.m.mu.Lock()
	defer nd.m.mu.Unlock()
	if p := nd.m.peers[k]; p != nil {
		return *p
	}
	return peer{}
}

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// heard waits until every pair of ring neighbours has heard each other.
func heard(t *testing.T, nodes []*node) {
	t.Helper()
	for k, nd := range nodes {
		for _, j := range Neighbours(k, len(nodes)) {
			waitFor(t, fmt.Sprintf("node %d to hear node %d", k, j), func() bool { return !nd.peerState(j).heard.IsZero() })
		}
	}
}

func expectSilence(t *testing.T, nd *node, want int) Silence {
	t.Helper()
	select {
	case s := <-nd.m.Silent():
		if s.Node != want {
			t.Fatalf("silent node %d, want %d", s.Node, want)
		}
		return s
	case <-time.After(20 * time.Second):
		t.Fatalf("node %d: no silence reported", want)
	}
	return Silence{}
}

// expectNoSilence checks, once the timeout has passed since quietSince
// (plus two checks), that nd reported nothing.
func expectNoSilence(t *testing.T, nd *node, quietSince time.Time) {
	t.Helper()
	waitFor(t, "the timeout to pass", func() bool { return time.Since(quietSince) > testTimeout+2*testInterval })
	select {
	case s := <-nd.m.Silent():
		t.Fatalf("node %d reported silent, want nothing", s.Node)
	default:
	}
}

func TestNeighbours(t *testing.T) {
	for _, c := range []struct {
		node, nodes int
		want        string
	}{{0, 1, "[]"}, {0, 2, "[1]"}, {1, 2, "[0]"}, {0, 3, "[2 1]"}, {2, 4, "[1 3]"}, {0, 1000, "[999 1]"}} {
		if got := fmt.Sprint(Neighbours(c.node, c.nodes)); got != c.want {
			t.Errorf("Neighbours(%d, %d) = %s, want %s", c.node, c.nodes, got, c.want)
		}
	}
}

func TestMonitor_VanishedNeighbourReported(t *testing.T) {
	st := newStore(t)
	a, b := startNode(t, st, 0, 2), startNode(t, st, 1, 2)
	heard(t, []*node{a, b})
	b.cancel() // no leave: the machine stopped answering
	t0 := time.Now()
	s := expectSilence(t, a, 1)
	if s.Session != b.m.cfg.Session {
		t.Fatalf("session %q, want %q", s.Session, b.m.cfg.Session)
	}
	if d := time.Since(t0); d < testTimeout-2*testInterval {
		t.Fatalf("reported %v after the last heartbeat could be sent, before the %v timeout", d, testTimeout)
	}
}

func TestMonitor_LeaveIsNotSilence(t *testing.T) {
	st := newStore(t)
	a, b := startNode(t, st, 0, 2), startNode(t, st, 1, 2)
	heard(t, []*node{a, b})
	b.m.Close()
	waitFor(t, "node 0 to see node 1 leave", func() bool { return a.peerState(1).left })
	expectNoSilence(t, a, time.Now())
}

// Each agent publishes before it reads: whichever starts later finds the
// other, also past a stale record of an earlier incarnation.
func TestMonitor_FindEachOtherInAnyOrder(t *testing.T) {
	st := newStore(t)
	dead, err := net.ListenUDP("udp", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		t.Fatal(err)
	}
	stale := record{Node: 1, Session: "old", Addrs: []string{dead.LocalAddr().String()}}
	dead.Close()
	if err := putJSON(context.Background(), st, recordKey(1), stale); err != nil {
		t.Fatal(err)
	}
	a := startNode(t, st, 0, 2)
	waitFor(t, "node 0 to read node 1's stale record", func() bool { return len(a.peerState(1).record) == 1 })
	b := startNode(t, st, 1, 2)
	heard(t, []*node{a, b})
	if got := a.peerState(1).session; got != b.m.cfg.Session {
		t.Fatalf("node 0 follows session %q, want %q", got, b.m.cfg.Session)
	}
}

// A ring of four: node 2 vanishes; its neighbours 1 and 3 report it, node
// 0, which does not watch it, reports nothing (its ranks learn of the loss
// through the RSTs of 1's and 3's ranks).
func TestMonitor_RingOnlyNeighboursReport(t *testing.T) {
	st := newStore(t)
	var nodes []*node
	for k := 0; k < 4; k++ {
		nodes = append(nodes, startNode(t, st, k, 4))
	}
	heard(t, nodes)
	nodes[2].cancel()
	t0 := time.Now()
	expectSilence(t, nodes[1], 2)
	expectSilence(t, nodes[3], 2)
	expectNoSilence(t, nodes[0], t0)
	if _, ok := nodes[0].m.peers[2]; ok {
		t.Fatal("node 0 watches node 2, which is not its neighbour")
	}
}

// A restarted neighbour (a new session) replaces the old one before the
// timeout: no loss.
func TestMonitor_RestartedNeighbourReplaces(t *testing.T) {
	st := newStore(t)
	a, b := startNode(t, st, 0, 2), startNode(t, st, 1, 2)
	heard(t, []*node{a, b})
	b.cancel()
	b2 := startNode(t, st, 1, 2)
	t0 := time.Now()
	waitFor(t, "node 0 to follow node 1's new session", func() bool { return a.peerState(1).session == b2.m.cfg.Session })
	expectNoSilence(t, a, t0)
}

// A pod that cannot read the job's store (another token) can neither keep
// a vanished node alive nor be heard at all.
func TestMonitor_OtherTokenIgnored(t *testing.T) {
	st := newStore(t)
	a, b := startNode(t, st, 0, 2), startNode(t, st, 1, 2)
	heard(t, []*node{a, b})

	other := newStore(t) // the impostor's own token
	rec, err := getRecord(context.Background(), st, 0)
	if err != nil || rec == nil {
		t.Fatalf("node 0's record: %v %v", rec, err)
	}
	if err := putJSON(context.Background(), other, recordKey(0), rec); err != nil {
		t.Fatal(err)
	}
	imp := startNode(t, other, 1, 2) // says it is node 1, to node 0's address
	waitFor(t, "the impostor to send", func() bool {
		imp.m.mu.Lock()
		defer imp.m.mu.Unlock()
		return imp.m.seq > 3
	})
	b.cancel()
	expectSilence(t, a, 1)
	if got := a.peerState(1).session; got != b.m.cfg.Session {
		t.Fatalf("node 0 followed session %q, want the real node 1's %q", got, b.m.cfg.Session)
	}
}

// acceptLocked refuses every packet that is not a fresh one of a neighbour
// of this run sealed with the job's token.
func TestAccept(t *testing.T) {
	token := []byte("0123456789abcdef0123456789abcdef")
	m := &Monitor{cfg: Config{RunID: "job", Node: 0, Nodes: 3}, token: token,
		peers: map[int]*peer{1: {}, 2: {}}, log: zaptest.NewLogger(t)}
	from := &net.UDPAddr{IP: net.IPv4(10, 0, 0, 2), Port: 4000}
	now := time.Now()
	hb := body{Run: "job", From: 1, To: 0, Session: "s1", Started: 100, Seq: 5}
	accept := func(tok []byte, b body) bool { return m.acceptLocked(seal(tok, b), from, now) }
	with := func(f func(*body)) body { b := hb; f(&b); return b }

	if !accept(token, hb) {
		t.Fatal("a valid heartbeat was refused")
	}
	for name, c := range map[string]struct {
		tok []byte
		b   body
	}{
		"replayed":          {token, hb},
		"older seq":         {token, with(func(b *body) { b.Seq = 4 })},
		"other token":       {[]byte("fedcba9876543210fedcba9876543210"), with(func(b *body) { b.Seq = 9 })},
		"other run":         {token, with(func(b *body) { b.Run = "other"; b.Seq = 9 })},
		"to another node":   {token, with(func(b *body) { b.To = 2; b.Seq = 9 })},
		"not a neighbour":   {token, with(func(b *body) { b.From = 7; b.Seq = 9 })},
		"earlier session":   {token, with(func(b *body) { b.Session = "s0"; b.Started = 50; b.Seq = 9 })},
		"from itself":       {token, with(func(b *body) { b.From = 0; b.Seq = 9 })},
		"truncated or junk": {nil, hb},
	} {
		ok := false
		if c.tok == nil {
			pkt := seal(token, c.b)
			ok = m.acceptLocked(pkt[:len(pkt)-1], from, now) || m.acceptLocked([]byte("SAL1junk"), from, now)
		} else {
			ok = accept(c.tok, c.b)
		}
		if ok {
			t.Errorf("%s: accepted", name)
		}
	}
	if !accept(token, with(func(b *body) { b.Session = "s2"; b.Started = 200; b.Seq = 1 })) {
		t.Fatal("a later session was refused")
	}
	if got := m.peers[1].session; got != "s2" {
		t.Fatalf("session %q, want s2", got)
	}
	if !accept(token, with(func(b *body) { b.Session = "s2"; b.Started = 200; b.Seq = 2; b.Leave = true })) || !m.peers[1].left {
		t.Fatal("a leave was not taken")
	}
}

func TestStart_BadConfig(t *testing.T) {
	st := newStore(t)
	for name, c := range map[string]Config{
		"one node":      {Store: st, Node: 0, Nodes: 1, Session: "s"},
		"node too high": {Store: st, Node: 2, Nodes: 2, Session: "s"},
		"no session":    {Store: st, Node: 0, Nodes: 2},
		"no store":      {Node: 0, Nodes: 2, Session: "s"},
		"timeout short": {Store: st, Node: 0, Nodes: 2, Session: "s", Interval: time.Second, Timeout: time.Second},
		"bad listen":    {Store: st, Node: 0, Nodes: 2, Session: "s", Listen: "nowhere:x"},
	} {
		if m, err := Start(context.Background(), c); err == nil {
			m.Close()
			t.Errorf("%s: no error", name)
		}
	}
}

// The job's token is created once; every later agent reads the same.
func TestEnsureToken(t *testing.T) {
	st := newStore(t)
	a, err := Token(context.Background(), st)
	if err != nil {
		t.Fatal(err)
	}
	b, err := Token(context.Background(), st)
	if err != nil {
		t.Fatal(err)
	}
	if string(a) != string(b) || len(a) != 64 {
		t.Fatalf("tokens %q and %q, want one of 64 hex digits", a, b)
	}
}

// A neighbour whose record names an address nobody answers on (a firewall
// on the UDP port) is warned about once, and never reported silent.
func TestMonitor_UnheardNeighbourWarned(t *testing.T) {
	st := newStore(t)
	dead, err := net.ListenUDP("udp", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		t.Fatal(err)
	}
	defer dead.Close() // bound, never read: the packets go nowhere
	if err := putJSON(context.Background(), st, recordKey(1), record{Node: 1, Session: "x", Addrs: []string{dead.LocalAddr().String()}}); err != nil {
		t.Fatal(err)
	}
	core, logs := observer.New(zap.InfoLevel)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	m, err := Start(ctx, Config{Store: st, RunID: "job", Node: 0, Nodes: 2, Session: "s0", Listen: "127.0.0.1:0",
		Advertise: []string{"127.0.0.1"}, Interval: testInterval, Timeout: testTimeout, Log: zap.New(core)})
	if err != nil {
		t.Fatal(err)
	}
	m.mu.Lock()
	m.unheardAfter = 3 * testTimeout
	m.mu.Unlock()
	waitFor(t, "the warning", func() bool { return logs.FilterMessageSnippet("is not heard").Len() == 1 })
	select {
	case s := <-m.Silent():
		t.Fatalf("node %d reported silent, never having been heard", s.Node)
	default:
	}
	cancel()
	m.wg.Wait()
	if n := logs.FilterMessageSnippet("is not heard").Len(); n != 1 {
		t.Fatalf("warned %d times, want once", n)
	}
}

// checkLocked's verdict, fed packets and times by hand (no clock, no
// sockets): silent exactly Timeout after the last heartbeat; a stall of
// this monitor (a late check: SIGSTOP, a starved process) does not count
// as the neighbours' silence, while their silence after it still does.
func TestCheck_SilenceCountsOnlyWhileRunning(t *testing.T) {
	token := []byte("0123456789abcdef0123456789abcdef")
	const interval, timeout = 100 * time.Millisecond, 2 * time.Second
	newMon := func() *Monitor {
		return &Monitor{cfg: Config{RunID: "job", Node: 0, Nodes: 2, Interval: interval, Timeout: timeout}, token: token,
			peers: map[int]*peer{1: {}}, silent: make(chan Silence, 1), log: zaptest.NewLogger(t)}
	}
	from := &net.UDPAddr{IP: net.IPv4(10, 0, 0, 2), Port: 4000}
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	seq := uint64(0)
	hear := func(m *Monitor, at time.Time) {
		seq++
		if !m.acceptLocked(seal(token, body{Run: "job", From: 1, To: 0, Session: "s1", Started: 1, Seq: seq}), from, at) {
			t.Fatal("heartbeat refused")
		}
	}
	// check runs the checks every interval over [from, to] and returns
	// when the first silence was reported (zero: none).
	check := func(m *Monitor, from, to time.Time) time.Time {
		for now := from; !now.After(to); now = now.Add(interval) {
			m.checkLocked(now)
			select {
			case <-m.silent:
				return now
			default:
			}
		}
		return time.Time{}
	}

	m := newMon()
	hear(m, t0)
	if at := check(m, t0, t0.Add(timeout-interval)); !at.IsZero() {
		t.Fatalf("silent at +%v, before the %v timeout", at.Sub(t0), timeout)
	}
	if at := check(m, t0.Add(timeout), t0.Add(timeout)); !at.Equal(t0.Add(timeout)) {
		t.Fatalf("not silent %v after the last heartbeat", timeout)
	}

	// This monitor stalled 5 s right after a heartbeat (its checks
	// stopped): the first check after it does not report, nor do the
	// next ones while the neighbour's packets come again.
	m = newMon()
	hear(m, t0)
	check(m, t0, t0.Add(interval))
	back := t0.Add(interval + 5*time.Second)
	if at := check(m, back, back); !at.IsZero() {
		t.Fatal("a stall of this monitor was taken for the neighbour's silence")
	}
	hear(m, back.Add(10*time.Millisecond))
	if at := check(m, back.Add(interval), back.Add(time.Second)); !at.IsZero() {
		t.Fatal("silent after the stall although the neighbour is heard")
	}
	// The neighbour then goes quiet: reported Timeout after its last
	// heartbeat, checks on time.
	last := back.Add(10 * time.Millisecond)
	at := check(m, back.Add(time.Second+interval), back.Add(10*time.Second))
	if d := at.Sub(last); at.IsZero() || d < timeout || d > timeout+interval {
		t.Fatalf("silent %v after the last heartbeat, want %v to %v", d, timeout, timeout+interval)
	}

	// Checks a little late (a loaded machine: each 150 ms apart, under
	// two intervals) delay nothing.
	m = newMon()
	hear(m, t0)
	var found time.Time
	for now := t0; now.Before(t0.Add(5 * time.Second)); now = now.Add(150 * time.Millisecond) {
		m.checkLocked(now)
		select {
		case <-m.silent:
			found = now
		default:
		}
		if !found.IsZero() {
			break
		}
	}
	if d := found.Sub(t0); found.IsZero() || d < timeout || d > timeout+150*time.Millisecond {
		t.Fatalf("with checks 150 ms apart: silent %v after the last heartbeat, want %v to %v", d, timeout, timeout+150*time.Millisecond)
	}
}
